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

template <typename Fn>
Fn Ptsz(const char* name) {
  return reinterpret_cast<Fn>(LoadedSymbol("libcudart.so", name));
}

// After `e` from the first try: retries once per room the coordinator grants (core/memory.h).
template <typename Again>
cudaError_t WithRoom(cudaError_t e, size_t size, Again again) {
  if (e != cudaErrorMemoryAllocation) return e;
  e = memory::RetryWithRoom(size, cudaErrorMemoryAllocation, again);
  // Why: the failed first try left cudaErrorMemoryAllocation as the thread's last error; the call succeeded after
  // all, and torch's next cudaGetLastError check (after a kernel launch) would take it for a failure.
  if (e == cudaSuccess && Cudart().cudaGetLastError != nullptr) (void)Cudart().cudaGetLastError();
  return e;
}

}  // namespace

#define PRISM_REAL(fn) \
  const auto real = Cudart().fn; \
  if (real == nullptr) return cudaErrorNotSupported;

PRISM_API cudaError_t cudaMalloc(void** devPtr, size_t size) {
  PRISM_REAL(cudaMalloc)
  cudaError_t e = WithRoom(real(devPtr, size), size, [&] { return real(devPtr, size); });
  if (e == cudaSuccess) memory::RecordAlloc(*devPtr, size);
  return e;
}

PRISM_API cudaError_t cudaFree(void* devPtr) {
  PRISM_REAL(cudaFree)
  cudaError_t e = real(devPtr);
  if (e == cudaSuccess) memory::RecordFree(devPtr);
  return e;
}

PRISM_API cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  PRISM_REAL(cudaMallocAsync)
  cudaError_t e = WithRoom(real(devPtr, size, hStream), size, [&] { return real(devPtr, size, hStream); });
  if (e == cudaSuccess) memory::RecordAlloc(*devPtr, size);
  return e;
}

PRISM_API cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  PRISM_REAL(cudaFreeAsync)
  cudaError_t e = real(devPtr, hStream);
  if (e == cudaSuccess) memory::RecordFree(devPtr);
  return e;
}

PRISM_API cudaError_t cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream) {
  PRISM_REAL(cudaMallocFromPoolAsync)
  cudaError_t e = WithRoom(real(ptr, size, memPool, stream), size, [&] { return real(ptr, size, memPool, stream); });
  if (e == cudaSuccess) memory::RecordAlloc(*ptr, size);
  return e;
}

PRISM_API cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) {
  PRISM_REAL(cudaMallocManaged)
  cudaError_t e = real(devPtr, size, flags);
  if (e == cudaSuccess) memory::RecordAlloc(*devPtr, size);
  return e;
}

PRISM_API cudaError_t cudaMallocPitch(void** devPtr, size_t* pitch, size_t width, size_t height) {
  PRISM_REAL(cudaMallocPitch)
  cudaError_t e = real(devPtr, pitch, width, height);
  if (e == cudaSuccess) memory::RecordAlloc(*devPtr, *pitch * height);
  return e;
}

#undef PRISM_REAL

// Per-thread-default-stream variants (code built with --default-stream per-thread binds these names).
PRISM_API cudaError_t cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream) {
  static const auto real = Ptsz<cudaError_t (*)(void**, size_t, cudaStream_t)>("cudaMallocAsync_ptsz");
  if (real == nullptr) return cudaErrorNotSupported;
  cudaError_t e = WithRoom(real(devPtr, size, hStream), size, [&] { return real(devPtr, size, hStream); });
  if (e == cudaSuccess) memory::RecordAlloc(*devPtr, size);
  return e;
}

PRISM_API cudaError_t cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream) {
  static const auto real = Ptsz<cudaError_t (*)(void*, cudaStream_t)>("cudaFreeAsync_ptsz");
  if (real == nullptr) return cudaErrorNotSupported;
  cudaError_t e = real(devPtr, hStream);
  if (e == cudaSuccess) memory::RecordFree(devPtr);
  return e;
}

PRISM_API cudaError_t cudaMallocFromPoolAsync_ptsz(void** ptr, size_t size, cudaMemPool_t memPool,
                                                   cudaStream_t stream) {
  static const auto real =
      Ptsz<cudaError_t (*)(void**, size_t, cudaMemPool_t, cudaStream_t)>("cudaMallocFromPoolAsync_ptsz");
  if (real == nullptr) return cudaErrorNotSupported;
  cudaError_t e = WithRoom(real(ptr, size, memPool, stream), size, [&] { return real(ptr, size, memPool, stream); });
  if (e == cudaSuccess) memory::RecordAlloc(*ptr, size);
  return e;
}
