#include "interpose/core/runtime.h"

#include <cstdlib>

#include "interpose/core/gpu.h"
#include "interpose/core/real_symbols.h"
#include "nccl_patch/semantics.h"

namespace prism::interpose {

namespace detail {

std::atomic<Runtime*> g_runtime{nullptr};

Runtime& ProcessRuntime() {
  // Why leaked: the progress thread, CUPTI's thread and atexit paths use it until the very end of the process.
  static Runtime* rt = new Runtime(Runtime::Parts{});
  return *rt;
}

}  // namespace detail

namespace {

const char* RealGetenv(const char* name) { return std::getenv(name); }

int PolicyOf(const Config& c) { return static_cast<int>(payload::ParsePolicy(c.payload.c_str())); }

}  // namespace

Runtime::Runtime(Parts parts)
    : config_(std::move(parts.config)),
      payload_policy_(PolicyOf(config_)),
      gpu_(parts.gpu != nullptr ? parts.gpu : &DriverGpuOfProcess()),
      nccl_(parts.nccl),
      driver_(parts.driver),
      kernel_tracer_(NewKernelTracer()),
      unit_stats_(NewUnitStats()),
      memory_(NewMemoryState()),
      recorded_(NewRecordedState()),
      comms_(NewCommRegistry()),
      coord_(NewCoordConn()) {}

Runtime::~Runtime() = default;

void Runtime::set_config(const Config& c) {
  config_ = c;
  payload_policy_ = PolicyOf(config_);
}

const NcclFns& Runtime::nccl() const { return nccl_ != nullptr ? *nccl_ : LoadedNccl(); }
const DriverFns& Runtime::driver() const { return driver_ != nullptr ? *driver_ : LoadedDriver(); }

void LoadProcessRuntime() {
  Runtime& rt = detail::ProcessRuntime();
  Config c;
  LoadConfig(&RealGetenv, &c);
  rt.set_config(c);
  detail::g_runtime.store(&rt, std::memory_order_release);
}

// The accessors the rest of core/ uses: views of the current runtime.
const Config& Cfg() { return Rt().config(); }
Gpu& TheGpu() { return Rt().gpu(); }
const NcclFns& RealNccl() { return Rt().nccl(); }
const DriverFns& Driver() { return Rt().driver(); }

}  // namespace prism::interpose
