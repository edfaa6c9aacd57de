// Device-memory accounting of one real rank: every allocation the cudaMalloc family, ncclMemAlloc and the VMM
// path (cuMemCreate, reached through cudaGetDriverEntryPoint/cuGetProcAddress by PyTorch's expandable
// segments) makes, with current and peak bytes (the runtime's, runtime.h). Not on any hot path (PyTorch's caching allocator calls these
// rarely); a mutex guards the maps.
#pragma once

#include <cstddef>
#include <cstdint>

namespace prism::interpose::memory {

void RecordAlloc(const void* ptr, uint64_t bytes);
// Bytes the allocation at `ptr` held (0 when unknown, e.g. allocated before libprism saw it).
uint64_t RecordFree(const void* ptr);
void RecordHandleCreate(uint64_t handle, uint64_t bytes);
uint64_t RecordHandleRelease(uint64_t handle);

uint64_t CurrentBytes();
uint64_t PeakBytes();

// Allocation admission under context switching (docs/collect.md, ipc.h kMemRoom). After a device allocation of
// `bytes` failed for lack of memory, the caller's `attempt`-th retry (from 0): synchronises the device (the real
// driver's cuCtxSynchronize; the request then says idle: the coordinator may swap this rank out for another rank's
// room while it waits), asks the coordinator for room and waits for its answer; true: retry the allocation. False
// at once when the coordinator did not say swap is on, after kMaxRoomAsks asks for one allocation, and within
// kRoomQuietS of a refusal (torch's caching allocator frees its cache and calls again after a failure: that call
// fails at once instead of waiting again).
inline constexpr int kMaxRoomAsks = 3;
inline constexpr double kRoomQuietS = 10;
// Never throws.
bool WaitForRoom(uint64_t bytes, int attempt);

// After `alloc` failed with `oom` (the allocator's "out of memory": cudaErrorMemoryAllocation,
// CUDA_ERROR_OUT_OF_MEMORY): calls `again` (the same allocation) once per room the coordinator grants, and returns
// the last result (`oom` when no room was granted).
template <typename E, typename Again>
E RetryWithRoom(uint64_t bytes, E oom, Again again) {
  E e = oom;
  for (int attempt = 0; e == oom && WaitForRoom(bytes, attempt); ++attempt) e = again();
  return e;
}

}  // namespace prism::interpose::memory
