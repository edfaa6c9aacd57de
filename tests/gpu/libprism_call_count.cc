// How many times a process calls the CUDA runtime entry points libprism_cost_bench times (issue 27): an LD_PRELOAD
// library that counts each call and forwards it to the next definition (libcudart, or libprism when preloaded after
// it). At exit it appends one line per process to $PRISM_CALL_COUNT_OUT (stderr when unset):
//   CALLS pid=<pid> cudaGetDevice=<n> cudaSetDevice=<n> ...
// tests/gpu/libprism_cost.sh runs a job with two iteration counts and takes the difference over the extra
// iterations, so the start-up's calls cancel.
//
// Build: g++ -O2 -shared -fPIC -o libprism_call_count.so libprism_call_count.cc -I/usr/local/cuda/include -ldl
// Only calls through the dynamic libcudart are seen: libraries that link cudart statically (cuBLAS's own launches)
// are not, and neither are they by libprism, which interposes the same symbols.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace {

enum Op { kGetDevice, kSetDevice, kLaunchKernel, kEventRecord, kEventRecordWithFlags, kStreamWaitEvent,
          kEventQuery, kStreamQuery, kMalloc, kFree, kOps };
const char* const kNames[kOps] = {"cudaGetDevice",   "cudaSetDevice",       "cudaLaunchKernel",
                                  "cudaEventRecord", "cudaEventRecordWithFlags", "cudaStreamWaitEvent",
                                  "cudaEventQuery",  "cudaStreamQuery",     "cudaMalloc",
                                  "cudaFree"};
std::atomic<unsigned long long> g_count[kOps];

template <typename Fn>
Fn Next(const char* name) {
  static_assert(sizeof(Fn) == sizeof(void*));
  void* p = dlsym(RTLD_NEXT, name);
  if (p == nullptr) {
    std::fprintf(stderr, "libprism_call_count: no next definition of %s\n", name);
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

struct Report {
  ~Report() {
    unsigned long long total = 0;
    for (auto& c : g_count) total += c.load();
    if (total == 0) return;  // the launcher processes (torchrun's agent) make no CUDA calls
    const char* path = std::getenv("PRISM_CALL_COUNT_OUT");
    FILE* f = path != nullptr ? std::fopen(path, "a") : stderr;
    if (f == nullptr) return;
    std::fprintf(f, "CALLS pid=%d", static_cast<int>(getpid()));
    for (int i = 0; i < kOps; ++i) std::fprintf(f, " %s=%llu", kNames[i], g_count[i].load());
    std::fprintf(f, "\n");
    if (f != stderr) std::fclose(f);
  }
} g_report;

}  // namespace

#define COUNTED(ret, name, op, params, args)                              \
  extern "C" ret name params {                                            \
    static const auto next = Next<ret(*) params>(#name);                  \
    g_count[op].fetch_add(1, std::memory_order_relaxed);                  \
    return next args;                                                     \
  }

COUNTED(cudaError_t, cudaGetDevice, kGetDevice, (int* d), (d))
COUNTED(cudaError_t, cudaSetDevice, kSetDevice, (int d), (d))
COUNTED(cudaError_t, cudaLaunchKernel, kLaunchKernel,
        (const void* f, dim3 g, dim3 b, void** a, size_t sh, cudaStream_t s), (f, g, b, a, sh, s))
COUNTED(cudaError_t, cudaEventRecord, kEventRecord, (cudaEvent_t e, cudaStream_t s), (e, s))
COUNTED(cudaError_t, cudaEventRecordWithFlags, kEventRecordWithFlags,
        (cudaEvent_t e, cudaStream_t s, unsigned int fl), (e, s, fl))
COUNTED(cudaError_t, cudaStreamWaitEvent, kStreamWaitEvent, (cudaStream_t s, cudaEvent_t e, unsigned int fl),
        (s, e, fl))
COUNTED(cudaError_t, cudaEventQuery, kEventQuery, (cudaEvent_t e), (e))
COUNTED(cudaError_t, cudaStreamQuery, kStreamQuery, (cudaStream_t s), (s))
COUNTED(cudaError_t, cudaMalloc, kMalloc, (void** p, size_t n), (p, n))
COUNTED(cudaError_t, cudaFree, kFree, (void* p), (p))
