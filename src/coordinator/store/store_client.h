// A small blocking TCPStore client speaking the same bytes as torch's c10d::TCPStore client. Used by tests, the
// benchmark, `prism-run status` and anyone who wants to poke a running store. Keys go on the wire as given (torch's
// client adds "/" in front of user keys; pass "/mykey" to read what torch wrote as "mykey").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/non_copyable.h"

namespace prism::store {

class StoreClient : NonCopyable {
 public:
  StoreClient() = default;
  ~StoreClient();

  // TCP connect, then VALIDATE and PING like torch's TCPStore constructor (unless handshake is false).
  bool Connect(const std::string& host, uint16_t port, int timeout_ms = 10000, bool handshake = true);
  void Close();
  int fd() const { return fd_; }
  // Why the last operation failed.
  const std::string& error() const { return error_; }

  bool Validate();
  bool Ping(uint32_t nonce, uint32_t* echo);
  bool Set(const std::string& key, const std::string& value);
  // Plain GET (no WAIT first): missing keys read as "".
  bool Get(const std::string& key, std::string* value);
  // What torch's get() does: WAIT then GET.
  bool WaitGet(const std::string& key, int timeout_ms, std::string* value);
  bool Add(const std::string& key, int64_t delta, int64_t* result);
  bool Check(const std::vector<std::string>& keys, bool* ready);
  // WAIT; on timeout sends CANCEL_WAIT and absorbs a racing STOP_WAITING like torch (*timed_out = true).
  bool Wait(const std::vector<std::string>& keys, int timeout_ms, bool* timed_out = nullptr);
  bool CompareSet(const std::string& key, const std::string& expected, const std::string& desired,
                  std::string* result);
  bool DeleteKey(const std::string& key, int64_t* deleted);
  bool NumKeys(int64_t* n);
  bool Append(const std::string& key, const std::string& value);
  bool MultiGet(const std::vector<std::string>& keys, std::vector<std::string>* values);
  bool MultiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  bool QueuePush(const std::string& key, const std::string& value);
  bool QueuePop(const std::string& key, std::optional<std::string>* value);
  bool QueueLen(const std::string& key, int64_t* n);
  bool ListKeys(std::vector<std::string>* keys);
  bool Barrier(const std::string& key, int64_t world_size, int timeout_ms);

  // Raw access for protocol tests.
  bool SendRaw(const std::string& bytes);
  bool ReadRaw(void* data, size_t len, int timeout_ms);
  bool ReadU8(uint8_t* v, int timeout_ms = -1);
  bool ReadI64(int64_t* v, int timeout_ms = -1);
  bool ReadBytes(std::string* v, int timeout_ms = -1);

 private:
  int fd_ = -1;
  std::string error_;
};

}  // namespace prism::store
