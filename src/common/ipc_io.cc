#include "common/ipc_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>

namespace prism::ipc {
namespace {

std::string Errno(const char* what) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s: %s", what, std::strerror(errno));
  return buf;
}

uint64_t Fnv1a(std::string_view s, uint64_t basis) {
  uint64_t h = basis;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

bool AppendFrame(std::string* out, MsgType type, const void* payload, size_t len) {
  if (len > kMaxFrameBytes) return false;
  FrameHeader h;
  h.type = static_cast<uint16_t>(type);
  h.length = static_cast<uint32_t>(len);
  out->append(reinterpret_cast<const char*>(&h), sizeof(h));
  if (len) out->append(static_cast<const char*>(payload), len);
  return true;
}

std::string EncodeFrame(MsgType type, std::string_view payload) {
  std::string s;
  s.reserve(sizeof(FrameHeader) + payload.size());
  if (!AppendFrame(&s, type, payload.data(), payload.size())) s.clear();
  return s;
}

std::string CheckHeader(const FrameHeader& h, uint32_t max_frame_bytes) {
  char buf[160];
  if (h.magic != kFrameMagic) {
    std::snprintf(buf, sizeof(buf), "bad frame magic 0x%08x (expected 0x%08x)", h.magic, kFrameMagic);
    return buf;
  }
  if (h.version != kVersion) {
    std::snprintf(buf, sizeof(buf), "unsupported frame version %u (this side speaks %u)", unsigned{h.version},
                  unsigned{kVersion});
    return buf;
  }
  if (h.length > max_frame_bytes) {
    std::snprintf(buf, sizeof(buf), "frame of %u bytes exceeds the limit %u", h.length, max_frame_bytes);
    return buf;
  }
  if (h.type == static_cast<uint16_t>(MsgType::kInvalid)) return "frame type 0 (invalid)";
  return {};
}

char* FrameDecoder::Reserve(size_t len) {
  if (pos_ == len_) {
    pos_ = len_ = 0;
  } else if (pos_ > 0 && (len_ + len > cap_ || pos_ >= len_ - pos_)) {
    // Why compact only here: the bytes moved are at most the start of the next frame (WantBytes keeps reads from
    // running past a frame's end), never a whole frame.
    std::memmove(buf_.get(), buf_.get() + pos_, len_ - pos_);
    len_ -= pos_;
    pos_ = 0;
  }
  if (len_ + len > cap_) {
    size_t cap = std::max<size_t>(cap_ * 2, len_ + len);
    std::unique_ptr<char[]> grown(new char[cap]);  // Why not a std::string: resize would zero what the read fills
    if (len_) std::memcpy(grown.get(), buf_.get(), len_);
    buf_ = std::move(grown);
    cap_ = cap;
  }
  return buf_.get() + len_;
}

size_t FrameDecoder::WantBytes(size_t dflt) const {
  const size_t have = len_ - pos_;
  if (have < sizeof(FrameHeader)) return dflt;
  FrameHeader h;
  std::memcpy(&h, buf_.get() + pos_, sizeof(h));
  if (h.length > max_) return dflt;  // Next reports it
  const size_t whole = sizeof(h) + h.length;
  return whole > have ? std::max(dflt, whole - have) : dflt;
}

void FrameDecoder::Feed(const void* data, size_t len) {
  if (failed_ || len == 0) return;
  std::memcpy(Reserve(len), data, len);
  Commit(len);
}

DecodeStatus FrameDecoder::NextView(FrameView* out) {
  if (failed_) return DecodeStatus::kError;
  if (len_ - pos_ < sizeof(FrameHeader)) return DecodeStatus::kNeedMore;
  FrameHeader h;
  std::memcpy(&h, buf_.get() + pos_, sizeof(h));
  std::string why = CheckHeader(h, max_);
  if (!why.empty()) {
    error_ = std::move(why);
    failed_ = true;
    return DecodeStatus::kError;
  }
  if (len_ - pos_ - sizeof(h) < h.length) return DecodeStatus::kNeedMore;
  out->type = static_cast<MsgType>(h.type);
  out->version = h.version;
  out->payload = std::string_view(buf_.get() + pos_ + sizeof(h), h.length);
  pos_ += sizeof(h) + h.length;  // the bytes stay where they are until the next Reserve
  return DecodeStatus::kFrame;
}

DecodeStatus FrameDecoder::Next(Frame* out) {
  FrameView v;
  const DecodeStatus st = NextView(&v);
  if (st != DecodeStatus::kFrame) return st;
  out->type = v.type;
  out->version = v.version;
  out->payload.assign(v.payload.data(), v.payload.size());
  return st;
}

bool RetryWrite(int fd) {
  if (errno == EINTR) return true;
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    pollfd pfd{fd, POLLOUT, 0};
    ::poll(&pfd, 1, -1);
    return true;
  }
  return false;
}

IoStatus WriteAll(int fd, const void* data, size_t len, std::string* error) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (RetryWrite(fd)) continue;
      if (errno == EPIPE || errno == ECONNRESET) {
        if (error) *error = Errno("send");
        return IoStatus::kClosed;
      }
      if (error) *error = Errno("send");
      return IoStatus::kError;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return IoStatus::kOk;
}

IoStatus ReadExact(int fd, void* data, size_t len, int timeout_ms, std::string* error) {
  char* p = static_cast<char*>(data);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  while (len > 0) {
    int wait_ms = -1;
    if (timeout_ms >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        if (error) *error = "timed out";
        return IoStatus::kTimeout;
      }
      wait_ms = static_cast<int>(left.count());
    }
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, wait_ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (error) *error = Errno("poll");
      return IoStatus::kError;
    }
    if (r == 0) continue;  // the deadline check above decides
    ssize_t n = ::recv(fd, p, len, 0);
    if (n == 0) {
      if (error) *error = "peer closed the connection";
      return IoStatus::kClosed;
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (error) *error = Errno("recv");
      return errno == ECONNRESET ? IoStatus::kClosed : IoStatus::kError;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return IoStatus::kOk;
}

IoStatus SendFrame(int fd, MsgType type, const void* payload, size_t len, std::string* error) {
  std::string buf;
  if (!AppendFrame(&buf, type, payload, len)) {
    if (error) *error = "payload over kMaxFrameBytes";
    return IoStatus::kError;
  }
  return WriteAll(fd, buf.data(), buf.size(), error);
}

IoStatus RecvFrame(int fd, Frame* out, int timeout_ms, std::string* error) {
  FrameHeader h;
  IoStatus s = ReadExact(fd, &h, sizeof(h), timeout_ms, error);
  if (s != IoStatus::kOk) return s;
  std::string why = CheckHeader(h);
  if (!why.empty()) {
    if (error) *error = std::move(why);
    return IoStatus::kError;
  }
  out->type = static_cast<MsgType>(h.type);
  out->version = h.version;
  out->payload.resize(h.length);
  if (h.length == 0) return IoStatus::kOk;
  return ReadExact(fd, out->payload.data(), h.length, timeout_ms, error);
}

int ConnectUnix(const std::string& path, std::string* error) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    if (error) *error = "socket path too long: " + path;
    return -1;
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    if (error) *error = Errno("socket");
    return -1;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  while (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EINTR) continue;
    if (error) *error = Errno(("connect " + path).c_str());
    ::close(fd);
    return -1;
  }
  return fd;
}

int ConnectTcp(const std::string& host, uint16_t port, int timeout_ms, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_s = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0) {
    if (error) *error = "resolve " + host + ": " + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  std::string last = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last = Errno("socket");
      continue;
    }
    int r = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd, POLLOUT, 0};
      int pr;
      do {
        pr = ::poll(&pfd, 1, timeout_ms);
      } while (pr < 0 && errno == EINTR);
      int soerr = 0;
      socklen_t sl = sizeof(soerr);
      if (pr == 1) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
      if (pr == 1 && soerr == 0) {
        r = 0;
      } else {
        errno = pr == 0 ? ETIMEDOUT : soerr;
        r = -1;
      }
    }
    if (r == 0) {
      int flags = ::fcntl(fd, F_GETFL);
      ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      break;
    }
    last = Errno(("connect " + host + ":" + port_s).c_str());
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0 && error) *error = last;
  return fd;
}

std::string MakeVirtualNcclId(std::string_view key, int writer_rank) {
  std::string id(kNcclIdBytes, '\0');
  std::memcpy(id.data(), kVirtualIdMagic, sizeof(kVirtualIdMagic));
  uint32_t version = kVirtualIdVersion;
  int32_t writer = writer_rank;
  uint64_t h1 = Fnv1a(key, 0xcbf29ce484222325ull);
  uint64_t h2 = Fnv1a(key, 0x84222325cbf29ce4ull);
  std::memcpy(id.data() + 8, &version, 4);
  std::memcpy(id.data() + 12, &writer, 4);
  std::memcpy(id.data() + 16, &h1, 8);
  std::memcpy(id.data() + 24, &h2, 8);
  std::string_view tail = key.size() > 96 ? key.substr(key.size() - 96) : key;
  std::memcpy(id.data() + 32, tail.data(), tail.size());
  return id;
}

bool IsVirtualNcclId(const void* id, size_t len, int* writer_rank) {
  if (id == nullptr || len != kNcclIdBytes) return false;
  const char* p = static_cast<const char*>(id);
  if (std::memcmp(p, kVirtualIdMagic, sizeof(kVirtualIdMagic)) != 0) return false;
  uint32_t version = 0;
  std::memcpy(&version, p + 8, 4);
  if (version != kVirtualIdVersion) return false;
  if (writer_rank) {
    int32_t w = 0;
    std::memcpy(&w, p + 12, 4);
    *writer_rank = w;
  }
  return true;
}

std::string HexEncode(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    s.push_back(kDigits[c >> 4]);
    s.push_back(kDigits[c & 15]);
  }
  return s;
}

bool HexDecode(std::string_view hex, std::string* out) {
  if (hex.size() % 2) return false;
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  out->clear();
  out->reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = val(hex[i]), lo = val(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

}  // namespace prism::ipc
