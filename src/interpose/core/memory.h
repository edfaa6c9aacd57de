// Device-memory accounting of one real rank: every allocation the cudaMalloc family, ncclMemAlloc and the VMM
// path (cuMemCreate, reached through cudaGetDriverEntryPoint/cuGetProcAddress by PyTorch's expandable
// segments) makes, with current and peak bytes. Not on any hot path (PyTorch's caching allocator calls these
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
// Resets peak to current (tests).
void ResetPeakForTest();

}  // namespace prism::interpose::memory
