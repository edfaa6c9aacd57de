// Device-memory accounting: the cudaMalloc family (PyTorch's caching allocator, cudaMallocAsync backend) ->
// current and peak bytes of this rank (core/memory.h). The VMM path (expandable segments) is counted in
// core/driver_overrides.cc. Under context switching an allocation that fails for lack of memory waits for the
// coordinator to make room and is retried (memory::RetryWithRoom; cudaMalloc, cudaMallocAsync, cudaMallocFromPoolAsync
// and their per-thread variants).
#include <cuda_runtime_api.h>

#include "interpose/api.h"
#include "interpose/core/memory.h"
#include "interpose/core/real_symbols.h"

using namespace prism::interpose;

namespace {

// An allocation through `alloc` (a call of the real function) of `size` bytes at *ptr: retried once per room the
// coordinator grants after a failure for lack of memory (core/memory.h), and counted when it succeeded.
template <typename Alloc>
cudaError_t Allocate(void** ptr, size_t size, Alloc alloc) {
  cudaError_t e = alloc();
  if (e == cudaErrorMemoryAllocation) {
    e = memory::RetryWithRoom(size, cudaErrorMemoryAllocation, alloc);
    // Why: the failed first try left cudaErrorMemoryAllocation as the thread's last error; the call succeeded after
    // all, and torch's next cudaGetLastError check (after a kernel launch) would take it for a failure.
    if (e == cudaSuccess && Cudart().cudaGetLastError != nullptr) (void)Cudart().cudaGetLastError();
  }
  if (e == cudaSuccess) memory::RecordAlloc(*ptr, size);
  return e;
}

// A free through `release` (a call of the real function) of `ptr`, forgotten when it succeeded.
template <typename Release>
cudaError_t Free(void* ptr, Release release) {
  const cudaError_t e = release();
  if (e == cudaSuccess) memory::RecordFree(ptr);
  return e;
}

}  // namespace

PRISM_API cudaError_t cudaMalloc(void** devPtr, size_t size) {
  const auto real = Cudart().cudaMalloc;
  if (real == nullptr) return cudaErrorNotSupported;
  return Allocate(devPtr, size, [&] { return real(devPtr, size); });
}

PRISM_API cudaError_t cudaFree(void* devPtr) {
  const auto real = Cudart().cudaFree;
  if (real == nullptr) return cudaErrorNotSupported;
  return Free(devPtr, [&] { return real(devPtr); });
}

PRISM_API cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  const auto real = Cudart().cudaMallocAsync;
  if (real == nullptr) return cudaErrorNotSupported;
  return Allocate(devPtr, size, [&] { return real(devPtr, size, hStream); });
}

PRISM_API cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  const auto real = Cudart().cudaFreeAsync;
  if (real == nullptr) return cudaErrorNotSupported;
  return Free(devPtr, [&] { return real(devPtr, hStream); });
}

PRISM_API cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  const auto real = Cudart().cudaMallocFromPoolAsync;
  if (real == nullptr) return cudaErrorNotSupported;
  return Allocate(ptr, size, [&] { return real(ptr, size, memPool, stream); });
}

PRISM_API cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) {
  const auto real = Cudart().cudaMallocManaged;
  if (real == nullptr) return cudaErrorNotSupported;
  // Why not Allocate: managed memory is not device memory the coordinator can make room for.
  const cudaError_t e = real(devPtr, size, flags);
  if (e == cudaSuccess) memory::RecordAlloc(*devPtr, size);
  return e;
}

PRISM_API cudaError_t cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height) {
  const auto real = Cudart().cudaMallocPitch;
  if (real == nullptr) return cudaErrorNotSupported;
  const cudaError_t e = real(devPtr, pitch, width, height);
  if (e == cudaSuccess) memory::RecordAlloc(*devPtr, *pitch * height);
  return e;
}

// Per-thread-default-stream variants (code built with --default-stream per-thread binds these names).
PRISM_API cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream) {
  const auto real = Cudart().cudaMallocAsync_ptsz;
  if (real == nullptr) return cudaErrorNotSupported;
  return Allocate(devPtr, size, [&] { return real(devPtr, size, hStream); });
}

PRISM_API cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream) {
  const auto real = Cudart().cudaFreeAsync_ptsz;
  if (real == nullptr) return cudaErrorNotSupported;
  return Free(devPtr, [&] { return real(devPtr, hStream); });
}

PRISM_API cudaError_t cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t memPool,
                                                   cudaStream_t stream) {
  const auto real = Cudart().cudaMallocFromPoolAsync_ptsz;
  if (real == nullptr) return cudaErrorNotSupported;
  return Allocate(ptr, size, [&] { return real(ptr, size, memPool, stream); });
}
