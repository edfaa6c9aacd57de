// Shared by the exported entry points only (the *.cc files of this folder, linked into libprism.so).
//
// Every exported function has one shape, as darshan's wrappers and NCCL's collectives do:
//
//   PRISM_API cudaError_t cudaFoo(int device, void* out) {
//     const auto real = Cudart().cudaFoo;                 // 1. the real entry point (core/real_symbols.h), when the
//     if (real == nullptr) return cudaErrorNotSupported;   //    call passes through; a missing one is said explicitly
//     return Foo(real, Convert(device), out);              // 2. converted arguments to one internal function
//   }                                                      // 3. the API's own result code, returned untouched
//
// NCCL functions start with the foreign-handle check instead (a real communicator goes to the real function:
// ForwardForeign) and call one function of core/ (Submit, CommInit, ...) through Guarded. Inside the user's process
// nothing throws across the C boundary (Guarded turns an exception into the API's error code), nothing exits, and no
// macro hides a `return`.
#pragma once

#include <nccl.h>

#include <exception>

#include "interpose/core/comm.h"
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

// Runs `f` (returning nothing) for a side effect the API's result does not depend on (bookkeeping after a call that
// succeeded): an exception is dropped.
template <typename F>
void Guarded(F&& f) noexcept {
  try {
    f();
  } catch (...) {
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

// A non-null handle that is not a libprism communicator: the real NCCL's (ForwardForeign).
inline bool IsForeign(ncclComm_t comm) { return comm != nullptr && ToComm(comm) == nullptr; }

// True when the caller (pass __builtin_return_address(0)) is the real libnccl: its internal calls to public
// functions that take no communicator (ncclGetUniqueId, ncclMemAlloc/Free) go back to it.
bool CalledFromRealNccl(const void* return_address);

}  // namespace prism::interpose
