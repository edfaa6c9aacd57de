#include "coordinator/store/store_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <new>

#include <fmt/format.h>

#include "common/log.h"
#include "common/net.h"

namespace prism::store {
namespace {

constexpr ClientId kListenId = 1;
constexpr ClientId kEventId = 2;
constexpr size_t kReadChunk = 64 * 1024;
// Why: one client streaming a large request must not starve the others; the rest is read on the next turn.
constexpr size_t kReadBudgetPerTurn = 1 << 20;

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return fmt::format("{}:{}", host, port);
}

}  // namespace

StoreServer::~StoreServer() { Stop(); }

bool StoreServer::Start(const StoreServerOptions& opts, std::string* error) {
  if (running_) {
    *error = "store server already running";
    return false;
  }
  opts_ = opts;
  state_ = std::make_unique<StoreState>([this](ClientId id, std::string_view b) { Deliver(id, b); }, opts_.stand_in,
                                        opts_.max_total_bytes);
  std::string why;
  bool unresolved = false;
  listen_fd_ = net::ListenTcp(opts_.host, opts_.port, &port_, &why, &unresolved);
  if (listen_fd_ < 0) {
    *error = unresolved ? fmt::format("store: cannot resolve bind address '{}': {}", opts_.host, why)
                        : fmt::format("store: cannot listen on {}:{}: {}", opts_.host, opts_.port, why);
    return false;
  }

  if (!opts_.record_path.empty()) {
    record_ = std::fopen(opts_.record_path.c_str(), "wb");
    if (!record_) {
      *error = fmt::format("store: cannot write wire capture '{}': {}", opts_.record_path, std::strerror(errno));
      Stop();
      return false;
    }
    uint32_t header[2] = {kWireVersion, 0};
    std::fwrite(kWireMagic, 1, sizeof(kWireMagic), record_);
    std::fwrite(header, 1, sizeof(header), record_);
  }
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (epoll_fd_ < 0 || event_fd_ < 0) {
    *error = fmt::format("store: epoll/eventfd: {}", std::strerror(errno));
    Stop();
    return false;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.u64 = kEventId;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &ev);
  stop_ = false;
  running_ = true;
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    accepting_calls_ = true;
  }
  thread_ = std::thread([this] { Loop(); });
  Log("store")->info("TCPStore server listening on {}:{}", opts_.host, port_);
  return true;
}

void StoreServer::Stop() {
  if (thread_.joinable()) {
    stop_ = true;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof(one));
    thread_.join();
  }
  running_ = false;
  for (auto& [id, c] : clients_) ::close(c.fd);
  clients_.clear();
  if (record_) {
    std::fclose(record_);
    record_ = nullptr;
  }
  n_clients_ = 0;
  for (int* fd : {&listen_fd_, &epoll_fd_, &event_fd_, &spare_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  // Calls posted before the loop stopped still run (their callers wait); later ones run inline.
  std::lock_guard<std::mutex> lock(calls_mu_);
  accepting_calls_ = false;
  while (!calls_.empty()) {
    calls_.front().first(*state_);
    calls_done_ = calls_.front().second;
    calls_.pop_front();
  }
  calls_cv_.notify_all();
}

void StoreServer::Call(const std::function<void(StoreState&)>& fn) {
  if (std::this_thread::get_id() == loop_thread_id_) {
    fn(*state_);
    return;
  }
  std::unique_lock<std::mutex> lock(calls_mu_);
  if (!accepting_calls_) {
    // Not running (before Start or after Stop): nobody else touches the state; the lock serialises callers.
    if (state_) fn(*state_);
    return;
  }
  uint64_t ticket = ++calls_posted_;
  calls_.emplace_back(fn, ticket);
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof(one));
  calls_cv_.wait(lock, [&] { return calls_done_ >= ticket; });
}

void StoreServer::RunCalls() {
  std::deque<std::pair<std::function<void(StoreState&)>, uint64_t>> calls;
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    calls.swap(calls_);
  }
  for (auto& [fn, ticket] : calls) {
    fn(*state_);
    std::lock_guard<std::mutex> lock(calls_mu_);
    calls_done_ = ticket;
  }
  calls_cv_.notify_all();
}

void StoreServer::RetryWaits() {
  Call([](StoreState& s) { s.RetryWaits(); });
}

ServerStats StoreServer::Stats() {
  ServerStats st;
  Call([&](StoreState& s) { st.store = s.Stats(); });
  st.clients = n_clients_;
  st.accepted = n_accepted_;
  st.dropped = n_dropped_;
  st.max_unread = max_unread_;
  return st;
}

std::vector<std::string> StoreServer::WaitedKeys(size_t max) {
  std::vector<std::string> keys;
  Call([&](StoreState& s) { keys = s.WaitedKeys(max); });
  return keys;
}

std::vector<std::string> StoreServer::BlockedPeers() {
  std::vector<std::string> peers;
  Call([&](StoreState& s) {
    for (ClientId id : s.WaitingClients()) {
      auto it = clients_.find(id);
      if (it != clients_.end()) peers.push_back(it->second.peer);
    }
  });
  return peers;
}

void StoreServer::Loop() {
  loop_thread_id_ = std::this_thread::get_id();
  std::vector<epoll_event> events(256);
  while (!stop_) {
    int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      Log("store")->error("epoll_wait: {}; store server stops", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n; ++i) {
      ClientId id = events[static_cast<size_t>(i)].data.u64;
      uint32_t ev = events[static_cast<size_t>(i)].events;
      if (id == kListenId) {
        Accept();
      } else if (id == kEventId) {
        uint64_t v;
        while (::read(event_fd_, &v, sizeof(v)) > 0) {
        }
        RunCalls();
      } else {
        auto it = clients_.find(id);
        if (it == clients_.end()) continue;
        if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
          // Why: what ProcessInput does not catch (a failed read-buffer allocation) still drops this client only.
          try {
            OnReadable(id);
          } catch (const std::exception& e) {
            MarkDrop(it->second, fmt::format("failed reading its requests: {}", e.what()));
            dirty_.insert(id);
          }
        }
        auto again = clients_.find(id);
        if (again != clients_.end() && (ev & EPOLLOUT)) dirty_.insert(id);
      }
    }
    // Output produced by this batch (replies, woken waits) goes out now; drops happen here, never while a request
    // is being handled (StoreState calls back into Deliver mid-request).
    std::vector<ClientId> dirty(dirty_.begin(), dirty_.end());
    dirty_.clear();
    for (ClientId id : dirty) {
      auto it = clients_.find(id);
      if (it == clients_.end()) continue;
      Client& c = it->second;
      if (c.drop_reason.empty()) Flush(id, c);
      if (!c.drop_reason.empty()) Drop(id, true);
    }
    if (opts_.on_waits_changed) {
      std::vector<ClientId> waiting = state_->WaitingClients();
      if (waiting != last_waiting_) {
        last_waiting_ = std::move(waiting);
        opts_.on_waits_changed();
      }
    }
  }
  loop_thread_id_ = std::thread::id{};
}

void StoreServer::Accept() {
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if ((errno == EMFILE || errno == ENFILE) && spare_fd_ >= 0) {
        ::close(spare_fd_);
        int c = ::accept(listen_fd_, nullptr, nullptr);
        if (c >= 0) ::close(c);
        spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        Log("store")->error("out of file descriptors: refused a client ({} connected); raise ulimit -n",
                            clients_.size());
        continue;
      }
      Log("store")->error("accept: {}", std::strerror(errno));
      return;
    }
    if (clients_.size() >= opts_.max_clients) {
      Log("store")->warn("refusing client {}: {} clients connected (limit)", PeerName(fd), clients_.size());
      ::close(fd);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ClientId id = next_id_++;
    Client c;
    c.fd = fd;
    c.peer = PeerName(fd);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    clients_.emplace(id, std::move(c));
    ++n_clients_;
    ++n_accepted_;
  }
}

void StoreServer::MarkDrop(Client& c, std::string reason) {
  if (c.drop_reason.empty()) c.drop_reason = std::move(reason);
}

void StoreServer::OnReadable(ClientId id) {
  Client& c = clients_.at(id);
  char buf[kReadChunk];
  size_t total = 0;
  bool eof = false;
  while (total < kReadBudgetPerTurn) {
    ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n > 0) {
      if (record_) Record(c, kWireData, buf, static_cast<size_t>(n));
      c.in.append(buf, static_cast<size_t>(n));
      total += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      eof = true;
      break;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    eof = true;  // ECONNRESET and friends: same as a close
    break;
  }
  if (total > 0) ProcessInput(id, c);
  if (eof && c.drop_reason.empty()) {
    size_t pending = c.in.size() - c.in_pos;
    if (pending > 0) {
      MarkDrop(c, fmt::format("disconnected in the middle of a request ({} bytes of it received)", pending));
    } else {
      c.drop_reason = "closed";
    }
  }
  if (!c.drop_reason.empty() || c.out.size() > c.out_pos) dirty_.insert(id);
}

void StoreServer::ProcessInput(ClientId id, Client& c) {
  Request req;
  std::string error;
  while (c.drop_reason.empty() && c.in_pos < c.in.size()) {
    size_t consumed = 0;
    const auto* data = reinterpret_cast<const uint8_t*>(c.in.data()) + c.in_pos;
    size_t avail = c.in.size() - c.in_pos;
    ParseStatus st = ParseRequest(data, avail, opts_.limits, &req, &consumed, &error);
    if (st == ParseStatus::kNeedMore) {
      if (avail > opts_.limits.max_request_bytes) {
        MarkDrop(c, fmt::format("request larger than {} bytes", opts_.limits.max_request_bytes));
      }
      break;
    }
    if (st == ParseStatus::kError) {
      MarkDrop(c, fmt::format("bad request after {} good ones: {}", c.requests, error));
      break;
    }
    if (!c.validated) {
      // Why strict: torch's clients always send VALIDATE first; anything else is not a torch client.
      if (req.type != QueryType::kValidate) {
        MarkDrop(c, fmt::format("first command was {} (byte {}), expected VALIDATE", QueryTypeName(req.type),
                                static_cast<int>(req.type)));
        break;
      }
    }
    if (req.type == QueryType::kValidate) {
      if (req.u32 != kValidationMagic) {
        MarkDrop(c, fmt::format("VALIDATE with magic 0x{:08x}, expected 0x{:08x}", req.u32, kValidationMagic));
        break;
      }
      c.validated = true;
    }
    ++c.requests;
    std::string reply;
    uint64_t unread = c.out.size() - c.out_pos;
    uint64_t room = opts_.max_output_bytes > unread ? opts_.max_output_bytes - unread : 0;
    bool ok = false;
    // Why catch: an allocation failure (or a stand-in's exception) in one client's request must drop that client,
    // not end the coordinator.
    try {
      ok = state_->Handle(id, req, &reply, &error, room);
    } catch (const std::bad_alloc&) {
      error = "out of memory";
    } catch (const std::exception& e) {
      error = fmt::format("exception: {}", e.what());
    }
    if (!ok) {
      // Handle's reply-cap refusal names only the room it was given; the log line also names the cap.
      bool over = error.starts_with("its reply would pass");
      MarkDrop(c, over ? fmt::format("{} refused: {} ({} bytes of replies already unread, limit {} per client)",
                                     QueryTypeName(req.type), error, unread, opts_.max_output_bytes)
                       : fmt::format("{} refused: {}", QueryTypeName(req.type), error));
      break;
    }
    c.in_pos += consumed;
    if (!reply.empty() && !QueueOutput(c, reply, QueryTypeName(req.type))) break;
  }
  if (c.in_pos == c.in.size()) {
    c.in.clear();
    c.in_pos = 0;
  } else if (c.in_pos > (1u << 16) && c.in_pos > c.in.size() / 2) {
    c.in.erase(0, c.in_pos);
    c.in_pos = 0;
  }
}

bool StoreServer::QueueOutput(Client& c, std::string_view bytes, const char* what) {
  if (!c.drop_reason.empty()) return false;
  uint64_t unread = c.out.size() - c.out_pos;
  if (unread + bytes.size() > opts_.max_output_bytes) {
    MarkDrop(c, fmt::format("{} reply of {} bytes would pass the limit of {} bytes of replies unread per client ({} "
                            "unread)", what, bytes.size(), opts_.max_output_bytes, unread));
    return false;
  }
  // Why compact here: a client that reads as we write never drains the buffer, so the sent prefix would pile up.
  if (c.out_pos > 0 && (c.out.size() + bytes.size() > opts_.max_output_bytes ||
                        (c.out_pos > (1u << 16) && c.out_pos > c.out.size() / 2))) {
    c.out.erase(0, c.out_pos);
    c.out_pos = 0;
  }
  try {
    c.out.append(bytes);
  } catch (const std::bad_alloc&) {
    MarkDrop(c, fmt::format("out of memory queueing a {} reply of {} bytes", what, bytes.size()));
    return false;
  }
  if (unread + bytes.size() > max_unread_) max_unread_ = unread + bytes.size();
  return true;
}

void StoreServer::Deliver(ClientId id, std::string_view bytes) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  QueueOutput(it->second, bytes, "wait");
  dirty_.insert(id);
}

void StoreServer::Flush(ClientId id, Client& c) {
  if (!net::SendSome(c.fd, c.out, &c.out_pos)) {
    MarkDrop(c, fmt::format("send failed: {}", std::strerror(errno)));
    return;
  }
  if (c.out_pos == c.out.size()) {
    c.out.clear();
    c.out_pos = 0;
  }
  UpdateEpoll(id, c);
}

void StoreServer::UpdateEpoll(ClientId id, Client& c) {
  bool want = c.out_pos < c.out.size();
  if (want == c.want_write) return;
  c.want_write = want;
  epoll_event ev{};
  ev.events = EPOLLIN | (want ? EPOLLOUT : 0u);
  ev.data.u64 = id;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
}

void StoreServer::Drop(ClientId id, bool log_as_error) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  Client& c = it->second;
  if (c.drop_reason == "closed") {
    Log("store")->debug("client {} closed after {} requests", c.peer, c.requests);
  } else if (log_as_error) {
    ++n_dropped_;
    Log("store")->warn("dropping client {}: {}", c.peer, c.drop_reason);
  }
  if (record_ && c.record_conn) Record(c, kWireClosed, nullptr, 0);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  ::close(c.fd);
  state_->DropClient(id);
  clients_.erase(it);
  --n_clients_;
}

void StoreServer::Record(Client& c, uint32_t kind, const char* data, size_t len) {
  if (c.record_conn == 0) c.record_conn = record_next_conn_++;
  uint32_t head[2] = {c.record_conn, kind};
  uint64_t n = len;
  std::fwrite(head, 1, sizeof(head), record_);
  std::fwrite(&n, 1, sizeof(n), record_);
  if (len) std::fwrite(data, 1, len, record_);
  // Why flush: a capture is taken to debug runs that may die; what was seen must be on disk.
  std::fflush(record_);
}

}  // namespace prism::store
