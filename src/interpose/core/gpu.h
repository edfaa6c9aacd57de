// The shim's own GPU work, behind an interface so that unit tests fake the CUDA boundary (as libkineto's
// CuptiActivityApi). The real implementation (DriverGpu) uses only the CUDA driver API and the kernels of the
// embedded fatbin: arrival stamps, gates, payload steps, clock calibration.
//
// Arrival stamps are kernel writes of %globaltimer into host-mapped words (PRISM_ARRIVAL=kernel, the default), which
// the progress thread reads without a CUDA call, or event records (PRISM_ARRIVAL=event): cuEventRecord costs the
// calling thread less than a launch, but the progress thread must query the event and read its time as an anchor
// event's %globaltimer value plus the elapsed time between the two (docs/libprism.md, "Arrival stamps", says what
// each measured). Event stamps are never used where a driver call from the progress thread could block (a process
// the coordinator may checkpoint) or where CUPTI aligns its clock on the stamp kernels (PRISM_KERNELS).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>

#include "interpose/core/config.h"
#include "nccl_patch/semantics.h"

namespace prism::interpose {

// Slots of host-mapped memory: one arrival word and one gate word per in-flight operation (a ring), plus a
// ring of iteration stamps.
inline constexpr uint32_t kGateSlots = 16384;
inline constexpr uint32_t kIterSlots = 1024;

struct ClockCalibration {
  int64_t gpu_minus_host_ns = 0;      // %globaltimer - CLOCK_REALTIME (re-measured at most every second)
  int64_t wait_release_ns = 10000;    // host writes a wait-gate word -> the stream runs on (measured)
  int64_t spin_release_ns = 10000;    // same for the spinning gate with one CTA
};

class Gpu {
 public:
  virtual ~Gpu() = default;
  // One-time setup on a thread whose current context is the job's (module load, warm-up of every own kernel,
  // slot memory, clock calibration). Idempotent and thread-safe; false when the GPU cannot be used (logged).
  virtual bool EnsureReady() = 0;
  // Host views of the slot words (valid after EnsureReady). ArrivalWord holds kernel stamps only: read arrivals
  // through Arrival().
  virtual volatile uint64_t* ArrivalWord(uint32_t slot) = 0;
  virtual volatile uint32_t* GateWord(uint32_t slot) = 0;
  virtual volatile uint64_t* IterWord(uint32_t slot) = 0;
  virtual ClockCalibration Calibration() const = 0;
  // Calibration().wait_release_ns without reading the clock (it is measured once, at set-up): per unit.
  virtual int64_t WaitReleaseNs() const { return Calibration().wait_release_ns; }
  // Enqueue on `stream`: the arrival stamp of `slot`; a gate that holds the stream until GateWord(slot) reaches
  // `ticket`; one payload step; an iteration stamp. CUDA_SUCCESS or the driver's error.
  virtual CUresult Stamp(CUstream stream, uint32_t slot) = 0;
  // The arrival stamp of `slot` on the GPU clock (%globaltimer, Unix-epoch ns); 0 while the stream has not reached
  // it. Called by the progress thread.
  virtual uint64_t Arrival(uint32_t slot) { return *ArrivalWord(slot); }
  // Forgets the slot's earlier stamp: called before the slot is stamped again, so that an unstamped slot reads 0.
  virtual void ClearArrival(uint32_t slot) { *ArrivalWord(slot) = 0; }
  // Stamps from now on are kernel writes (see the top of this file); `why` is logged.
  virtual void UseKernelStamps(const char* why) {}
  // The arrival stamp fused with the unit's first payload step (one launch instead of two).
  virtual CUresult StampAndStep(CUstream stream, uint32_t slot, const payload::OpDesc& desc,
                                const payload::Step& step) = 0;
  virtual CUresult Gate(CUstream stream, uint32_t slot, uint32_t ticket, GateKind kind, int ctas) = 0;
  virtual CUresult RunStep(CUstream stream, const payload::OpDesc& desc, const payload::Step& step) = 0;
  virtual CUresult StampIteration(CUstream stream, uint32_t iter_slot) = 0;
  // True when the stream is being captured into a CUDA graph (gates would be recorded into the graph).
  virtual bool Capturing(CUstream stream) = 0;
  // Makes the job's context current on this thread if another one is.
  virtual void EnsureContext() = 0;
  // Release latency of a spinning gate of `ctas` CTAs (measured on first use of that count, on this thread).
  virtual int64_t SpinReleaseNs(int ctas) = 0;
  // Real data through the host (exchange between real members, recorded payloads): a copy on `stream` between
  // device memory and host memory from HostStaging (or any host memory for host-to-device), and a wait for the
  // stream. HostStaging gives page-locked memory of at least `bytes`, owned by this thread, valid until its next
  // call on this thread (nullptr when it cannot be had).
  virtual CUresult CopyAsync(CUstream stream, uint64_t dst, uint64_t src, uint64_t bytes) = 0;
  virtual CUresult Synchronize(CUstream stream) = 0;
  virtual uint8_t* HostStaging(size_t bytes) = 0;
  // Re-measures the GPU-host clock offset when the last measurement is older than a second (the clocks drift by
  // a few us per second). Called on job threads between operations; never blocks more than ~0.3 ms.
  virtual void MaybeRecalibrate() = 0;
};

// Set by the cudaStreamBeginCapture wrappers: once any capture began, units check their stream's capture state.
void NoteCaptureBegan();

// The current runtime's GPU (runtime.h): DriverGpuOfProcess() unless the runtime was given a fake.
Gpu& TheGpu();
// The CUDA driver's implementation, one per process, created on first call (no CUDA call until EnsureReady).
Gpu& DriverGpuOfProcess();

// Host clock in the same epoch as %globaltimer (CLOCK_REALTIME, ns).
uint64_t HostNowNs();

}  // namespace prism::interpose
