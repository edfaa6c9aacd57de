// What a collective's arrival stamp costs the calling thread (issue 27; docs/libprism.md "Arrival stamps"): ns per
// call of each way to stamp, and of a unit's stamp + gate, with a second thread reading the stamps as libprism's
// progress thread does (host-mapped words, or cuEventQuery on every pending event, or on the oldest one only).
//
//   arrival_stamp_bench [CALLS=20000] [REPS=5]
// Prints "STAMP case=<name> median_ns=<x> min_ns=<y>" per case (median and minimum over REPS blocks of CALLS calls;
// the stream is synchronised every 200 calls so the queue never fills, and the gates are open), then
// "STAMP case=futex_wake_of_sleeper median_ns=<x> p90_ns=<y>": what waking a thread asleep on a futex costs the
// waker (libprism's push of a unit to an idle progress thread), each wake 200 us after the last.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

__global__ void Stamp(uint64_t* out) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *reinterpret_cast<volatile uint64_t*>(out) = t;
  __threadfence_system();
}

namespace {

constexpr int kBatch = 200;  // calls between synchronisations: the progress thread's pending units in the suite

void Check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "arrival_stamp_bench: %s: CUDA error %d\n", what, static_cast<int>(r));
    std::exit(1);
  }
}

// Reader modes of the second thread: none, host-mapped words, every pending event, the oldest pending event.
enum class Reader { kNone, kWords, kAllEvents, kOldestEvent };

struct Shared {
  std::atomic<bool> stop{false};
  std::atomic<int> issued{0};  // calls enqueued in the current batch
  Reader mode = Reader::kNone;
  CUevent* events = nullptr;
  volatile uint64_t* words = nullptr;
};

// The progress thread's pattern: every 2 us, read what the batch issued so far.
void ReaderLoop(Shared* s, CUcontext ctx) {
  cuCtxSetCurrent(ctx);
  uint64_t sink = 0;
  while (!s->stop.load(std::memory_order_relaxed)) {
    const int n = s->issued.load(std::memory_order_acquire);
    if (s->mode == Reader::kWords) {
      for (int i = 0; i < n; ++i) sink += s->words[i];
    } else if (s->mode == Reader::kAllEvents) {
      for (int i = 0; i < n; ++i) sink += cuEventQuery(s->events[i]) == CUDA_SUCCESS;
    } else if (s->mode == Reader::kOldestEvent) {
      for (int i = 0; i < n; ++i) {
        if (cuEventQuery(s->events[i]) != CUDA_SUCCESS) break;
        ++sink;
      }
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(2);
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  if (sink == 42) std::printf(" ");
}

long Futex(std::atomic<uint32_t>* word, int op, uint32_t val) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, nullptr, nullptr, 0);
}

// The waker's cost of FUTEX_WAKE when the other thread sleeps in FUTEX_WAIT (as ProgressPush with an idle progress
// thread): `n` wakes, each after a 200 us pause in which the sleeper went back to sleep.
void FutexWakeCase(int n) {
  std::atomic<uint32_t> word{0};
  std::atomic<int> asleep{0};
  std::atomic<bool> stop{false};
  std::thread sleeper([&] {
    for (;;) {
      const uint32_t w = word.load();  // Why before `stop`: a stop and wake after this read make the wait return
      if (stop.load()) break;
      asleep.store(1);
      Futex(&word, FUTEX_WAIT_PRIVATE, w);
      asleep.store(0);
    }
  });
  std::vector<double> ns;
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    const auto t0 = std::chrono::steady_clock::now();
    word.fetch_add(1);
    if (asleep.load()) Futex(&word, FUTEX_WAKE_PRIVATE, 1);
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  stop.store(true);
  word.fetch_add(1);
  Futex(&word, FUTEX_WAKE_PRIVATE, 1);
  sleeper.join();
  std::sort(ns.begin(), ns.end());
  std::printf("STAMP case=futex_wake_of_sleeper median_ns=%.1f p90_ns=%.1f\n", ns[ns.size() / 2],
              ns[ns.size() * 9 / 10]);
}

}  // namespace

int main(int argc, char** argv) {
  const long calls = argc > 1 ? std::atol(argv[1]) : 20000;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  Check(cuInit(0), "cuInit");
  CUdevice dev;
  CUcontext ctx;
  Check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  Check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  CUstream stream;
  Check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  void* host = nullptr;
  Check(cuMemHostAlloc(&host, 8 * (kBatch + 1), CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
  CUdeviceptr dev_words;
  Check(cuMemHostGetDevicePointer(&dev_words, host, 0), "cuMemHostGetDevicePointer");
  auto* words = static_cast<volatile uint64_t*>(host);
  words[kBatch] = 1;  // the gate word: already open
  const CUdeviceptr gate = dev_words + 8 * kBatch;
  std::vector<CUevent> timed(kBatch), untimed(kBatch);
  for (int i = 0; i < kBatch; ++i) {
    Check(cuEventCreate(&timed[i], CU_EVENT_DEFAULT), "cuEventCreate");
    Check(cuEventCreate(&untimed[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  }
  cudaSetDevice(0);

  Shared sh;
  sh.events = timed.data();
  sh.words = words;
  std::thread reader(ReaderLoop, &sh, ctx);

  auto stamp_kernel = [&](int i) {
    Stamp<<<1, 32, 0, reinterpret_cast<cudaStream_t>(stream)>>>(reinterpret_cast<uint64_t*>(dev_words + 8 * i));
  };
  auto wait = [&] { Check(cuStreamWaitValue32(stream, gate, 1, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32"); };
  struct Case {
    const char* name;
    Reader mode;
    std::function<void(int)> body;
  };
  const std::vector<Case> cases = {
      {"kernel_stamp", Reader::kNone, [&](int i) { stamp_kernel(i); }},
      {"event_record_timed", Reader::kNone, [&](int i) { Check(cuEventRecord(timed[i], stream), "rec"); }},
      {"event_record_untimed", Reader::kNone, [&](int i) { Check(cuEventRecord(untimed[i], stream), "rec"); }},
      {"stream_wait_value", Reader::kNone, [&](int) { wait(); }},
      {"unit_kernel_stamp+wait,reader_words", Reader::kWords, [&](int i) { stamp_kernel(i); wait(); }},
      {"unit_event+wait,no_reader", Reader::kNone, [&](int i) { Check(cuEventRecord(timed[i], stream), "rec"); wait(); }},
      {"unit_event+wait,reader_all_events", Reader::kAllEvents,
       [&](int i) { Check(cuEventRecord(timed[i], stream), "rec"); wait(); }},
      {"unit_event+wait,reader_oldest_event", Reader::kOldestEvent,
       [&](int i) { Check(cuEventRecord(timed[i], stream), "rec"); wait(); }},
  };
  for (const Case& c : cases) {
    std::vector<double> per_rep;
    for (int r = 0; r < reps; ++r) {
      double ns = 0;
      long done = 0;
      while (done < calls) {
        sh.mode = Reader::kNone;
        sh.issued.store(0, std::memory_order_release);
        Check(cuStreamSynchronize(stream), "cuStreamSynchronize");
        sh.mode = c.mode;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kBatch; ++i) {
          c.body(i);
          sh.issued.store(i + 1, std::memory_order_release);
        }
        ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        done += kBatch;
      }
      per_rep.push_back(ns / static_cast<double>(done));
    }
    std::sort(per_rep.begin(), per_rep.end());
    std::printf("STAMP case=%s median_ns=%.1f min_ns=%.1f\n", c.name, per_rep[per_rep.size() / 2], per_rep[0]);
    std::fflush(stdout);
  }
  sh.stop.store(true);
  reader.join();
  FutexWakeCase(2000);
  Check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  return 0;
}
