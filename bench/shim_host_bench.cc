// Host cost of libprism's collective path without the driver: Submit() of an fp32 SUM all-reduce with the GPU
// boundary faked (tests/unit/shim_fake_gpu.h), so what is left is libprism's own work per call (validation,
// planning, cost model, slot/ticket, progress queue). The GPU suite measures the whole (driver calls included);
// the difference between the two is what the two driver calls per collective cost.
//   build/bin/shim_host_bench [calls] [gap_us] [evict_mib]   prints median and p90 ns per call over 5 runs, for fixed
//   and model durations, and how many calls woke the progress thread; gap_us > 0 spaces the calls (each after the
//   progress thread went idle); evict_mib > 0 writes that many MiB between calls, untimed, as a training step's
//   kernels launches and tensors do between two collectives, so that each call finds its data out of cache
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "../tests/unit/shim_fake_gpu.h"
#include "interpose/core/comm.h"
#include "interpose/core/config.h"
#include "interpose/core/progress.h"
#include "interpose/core/runtime.h"
#include "interpose/core/submit.h"

using namespace prism::interpose;

namespace {

// gap_us > 0: a call every gap_us (the wait not timed), so that the progress thread has released everything and
// sleeps before each call, as between the collectives of a GPU-bound job; 0: back to back.
double RunOnce(Comm* comm, int calls, int gap_us, std::vector<char>* evict, std::vector<double>* per_call) {
  std::vector<float> buf(1024, 1.0f);
  OpCall call;
  call.op = prism::payload::OpKind::kAllReduce;
  call.comm = comm;
  call.count = buf.size();
  call.send = buf.data();
  call.recv = buf.data();
  per_call->clear();
  for (int i = 0; i < calls; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    Submit(call);
    auto t1 = std::chrono::steady_clock::now();
    per_call->push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    if (!evict->empty()) {
      for (size_t b = 0; b < evict->size(); b += 64) (*evict)[b] = static_cast<char>(b + i);
      asm volatile("" : : "r"(evict->data()) : "memory");  // Why: the writes must happen
    }
    if (gap_us > 0) {
      ProgressDrain(5000000000ull);
      std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
    } else if ((i & 255) == 255) {
      ProgressDrain(5000000000ull);  // keep the in-flight ring from filling
    }
  }
  ProgressDrain(5000000000ull);
  std::sort(per_call->begin(), per_call->end());
  return (*per_call)[per_call->size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 20000;
  const int gap_us = argc > 2 ? std::atoi(argv[2]) : 0;
  const int evict_mib = argc > 3 ? std::atoi(argv[3]) : 0;
  if (calls <= 0 || gap_us < 0 || evict_mib < 0) {
    std::fprintf(stderr, "usage: shim_host_bench [calls>0] [gap_us>=0] [evict_mib>=0]\n");
    return 2;
  }
  std::vector<char> evict(static_cast<size_t>(evict_mib) << 20);
  testing::FakeGpu gpu;
  gpu.stamp_arrivals = true;
  struct Durations {
    const char* name;
    double fixed_us;
  };
  for (const Durations& d : {Durations{"fixed", 1.0}, Durations{"cost-model", -1.0}}) {
    Config c;
    c.rank = 5;
    c.world_size = 1024;
    c.fixed_dur_us = d.fixed_us;
    ScopedRuntime rt({.config = c, .gpu = &gpu});
    ncclUniqueId id;
    GetUniqueId(&id);
    InitArgs a;
    a.nranks = 1024;
    a.rank = 5;
    a.ids = &id;
    Comm* comm = nullptr;
    if (CommInit(a, &comm) != ncclSuccess) return 1;
    std::vector<double> meds, p90s, v;
    const uint64_t wakes0 = ProgressWakes();
    for (int run = 0; run < 5; ++run) {
      meds.push_back(RunOnce(comm, calls, gap_us, &evict, &v));
      p90s.push_back(v[v.size() * 9 / 10]);
      std::lock_guard<std::mutex> l(gpu.mu);
      gpu.steps.clear();
      gpu.descs.clear();
      gpu.gates.clear();
    }
    std::sort(meds.begin(), meds.end());
    std::sort(p90s.begin(), p90s.end());
    std::printf("libprism host path without driver calls (%s durations): median %.0f ns, p90 %.0f ns per "
                "all-reduce (median of 5 runs x %d calls, %s%s); %.2f progress-thread wake-ups per call\n",
                d.name, meds[2], p90s[2], calls, gap_us > 0 ? "spaced" : "back to back",
                evict_mib > 0 ? ", caches evicted between calls" : "",
                static_cast<double>(ProgressWakes() - wakes0) / (5.0 * calls));
    ProgressDrain(5000000000ull);  // before the runtime goes (untimed)
  }
  return 0;
}
