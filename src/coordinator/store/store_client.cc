#include "coordinator/store/store_client.h"

#include <unistd.h>

#include "common/ipc_io.h"
#include "coordinator/store/store_protocol.h"

namespace prism::store {
namespace {

constexpr int kReplyTimeoutMs = 60000;  // Why: a reply the server owes now; only WAIT blocks for long

}  // namespace

StoreClient::~StoreClient() { Close(); }

void StoreClient::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool StoreClient::Connect(const std::string& host, uint16_t port, int timeout_ms, bool handshake) {
  Close();
  fd_ = ipc::ConnectTcp(host, port, timeout_ms, &error_);
  if (fd_ < 0) return false;
  if (!handshake) return true;
  uint32_t echo = 0;
  uint32_t nonce = static_cast<uint32_t>(::getpid());
  if (!Validate() || !Ping(nonce, &echo)) return false;
  if (echo != nonce) {
    error_ = "PING echoed a different value";
    return false;
  }
  return true;
}

bool StoreClient::SendRaw(const std::string& bytes) {
  if (fd_ < 0) {
    error_ = "not connected";
    return false;
  }
  return ipc::WriteAll(fd_, bytes.data(), bytes.size(), &error_) == ipc::IoStatus::kOk;
}

bool StoreClient::ReadRaw(void* data, size_t len, int timeout_ms) {
  if (fd_ < 0) {
    error_ = "not connected";
    return false;
  }
  return ipc::ReadExact(fd_, data, len, timeout_ms, &error_) == ipc::IoStatus::kOk;
}

bool StoreClient::ReadU8(uint8_t* v, int timeout_ms) {
  return ReadRaw(v, 1, timeout_ms < 0 ? kReplyTimeoutMs : timeout_ms);
}
bool StoreClient::ReadI64(int64_t* v, int timeout_ms) {
  return ReadRaw(v, 8, timeout_ms < 0 ? kReplyTimeoutMs : timeout_ms);
}
bool StoreClient::ReadBytes(std::string* v, int timeout_ms) {
  uint64_t n = 0;
  int t = timeout_ms < 0 ? kReplyTimeoutMs : timeout_ms;
  if (!ReadRaw(&n, 8, t)) return false;
  if (n > (1ull << 32)) {
    error_ = "reply length " + std::to_string(n) + " is not plausible";
    return false;
  }
  v->resize(n);
  return n == 0 || ReadRaw(v->data(), n, t);
}

bool StoreClient::Validate() { return SendRaw(EncodeValidate()); }

bool StoreClient::Ping(uint32_t nonce, uint32_t* echo) {
  return SendRaw(EncodePing(nonce)) && ReadRaw(echo, 4, kReplyTimeoutMs);
}

bool StoreClient::Set(const std::string& key, const std::string& value) {
  return SendRaw(EncodeKeyValue(QueryType::kSet, key, value));
}

bool StoreClient::Get(const std::string& key, std::string* value) {
  return SendRaw(EncodeKeyOnly(QueryType::kGet, key)) && ReadBytes(value);
}

bool StoreClient::WaitGet(const std::string& key, int timeout_ms, std::string* value) {
  bool timed_out = false;
  if (!Wait({key}, timeout_ms, &timed_out)) return false;
  if (timed_out) {
    error_ = "wait timeout on " + key;
    return false;
  }
  return Get(key, value);
}

bool StoreClient::Add(const std::string& key, int64_t delta, int64_t* result) {
  return SendRaw(EncodeAdd(key, delta)) && ReadI64(result);
}

bool StoreClient::Check(const std::vector<std::string>& keys, bool* ready) {
  uint8_t r = 0;
  if (!SendRaw(EncodeKeyList(QueryType::kCheck, keys)) || !ReadU8(&r)) return false;
  *ready = r == kCheckReady;
  return true;
}

bool StoreClient::Wait(const std::vector<std::string>& keys, int timeout_ms, bool* timed_out) {
  if (timed_out) *timed_out = false;
  if (!SendRaw(EncodeKeyList(QueryType::kWait, keys))) return false;
  uint8_t r = 0;
  if (ReadRaw(&r, 1, timeout_ms)) {
    if (r != kStopWaiting) {
      error_ = "unexpected WAIT reply " + std::to_string(r);
      return false;
    }
    return true;
  }
  if (error_ != "timed out") return false;
  // torch's doWait: CANCEL_WAIT, then WAIT_CANCELED, or STOP_WAITING (a race) followed by WAIT_CANCELED.
  if (!SendRaw(EncodeNoArgs(QueryType::kCancelWait)) || !ReadU8(&r)) return false;
  if (r == kStopWaiting && !ReadU8(&r)) return false;
  if (r != kWaitCanceled) {
    error_ = "expected WAIT_CANCELED, got " + std::to_string(r);
    return false;
  }
  if (timed_out) *timed_out = true;
  return true;
}

bool StoreClient::CompareSet(const std::string& key, const std::string& expected, const std::string& desired,
                             std::string* result) {
  return SendRaw(EncodeCompareSet(key, expected, desired)) && ReadBytes(result);
}

bool StoreClient::DeleteKey(const std::string& key, int64_t* deleted) {
  return SendRaw(EncodeKeyOnly(QueryType::kDeleteKey, key)) && ReadI64(deleted);
}

bool StoreClient::NumKeys(int64_t* n) { return SendRaw(EncodeNoArgs(QueryType::kGetNumKeys)) && ReadI64(n); }

bool StoreClient::Append(const std::string& key, const std::string& value) {
  return SendRaw(EncodeKeyValue(QueryType::kAppend, key, value));
}

bool StoreClient::MultiGet(const std::vector<std::string>& keys, std::vector<std::string>* values) {
  if (!SendRaw(EncodeKeyList(QueryType::kMultiGet, keys))) return false;
  values->assign(keys.size(), {});
  for (auto& v : *values) {
    if (!ReadBytes(&v)) return false;
  }
  return true;
}

bool StoreClient::MultiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values) {
  return SendRaw(EncodeMultiSet(keys, values));
}

bool StoreClient::QueuePush(const std::string& key, const std::string& value) {
  return SendRaw(EncodeKeyValue(QueryType::kQueuePush, key, value));
}

bool StoreClient::QueuePop(const std::string& key, std::optional<std::string>* value) {
  int64_t n = 0;
  if (!SendRaw(EncodeKeyOnly(QueryType::kQueuePop, key)) || !ReadI64(&n)) return false;
  if (n == 0) {
    value->reset();
    return true;
  }
  std::string v;
  if (!ReadBytes(&v)) return false;
  *value = std::move(v);
  return true;
}

bool StoreClient::QueueLen(const std::string& key, int64_t* n) {
  return SendRaw(EncodeKeyOnly(QueryType::kQueueLen, key)) && ReadI64(n);
}

bool StoreClient::ListKeys(std::vector<std::string>* keys) {
  int64_t n = 0;
  if (!SendRaw(EncodeNoArgs(QueryType::kListKeys)) || !ReadI64(&n)) return false;
  keys->assign(static_cast<size_t>(n), {});
  for (auto& k : *keys) {
    if (!ReadBytes(&k)) return false;
  }
  return true;
}

bool StoreClient::Barrier(const std::string& key, int64_t world_size, int timeout_ms) {
  uint8_t r = 0;
  return SendRaw(EncodeBarrier(key, world_size)) && ReadRaw(&r, 1, timeout_ms) && r == kStopWaiting;
}

}  // namespace prism::store
