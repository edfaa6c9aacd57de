#include "replay/chakra/chakra_et_reader.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/gzip_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>

#include "common/bounded_read.h"
#include "prism/limits.h"

namespace prism::chakra {

namespace pbio = google::protobuf::io;

namespace {

// ---------------------------------------------------------------------------------------------------------
// The fast decoder. Each function returns false to leave the message to protobuf's parser ("fallback"), never
// to refuse it: only protobuf refuses. It handles the canonical encoding of the fields below and skips unknown
// fields of wire types 0, 1, 2 and 5; anything else falls back.

using Byte = unsigned char;

// A varint of at most 10 bytes, with the bits past 64 dropped (protobuf's VarintParse does the same).
inline bool Varint(const Byte*& p, const Byte* end, uint64_t* v) {
  if (p < end && *p < 0x80) {
    *v = *p++;
    return true;
  }
  uint64_t r = 0;
  for (int i = 0; i < 10; ++i) {
    if (p == end) return false;
    const Byte b = *p++;
    r |= static_cast<uint64_t>(b & 0x7f) << (7 * i);
    if (b < 0x80) {
      *v = r;
      return true;
    }
  }
  return false;
}

// A tag whose value fits 32 bits and whose field number is not 0.
inline bool Tag(const Byte*& p, const Byte* end, uint32_t* field, uint32_t* wire) {
  const Byte* start = p;
  uint64_t t = 0;
  if (!Varint(p, end, &t) || p - start > 5 || t > 0xffffffffULL || (t >> 3) == 0) return false;
  *field = static_cast<uint32_t>(t >> 3);
  *wire = static_cast<uint32_t>(t & 7);
  return true;
}

// A length prefix that fits in what is left.
inline bool Length(const Byte*& p, const Byte* end, size_t* n) {
  const Byte* start = p;
  uint64_t v = 0;
  if (!Varint(p, end, &v) || p - start > 5 || v > static_cast<uint64_t>(end - p)) return false;
  *n = static_cast<size_t>(v);
  return true;
}

// Text that protobuf's UTF-8 check would pass without question; other text falls back.
inline bool Ascii(const Byte* p, size_t n) {
  uint64_t acc = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    acc |= w;
  }
  for (; i < n; ++i) acc |= p[i];
  return (acc & 0x8080808080808080ULL) == 0;
}

inline bool Text(const Byte*& p, const Byte* end, std::string_view* s, bool check_ascii = true) {
  size_t n = 0;
  if (!Length(p, end, &n) || (check_ascii && !Ascii(p, n))) return false;
  *s = std::string_view(reinterpret_cast<const char*>(p), n);
  p += n;
  return true;
}

inline bool Skip(const Byte*& p, const Byte* end, uint32_t wire) {
  uint64_t v = 0;
  size_t n = 0;
  switch (wire) {
    case 0: return Varint(p, end, &v);
    case 1:
      if (end - p < 8) return false;
      p += 8;
      return true;
    case 2:
      if (!Length(p, end, &n)) return false;
      p += n;
      return true;
    case 5:
      if (end - p < 4) return false;
      p += 4;
      return true;
    default: return false;  // groups, end-group, invalid wire types: protobuf decides
  }
}

inline uint32_t Fixed32(const Byte*& p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  p += 4;
  return v;
}

inline uint64_t Fixed64(const Byte*& p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  p += 8;
  return v;
}

// IOInfo: values = 1, shapes = 2, types = 3 (strings). A repeated IOInfo field merges, as protobuf merges it.
bool DecodeIoInfo(const Byte* p, const Byte* end, std::string_view* values) {
  while (p < end) {
    uint32_t field = 0, wire = 0;
    if (!Tag(p, end, &field, &wire)) return false;
    if (field >= 1 && field <= 3) {
      std::string_view s;
      if (wire != 2 || !Text(p, end, &s)) return false;
      if (field == 1 && values) *values = s;
    } else if (!Skip(p, end, wire)) {
      return false;
    }
  }
  return true;
}

// AttributeProto: name = 1, doc_string = 2, the scalar members of `value` (odd fields 3..31). A list member
// (even fields 4..32) falls back.
bool DecodeAttr(const Byte* p, const Byte* end, EtAttrView* a) {
  a->name = {};
  a->value_case = 0;
  while (p < end) {
    uint32_t field = 0, wire = 0;
    if (!Tag(p, end, &field, &wire)) return false;
    if (field > 32) {
      if (!Skip(p, end, wire)) return false;
      continue;
    }
    if (field >= 4 && field % 2 == 0) return false;  // a list
    uint64_t v = 0;
    // Why each member overwrites value_case: the oneof keeps the last member set.
    switch (field) {
      case 1:
      case 2: {
        std::string_view s;
        if (wire != 2 || !Text(p, end, &s)) return false;
        if (field == 1) a->name = s;
        continue;
      }
      case 3:  // double_val
        if (wire != 1 || end - p < 8) return false;
        {
          const uint64_t bits = Fixed64(p);
          std::memcpy(&a->d, &bits, 8);
        }
        break;
      case 5:  // float_val
        if (wire != 5 || end - p < 4) return false;
        {
          const uint32_t bits = Fixed32(p);
          float f;
          std::memcpy(&f, &bits, 4);
          a->d = f;
        }
        break;
      case 7:   // int32_val
      case 9:   // int64_val
      case 11:  // uint32_val
      case 13:  // uint64_val
      case 15:  // sint32_val
      case 17:  // sint64_val
      case 27:  // bool_val
        if (wire != 0 || !Varint(p, end, &v)) return false;
        switch (field) {
          case 7: a->i = static_cast<int32_t>(static_cast<uint32_t>(v)); break;
          case 9: a->i = static_cast<int64_t>(v); break;
          case 11: a->i = static_cast<int64_t>(static_cast<uint32_t>(v)); break;
          case 13: a->i = static_cast<int64_t>(v); break;
          case 15: {
            const uint32_t u = static_cast<uint32_t>(v);
            a->i = static_cast<int32_t>((u >> 1) ^ (~(u & 1) + 1));
            break;
          }
          case 17: a->i = static_cast<int64_t>((v >> 1) ^ (~(v & 1) + 1)); break;
          default: a->i = v != 0 ? 1 : 0; break;
        }
        break;
      case 19:  // fixed32_val
      case 23:  // sfixed32_val
        if (wire != 5 || end - p < 4) return false;
        {
          const uint32_t u = Fixed32(p);
          a->i = field == 19 ? static_cast<int64_t>(u) : static_cast<int64_t>(static_cast<int32_t>(u));
        }
        break;
      case 21:  // fixed64_val
      case 25:  // sfixed64_val
        if (wire != 1 || end - p < 8) return false;
        a->i = static_cast<int64_t>(Fixed64(p));
        break;
      case 29:  // string_val
      case 31:  // bytes_val
        if (wire != 2 || !Text(p, end, &a->s, /*check_ascii=*/field == 29)) return false;
        break;
      default: return false;
    }
    a->value_case = static_cast<int>(field);
  }
  return true;
}

bool DecodeDeps(const Byte*& p, const Byte* end, uint32_t wire, std::vector<uint64_t>* out) {
  uint64_t v = 0;
  if (wire == 0) {
    if (!Varint(p, end, &v)) return false;
    out->push_back(v);
    return true;
  }
  if (wire != 2) return false;
  size_t n = 0;
  if (!Length(p, end, &n)) return false;
  const Byte* stop = p + n;
  while (p < stop) {
    if (!Varint(p, stop, &v)) return false;
    out->push_back(v);
  }
  return true;
}

bool DecodeNode(std::string_view bytes, EtNodeView* n) {
  n->id = 0;
  n->name = {};
  n->type = 0;
  n->ctrl_deps.clear();
  n->data_deps.clear();
  n->start_time_micros = 0;
  n->duration_micros = 0;
  n->inputs_values = {};
  n->attrs.clear();
  const Byte* p = reinterpret_cast<const Byte*>(bytes.data());
  const Byte* end = p + bytes.size();
  while (p < end) {
    uint32_t field = 0, wire = 0;
    if (!Tag(p, end, &field, &wire)) return false;
    uint64_t v = 0;
    size_t len = 0;
    switch (field) {
      case 1:
      case 3:
      case 6:
      case 7:
        if (wire != 0 || !Varint(p, end, &v)) return false;
        if (field == 1) n->id = v;
        if (field == 3) n->type = static_cast<int32_t>(static_cast<uint32_t>(v));
        if (field == 6) n->start_time_micros = v;
        if (field == 7) n->duration_micros = v;
        break;
      case 2:
        if (wire != 2 || !Text(p, end, &n->name)) return false;
        break;
      case 4:
        if (!DecodeDeps(p, end, wire, &n->ctrl_deps)) return false;
        break;
      case 5:
        if (!DecodeDeps(p, end, wire, &n->data_deps)) return false;
        break;
      case 8:
      case 9:
      case 10:
        if (wire != 2 || !Length(p, end, &len)) return false;
        if (field == 10) {
          if (!DecodeAttr(p, p + len, &n->attrs.emplace_back())) return false;
        } else if (!DecodeIoInfo(p, p + len, field == 8 ? &n->inputs_values : nullptr)) {
          return false;
        }
        p += len;
        break;
      default:
        if (!Skip(p, end, wire)) return false;
    }
  }
  return true;
}

void ViewOf(const et::Node& m, EtNodeView* n) {
  n->id = m.id();
  n->name = m.name();
  n->type = m.type();
  n->ctrl_deps.assign(m.ctrl_deps().begin(), m.ctrl_deps().end());
  n->data_deps.assign(m.data_deps().begin(), m.data_deps().end());
  n->start_time_micros = m.start_time_micros();
  n->duration_micros = m.duration_micros();
  n->inputs_values = m.inputs().values();
  n->attrs.clear();
  for (const et::AttributeProto& a : m.attr()) {
    EtAttrView& v = n->attrs.emplace_back();
    v.name = a.name();
    v.value_case = static_cast<int>(a.value_case());
    v.i = AttrInt(a).value_or(0);
    if (a.value_case() == et::AttributeProto::kDoubleVal) v.d = a.double_val();
    if (a.value_case() == et::AttributeProto::kFloatVal) v.d = a.float_val();
    if (a.value_case() == et::AttributeProto::kStringVal) v.s = a.string_val();
    if (a.value_case() == et::AttributeProto::kBytesVal) v.s = a.bytes_val();
  }
}

bool IsIntCase(int c) {
  using A = et::AttributeProto;
  switch (c) {
    case A::kInt32Val:
    case A::kInt64Val:
    case A::kUint32Val:
    case A::kUint64Val:
    case A::kSint32Val:
    case A::kSint64Val:
    case A::kFixed32Val:
    case A::kFixed64Val:
    case A::kSfixed32Val:
    case A::kSfixed64Val:
    case A::kBoolVal: return true;
    default: return false;
  }
}

std::string MessageLabel(size_t index) {
  return index == 0 ? std::string("message 0 (GlobalMetadata)")
                    : "message " + std::to_string(index) + " (node #" + std::to_string(index - 1) + ")";
}

}  // namespace

// A file read in blocks into one buffer that is kept from file to file (protobuf's FileInputStream allocates its
// own per file). Read errors are kept for GetErrno, as FileInputStream keeps them.
class EtReader::FdStream : public pbio::ZeroCopyInputStream {
 public:
  // Why 256 KiB: most rank files are smaller, so a message rarely straddles two blocks.
  FdStream() : buf_(256 << 10) {}
  ~FdStream() override { Reset(-1); }
  void Reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
    len_ = backup_ = 0;
    count_ = 0;
    errno_ = 0;
  }
  int GetErrno() const { return errno_; }
  bool Next(const void** data, int* size) override {
    if (backup_ > 0) {
      *data = buf_.data() + (len_ - backup_);
      *size = backup_;
      count_ += backup_;
      backup_ = 0;
      return true;
    }
    if (fd_ < 0 || errno_ != 0) return false;
    ssize_t n = 0;
    do {
      n = ::read(fd_, buf_.data(), buf_.size());
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      if (n < 0) errno_ = errno;
      return false;
    }
    len_ = static_cast<int>(n);
    *data = buf_.data();
    *size = len_;
    count_ += len_;
    return true;
  }
  void BackUp(int count) override {
    backup_ = count;
    count_ -= count;
  }
  bool Skip(int count) override {
    const void* data = nullptr;
    int size = 0;
    while (count > 0) {
      if (!Next(&data, &size)) return false;
      if (size > count) {
        BackUp(size - count);
        return true;
      }
      count -= size;
    }
    return true;
  }
  int64_t ByteCount() const override { return count_; }

 private:
  std::vector<char> buf_;
  int fd_ = -1;
  int len_ = 0, backup_ = 0;
  int64_t count_ = 0;
  int errno_ = 0;
};

std::optional<int64_t> AttrInt(const EtAttrView& a) {
  if (IsIntCase(a.value_case)) return a.i;
  return std::nullopt;
}

std::optional<std::string> AttrString(const EtAttrView& a) {
  if (a.value_case == et::AttributeProto::kStringVal || a.value_case == et::AttributeProto::kBytesVal) {
    return std::string(a.s);
  }
  return std::nullopt;
}

std::optional<double> AttrDouble(const EtAttrView& a) {
  if (a.value_case == et::AttributeProto::kDoubleVal || a.value_case == et::AttributeProto::kFloatVal) return a.d;
  if (IsIntCase(a.value_case)) return static_cast<double>(a.i);
  return std::nullopt;
}

std::string_view AttrValueKind(const EtAttrView& a) {
  const auto* field = et::AttributeProto::descriptor()->FindFieldByNumber(a.value_case);
  return field ? std::string_view(field->name()) : std::string_view("none");
}

EtReader::EtReader() : file_(std::make_unique<FdStream>()) {}

EtReader::~EtReader() { Close(); }

void EtReader::Close() {
  gz_.reset();
  file_->Reset(-1);
  in_ = nullptr;
}

// The checks, their order and their messages are ReadEtFile's.
bool EtReader::Open(const std::string& path, std::string* error) {
  Close();
  path_ = path;
  offset_ = 0;
  index_ = 0;
  done_ = false;
  metadata_.Clear();
  const int fd = OpenEtFile(path, &gzip_, &file_size_, error);
  if (fd < 0) return false;
  file_->Reset(fd);
  in_ = file_.get();
  if (gzip_) {
    gz_ = std::make_unique<pbio::GzipInputStream>(file_.get(), pbio::GzipInputStream::GZIP);
    in_ = gz_.get();
  }
  std::string why;
  const std::string where = gzip_ ? " (uncompressed offset " : " (offset ";
  std::string_view bytes;
  uint64_t next = 0;
  int rc = ReadFrame(&bytes, &next, &why);
  if (rc == 0) {
    *error = path + ": empty file (a Chakra ET file starts with a GlobalMetadata message)";
    return false;
  }
  if (rc > 0) {
    pbio::CodedInputStream coded(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(bytes.size()));
    if (!metadata_.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage()) {
      rc = -1;
      why = Unparsable(bytes.size());
    }
  }
  if (rc < 0) {
    *error = path + ": " + MessageLabel(0) + where + "0): " + why;
    return false;
  }
  offset_ = next;
  index_ = 1;
  return true;
}

std::string EtReader::Unparsable(uint64_t size) const {
  return file_size_ != 0 ? "the " + std::to_string(size) + " bytes do not parse as the message"
                         : "truncated, or the " + std::to_string(size) + " bytes do not parse as the message";
}

// One length-delimited message, taken as ReadEtFile's ReadDelimited takes it (a fresh CodedInputStream, the
// same length and truncation checks). Returns 1 with *bytes (valid until the next call) and *next, the offset
// after it; 0 at a clean end; -1.
int EtReader::ReadFrame(std::string_view* bytes, uint64_t* next, std::string* why) {
  pbio::CodedInputStream coded(in_);
  const void* data = nullptr;
  int avail = 0;
  if (!coded.GetDirectBufferPointer(&data, &avail)) return 0;
  uint32_t size = 0;
  if (!coded.ReadVarint32(&size)) {
    *why = "truncated or malformed length prefix";
    return -1;
  }
  const uint64_t body = offset_ + pbio::CodedOutputStream::VarintSize32(size);
  if (file_size_ != 0 && body + size > file_size_) {
    *why = "truncated: the length prefix says " + std::to_string(size) + " bytes but only " +
           std::to_string(file_size_ - body) + " remain";
    return -1;
  }
  // Why refused: one message over 2 GiB is past what protobuf parses as one message.
  if (size > static_cast<uint32_t>(INT_MAX)) {
    *why = Unparsable(size);
    return -1;
  }
  if (coded.GetDirectBufferPointer(&data, &avail) && static_cast<uint32_t>(avail) >= size) {
    *bytes = std::string_view(static_cast<const char*>(data), size);
    coded.Skip(static_cast<int>(size));
  } else {
    scratch_.resize(size);
    if (!coded.ReadRaw(scratch_.data(), static_cast<int>(size))) {
      *why = Unparsable(size);
      return -1;
    }
    *bytes = scratch_;
  }
  *next = body + size;
  return 1;
}

int EtReader::Next(EtNodeView* node, std::string* error) {
  if (done_ || !in_) return 0;
  const uint64_t at = offset_;
  std::string why;
  std::string_view bytes;
  uint64_t next = 0;
  int rc = ReadFrame(&bytes, &next, &why);
  if (rc == 0) {
    done_ = true;
    if (file_->GetErrno() != 0) {
      *error = path_ + ": read error: " + std::strerror(file_->GetErrno());
      return -1;
    }
    return 0;
  }
  const size_t index = index_++;
  if (rc > 0 && !DecodeNode(bytes, node)) {
    pbio::CodedInputStream coded(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(bytes.size()));
    if (fallback_.ParseFromCodedStream(&coded) && coded.ConsumedEntireMessage()) {
      ++protobuf_decoded_;
      ViewOf(fallback_, node);
    } else {
      rc = -1;
      why = Unparsable(bytes.size());
    }
  }
  if (rc > 0) offset_ = next;
  // Why this order (the cap, then the message's own error): ReadEtFile's.
  if (offset_ > limits::kMaxChakraFileBytes) {
    *error = path_ + ": more than the " + ByteCap(limits::kMaxChakraFileBytes) + " cap on Chakra ET files" +
             (gzip_ ? " (uncompressed)" : "");
    return -1;
  }
  if (rc < 0) {
    *error = path_ + ": " + MessageLabel(index) + (gzip_ ? " (uncompressed offset " : " (offset ") +
             std::to_string(at) + "): " + why;
    if (gz_ && gz_->ZlibErrorMessage()) *error += std::string(" (gzip: ") + gz_->ZlibErrorMessage() + ")";
    done_ = true;
    return -1;
  }
  return 1;
}

}  // namespace prism::chakra
