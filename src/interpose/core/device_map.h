// Device virtualisation: the job sees PRISM_GPUS_PER_NODE devices; every one of them is the physical GPU
// PRISM_PHYS_DEVICE (ordinal 0 of the CUDA_VISIBLE_DEVICES the launcher set). The current virtual device is
// per thread, as CUDA's current device is; cudaGetDevice answers from a thread_local without calling CUDA.
#pragma once

#include <cstdint>

namespace prism::interpose::devices {

// True when PRISM_GPUS_PER_NODE >= 1 (otherwise every wrapper passes through unchanged).
bool Virtualized();
// Devices the job sees.
int Count();
// The physical ordinal every virtual device maps to.
int Physical();
// True when 0 <= v < Count().
bool Valid(int v);
// The calling thread's current virtual device (0 until the thread sets one, as in CUDA).
int Current();
void SetCurrent(int v);

// Peer access between two virtual devices (they share one GPU, so it always "works"); tracked so that a second
// enable reports cudaErrorPeerAccessAlreadyEnabled as CUDA does. Returns false when already in that state.
bool SetPeerAccess(int device, int peer, bool enable);

}  // namespace prism::interpose::devices
