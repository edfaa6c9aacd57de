// Iteration marks from the Python hook (prism_iteration_mark, after each optimizer step): a GPU clock stamp on the
// stream, the iter line of the event file, and what switches at iteration boundaries (PRISM_KERNELS_TOGGLE,
// PRISM_GATE_TOGGLE).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

namespace prism::interpose {

// Stamps the GPU clock on `stream` (iteration time is GPU time). Returns the iteration number.
int IterationMark(cudaStream_t stream, uint64_t torch_max_allocated);

// PRISM_GATE_TOGGLE's state: set at iteration marks, read per unit (true: units are not gated).
[[gnu::visibility("hidden")]] extern std::atomic<bool> g_gates_toggled_off;
inline bool GatesToggledOff() { return g_gates_toggled_off.load(std::memory_order_relaxed); }

}  // namespace prism::interpose
