#include "replay/chakra/chakra_et_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/gzip_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>

#include "common/bounded_read.h"
#include "prism/limits.h"

namespace prism::chakra {

namespace pbio = google::protobuf::io;

namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string MessageLabel(size_t index) {
  return index == 0 ? std::string("message 0 (GlobalMetadata)")
                    : "message " + std::to_string(index) + " (node #" + std::to_string(index - 1) + ")";
}

// Reads one length-delimited message. Returns 1 when read, 0 at a clean end of file, -1 on error.
// `file_size` (0 when unknown: gzip) tells a truncated file from bytes that do not parse.
// Why a fresh CodedInputStream per message: it has a total byte limit; Chakra's reader does the same.
int ReadDelimited(pbio::ZeroCopyInputStream* in, google::protobuf::MessageLite* msg, uint64_t file_size,
                  uint64_t* offset, std::string* why) {
  pbio::CodedInputStream coded(in);
  const void* data = nullptr;
  int avail = 0;
  if (!coded.GetDirectBufferPointer(&data, &avail)) return 0;  // nothing left: clean end
  uint32_t size = 0;
  if (!coded.ReadVarint32(&size)) {
    *why = "truncated or malformed length prefix";
    return -1;
  }
  const uint64_t body = *offset + pbio::CodedOutputStream::VarintSize32(size);
  if (file_size != 0 && body + size > file_size) {
    *why = "truncated: the length prefix says " + std::to_string(size) + " bytes but only " +
           std::to_string(file_size - body) + " remain";
    return -1;
  }
  pbio::CodedInputStream::Limit limit = coded.PushLimit(static_cast<int>(size));
  if (!msg->ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage() || coded.BytesUntilLimit() > 0) {
    *why = file_size != 0 ? "the " + std::to_string(size) + " bytes do not parse as the message"
                          : "truncated, or the " + std::to_string(size) + " bytes do not parse as the message";
    return -1;
  }
  coded.PopLimit(limit);
  *offset = body + size;
  return 1;
}

// An attribute named `name` whose value `set_value` writes.
template <typename SetValue>
et::AttributeProto NamedAttr(std::string name, SetValue set_value) {
  et::AttributeProto a;
  a.set_name(std::move(name));
  set_value(a);
  return a;
}

}  // namespace

int OpenEtFile(const std::string& path, bool* gzip, uint64_t* file_size, std::string* error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = path + ": cannot open: " + std::strerror(errno);
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode) || (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode))) {
    *error = path + (S_ISDIR(st.st_mode) ? ": is a directory, not a file" : ": is a device or socket, not a file");
    ::close(fd);
    return -1;
  }
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > limits::kMaxChakraFileBytes) {
    *error = path + ": " + std::to_string(st.st_size) + " bytes is larger than the " +
             ByteCap(limits::kMaxChakraFileBytes) + " cap on Chakra ET files";
    ::close(fd);
    return -1;
  }
  unsigned char magic[2] = {0, 0};
  ssize_t got = ::pread(fd, magic, 2, 0);
  *gzip = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  *file_size = !*gzip && S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
  return fd;
}

bool ReadEtFile(const std::string& path, EtFile* out, std::string* error) {
  *out = EtFile{};
  bool gzip = false;
  uint64_t file_size = 0;
  const int fd = OpenEtFile(path, &gzip, &file_size, error);
  if (fd < 0) return false;
  pbio::FileInputStream file(fd);
  file.SetCloseOnDelete(true);
  std::unique_ptr<pbio::GzipInputStream> gz;
  pbio::ZeroCopyInputStream* in = &file;
  if (gzip) {
    gz = std::make_unique<pbio::GzipInputStream>(&file, pbio::GzipInputStream::GZIP);
    in = gz.get();
  }
  uint64_t offset = 0;
  std::string why;
  const std::string where = gzip ? " (uncompressed offset " : " (offset ";
  int rc = ReadDelimited(in, &out->metadata, file_size, &offset, &why);
  if (rc == 0) {
    *error = path + ": empty file (a Chakra ET file starts with a GlobalMetadata message)";
    return false;
  }
  if (rc < 0) {
    *error = path + ": " + MessageLabel(0) + where + "0): " + why;
    return false;
  }
  for (size_t index = 1;; ++index) {
    et::Node node;
    uint64_t at = offset;
    rc = ReadDelimited(in, &node, file_size, &offset, &why);
    if (rc == 0) break;
    // Why: a gzip file (or a pipe) has no size to check up front; its uncompressed bytes are capped as they come.
    if (offset > limits::kMaxChakraFileBytes) {
      *error = path + ": more than the " + ByteCap(limits::kMaxChakraFileBytes) + " cap on Chakra ET files" +
               (gzip ? " (uncompressed)" : "");
      return false;
    }
    if (rc < 0) {
      *error = path + ": " + MessageLabel(index) + where + std::to_string(at) + "): " + why;
      if (gz && gz->ZlibErrorMessage()) *error += std::string(" (gzip: ") + gz->ZlibErrorMessage() + ")";
      return false;
    }
    out->nodes.push_back(std::move(node));
  }
  if (file.GetErrno() != 0) {
    *error = path + ": read error: " + std::strerror(file.GetErrno());
    return false;
  }
  return true;
}

bool WriteEtFile(const std::string& path, const EtFile& f, std::string* error) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = path + ": cannot create: " + std::strerror(errno);
    return false;
  }
  bool ok = true;
  {
    pbio::FileOutputStream file(fd);
    std::unique_ptr<pbio::GzipOutputStream> gz;
    pbio::ZeroCopyOutputStream* outs = &file;
    if (EndsWith(path, ".gz")) {
      gz = std::make_unique<pbio::GzipOutputStream>(&file);
      outs = gz.get();
    }
    auto write = [&](const google::protobuf::MessageLite& m) {
      pbio::CodedOutputStream coded(outs);
      coded.WriteVarint32(static_cast<uint32_t>(m.ByteSizeLong()));
      m.SerializeWithCachedSizes(&coded);
      return !coded.HadError();
    };
    ok = write(f.metadata);
    for (size_t i = 0; ok && i < f.nodes.size(); ++i) ok = write(f.nodes[i]);
    if (gz) ok = gz->Close() && ok;
    ok = file.Close() && ok;
    if (!ok) *error = path + ": write failed: " + std::strerror(file.GetErrno() ? file.GetErrno() : EIO);
  }
  return ok;
}

const et::AttributeProto* FindAttr(const google::protobuf::RepeatedPtrField<et::AttributeProto>& attrs,
                                   std::string_view name) {
  for (const auto& a : attrs) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

std::optional<int64_t> AttrInt(const et::AttributeProto& a) {
  using A = et::AttributeProto;
  switch (a.value_case()) {
    case A::kInt32Val: return a.int32_val();
    case A::kInt64Val: return a.int64_val();
    case A::kUint32Val: return static_cast<int64_t>(a.uint32_val());
    case A::kUint64Val: return static_cast<int64_t>(a.uint64_val());
    case A::kSint32Val: return a.sint32_val();
    case A::kSint64Val: return a.sint64_val();
    case A::kFixed32Val: return static_cast<int64_t>(a.fixed32_val());
    case A::kFixed64Val: return static_cast<int64_t>(a.fixed64_val());
    case A::kSfixed32Val: return a.sfixed32_val();
    case A::kSfixed64Val: return a.sfixed64_val();
    case A::kBoolVal: return a.bool_val() ? 1 : 0;
    default: return std::nullopt;
  }
}

std::optional<std::string> AttrString(const et::AttributeProto& a) {
  if (a.value_case() == et::AttributeProto::kStringVal) return a.string_val();
  if (a.value_case() == et::AttributeProto::kBytesVal) return a.bytes_val();
  return std::nullopt;
}

std::optional<double> AttrDouble(const et::AttributeProto& a) {
  if (a.value_case() == et::AttributeProto::kDoubleVal) return a.double_val();
  if (a.value_case() == et::AttributeProto::kFloatVal) return a.float_val();
  if (auto i = AttrInt(a)) return static_cast<double>(*i);
  return std::nullopt;
}

std::string_view AttrValueKind(const et::AttributeProto& a) {
  const auto* field = et::AttributeProto::descriptor()->FindFieldByNumber(static_cast<int>(a.value_case()));
  return field ? std::string_view(field->name()) : std::string_view("none");
}

et::AttributeProto MakeIntAttr(std::string name, int64_t v) {
  return NamedAttr(std::move(name), [&](et::AttributeProto& a) { a.set_int64_val(v); });
}
et::AttributeProto MakeInt32Attr(std::string name, int32_t v) {
  return NamedAttr(std::move(name), [&](et::AttributeProto& a) { a.set_int32_val(v); });
}
et::AttributeProto MakeUint64Attr(std::string name, uint64_t v) {
  return NamedAttr(std::move(name), [&](et::AttributeProto& a) { a.set_uint64_val(v); });
}
et::AttributeProto MakeBoolAttr(std::string name, bool v) {
  return NamedAttr(std::move(name), [&](et::AttributeProto& a) { a.set_bool_val(v); });
}
et::AttributeProto MakeStringAttr(std::string name, std::string v) {
  return NamedAttr(std::move(name), [&](et::AttributeProto& a) { a.set_string_val(std::move(v)); });
}
et::AttributeProto MakeDoubleAttr(std::string name, double v) {
  return NamedAttr(std::move(name), [&](et::AttributeProto& a) { a.set_double_val(v); });
}

std::string NodeTypeName(int type) {
  if (et::NodeType_IsValid(type)) return et::NodeType_Name(static_cast<et::NodeType>(type));
  return "NodeType " + std::to_string(type);
}

std::string CommTypeName(int64_t type) {
  if (type >= 0 && type <= 0x7fffffff && et::CollectiveCommType_IsValid(static_cast<int>(type))) {
    return et::CollectiveCommType_Name(static_cast<et::CollectiveCommType>(type));
  }
  return "CollectiveCommType " + std::to_string(type);
}

}  // namespace prism::chakra
