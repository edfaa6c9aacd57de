// c10d TCPStore wire protocol, as torch 2.11's clients speak it (torch/csrc/distributed/c10d/TCPStore.cpp and the
// libuv server TCPStoreLibUvBackend.cpp). A request is one QueryType byte followed by its arguments; strings and
// byte vectors are a uint64 length then the raw bytes; scalars are host-order (little-endian on every machine we
// run on). Replies use the same encoding. See docs/coordinator.md for the table of requests and replies.
//
// This file only parses and encodes; it owns no sockets and no state, so tests and the fuzz target drive it
// directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace prism::store {

// Values of the QueryType byte (PT TCPStoreBackend.hpp). 14..16 exist from about torch 2.6 on, 17..18 only in
// recent main (we accept them; torch 2.11 is not known to send them).
enum class QueryType : uint8_t {
  kValidate = 0,
  kSet = 1,
  kCompareSet = 2,
  kGet = 3,
  kAdd = 4,
  kCheck = 5,
  kWait = 6,
  kGetNumKeys = 7,
  kDeleteKey = 8,
  kAppend = 9,
  kMultiGet = 10,
  kMultiSet = 11,
  kCancelWait = 12,
  kPing = 13,
  kQueuePush = 14,
  kQueuePop = 15,
  kQueueLen = 16,
  kListKeys = 17,
  kBarrier = 18,
};
inline constexpr uint8_t kMaxQueryType = 18;

const char* QueryTypeName(QueryType t);

inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;
inline constexpr uint8_t kCheckReady = 0;       // CheckResponseType::READY
inline constexpr uint8_t kCheckNotReady = 1;    // CheckResponseType::NOT_READY
inline constexpr uint8_t kStopWaiting = 0;      // WaitResponseType::STOP_WAITING
inline constexpr uint8_t kWaitCanceled = 1;     // WaitResponseType::WAIT_CANCELED

// Limits. The first three are torch's libuv server's (MAX_STRING_LEN, MAX_PAYLOAD_LEN, MAX_KEY_COUNT per request).
struct Limits {
  uint64_t max_key_len = 8 * 1024;
  uint64_t max_value_len = 8 * 1024 * 1024;
  uint64_t max_keys_per_request = 128 * 1024;
  // Why: a MULTI_SET of 128K keys x 8 MiB would be 1 TiB; torch never sends more than a few MiB in one request.
  uint64_t max_request_bytes = 64ull * 1024 * 1024;
};

// One decoded request. Views point into the buffer given to ParseRequest and are valid until it changes.
struct Request {
  QueryType type = QueryType::kValidate;
  uint32_t u32 = 0;                       // VALIDATE magic, PING nonce
  int64_t i64 = 0;                        // ADD delta, BARRIER world size
  std::vector<std::string_view> keys;     // every key, in order
  std::vector<std::string_view> values;   // SET/APPEND/QUEUE_PUSH: 1; COMPARE_SET: expected, desired; MULTI_SET: n
};

enum class ParseStatus {
  kOk,        // one whole request decoded; *consumed says how many bytes it took
  kNeedMore,  // the buffer holds a prefix of a valid request
  kError,     // not a request we accept (unknown type, over a limit); the connection should be dropped
};

// Decodes the request at the start of [data, data+len). Never reads past len, never allocates more than the
// request's key/value counts (bounded by `limits`). On kError, *error says what and at which offset.
ParseStatus ParseRequest(const uint8_t* data, size_t len, const Limits& limits, Request* out, size_t* consumed,
                         std::string* error);

// Reply encoders: append to *out.
void PutU8(std::string* out, uint8_t v);
void PutU32(std::string* out, uint32_t v);
void PutI64(std::string* out, int64_t v);
void PutU64(std::string* out, uint64_t v);
void PutBytes(std::string* out, std::string_view bytes);  // uint64 length + bytes

// Request encoders (what a torch client sends): used by StoreClient, tests, the fuzz corpus and the benchmark.
std::string EncodeValidate(uint32_t magic = kValidationMagic);
std::string EncodePing(uint32_t nonce);
std::string EncodeKeyOnly(QueryType t, std::string_view key);                        // GET, DELETE_KEY, QUEUE_POP/LEN
std::string EncodeKeyValue(QueryType t, std::string_view key, std::string_view value);  // SET, APPEND, QUEUE_PUSH
std::string EncodeAdd(std::string_view key, int64_t delta);
std::string EncodeKeyList(QueryType t, const std::vector<std::string>& keys);        // CHECK, WAIT, MULTI_GET
std::string EncodeCompareSet(std::string_view key, std::string_view expected, std::string_view desired);
std::string EncodeMultiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values);
std::string EncodeBarrier(std::string_view key, int64_t world_size);
std::string EncodeNoArgs(QueryType t);                                               // GETNUMKEYS, CANCEL_WAIT, LIST_KEYS

// Printable form of a key for logs: non-printable bytes as \xNN, long keys cut.
std::string PrintableKey(std::string_view key, size_t max_len = 120);

}  // namespace prism::store
