// The coordinator's event bus: the Unix socket (and, when asked, a TCP port) that libprism.so in every real rank
// connects to, read and written as include/prism/ipc.h frames on one epoll loop, with a wake-up eventfd and the
// status timer on the same loop. It knows connections, not ranks: what a frame means is the handler's business.
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/ipc_io.h"
#include "common/non_copyable.h"
#include "prism/limits.h"

namespace prism::coord {

using BusId = uint64_t;

// What one client may make the bus hold (include/prism/limits.h says why each is what it is).
struct BusLimits {
  uint32_t max_frame_bytes = limits::kMaxBusFrameBytes;
  uint64_t max_reply_bytes = limits::kMaxBusReplyBytes;    // unread replies to its own requests (Send)
  uint64_t max_queued_bytes = limits::kMaxBusQueuedBytes;  // unread output of any kind
  uint64_t max_parked_bytes = limits::kMaxBusParkedBytes;  // its requests parked by the handler (parked_bytes)
};

struct BusClient {
  int fd = -1;
  std::string peer;
  ipc::FrameDecoder decoder;
  std::string out;
  size_t out_pos = 0;
  bool want_write = false;
  int rank = -1;
  std::string drop_reason;  // set: the client is dropped at the end of the turn (after its output is flushed)
  uint64_t reply_bytes = 0;   // of out's unsent bytes, at most this many are replies queued by Send
  uint64_t parked_bytes = 0;  // the handler's count of what it holds for this client's requests
};

class EventBus : NonCopyable {
 public:
  // One decoded frame; the view lives until the client's next read. A handler marks a bad client with drop_reason.
  using FrameHandler = std::function<void(BusId, BusClient&, const ipc::FrameView&)>;
  // A client about to be closed; true when it was a rank's live connection that never said goodbye (logged).
  using DropHandler = std::function<bool(BusId, BusClient&)>;
  // What one epoll event was, for the loop that owns the bus.
  enum class Event { kNone, kWake, kTimer };

  EventBus(FrameHandler on_frame, DropHandler on_drop);
  // Before Listen.
  void set_limits(const BusLimits& limits) { limits_ = limits; }
  const BusLimits& limits() const { return limits_; }
  ~EventBus();

  // <out_dir>/coord.sock (a /tmp path when that is too long for sun_path) and, when `tcp` is "HOST:PORT", a TCP
  // port; the timer ticks every `tick_ms`. *socket_path and *tcp_endpoint ("advertised-host:port") are set as each
  // listener comes up, so a caller can clean up after a later failure.
  bool Listen(const std::string& out_dir, const std::string& tcp, int tick_ms, uint64_t started_ns,
              std::string* socket_path, std::string* tcp_endpoint, std::string* error);
  // Closes the clients, then the listeners and the loop's descriptors. The socket file is the caller's.
  void CloseClients();
  void Close();

  int Wait(epoll_event* events, int max, int timeout_ms);
  // Accepts, reads (calling the frame handler) or writes as `ev` says; says which loop event it was.
  Event Handle(const epoll_event& ev);
  // The end of a turn: queued output is flushed and marked clients are dropped.
  void FlushAndDrop();
  // A message is waiting: long work on the bus thread should yield (ReleasePolicy::Idle's stop).
  bool Pending() const;
  // Wakes the loop from another thread (Event::kWake). wake_fd: for callbacks on other threads that write to it
  // themselves (VirtualRanks' id listener, the store's wait hook).
  void Wake();
  int wake_fd() const { return wake_fd_; }

  BusClient* Find(BusId id);
  // Queues a reply. A client whose unread replies would pass max_reply_bytes gets none: it is marked to be
  // dropped (as a handler marks a bad client), so a stream of small requests cannot make the bus hold any amount.
  void Send(BusId id, ipc::MsgType type, std::string_view payload);
  void SendJson(BusId id, ipc::MsgType type, const nlohmann::json& j) { Send(id, type, j.dump()); }
  void Flush(BusId id, BusClient& c);

 private:
  void AcceptOn(int listen_fd);
  void OnReadable(BusId id);
  void Drop(BusId id);

  FrameHandler on_frame_;
  DropHandler on_drop_;
  BusLimits limits_;
  int epoll_fd_ = -1, unix_fd_ = -1, tcp_fd_ = -1, wake_fd_ = -1, timer_fd_ = -1;
  std::unordered_map<BusId, BusClient> clients_;
  BusId next_id_ = 16;
};

}  // namespace prism::coord
