// libprism's process state in one object: the configuration (config.h), the GPU interface (gpu.h, the class tests
// fake), the real NCCL and driver tables (real_symbols.h), and the state that lives as long as they do: the
// communicators (comm.cc), the coordinator connection (coord_client.cc), the host-time statistics (unit_stats.cc),
// recorded payloads (recorded.cc), memory accounting (memory.cc) and the kernel trace (kernel_trace.cc).
//
// The library constructor makes the process's runtime from the environment (reading it only: no CUDA, no sockets,
// no threads; each part sets itself up on first use). Tests construct their own, with a fake GPU, a fake NCCL or
// driver table and the configuration they need, installed for a scope (ScopedRuntime): a fresh runtime is fresh
// state, so no test resets process-wide globals.
//
// Hot path: Rt() is one pointer load (and a branch never taken once the library constructor ran); the parts are
// members or pointers set at construction (no lock, no allocation, no virtual call to reach them).
#pragma once

#include <atomic>
#include <memory>
#include <utility>

#include "interpose/core/config.h"

namespace prism::interpose {

class Gpu;
struct NcclFns;
struct DriverFns;

// The parts each file of core/ keeps its state in (defined there; created and destroyed with the runtime).
struct CommRegistry;   // comm.cc
struct CoordConn;      // coord_client.cc
struct UnitStats;      // unit_stats.cc
struct RecordedState;  // recorded.cc
struct MemoryState;    // memory.cc
struct KernelTracer;   // kernel_trace.cc
CommRegistry* NewCommRegistry();
CoordConn* NewCoordConn();
UnitStats* NewUnitStats();
RecordedState* NewRecordedState();
MemoryState* NewMemoryState();
KernelTracer* NewKernelTracer();
void DestroyPart(CommRegistry* p);
void DestroyPart(CoordConn* p);
void DestroyPart(UnitStats* p);
void DestroyPart(RecordedState* p);
void DestroyPart(MemoryState* p);
void DestroyPart(KernelTracer* p);

class Runtime {
 public:
  // What a runtime is made of. A part left null is the real one: DriverGpu (the CUDA driver and the embedded
  // kernels), the libnccl the job loaded (or PRISM_NCCL_LIBRARY), libcuda.so.1; the tables are resolved on first use.
  struct Parts {
    Config config;
    Gpu* gpu = nullptr;
    const NcclFns* nccl = nullptr;
    const DriverFns* driver = nullptr;
  };

  explicit Runtime(Parts parts);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Config& config() const { return config_; }
  // Replaces the configuration (tests, between operations: not synchronised with threads that read it).
  void set_config(const Config& c);
  Gpu& gpu() const { return *gpu_; }
  const NcclFns& nccl() const;
  const DriverFns& driver() const;
  // PRISM_PAYLOAD parsed (payload::Policy; kInvalid for a bad value: operation.cc logs it once and uses mirror).
  int payload_policy() const { return payload_policy_; }

  CommRegistry& comms() const { return *comms_; }
  CoordConn& coord() const { return *coord_; }
  UnitStats& unit_stats() const { return *unit_stats_; }
  RecordedState& recorded() const { return *recorded_; }
  MemoryState& memory() const { return *memory_; }
  KernelTracer& kernel_tracer() const { return *kernel_tracer_; }

 private:
  struct PartDeleter {
    template <typename T>
    void operator()(T* p) const { DestroyPart(p); }
  };
  template <typename T>
  using Part = std::unique_ptr<T, PartDeleter>;

  Config config_;
  int payload_policy_ = 0;
  Gpu* gpu_ = nullptr;
  const NcclFns* nccl_ = nullptr;
  const DriverFns* driver_ = nullptr;
  // Why the kernel tracer first: destroyed last, after the parts whose threads could still produce records.
  Part<KernelTracer> kernel_tracer_;
  Part<UnitStats> unit_stats_;
  Part<MemoryState> memory_;
  Part<RecordedState> recorded_;
  Part<CommRegistry> comms_;
  Part<CoordConn> coord_;
};

namespace detail {
[[gnu::visibility("hidden")]] extern std::atomic<Runtime*> g_runtime;
Runtime& ProcessRuntime();
}  // namespace detail

// The runtime libprism runs against: the one a ScopedRuntime installed, else the process's.
inline Runtime& Rt() {
  Runtime* r = detail::g_runtime.load(std::memory_order_acquire);
  return __builtin_expect(r != nullptr, 1) ? *r : detail::ProcessRuntime();
}

// The library constructor: the process's runtime, configured from the environment (getenv only).
void LoadProcessRuntime();

// A runtime installed for its own lifetime: Rt() returns it until it is destroyed, then the one before. How tests
// and benches inject a fake GPU, fake NCCL or driver tables and their configuration:
//   testing::FakeGpu gpu;
//   ScopedRuntime rt({.config = c, .gpu = &gpu});
// Not while other threads run operations (drain the progress thread first).
class ScopedRuntime {
 public:
  explicit ScopedRuntime(Runtime::Parts parts)
      : rt_(std::move(parts)), previous_(detail::g_runtime.exchange(&rt_, std::memory_order_acq_rel)) {}
  ~ScopedRuntime() { detail::g_runtime.store(previous_, std::memory_order_release); }
  ScopedRuntime(const ScopedRuntime&) = delete;
  ScopedRuntime& operator=(const ScopedRuntime&) = delete;

  Runtime& operator*() { return rt_; }
  Runtime* operator->() { return &rt_; }

 private:
  Runtime rt_;
  Runtime* previous_;
};

}  // namespace prism::interpose
