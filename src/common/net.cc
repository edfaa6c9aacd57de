#include "common/net.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace prism::net {

int ListenTcp(const std::string& host, uint16_t port, uint16_t* bound_port, std::string* error, bool* unresolved) {
  *unresolved = false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res); rc != 0) {
    *unresolved = true;
    *error = gai_strerror(rc);
    return -1;
  }
  int listen_fd = -1;
  std::string last = "no address";
  for (addrinfo* ai = res; ai && listen_fd < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      last = std::strerror(errno);
      ::close(fd);
      continue;
    }
    listen_fd = fd;
  }
  ::freeaddrinfo(res);
  if (listen_fd < 0) {
    *error = last;
    return -1;
  }
  sockaddr_storage ss{};
  socklen_t sl = sizeof(ss);
  ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&ss), &sl);
  *bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return listen_fd;
}

bool SendSome(int fd, const std::string& out, size_t* pos) {
  while (*pos < out.size()) {
    ssize_t n = ::send(fd, out.data() + *pos, out.size() - *pos, MSG_NOSIGNAL);
    if (n > 0) {
      *pos += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return false;
  }
  return true;
}

std::string HostName() {
  char h[256] = {0};
  ::gethostname(h, sizeof(h) - 1);
  return h;
}

}  // namespace prism::net
