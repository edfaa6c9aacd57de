#include "coordinator/bus/event_bus.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "common/log.h"
#include "common/net.h"

namespace prism::coord {
namespace {

constexpr BusId kUnixListenId = 1;
constexpr BusId kTcpListenId = 2;
constexpr BusId kWakeId = 3;
constexpr BusId kTimerId = 4;

bool SplitHostPort(const std::string& s, std::string* host, uint16_t* port) {
  size_t c = s.rfind(':');
  if (c == std::string::npos) return false;
  *host = s.substr(0, c);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  try {
    int p = std::stoi(s.substr(c + 1));
    if (p < 0 || p > 65535) return false;
    *port = static_cast<uint16_t>(p);
  } catch (...) {
    return false;
  }
  return true;
}

}  // namespace

EventBus::EventBus(FrameHandler on_frame, DropHandler on_drop)
    : on_frame_(std::move(on_frame)), on_drop_(std::move(on_drop)) {}

EventBus::~EventBus() {
  CloseClients();
  Close();
}

bool EventBus::Listen(const std::string& out_dir, const std::string& tcp, int tick_ms, uint64_t started_ns,
                      std::string* socket_path, std::string* tcp_endpoint, std::string* error) {
  std::string path = (std::filesystem::absolute(out_dir) / "coord.sock").string();
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    // Why: sun_path holds 107 characters; deep output directories do not fit.
    path = fmt::format("/tmp/prism-coord-{}-{}.sock", ::getpid(), started_ns % 1000000);
  }
  ::unlink(path.c_str());
  unix_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (unix_fd_ < 0 || ::bind(unix_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(unix_fd_, SOMAXCONN) != 0) {
    *error = fmt::format("coordinator: cannot listen on Unix socket '{}': {}", path, std::strerror(errno));
    return false;
  }
  *socket_path = path;
  if (!tcp.empty()) {
    std::string host;
    uint16_t port = 0;
    if (!SplitHostPort(tcp, &host, &port)) {
      *error = fmt::format("coordinator: bus address '{}' is not HOST:PORT", tcp);
      return false;
    }
    std::string why;
    bool unresolved = false;
    uint16_t bound = 0;
    tcp_fd_ = net::ListenTcp(host, port, &bound, &why, &unresolved);
    if (tcp_fd_ < 0) {
      *error = unresolved ? fmt::format("coordinator: bus address '{}': {}", tcp, why)
                          : fmt::format("coordinator: cannot listen on bus address '{}': {}", tcp, why);
      return false;
    }
    std::string adv = (host.empty() || host == "0.0.0.0" || host == "::") ? net::HostName() : host;
    *tcp_endpoint = fmt::format("{}:{}", adv, bound);
  }
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0 || timer_fd_ < 0) {
    *error = fmt::format("coordinator: epoll/eventfd/timerfd: {}", std::strerror(errno));
    return false;
  }
  itimerspec its{};
  int ms = std::max(tick_ms, 10);
  its.it_interval.tv_sec = ms / 1000;
  its.it_interval.tv_nsec = (ms % 1000) * 1000000L;
  its.it_value = its.it_interval;
  ::timerfd_settime(timer_fd_, 0, &its, nullptr);
  auto add = [this](int fd, BusId id) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  };
  add(unix_fd_, kUnixListenId);
  if (tcp_fd_ >= 0) add(tcp_fd_, kTcpListenId);
  add(wake_fd_, kWakeId);
  add(timer_fd_, kTimerId);
  return true;
}

void EventBus::CloseClients() {
  for (auto& [id, c] : clients_) ::close(c.fd);
  clients_.clear();
}

void EventBus::Close() {
  for (int* fd : {&unix_fd_, &tcp_fd_, &epoll_fd_, &wake_fd_, &timer_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

int EventBus::Wait(epoll_event* events, int max, int timeout_ms) {
  return ::epoll_wait(epoll_fd_, events, max, timeout_ms);
}

EventBus::Event EventBus::Handle(const epoll_event& e) {
  const BusId id = e.data.u64;
  if (id == kUnixListenId) {
    AcceptOn(unix_fd_);
  } else if (id == kTcpListenId) {
    AcceptOn(tcp_fd_);
  } else if (id == kWakeId || id == kTimerId) {
    uint64_t v;
    while (::read(id == kWakeId ? wake_fd_ : timer_fd_, &v, sizeof(v)) > 0) {
    }
    return id == kWakeId ? Event::kWake : Event::kTimer;
  } else if (clients_.count(id)) {
    if (e.events & (EPOLLIN | EPOLLHUP | EPOLLERR)) OnReadable(id);
    auto it = clients_.find(id);
    if (it != clients_.end() && (e.events & EPOLLOUT)) Flush(id, it->second);
  }
  return Event::kNone;
}

void EventBus::FlushAndDrop() {
  std::vector<BusId> drop;
  for (auto& [id, c] : clients_) {
    // Flushed even when dropping: a kError should reach the peer before the close.
    if (c.out_pos < c.out.size()) Flush(id, c);
    if (!c.drop_reason.empty()) drop.push_back(id);
  }
  for (BusId id : drop) Drop(id);
}

bool EventBus::Pending() const {
  pollfd p{epoll_fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

void EventBus::Wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

BusClient* EventBus::Find(BusId id) {
  auto it = clients_.find(id);
  return it == clients_.end() ? nullptr : &it->second;
}

void EventBus::AcceptOn(int listen_fd) {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) Log("coord")->error("accept: {}", std::strerror(errno));
      return;
    }
    if (listen_fd == tcp_fd_) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    BusId id = next_id_++;
    BusClient c;
    c.fd = fd;
    c.decoder = ipc::FrameDecoder(limits_.max_frame_bytes);
    c.peer = listen_fd == tcp_fd_ ? "tcp#" + std::to_string(id) : "unix#" + std::to_string(id);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    clients_.emplace(id, std::move(c));
  }
}

void EventBus::OnReadable(BusId id) {
  BusClient& c = clients_.at(id);
  bool eof = false;
  // Why read into the decoder and handle frames after every read: a frame's bytes are copied once, by the kernel,
  // and handed on as a view (kOpData: up to 8 MiB of exchange bytes), which lives until the next read.
  for (int turns = 0; turns < 16 && c.drop_reason.empty(); ++turns) {
    const size_t want = c.decoder.WantBytes(64 * 1024);
    ssize_t n = ::recv(c.fd, c.decoder.Reserve(want), want, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      eof = true;
      break;
    }
    c.decoder.Commit(static_cast<size_t>(n));
    ipc::FrameView f;
    for (;;) {
      ipc::DecodeStatus st = c.decoder.NextView(&f);
      if (st == ipc::DecodeStatus::kNeedMore) break;
      if (st == ipc::DecodeStatus::kError) {
        c.drop_reason = c.decoder.error();
        break;
      }
      on_frame_(id, c, f);
      if (!c.drop_reason.empty()) break;
    }
  }
  if (eof && c.drop_reason.empty()) {
    c.drop_reason = c.decoder.buffered() ? fmt::format("disconnected mid-frame ({} bytes)", c.decoder.buffered())
                                         : "closed";
  }
}

void EventBus::Send(BusId id, ipc::MsgType type, std::string_view payload) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  BusClient& c = it->second;
  const uint64_t frame = sizeof(ipc::FrameHeader) + payload.size();
  if (c.reply_bytes + frame > limits_.max_reply_bytes) {
    if (c.drop_reason.empty()) {
      c.drop_reason = fmt::format("does not read its replies: {} bytes of them unread, and {} more would pass the "
                                  "{}-byte cap", c.reply_bytes, frame, limits_.max_reply_bytes);
    }
    return;
  }
  if (!ipc::AppendFrame(&c.out, type, payload.data(), payload.size())) {
    Log("coord")->error("dropping an oversized {}-byte message to {}", payload.size(), c.peer);
    return;
  }
  c.reply_bytes += frame;
}

void EventBus::Flush(BusId id, BusClient& c) {
  if (!net::SendSome(c.fd, c.out, &c.out_pos)) {
    if (c.drop_reason.empty()) c.drop_reason = fmt::format("send failed: {}", std::strerror(errno));
    return;
  }
  const uint64_t unsent = c.out.size() - c.out_pos;
  c.reply_bytes = std::min(c.reply_bytes, unsent);
  if (unsent == 0) {
    c.out.clear();
    c.out_pos = 0;
  } else if (unsent > limits_.max_queued_bytes) {
    if (c.drop_reason.empty()) {
      c.drop_reason = fmt::format("does not read its messages: {} bytes unread, over the {}-byte cap", unsent,
                                  limits_.max_queued_bytes);
    }
    return;
  }
  bool want = c.out_pos < c.out.size();
  if (want != c.want_write) {
    c.want_write = want;
    epoll_event ev{};
    ev.events = EPOLLIN | (want ? EPOLLOUT : 0u);
    ev.data.u64 = id;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  }
}

void EventBus::Drop(BusId id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  BusClient& c = it->second;
  const bool lost = on_drop_(id, c);
  if (c.drop_reason != "closed") {
    Log("coord")->warn("dropping bus client {}: {}", c.peer, c.drop_reason);
  } else if (lost) {
    Log("coord")->warn("{} disconnected without saying goodbye", c.peer);
  }
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  ::close(c.fd);
  clients_.erase(it);
}

}  // namespace prism::coord
