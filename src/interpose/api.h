// Shared by the exported entry points only (the *.cc files of this folder, linked into libprism.so).
#pragma once

#include <nccl.h>

#include <exception>

#include "interpose/core/real_symbols.h"

// An exported C symbol (exports.map decides the final list).
#define PRISM_API extern "C" __attribute__((visibility("default")))

namespace prism::interpose {

// Runs `f` and converts any C++ exception into `on_throw`: nothing ever crosses the C boundary.
template <typename R, typename F>
R Guarded(R on_throw, F&& f) noexcept {
  try {
    return f();
  } catch (...) {
    return on_throw;
  }
}

// A handle that is not a libprism communicator is the real NCCL's: libnccl calls its own public functions (e.g.
// ncclCommEnsureReady calls ncclCommGetAsyncError), and with libprism preloaded those calls land here with the
// real communicator of a passthrough communicator (core/comm.h). `fn` is the real function from RealNccl().
template <typename Fn, typename... Args>
ncclResult_t ForwardForeign(Fn fn, Args... args) {
  if (fn == nullptr) return ncclInvalidArgument;
  return fn(args...);
}

// True when the caller (pass __builtin_return_address(0)) is the real libnccl: its internal calls to public
// functions that take no communicator (ncclGetUniqueId, ncclMemAlloc/Free) go back to it.
bool CalledFromRealNccl(const void* return_address);

}  // namespace prism::interpose
