// Reading and writing one Chakra execution-trace (ET) file: length-delimited protobuf messages (a varint32
// byte count, then the message), first a GlobalMetadata, then Nodes until the end of the file. Files whose
// first two bytes are the gzip magic are decompressed on the fly (as Chakra's own readers do); names ending in
// ".gz" are written compressed. The message types are our et_def.proto (the Chakra wire format).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "replay/chakra/et_def.pb.h"

namespace prism::chakra {

// The generated messages are in prism::chakra::et (et_def.proto's package): `et::Node` here.

struct EtFile {
  et::GlobalMetadata metadata;
  std::vector<et::Node> nodes;
};

// Reads the whole file. On failure returns false with *error naming the file, the message (0 is the
// metadata, k >= 1 is node k-1) and its byte offset: missing file, empty file, a truncated length or message,
// bytes that do not parse as the message.
bool ReadEtFile(const std::string& path, EtFile* out, std::string* error);

// Opens an ET file for reading, with the checks both readers make (ReadEtFile and EtReader::Open): a regular
// file within the size cap, or a pipe. Returns the descriptor, which the caller closes, with *gzip (the file
// starts with gzip's magic) and *file_size (a plain regular file's size, else 0: no size to check messages
// against); or -1 with *error.
int OpenEtFile(const std::string& path, bool* gzip, uint64_t* file_size, std::string* error);

// Writes `f` (metadata, then nodes). Returns false with *error on an I/O failure.
bool WriteEtFile(const std::string& path, const EtFile& f, std::string* error);

// Attributes. Find returns the first attribute of that name, or nullptr.
const et::AttributeProto* FindAttr(const google::protobuf::RepeatedPtrField<et::AttributeProto>& attrs,
                                   std::string_view name);
// The value of an integer-like attribute whatever its oneof member (int32/int64/uint32/uint64/sint*/fixed*/
// sfixed*/bool): Chakra's writers disagree on which one they use. nullopt for no value or a non-integer.
std::optional<int64_t> AttrInt(const et::AttributeProto& a);
// string_val (or bytes_val); nullopt otherwise.
std::optional<std::string> AttrString(const et::AttributeProto& a);
// double_val, float_val or any integer; nullopt otherwise.
std::optional<double> AttrDouble(const et::AttributeProto& a);
// "int64_val", "string_val", ... ("none" when unset), for messages.
std::string_view AttrValueKind(const et::AttributeProto& a);

// Builders used by the exporter and the tests.
et::AttributeProto MakeIntAttr(std::string name, int64_t v);      // int64_val
et::AttributeProto MakeInt32Attr(std::string name, int32_t v);    // int32_val
et::AttributeProto MakeUint64Attr(std::string name, uint64_t v);  // uint64_val
et::AttributeProto MakeBoolAttr(std::string name, bool v);
et::AttributeProto MakeStringAttr(std::string name, std::string v);
et::AttributeProto MakeDoubleAttr(std::string name, double v);

// "COMP_NODE", "COMM_COLL_NODE", ...; "NodeType <n>" for a value outside the enum.
std::string NodeTypeName(int type);
// "ALL_REDUCE", ...; "CollectiveCommType <n>" for a value outside the enum.
std::string CommTypeName(int64_t type);

}  // namespace prism::chakra
