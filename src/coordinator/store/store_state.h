// The key-value state behind the TCPStore server and the meaning of every request: what torch's libuv server
// does (TCPStoreLibUvBackend.cpp, LibUVStoreDaemon), with the same replies, plus a StandIn hook through which
// virtual ranks answer for keys that only they would write. No sockets here: StoreServer feeds it decoded
// requests and delivers the replies; tests drive it directly. Not thread-safe: one thread owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "coordinator/store/store_protocol.h"

namespace prism::store {

using ClientId = uint64_t;

// Hook for virtual ranks (coordinator/store/virtual_ranks.h implements it). Called on the store's thread.
class StandIn {
 public:
  enum class Access { kRead, kAdd };
  virtual ~StandIn() = default;

  // A client reads (WAIT, CHECK, GET, MULTI_GET, QUEUE-less) or ADDs to `key`, which does not exist. Return the value
  // a virtual rank would have written, to be stored before the request goes on, or nullopt to leave it missing.
  // `batch` is every key of the same request (the scalable-init keys are read as one batch).
  virtual std::optional<std::string> Materialize(std::string_view key, Access access,
                                                 std::span<const std::string_view> batch) = 0;

  // Every value a client stores (SET, MULTI_SET, COMPARE_SET that stored, APPEND's result). Return true to consume
  // it: the key is then not stored (Prism's own registration keys).
  virtual bool OnSet(std::string_view key, std::string_view value) { return false; }
};

struct StoreStats {
  uint64_t keys = 0;
  uint64_t bytes = 0;
  uint64_t waits = 0;          // requests blocked in WAIT/BARRIER right now
  uint64_t requests = 0;
  uint64_t materialized = 0;   // values the stand-in supplied
};

class StoreState {
 public:
  // Delivers bytes to a client other than the one whose request is running (a woken WAIT), or to that one for an
  // earlier request of its own. Called synchronously from Handle/RetryWaits.
  using Notify = std::function<void(ClientId client, std::string_view bytes)>;

  explicit StoreState(Notify notify, StandIn* stand_in = nullptr, uint64_t max_total_bytes = 4ull << 30);

  // Runs one request of `client` and appends its reply (if the command has one now) to *reply. Returns false, with
  // *error saying why, when the client broke the protocol's semantics (ADD on a non-integer, store full) or its
  // reply would pass max_reply bytes (checked before each value is copied, so a MULTI_GET naming a large value
  // many times stops there); the caller then drops the client. Validation (VALIDATE before anything else) is the
  // caller's business.
  bool Handle(ClientId client, const Request& req, std::string* reply, std::string* error,
              uint64_t max_reply = UINT64_MAX);

  // Forgets a client: its pending waits go away.
  void DropClient(ClientId client);

  // Offers every key some client waits on to the stand-in again. Call after the stand-in learned something (a
  // group's members), so a wait registered before the registration is answered.
  void RetryWaits();

  // In-process access for the coordinator (same thread as Handle).
  void Set(std::string_view key, std::string_view value);
  std::optional<std::string> Get(std::string_view key) const;

  StoreStats Stats() const;
  // Up to `max` keys some client is waiting on, for status and hang diagnosis.
  std::vector<std::string> WaitedKeys(size_t max) const;
  // Clients blocked in a WAIT (or BARRIER) on a missing key now, in id order (context switching: such a rank waits
  // on the others; docs/collect.md).
  std::vector<ClientId> WaitingClients() const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Map = std::unordered_map<std::string, std::string, StringHash, std::equal_to<>>;

  struct Wait {
    ClientId client;
    size_t remaining;               // distinct missing keys not yet set
    std::vector<std::string> keys;  // unlinked on cancel; a WAIT's are all its keys, the stand-in's batch on retry
  };

  bool Exists(std::string_view key) const;
  // Stores a value and wakes waiters of the key; false when the store would exceed its byte budget.
  bool Store(std::string_view key, std::string value, std::string* error);
  // Asks the stand-in for a missing key; stores and returns true when it supplied one.
  bool TryMaterialize(std::string_view key, StandIn::Access access, std::span<const std::string_view> batch);
  void WakeAll(std::string_view key);
  void WakeOne(std::string_view key);
  void Finish(uint64_t wait_id);
  void CancelWaits(ClientId client);
  bool ParseCounter(std::string_view key, int64_t* value, std::string* error) const;

  // One request being answered (Handle): who asked, what, and where the reply or the error goes.
  struct Call {
    ClientId client;
    const Request& req;
    std::string* reply;
    std::string* error;
    uint64_t max_reply;
    std::span<const std::string_view> batch;  // the request's keys, offered to the stand-in
    // True when `n` more reply bytes fit under max_reply; otherwise says so in *error.
    bool Fits(uint64_t n) const;
    // Appends `bytes` (length first) when they fit.
    bool PutBytes(std::string_view bytes) const;
  };
  // The commands of Handle with more than a line or two; each returns false with *error set to refuse.
  bool SetKey(std::string_view key, std::string_view value, std::string* error);  // the stand-in's first
  bool PutValue(const Call& c, std::string_view key);  // GET's answer: the value, empty when absent
  bool Counter(const Call& c, int64_t* value);         // the first key as a number (ADD, BARRIER)
  bool CompareSet(const Call& c);
  bool Add(const Call& c);
  bool Check(const Call& c);
  bool WaitFor(const Call& c);
  bool Delete(std::string_view key);  // true when the key was there
  bool QueuePush(const Call& c);
  bool QueuePop(const Call& c);
  bool Barrier(const Call& c);
  // Blocks `client` until every key of `wait_on` is set; `keys` are kept for cancelling and retrying.
  void Park(ClientId client, const std::vector<std::string>& wait_on, std::vector<std::string> keys);

  Notify notify_;
  StandIn* stand_in_;
  uint64_t max_total_bytes_;
  Map kv_;
  uint64_t bytes_ = 0;
  std::unordered_map<std::string, std::deque<std::string>, StringHash, std::equal_to<>> queues_;
  uint64_t next_wait_ = 1;
  std::unordered_map<uint64_t, Wait> waits_;
  std::unordered_map<std::string, std::vector<uint64_t>, StringHash, std::equal_to<>> waiters_;  // key -> waits
  std::unordered_map<ClientId, std::vector<uint64_t>> client_waits_;
  uint64_t requests_ = 0;
  uint64_t materialized_ = 0;
};

}  // namespace prism::store
