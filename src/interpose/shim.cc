// libprism entry: the constructor only reads the environment (no CUDA, no sockets, no threads); heavy setup waits
// for first use (ARCHITECTURE.md "Data flow", step 3). Also the C functions of the Python hook
// (python/sitecustomize.py) and of the GPU tests (tests/gpu/shim_*.py), documented in docs/libprism.md.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "interpose/api.h"
#include "interpose/core/comm.h"
#include "interpose/core/config.h"
#include "interpose/core/event_log.h"
#include "interpose/core/gpu.h"
#include "interpose/core/iteration.h"
#include "interpose/core/memory.h"
#include "interpose/core/progress.h"
#include "interpose/core/runtime.h"
#include "interpose/core/unit_stats.h"
#include "interpose/kernels.h"

using namespace prism::interpose;

namespace {

__attribute__((constructor)) void PrismConstructor() { LoadProcessRuntime(); }

// Why no progress-thread join: at exit the thread may be waiting on a GPU that is being torn down; the event
// file is what must be complete.
__attribute__((destructor)) void PrismDestructor() { EventLogStop(); }

std::vector<int32_t> Ranks(const int* ranks, int n) {
  std::vector<int32_t> v;
  if (ranks != nullptr && n > 0) v.assign(ranks, ranks + n);
  return v;
}

}  // namespace

PRISM_API const char* prism_version() { return "0.1.0"; }

PRISM_API int prism_kernels_present() { return FatbinPresent() ? 1 : 0; }

// Iteration mark (Python hook, after each optimizer step): stamps the GPU clock on `stream` (a cudaStream_t, 0 =
// legacy default stream) and records torch.cuda.max_memory_allocated(). Returns the iteration index, -1 on error.
PRISM_API int prism_iteration_mark(void* stream, unsigned long long torch_max_allocated) {
  return Guarded(-1, [&] { return IterationMark(static_cast<cudaStream_t>(stream), torch_max_allocated); });
}

// A torch process group's members (global ranks in group-rank order), after new_group/init_process_group.
PRISM_API int prism_register_group(const char* name, const int* ranks, int n, const char* desc) {
  return Guarded(-1, [&] {
    RegisterGroup(name ? name : "", Ranks(ranks, n), desc ? desc : "");
    return 0;
  });
}

// new_group(ranks) is about to run on this thread (communicators it creates eagerly belong to it).
PRISM_API int prism_group_begin(const int* ranks, int n) {
  return Guarded(-1, [&] {
    BeginGroupScope(Ranks(ranks, n));
    return 0;
  });
}

PRISM_API void prism_group_end() { EndGroupScope(); }

// Host time libprism spends per executed unit (q = 0.5: median), in ns.
PRISM_API unsigned long long prism_host_overhead_ns(double q) { return HostOverheadQuantileNs(q); }
PRISM_API unsigned long long prism_units_executed() { return UnitsExecuted(); }
PRISM_API unsigned long long prism_progress_wakes() { return ProgressWakes(); }
PRISM_API void prism_reset_stats() { ResetUnitStats(); }

PRISM_API unsigned long long prism_device_bytes_current() { return memory::CurrentBytes(); }
PRISM_API unsigned long long prism_device_bytes_peak() { return memory::PeakBytes(); }

// Waits until every gate handed to the progress thread has opened. 1 = drained, 0 = timeout.
PRISM_API int prism_drain(double timeout_s) {
  return ProgressDrain(static_cast<uint64_t>(timeout_s * 1e9)) ? 1 : 0;
}

// Clock calibration (ns): GPU - host clock now (the drift followed between probes), wait-gate and spin-gate release
// latency measured at GPU setup.
PRISM_API long long prism_calibration_ns(int which) {
  ClockCalibration c = TheGpu().Calibration();
  switch (which) {
    case 0: return c.gpu_minus_host_ns;
    case 1: return c.wait_release_ns;
    case 2: return c.spin_release_ns;
    default: return 0;
  }
}

PRISM_API const char* prism_events_path() {
  static thread_local std::string p;
  p = EventLogPath();
  return p.c_str();
}

// Flushes the event file (writes the bye line); later events are dropped. For tests and clean shutdown.
PRISM_API void prism_shutdown() { EventLogStop(); }
