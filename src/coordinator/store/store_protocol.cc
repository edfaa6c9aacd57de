#include "coordinator/store/store_protocol.h"

#include <cstring>

#include <fmt/format.h>

namespace prism::store {
namespace {

// A cursor over the input that fails softly: every Read* returns false when the bytes are not there yet.
class Reader {
 public:
  Reader(const uint8_t* data, size_t len, uint64_t limit) : data_(data), len_(len), limit_(limit) {}

  size_t pos() const { return pos_; }
  size_t left() const { return len_ - pos_; }
  uint64_t limit() const { return limit_; }

  template <typename T>
  bool Read(T* v) {
    if (left() < sizeof(T)) return false;
    std::memcpy(v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  bool ReadView(uint64_t n, std::string_view* v) {
    if (left() < n) return false;
    *v = std::string_view(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return true;
  }

 private:
  const uint8_t* data_;
  size_t len_;
  uint64_t limit_;
  size_t pos_ = 0;
};

enum class Step { kOk, kNeedMore, kError };

// Why separate steps: "need more" and "error" must be told apart before any byte is committed, so a half-sent
// frame waits and an oversized length is refused as soon as its 8 bytes arrive.
Step ReadLenPrefixed(Reader& r, uint64_t max, const char* what, std::string_view* out, std::string* error) {
  uint64_t n = 0;
  size_t at = r.pos();
  if (!r.Read(&n)) return Step::kNeedMore;
  if (n > max) {
    *error = fmt::format("{} length {} at offset {} exceeds the limit {}", what, n, at, max);
    return Step::kError;
  }
  if (r.pos() + n > r.limit()) {
    *error = fmt::format("request would be at least {} bytes, over the limit {}", r.pos() + n, r.limit());
    return Step::kError;
  }
  if (!r.ReadView(n, out)) return Step::kNeedMore;
  return Step::kOk;
}

Step ReadCount(Reader& r, uint64_t max, std::string* error, uint64_t* n) {
  size_t at = r.pos();
  if (!r.Read(n)) return Step::kNeedMore;
  if (*n > max) {
    *error = fmt::format("key count {} at offset {} exceeds the limit {}", *n, at, max);
    return Step::kError;
  }
  return Step::kOk;
}

void PutRaw(std::string* out, const void* p, size_t n) { out->append(static_cast<const char*>(p), n); }

}  // namespace

const char* QueryTypeName(QueryType t) {
  switch (t) {
    case QueryType::kValidate: return "VALIDATE";
    case QueryType::kSet: return "SET";
    case QueryType::kCompareSet: return "COMPARE_SET";
    case QueryType::kGet: return "GET";
    case QueryType::kAdd: return "ADD";
    case QueryType::kCheck: return "CHECK";
    case QueryType::kWait: return "WAIT";
    case QueryType::kGetNumKeys: return "GETNUMKEYS";
    case QueryType::kDeleteKey: return "DELETE_KEY";
    case QueryType::kAppend: return "APPEND";
    case QueryType::kMultiGet: return "MULTI_GET";
    case QueryType::kMultiSet: return "MULTI_SET";
    case QueryType::kCancelWait: return "CANCEL_WAIT";
    case QueryType::kPing: return "PING";
    case QueryType::kQueuePush: return "QUEUE_PUSH";
    case QueryType::kQueuePop: return "QUEUE_POP";
    case QueryType::kQueueLen: return "QUEUE_LEN";
    case QueryType::kListKeys: return "LIST_KEYS";
    case QueryType::kBarrier: return "BARRIER";
  }
  return "UNKNOWN";
}

namespace {

Step ParseBody(Reader& r, const Limits& limits, Request* out, std::string* error) {
  uint8_t type = 0;
  if (!r.Read(&type)) return Step::kNeedMore;
  if (type > kMaxQueryType) {
    *error = fmt::format("unknown command byte 0x{:02x}", type);
    return Step::kError;
  }
  out->type = static_cast<QueryType>(type);
  out->keys.clear();
  out->values.clear();
  out->u32 = 0;
  out->i64 = 0;
  std::string_view k, v;
  switch (out->type) {
    case QueryType::kValidate:
    case QueryType::kPing:
      if (!r.Read(&out->u32)) return Step::kNeedMore;
      return Step::kOk;
    case QueryType::kSet:
    case QueryType::kAppend:
    case QueryType::kQueuePush:
      if (Step s = ReadLenPrefixed(r, limits.max_key_len, "key", &k, error); s != Step::kOk) return s;
      if (Step s = ReadLenPrefixed(r, limits.max_value_len, "value", &v, error); s != Step::kOk) return s;
      out->keys.push_back(k);
      out->values.push_back(v);
      return Step::kOk;
    case QueryType::kCompareSet: {
      std::string_view expected, desired;
      if (Step s = ReadLenPrefixed(r, limits.max_key_len, "key", &k, error); s != Step::kOk) return s;
      if (Step s = ReadLenPrefixed(r, limits.max_value_len, "expected value", &expected, error); s != Step::kOk) {
        return s;
      }
      if (Step s = ReadLenPrefixed(r, limits.max_value_len, "desired value", &desired, error); s != Step::kOk) {
        return s;
      }
      out->keys.push_back(k);
      out->values.push_back(expected);
      out->values.push_back(desired);
      return Step::kOk;
    }
    case QueryType::kGet:
    case QueryType::kDeleteKey:
    case QueryType::kQueuePop:
    case QueryType::kQueueLen:
      if (Step s = ReadLenPrefixed(r, limits.max_key_len, "key", &k, error); s != Step::kOk) return s;
      out->keys.push_back(k);
      return Step::kOk;
    case QueryType::kAdd:
    case QueryType::kBarrier:
      if (Step s = ReadLenPrefixed(r, limits.max_key_len, "key", &k, error); s != Step::kOk) return s;
      if (!r.Read(&out->i64)) return Step::kNeedMore;
      out->keys.push_back(k);
      return Step::kOk;
    case QueryType::kCheck:
    case QueryType::kWait:
    case QueryType::kMultiGet: {
      uint64_t n = 0;
      if (Step s = ReadCount(r, limits.max_keys_per_request, error, &n); s != Step::kOk) return s;
      // Why no reserve(n) first: n is untrusted until the bytes are here; grow as keys arrive.
      for (uint64_t i = 0; i < n; ++i) {
        if (Step s = ReadLenPrefixed(r, limits.max_key_len, "key", &k, error); s != Step::kOk) return s;
        out->keys.push_back(k);
      }
      return Step::kOk;
    }
    case QueryType::kMultiSet: {
      uint64_t n = 0;
      if (Step s = ReadCount(r, limits.max_keys_per_request, error, &n); s != Step::kOk) return s;
      for (uint64_t i = 0; i < n; ++i) {
        if (Step s = ReadLenPrefixed(r, limits.max_key_len, "key", &k, error); s != Step::kOk) return s;
        if (Step s = ReadLenPrefixed(r, limits.max_value_len, "value", &v, error); s != Step::kOk) return s;
        out->keys.push_back(k);
        out->values.push_back(v);
      }
      return Step::kOk;
    }
    case QueryType::kGetNumKeys:
    case QueryType::kCancelWait:
    case QueryType::kListKeys:
      return Step::kOk;
  }
  return Step::kError;
}

}  // namespace

ParseStatus ParseRequest(const uint8_t* data, size_t len, const Limits& limits, Request* out, size_t* consumed,
                         std::string* error) {
  Reader r(data, len, limits.max_request_bytes);
  switch (ParseBody(r, limits, out, error)) {
    case Step::kOk:
      *consumed = r.pos();
      return ParseStatus::kOk;
    case Step::kNeedMore:
      return ParseStatus::kNeedMore;
    case Step::kError:
      break;
  }
  return ParseStatus::kError;
}

void PutU8(std::string* out, uint8_t v) { out->push_back(static_cast<char>(v)); }
void PutU32(std::string* out, uint32_t v) { PutRaw(out, &v, sizeof(v)); }
void PutI64(std::string* out, int64_t v) { PutRaw(out, &v, sizeof(v)); }
void PutU64(std::string* out, uint64_t v) { PutRaw(out, &v, sizeof(v)); }
void PutBytes(std::string* out, std::string_view bytes) {
  PutU64(out, bytes.size());
  out->append(bytes);
}

// Every request starts with its QueryType byte; the encoders below append the arguments.
std::string EncodeNoArgs(QueryType t) {
  std::string s;
  PutU8(&s, static_cast<uint8_t>(t));
  return s;
}

namespace {

std::string EncodeU32(QueryType t, uint32_t v) {
  std::string s = EncodeNoArgs(t);
  PutU32(&s, v);
  return s;
}

std::string EncodeKeyI64(QueryType t, std::string_view key, int64_t v) {
  std::string s = EncodeKeyOnly(t, key);
  PutI64(&s, v);
  return s;
}

}  // namespace

std::string EncodeValidate(uint32_t magic) { return EncodeU32(QueryType::kValidate, magic); }
std::string EncodePing(uint32_t nonce) { return EncodeU32(QueryType::kPing, nonce); }

std::string EncodeKeyOnly(QueryType t, std::string_view key) {
  std::string s = EncodeNoArgs(t);
  PutBytes(&s, key);
  return s;
}

std::string EncodeKeyValue(QueryType t, std::string_view key, std::string_view value) {
  std::string s = EncodeKeyOnly(t, key);
  PutBytes(&s, value);
  return s;
}

std::string EncodeAdd(std::string_view key, int64_t delta) { return EncodeKeyI64(QueryType::kAdd, key, delta); }

std::string EncodeKeyList(QueryType t, const std::vector<std::string>& keys) {
  std::string s = EncodeNoArgs(t);
  PutU64(&s, keys.size());
  for (const auto& k : keys) PutBytes(&s, k);
  return s;
}

std::string EncodeCompareSet(std::string_view key, std::string_view expected, std::string_view desired) {
  std::string s = EncodeKeyValue(QueryType::kCompareSet, key, expected);
  PutBytes(&s, desired);
  return s;
}

std::string EncodeMultiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  std::string s = EncodeNoArgs(QueryType::kMultiSet);
  PutU64(&s, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    PutBytes(&s, keys[i]);
    PutBytes(&s, i < values.size() ? std::string_view(values[i]) : std::string_view());
  }
  return s;
}

std::string EncodeBarrier(std::string_view key, int64_t world_size) {
  return EncodeKeyI64(QueryType::kBarrier, key, world_size);
}

std::string PrintableKey(std::string_view key, size_t max_len) {
  std::string s;
  for (size_t i = 0; i < key.size() && i < max_len; ++i) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      s.push_back(static_cast<char>(c));
    } else {
      s += fmt::format("\\x{:02x}", c);
    }
  }
  if (key.size() > max_len) s += fmt::format("...({} bytes)", key.size());
  return s;
}

}  // namespace prism::store
