// Buffer registration and memory windows: accepted and tracked (nothing needs registering: no NCCL transport
// runs), so deregistration of a handle we never gave out is reported as NCCL would.
#include <nccl.h>

#include <mutex>
#include <new>
#include <unordered_set>

#include "interpose/api.h"
#include "interpose/core/comm.h"

using namespace prism::interpose;

namespace {

struct Registration {
  Comm* comm;
  void* buff;
  size_t size;
  int flags;
};

struct Table {
  std::mutex mu;
  std::unordered_set<Registration*> live;
};

Table& T() {
  static Table* t = new Table();
  return *t;
}

ncclResult_t Add(ncclComm_t comm, void* buff, size_t size, int flags, void** out) {
  Comm* c = ToComm(comm);
  if (c == nullptr || out == nullptr) return ncclInvalidArgument;
  auto* r = new (std::nothrow) Registration{c, buff, size, flags};
  if (r == nullptr) return ncclSystemError;
  return Guarded(ncclSystemError, [&] {
    std::lock_guard<std::mutex> lock(T().mu);
    T().live.insert(r);
    *out = r;
    return ncclSuccess;
  });
}

ncclResult_t Remove(ncclComm_t comm, void* handle) {
  Comm* c = ToComm(comm);
  if (c == nullptr) return ncclInvalidArgument;
  auto* r = static_cast<Registration*>(handle);
  std::lock_guard<std::mutex> lock(T().mu);
  auto it = T().live.find(r);
  if (it == T().live.end() || r->comm != c) {
    SetLastError("unknown registration handle");
    return ncclInvalidArgument;
  }
  T().live.erase(it);
  delete r;
  return ncclSuccess;
}

}  // namespace

PRISM_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  if (IsForeign(comm)) return ForwardForeign(RealNccl().ncclCommRegister, comm, buff, size, handle);
  return Add(comm, buff, size, 0, handle);
}

PRISM_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  if (IsForeign(comm)) return ForwardForeign(RealNccl().ncclCommDeregister, comm, handle);
  return Remove(comm, handle);
}

PRISM_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                              int winFlags) {
  if (IsForeign(comm)) return ForwardForeign(RealNccl().ncclCommWindowRegister, comm, buff, size, win, winFlags);
  void* h = nullptr;
  ncclResult_t r = Add(comm, buff, size, winFlags, &h);
  if (r == ncclSuccess) *win = static_cast<ncclWindow_t>(h);
  return r;
}

PRISM_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  if (IsForeign(comm)) return ForwardForeign(RealNccl().ncclCommWindowDeregister, comm, win);
  return Remove(comm, win);
}

#define PRISM_ALIAS(name) __attribute__((alias(#name), visibility("default")))
extern "C" {
ncclResult_t pncclCommRegister(const ncclComm_t, void*, size_t, void**) PRISM_ALIAS(ncclCommRegister);
ncclResult_t pncclCommDeregister(const ncclComm_t, void*) PRISM_ALIAS(ncclCommDeregister);
ncclResult_t pncclCommWindowRegister(ncclComm_t, void*, size_t, ncclWindow_t*, int)
    PRISM_ALIAS(ncclCommWindowRegister);
ncclResult_t pncclCommWindowDeregister(ncclComm_t, ncclWindow_t) PRISM_ALIAS(ncclCommWindowDeregister);
}
