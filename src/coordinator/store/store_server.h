// TCP server speaking c10d's TCPStore protocol (store_protocol.h) over StoreState (store_state.h).
// One thread, one epoll set, any number of clients; requests are parsed incrementally (a client may send half a
// request and the rest later), blocked WAITs are answered when a key is set (no polling), and a client that
// breaks the protocol (garbage, a wrong first command, an oversized length, a reply backlog it never reads) is
// dropped with a logged reason while the others carry on.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/non_copyable.h"
#include "coordinator/store/store_protocol.h"
#include "coordinator/store/store_state.h"

namespace prism::store {

struct StoreServerOptions {
  std::string host = "127.0.0.1";  // "0.0.0.0" (or "::") for other hosts; Why loopback: the store is unauthenticated
  uint16_t port = 0;               // 0: the kernel picks a free port; port() reports it
  Limits limits;
  uint64_t max_total_bytes = 4ull << 30;     // keys + values held
  // Replies queued unread for one client; checked before each reply (and each MULTI_GET value) is queued, and a
  // client that would pass it is dropped.
  uint64_t max_output_bytes = 256ull << 20;
  size_t max_clients = 1 << 20;
  StandIn* stand_in = nullptr;               // virtual ranks (not owned; must outlive the server)
  // Records every byte clients send, per connection, to this file (format: docs/coordinator.md, "Wire captures");
  // tests/unit/store_wire_replay_test.cc replays such files. Empty: no recording.
  std::string record_path;
  // Called on the server's thread whenever the set of clients blocked in a WAIT changes (BlockedPeers says which);
  // it must not block or call back into the server.
  std::function<void()> on_waits_changed;
};

// Wire capture file: "PRSMWIRE", uint32 version (1), uint32 0, then records
//   uint32 connection (1, 2, ... in order of first byte), uint32 kind (0 data, 1 closed), uint64 length, bytes.
inline constexpr char kWireMagic[8] = {'P', 'R', 'S', 'M', 'W', 'I', 'R', 'E'};
inline constexpr uint32_t kWireVersion = 1;
inline constexpr uint32_t kWireData = 0;
inline constexpr uint32_t kWireClosed = 1;

struct ServerStats {
  uint64_t clients = 0;        // connected now
  uint64_t accepted = 0;       // since start
  uint64_t dropped = 0;        // clients dropped for breaking the protocol
  uint64_t max_unread = 0;     // the most reply bytes one client had queued unread at once (at most max_output_bytes)
  StoreStats store;
};

class StoreServer : NonCopyable {
 public:
  StoreServer() = default;
  ~StoreServer();

  // Binds, listens and starts the server thread. False with *error (naming host and port) on failure.
  bool Start(const StoreServerOptions& opts, std::string* error);
  // Closes every client and the listener, joins the thread. Idempotent.
  void Stop();

  uint16_t port() const { return port_; }
  const std::string& host() const { return opts_.host; }
  bool running() const { return running_.load(); }

  // Runs fn on the server thread with the state and waits for it (inline when called from that thread, or when
  // the server is not running). Thread-safe.
  void Call(const std::function<void(StoreState&)>& fn);
  // Re-offers waited keys to the stand-in (after it learned a group's members from outside the store).
  void RetryWaits();
  ServerStats Stats();
  std::vector<std::string> WaitedKeys(size_t max);
  // The peer addresses ("127.0.0.1:40312") of the clients blocked in a WAIT now.
  std::vector<std::string> BlockedPeers();

 private:
  struct Client {
    int fd = -1;
    std::string peer;
    std::string in;
    size_t in_pos = 0;
    std::string out;
    size_t out_pos = 0;
    bool validated = false;
    bool want_write = false;
    uint64_t requests = 0;
    std::string drop_reason;  // set: drop after the current event batch
    uint32_t record_conn = 0;  // connection number in the wire capture (0: nothing recorded yet)
  };
  void Record(Client& c, uint32_t kind, const char* data, size_t len);

  void Loop();
  void Accept();
  void OnReadable(ClientId id);
  void ProcessInput(ClientId id, Client& c);
  void Flush(ClientId id, Client& c);
  // Queues bytes for a client; false (and the client marked for dropping) when they would pass max_output_bytes.
  bool QueueOutput(Client& c, std::string_view bytes, const char* what);
  void Deliver(ClientId id, std::string_view bytes);
  void MarkDrop(Client& c, std::string reason);
  void Drop(ClientId id, bool log_as_error);
  void RunCalls();
  void UpdateEpoll(ClientId id, Client& c);

  StoreServerOptions opts_;
  std::unique_ptr<StoreState> state_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int event_fd_ = -1;
  int spare_fd_ = -1;
  std::FILE* record_ = nullptr;
  uint32_t record_next_conn_ = 1;  // Why: released to accept-and-close a client when the process is out of descriptors
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<std::thread::id> loop_thread_id_{};
  std::atomic<bool> running_{false};
  std::atomic<bool> stop_{false};
  std::unordered_map<ClientId, Client> clients_;
  std::unordered_set<ClientId> dirty_;  // clients with output or a pending drop after the current batch
  ClientId next_id_ = 16;
  std::vector<ClientId> last_waiting_;  // on_waits_changed: the waiting clients it was last called for
  std::atomic<uint64_t> n_clients_{0}, n_accepted_{0}, n_dropped_{0}, max_unread_{0};

  std::mutex calls_mu_;
  std::condition_variable calls_cv_;
  std::deque<std::pair<std::function<void(StoreState&)>, uint64_t>> calls_;
  uint64_t calls_done_ = 0, calls_posted_ = 0;
  bool accepting_calls_ = false;  // under calls_mu_: the loop thread runs posted calls
};

}  // namespace prism::store
