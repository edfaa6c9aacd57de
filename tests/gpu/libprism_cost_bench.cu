// Bottom-up cost of libprism on a real rank (issue 27): nanoseconds per call of each CUDA runtime entry point a
// training step makes often, timed in one process over many calls. Run it natively and with libprism preloaded
// (tests/gpu/libprism_cost.sh alternates the two); the difference per call, times how many calls one iteration makes
// (libprism_call_count.cc), over the iteration time is libprism's share of the step.
//
//   libprism_cost_bench [CALLS=200000] [REPS=7]
// Prints one line per entry point: "COST op=<name> calls=<n> median_ns=<x> min_ns=<y>" (median and minimum over
// REPS blocks of CALLS calls).
//
// Why each op is what it is: torch's CUDAGuard asks cudaGetDevice (and sets the device when it differs) around
// every operator; every kernel goes through cudaLaunchKernel; the caching allocator records and waits on events
// per cross-stream use; cudaMalloc/cudaFree only on a cache miss. Launches are synchronised every 256 calls so the
// queue never fills (that would time the GPU, not the host).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

__global__ void Empty() {}

namespace {

double NsPerCall(long calls, const std::function<void(long)>& body) {
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < calls; ++i) body(i);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(calls);
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "libprism_cost_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const long calls = argc > 1 ? std::atol(argv[1]) : 200000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 7;
  if (calls <= 0 || reps <= 0) {
    std::fprintf(stderr, "usage: libprism_cost_bench [CALLS>0] [REPS>0]\n");
    return 2;
  }
  Check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t s1, s2;
  Check(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), "cudaStreamCreate");
  Check(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t ev;
  Check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  Empty<<<1, 1, 0, s1>>>();
  Check(cudaStreamSynchronize(s1), "warm-up launch");

  struct Op {
    std::string name;
    long calls;
    std::function<void(long)> body;
  };
  int dev = 0;
  const std::vector<Op> ops = {
      {"cudaGetDevice", calls, [&](long) { cudaGetDevice(&dev); }},
      {"cudaSetDevice", calls, [&](long) { cudaSetDevice(0); }},
      {"cudaLaunchKernel", calls,
       [&](long i) {
         Empty<<<1, 1, 0, s1>>>();
         if ((i & 255) == 255) cudaStreamSynchronize(s1);
       }},
      {"cudaEventRecord", calls, [&](long) { cudaEventRecord(ev, s1); }},
      {"cudaStreamWaitEvent", calls, [&](long) { cudaStreamWaitEvent(s2, ev, 0); }},
      {"cudaEventQuery", calls, [&](long) { cudaEventQuery(ev); }},
      {"cudaStreamQuery", calls, [&](long) { cudaStreamQuery(s1); }},
      {"cudaMalloc+cudaFree", std::max(1L, calls / 20),
       [&](long) {
         void* p = nullptr;
         if (cudaMalloc(&p, 1 << 20) == cudaSuccess) cudaFree(p);
       }},
  };
  for (const Op& op : ops) {
    std::vector<double> v;
    op.body(0);  // the first call of each may initialise something (libprism's lazy set-up, the driver's)
    for (int r = 0; r < reps; ++r) v.push_back(NsPerCall(op.calls, op.body));
    cudaDeviceSynchronize();
    std::sort(v.begin(), v.end());
    std::printf("COST op=%s calls=%ld median_ns=%.1f min_ns=%.1f\n", op.name.c_str(), op.calls, v[v.size() / 2],
                v.front());
    std::fflush(stdout);
  }
  Check(cudaGetLastError(), "the calls");
  return 0;
}
