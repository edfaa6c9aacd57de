// Bottom-up cost of libprism on a real rank (issue 27): nanoseconds per call of each CUDA runtime entry point a
// training step makes often, timed in one process over many calls. Run it natively and with libprism preloaded
// (tests/gpu/libprism_cost.sh alternates the two); the difference per call, times how many calls one iteration makes
// (libprism_call_count.cc), over the iteration time is libprism's share of the step.
//
//   libprism_cost_bench [CALLS=200000] [REPS=7]
// Prints one line per entry point: "COST op=<name> calls=<n> median_ns=<x> min_ns=<y>" (median and minimum over
// REPS blocks of CALLS calls), and under libprism " wakes=<k> of <n>": how many of the case's calls woke libprism's
// sleeping progress thread.
//
// Why each op is what it is: torch's CUDAGuard asks cudaGetDevice (and sets the device when it differs) around
// every operator; every kernel goes through cudaLaunchKernel; the caching allocator records and waits on events
// per cross-stream use; cudaMalloc/cudaFree only on a cache miss. Launches are synchronised every 256 calls so the
// queue never fills (that would time the GPU, not the host).
//
// Collectives (COST_NCCL_RANKS set): ncclAllReduce of 1024 floats, out of place, on a communicator of that many ranks,
// this process its rank 0; natively COST_NCCL_LIB names the real libnccl (1 rank: the only communicator one GPU can
// hold natively, and NCCL's cheapest path: no group, plan or kernel of its own, an out-of-place all-reduce is one
// device copy; so the difference to libprism's is an upper bound), under libprism the preloaded symbols answer (8
// ranks: the other 7 virtual, the unit planned, timed and gated). Two cases: "ncclAllReduce" back to back (synchronised
// every 64 calls, the wait outside the timing) and "ncclAllReduce,idle", each call timed alone after the stream has
// drained, as a training step's collectives come (milliseconds apart; the wake count says whether each found
// libprism's progress thread asleep, as a job's do).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

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

// The NCCL entry points the collective cases call: the real library's (COST_NCCL_LIB, natively) or whatever the
// process resolves first (libprism's under LD_PRELOAD).
// Why nccl.h's declarations: ncclCommInitRank takes the 128-byte id by value (on the stack, not a pointer).
struct Nccl {
  using GetUniqueId = decltype(&ncclGetUniqueId);
  using CommInitRank = decltype(&ncclCommInitRank);
  using AllReduce = decltype(&ncclAllReduce);
  GetUniqueId get_unique_id = nullptr;
  CommInitRank comm_init_rank = nullptr;
  AllReduce all_reduce = nullptr;
  ncclComm_t comm = nullptr;
};

// Why a string rather than exiting: a machine without the library still gets the runtime rows.
std::string OpenNccl(int nranks, Nccl* n) {
  void* h = RTLD_DEFAULT;
  if (const char* lib = std::getenv("COST_NCCL_LIB"); lib != nullptr && *lib != '\0') {
    h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) return std::string("cannot load ") + lib + ": " + dlerror();
  }
  n->get_unique_id = reinterpret_cast<Nccl::GetUniqueId>(dlsym(h, "ncclGetUniqueId"));
  n->comm_init_rank = reinterpret_cast<Nccl::CommInitRank>(dlsym(h, "ncclCommInitRank"));
  n->all_reduce = reinterpret_cast<Nccl::AllReduce>(dlsym(h, "ncclAllReduce"));
  if (n->get_unique_id == nullptr || n->comm_init_rank == nullptr || n->all_reduce == nullptr)
    return "no ncclGetUniqueId/ncclCommInitRank/ncclAllReduce (set COST_NCCL_LIB or preload libprism)";
  ncclUniqueId id{};
  if (const int r = n->get_unique_id(&id); r != 0) return "ncclGetUniqueId returned " + std::to_string(r);
  if (const int r = n->comm_init_rank(&n->comm, nranks, id, 0); r != 0)
    return "ncclCommInitRank(" + std::to_string(nranks) + " ranks) returned " + std::to_string(r);
  return "";
}

// The mean of each call timed alone, `untimed` run between calls outside the timing.
double NsEachCall(long calls, const std::function<void(long)>& body, const std::function<void(long)>& untimed) {
  double sum = 0;
  for (long i = 0; i < calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    body(i);
    sum += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    untimed(i);
  }
  return sum / static_cast<double>(calls);
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
    std::function<void(long)> untimed;  // when set: each call timed alone, this run after it outside the timing
  };
  int dev = 0;
  std::vector<Op> ops = {
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
  Nccl nccl;
  float* buf = nullptr;
  if (const char* ranks = std::getenv("COST_NCCL_RANKS"); ranks != nullptr && *ranks != '\0') {
    std::string why = OpenNccl(std::atoi(ranks), &nccl);
    if (why.empty() && cudaMalloc(&buf, 2 * 1024 * sizeof(float)) != cudaSuccess) why = "cudaMalloc of the buffers";
    auto all_reduce = [&] { return nccl.all_reduce(buf, buf + 1024, 1024, ncclFloat, ncclSum, nccl.comm, s1); };
    // Why one checked call first: a call that failed fast would be timed as a cheap collective.
    if (why.empty()) {
      if (const ncclResult_t r = all_reduce(); r != ncclSuccess)
        why = "ncclAllReduce returned " + std::to_string(static_cast<int>(r));
      else if (cudaStreamSynchronize(s1) != cudaSuccess)
        why = "the first ncclAllReduce's stream";
    }
    if (!why.empty()) {
      std::printf("COST op=ncclAllReduce skipped: %s\n", why.c_str());
    } else {
      auto call = [&](long) { all_reduce(); };
      ops.push_back({"ncclAllReduce", std::max(1L, calls / 10), call,
                     [&](long i) {
                       if ((i & 63) == 63) cudaStreamSynchronize(s1);
                     }});
      ops.push_back({"ncclAllReduce,idle", std::max(1L, calls / 50), call,
                     [&](long) { cudaStreamSynchronize(s1); }});
    }
  }
  // Under libprism: how many of a case's calls woke its sleeping progress thread (a system call each).
  using Wakes = unsigned long long (*)();
  const auto wakes = reinterpret_cast<Wakes>(dlsym(RTLD_DEFAULT, "prism_progress_wakes"));
  for (const Op& op : ops) {
    const unsigned long long wakes0 = wakes != nullptr ? wakes() : 0;
    std::vector<double> v;
    op.body(0);  // the first call of each may initialise something (libprism's lazy set-up, the driver's)
    if (op.untimed) op.untimed(-1);
    for (int r = 0; r < reps; ++r)
      v.push_back(op.untimed ? NsEachCall(op.calls, op.body, op.untimed) : NsPerCall(op.calls, op.body));
    cudaDeviceSynchronize();
    std::sort(v.begin(), v.end());
    std::printf("COST op=%s calls=%ld median_ns=%.1f min_ns=%.1f", op.name.c_str(), op.calls, v[v.size() / 2],
                v.front());
    if (wakes != nullptr) std::printf(" wakes=%llu of %ld", wakes() - wakes0, 1 + reps * op.calls);
    std::printf("\n");
    std::fflush(stdout);
  }
  Check(cudaGetLastError(), "the calls");
  return 0;
}
