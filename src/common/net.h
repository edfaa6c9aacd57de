// Listening sockets and this host's name, for the servers of the coordinator (its event bus, its store).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace prism::net {

// A listening TCP socket (non-blocking, close-on-exec, SO_REUSEADDR) on the first address of host:port that binds;
// host "" listens on every address, port 0 lets the kernel pick (*bound_port says which). -1 on failure, with
// *error the cause alone (the resolver's or the last socket call's) and *unresolved true when the name did not
// resolve, so that each server words its own message.
int ListenTcp(const std::string& host, uint16_t port, uint16_t* bound_port, std::string* error, bool* unresolved);

// Writes what the socket takes of out[*pos, end) to a non-blocking socket, advancing *pos (retried on EINTR, stops
// when it would block); false when the socket failed, errno saying why.
bool SendSome(int fd, const std::string& out, size_t* pos);

// gethostname(), for addresses a server advertises when it binds every address.
std::string HostName();

}  // namespace prism::net
