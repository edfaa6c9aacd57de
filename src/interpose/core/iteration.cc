#include "interpose/core/iteration.h"

#include "common/log.h"
#include "interpose/core/config.h"
#include "interpose/core/event_log.h"
#include "interpose/core/gpu.h"
#include "interpose/core/kernel_trace.h"
#include "interpose/core/streams.h"

namespace prism::interpose {

std::atomic<bool> g_gates_toggled_off{false};

namespace {
// PRISM_GATE_TOGGLE=N: after mark `it`, units are gated when (it / N) is even (the convention of
// PRISM_KERNELS_TOGGLE: tests/gpu/overhead_toggle.sh pools iteration times by block).
void GateToggleAtIteration(uint32_t it) {
  const Config& cfg = Cfg();
  if (cfg.gate_toggle <= 0) return;
  const bool off = (it / static_cast<uint32_t>(cfg.gate_toggle)) % 2 == 1;
  if (g_gates_toggled_off.exchange(off, std::memory_order_relaxed) == off) return;
  static std::atomic<bool> warned{false};
  if (cfg.world_size > 1 && !warned.exchange(true))
    Log("interpose")->warn("PRISM_GATE_TOGGLE at world {}: ungated blocks run ahead of the virtual ranks", cfg.world_size);
  Log("interpose")->info("PRISM_GATE_TOGGLE: units {} from iteration {}", off ? "not gated" : "gated", it + 1);
}
}  // namespace

int IterationMark(cudaStream_t stream, uint64_t torch_max_allocated) {
  static std::atomic<uint32_t> next{0};
  EventLogStart();
  uint32_t it = next.fetch_add(1);
  Gpu& gpu = TheGpu();
  volatile uint64_t* word = nullptr;
  if (gpu.EnsureReady()) {
    gpu.EnsureContext();
    word = gpu.IterWord(it);
    *word = 0;
    if (gpu.StampIteration(reinterpret_cast<CUstream>(stream), it) != CUDA_SUCCESS) word = nullptr;
  }
  LogIteration(it, word, HostNowNs(), torch_max_allocated, KnownStreamIndex(reinterpret_cast<CUstream>(stream)));
  KernelTraceAtIteration(it);
  GateToggleAtIteration(it);
  return static_cast<int>(it);
}

}  // namespace prism::interpose
