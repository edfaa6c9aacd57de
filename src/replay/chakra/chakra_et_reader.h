// Streaming reader of one Chakra ET file: the GlobalMetadata, then one Node at a time, each decoded into a view
// (EtNodeView) whose strings point into the reader's buffer until the next call. Nothing of earlier nodes is kept.
//
// Same files, framing, caps and error messages as ReadEtFile (chakra_et_io.h): the length prefix and the
// message bytes are taken with protobuf's CodedInputStream exactly as ReadEtFile takes them, and gzip through
// protobuf's GzipInputStream. A Node is decoded by a wire-format decoder of the fields the importer reads;
// whatever that decoder does not handle itself (a list-valued attribute, non-ASCII text, a known field with
// another wire type, groups, over-long varints) is handed to protobuf's own parser, which then decides, so an
// accepted message reads as et::Node would and a refused one is refused as ReadEtFile refuses it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/non_copyable.h"
#include "replay/chakra/chakra_et_io.h"

namespace google::protobuf::io {
class ZeroCopyInputStream;
class GzipInputStream;
}  // namespace google::protobuf::io

namespace prism::chakra {

// One AttributeProto: its name, which member of `value` is set (the field number: et::AttributeProto::kInt64Val,
// ...; 0 for none) and the value as the AttrInt/AttrDouble/AttrString accessors of chakra_et_io.h read it.
struct EtAttrView {
  std::string_view name;
  int value_case = 0;
  int64_t i = 0;       // the integer members, converted as AttrInt converts them
  double d = 0;        // double_val, float_val
  std::string_view s;  // string_val, bytes_val
};

// What the importer reads of a Node. Vectors keep their capacity from node to node.
struct EtNodeView {
  uint64_t id = 0;
  std::string_view name;
  int type = 0;
  std::vector<uint64_t> ctrl_deps, data_deps;
  uint64_t start_time_micros = 0;
  uint64_t duration_micros = 0;
  std::string_view inputs_values;  // inputs.values
  std::vector<EtAttrView> attrs;   // in file order
};

std::optional<int64_t> AttrInt(const EtAttrView& a);
std::optional<std::string> AttrString(const EtAttrView& a);
std::optional<double> AttrDouble(const EtAttrView& a);
std::string_view AttrValueKind(const EtAttrView& a);

class EtReader : NonCopyable {
 public:
  EtReader();
  ~EtReader();

  // Opens `path` and reads its GlobalMetadata. False with *error as ReadEtFile words it.
  bool Open(const std::string& path, std::string* error);
  const et::GlobalMetadata& metadata() const { return metadata_; }
  // The next node: 1 read into *node, 0 at the end of the file, -1 with *error (as ReadEtFile words it).
  int Next(EtNodeView* node, std::string* error);
  // Nodes decoded by protobuf's parser because the fast decoder left them to it (for tests).
  uint64_t protobuf_decoded() const { return protobuf_decoded_; }

 private:
  int ReadFrame(std::string_view* bytes, uint64_t* next, std::string* why);
  void Close();
  std::string Unparsable(uint64_t size) const;  // ReadEtFile's words for a message that does not parse

  std::string path_;
  class FdStream;
  std::unique_ptr<FdStream> file_;
  std::unique_ptr<google::protobuf::io::GzipInputStream> gz_;
  google::protobuf::io::ZeroCopyInputStream* in_ = nullptr;
  uint64_t file_size_ = 0;  // 0 when unknown (gzip, pipe)
  uint64_t offset_ = 0;
  size_t index_ = 0;        // messages read
  bool gzip_ = false;
  bool done_ = false;
  std::string scratch_;     // a message that straddles the stream's buffers
  et::GlobalMetadata metadata_;
  et::Node fallback_;       // protobuf's parse of a node the fast decoder left to it
  uint64_t protobuf_decoded_ = 0;
};

}  // namespace prism::chakra
