// libprism's own timing kernels (loaded from the embedded fatbin through the driver API, warmed before the first
// gate). Host-visible words are host-mapped pinned memory (cuMemHostAlloc DEVICEMAP), passed as device pointers.
#include <stdint.h>

namespace prism_shim_kernels {

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t LoadVolatile(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// True once *word has reached `ticket` (32-bit wrap-around compare: tickets only grow).
__device__ __forceinline__ bool Reached(const uint32_t* word, uint32_t ticket) {
  return static_cast<int32_t>(LoadVolatile(word) - ticket) >= 0;
}

}  // namespace prism_shim_kernels

// Arrival stamp: the GPU time at which the stream reached an operation (%globaltimer, Unix-epoch ns).
extern "C" __global__ void prism_stamp(uint64_t* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    uint64_t t = prism_shim_kernels::GlobalTimerNs();
    *reinterpret_cast<volatile uint64_t*>(out) = t == 0 ? 1 : t;
    __threadfence_system();
  }
}

// Spinning gate (PRISM_GATE=spin): every CTA polls the gate word until it reaches `ticket`, so the kernel holds
// as many SMs as NCCL's channels would.
extern "C" __global__ void prism_spin_gate(const uint32_t* gate, uint32_t ticket) {
  if (threadIdx.x == 0) {
    while (!prism_shim_kernels::Reached(gate, ticket)) __nanosleep(200);
  }
  __syncthreads();
}

// Clock calibration: says it started (*started = 1), waits for the host to write `ticket` into *flag, then writes
// the GPU time into *out. The host notes its own clock when it writes; the difference is the GPU-host clock
// offset (+ one PCIe read). Gives up after `timeout_ns` of GPU time (writes 1: not a measurement), so a probe
// never holds its stream.
extern "C" __global__ void prism_clock_probe(const uint32_t* flag, uint32_t ticket, uint64_t* out, uint64_t* started,
                                             uint64_t timeout_ns) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    const uint64_t t0 = prism_shim_kernels::GlobalTimerNs();
    *reinterpret_cast<volatile uint64_t*>(started) = 1;
    __threadfence_system();
    uint64_t t = t0;
    while (!prism_shim_kernels::Reached(flag, ticket)) {
      t = prism_shim_kernels::GlobalTimerNs();
      if (t - t0 > timeout_ns) break;
    }
    t = prism_shim_kernels::Reached(flag, ticket) ? prism_shim_kernels::GlobalTimerNs() : 1;
    *reinterpret_cast<volatile uint64_t*>(out) = t;
    __threadfence_system();
  }
}
