#include "interpose/core/gpu.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/log.h"
#include "interpose/core/clock_model.h"
#include "interpose/core/real_symbols.h"
#include "interpose/kernels.h"

namespace prism::interpose {

uint64_t HostNowNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

namespace {

using payload::StepKind;

constexpr int kNumStepKinds = 8;
constexpr int kMaxCtas = 1024;
std::atomic<bool> g_capture_began{false};

uint64_t WorkItems(const payload::Step& st) {
  switch (st.kind) {
    case StepKind::kCopy:
    case StepKind::kTile:
    case StepKind::kFillZero: return st.bytes;
    default: return st.count;
  }
}

class DriverGpu final : public Gpu {
  // An event of the clock that event stamps are read against: its %globaltimer value, measured by bracketing the
  // stamp kernel between `start` and `end` on the private stream.
  struct Anchor {
    CUevent start = nullptr, end = nullptr;
    int64_t gpu_ns = 0;    // %globaltimer at `start` (0: none)
    int64_t width_ns = 0;  // end - start: the anchor's error is at most half of it
  };
  static constexpr int kAnchors = 4;  // a ring: the progress thread reads the published one and the one before

 public:
  DriverGpu() {
    for (auto& s : spin_release_) s.store(-1);
  }

  bool EnsureReady() override {
    if (ready_.load(std::memory_order_acquire)) return true;
    std::lock_guard<std::mutex> lock(mu_);
    if (ready_.load(std::memory_order_relaxed)) return true;
    if (failed_) return false;
    if (!Setup()) {
      failed_ = true;
      return false;
    }
    ready_.store(true, std::memory_order_release);
    return true;
  }

  volatile uint64_t* ArrivalWord(uint32_t slot) override { return &arrival_[slot % kGateSlots]; }
  volatile uint32_t* GateWord(uint32_t slot) override { return &gate_[slot % kGateSlots]; }
  volatile uint64_t* IterWord(uint32_t slot) override { return &iter_[slot % kIterSlots]; }
  int64_t WaitReleaseNs() const override { return wait_release_.load(std::memory_order_relaxed); }
  ClockCalibration Calibration() const override {
    return ClockCalibration{clock_.OffsetAt(HostNowNs()), wait_release_.load(std::memory_order_relaxed),
                            spin_release_[1].load(std::memory_order_relaxed)};
  }

  CUresult Stamp(CUstream stream, uint32_t slot) override {
    const uint32_t i = slot % kGateSlots;
    if (event_stamps_.load(std::memory_order_relaxed)) {
      const CUresult r = d().cuEventRecord(events_[i], stream);
      by_event_[i] = r == CUDA_SUCCESS;
      return r;
    }
    by_event_[i] = 0;
    return StampKernel(stream, arrival_dev_ + sizeof(uint64_t) * i);
  }

  uint64_t Arrival(uint32_t slot) override {
    const uint32_t i = slot % kGateSlots;
    if (!by_event_[i]) return arrival_[i];
    return EventTime(events_[i]);
  }

  void ClearArrival(uint32_t slot) override {
    const uint32_t i = slot % kGateSlots;
    by_event_[i] = 0;
    arrival_[i] = 0;
  }

  void UseKernelStamps(const char* why) override {
    std::lock_guard<std::mutex> lock(mu_);  // Why: SetupEventStamps runs under it and reads forced_why_
    forced_why_ = why;
    if (event_stamps_.exchange(false)) Log("interpose")->info("arrival stamps are kernel writes from now on: {}", why);
  }

  CUresult StampAndStep(CUstream stream, uint32_t slot, const payload::OpDesc& desc,
                        const payload::Step& st) override {
    if (event_stamps_.load(std::memory_order_relaxed)) {
      const CUresult r = Stamp(stream, slot);
      return r == CUDA_SUCCESS ? RunStep(stream, desc, st) : r;
    }
    if (k_fused_ == nullptr) {
      CUresult r = Stamp(stream, slot);
      return r == CUDA_SUCCESS ? RunStep(stream, desc, st) : r;
    }
    CUdeviceptr stamp = arrival_dev_ + sizeof(uint64_t) * (slot % kGateSlots);
    int kind = static_cast<int>(st.kind);
    CUdeviceptr dst = payload::StepAddr(desc, st.dst_buf, st.dst_offset);
    CUdeviceptr src = payload::StepAddr(desc, st.src_buf, st.src_offset);
    uint64_t bytes = st.bytes, tile = st.tile_bytes, count = st.count, param = st.param, base = st.index_base;
    int dtype = static_cast<int>(st.dtype);
    CUdeviceptr scalar = st.scalar_addr;
    void* args[] = {&stamp, &kind, &dst, &src, &bytes, &tile, &count, &dtype, &param, &base, &scalar};
    return d().cuLaunchKernel(k_fused_, payload::PayloadBlocks(WorkItems(st)), 1, 1, payload::kPayloadThreadsPerBlock,
                              1, 1, 0, stream, args, nullptr);
  }

  CUresult Gate(CUstream stream, uint32_t slot, uint32_t ticket, GateKind kind, int ctas) override {
    CUdeviceptr g = gate_dev_ + sizeof(uint32_t) * (slot % kGateSlots);
    if (kind == GateKind::kSpin) {
      void* args[] = {&g, &ticket};
      unsigned blocks = static_cast<unsigned>(std::clamp(ctas, 1, kMaxCtas));
      return d().cuLaunchKernel(k_spin_, blocks, 1, 1, 32, 1, 1, 0, stream, args, nullptr);
    }
    // Why GEQ: tickets only grow, so a slot reused later never sees an old value as a release.
    return d().cuStreamWaitValue32(stream, g, ticket, CU_STREAM_WAIT_VALUE_GEQ);
  }

  CUresult CopyAsync(CUstream stream, uint64_t dst, uint64_t src, uint64_t bytes) override {
    if (bytes == 0) return CUDA_SUCCESS;
    return d().cuMemcpyAsync(dst, src, bytes, stream);
  }
  CUresult Synchronize(CUstream stream) override { return d().cuStreamSynchronize(stream); }
  uint8_t* HostStaging(size_t bytes) override {
    struct Staging {
      void* p = nullptr;
      size_t cap = 0;
    };
    thread_local Staging st;  // Why never freed: a few job threads, reused for the life of the process
    if (bytes <= st.cap && st.p != nullptr) return static_cast<uint8_t*>(st.p);
    size_t cap = 1 << 20;
    while (cap < bytes) cap <<= 1;
    void* p = nullptr;
    if (d().cuMemHostAlloc(&p, cap, CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) return nullptr;
    if (st.p != nullptr) d().cuMemFreeHost(st.p);
    st.p = p;
    st.cap = cap;
    return static_cast<uint8_t*>(p);
  }

  CUresult RunStep(CUstream stream, const payload::OpDesc& desc, const payload::Step& st) override {
    CUdeviceptr dst = payload::StepAddr(desc, st.dst_buf, st.dst_offset);
    CUdeviceptr src = payload::StepAddr(desc, st.src_buf, st.src_offset);
    switch (st.kind) {
      case StepKind::kNoop:
        return CUDA_SUCCESS;
      case StepKind::kCopy:
        return d().cuMemcpyAsync(dst, src, st.bytes, stream);
      case StepKind::kFillZero:
        return d().cuMemsetD8Async(dst, 0, st.bytes, stream);
      default:
        break;
    }
    CUfunction f = payload_[static_cast<int>(st.kind)];
    if (f == nullptr) return CUDA_ERROR_NOT_FOUND;
    int dtype = static_cast<int>(st.dtype);
    uint64_t bytes = st.bytes, tile = st.tile_bytes, count = st.count, param = st.param, base = st.index_base;
    CUdeviceptr scalar = st.scalar_addr;
    const unsigned threads = payload::kPayloadThreadsPerBlock;
    const unsigned blocks = payload::PayloadBlocks(WorkItems(st));
    switch (st.kind) {
      case StepKind::kTile: {
        void* args[] = {&dst, &src, &bytes, &tile};
        return d().cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, stream, args, nullptr);
      }
      case StepKind::kScale:
      case StepKind::kPower: {
        void* args[] = {&dst, &src, &count, &dtype, &param};
        return d().cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, stream, args, nullptr);
      }
      case StepKind::kMulScalar: {
        void* args[] = {&dst, &src, &count, &dtype, &param, &scalar};
        return d().cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, stream, args, nullptr);
      }
      case StepKind::kFillRandom: {
        void* args[] = {&dst, &count, &dtype, &param, &base};
        return d().cuLaunchKernel(f, blocks, 1, 1, threads, 1, 1, 0, stream, args, nullptr);
      }
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }

  CUresult StampIteration(CUstream stream, uint32_t iter_slot) override {
    return StampKernel(stream, iter_dev_ + sizeof(uint64_t) * (iter_slot % kIterSlots));
  }

  bool Capturing(CUstream stream) override {
    // Why the flag: cuStreamIsCapturing costs a driver call per collective; jobs that never capture skip it.
    if (!g_capture_began.load(std::memory_order_relaxed)) return false;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (d().cuStreamIsCapturing == nullptr || d().cuStreamIsCapturing(stream, &st) != CUDA_SUCCESS) return false;
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
  }

  void EnsureContext() override {
    CUcontext cur = nullptr;
    if (d().cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != ctx_ && ctx_ != nullptr) d().cuCtxSetCurrent(ctx_);
  }

  int64_t SpinReleaseNs(int ctas) override {
    ctas = std::clamp(ctas, 1, kMaxCtas);
    int64_t v = spin_release_[ctas].load(std::memory_order_relaxed);
    if (v >= 0) return v;
    std::lock_guard<std::mutex> lock(probe_mu_);
    v = spin_release_[ctas].load();
    if (v < 0) {
      v = MeasureRelease(GateKind::kSpin, ctas);
      spin_release_[ctas].store(v);
    }
    return v;
  }

  void MaybeRecalibrate() override {
    const uint64_t now = HostNowNs();
    if (now - last_calib_ns_.load(std::memory_order_relaxed) < 1000000000ull) return;
    std::unique_lock<std::mutex> lock(probe_mu_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    last_calib_ns_.store(now);
    int64_t off;
    ++probes_;
    if (ProbeOffset(200000, &off)) {
      clock_.Add(now, off);
      ++probes_ok_;
    }
    if (event_stamps_.load(std::memory_order_relaxed)) RefreshAnchor();
    // Why a line every 10 s: the offset drifts (9 us/s between processes on the H200) and a probe needs an idle SM
    // within 0.2 ms, which a GPU-bound job may never leave. With a stale offset the progress thread opens each timed
    // gate late by the drift and logs it on time, so the lateness lands in the next compute gap of the filled graph
    // (docs/fill.md "Rounds and noise"). A rank stopped by a signal writes no exit line, hence a periodic one.
    if (now - last_clock_log_ns_ >= 10000000000ull) {
      const int64_t cur = clock_.OffsetAt(now);
      const double span_s = static_cast<double>(now - first_calib_ns_) * 1e-9;
      Log("interpose")->info("clock: offset {} ns, {:+} ns since the first calibration {:.1f} s ago ({:+.2f} us/s); "
                             "drift followed between probes {:+.2f} us/s; {} of {} probes in the last 10 s measured",
                             cur, cur - first_offset_ns_, span_s,
                             span_s > 0 ? 1e-3 * static_cast<double>(cur - first_offset_ns_) / span_s : 0.0,
                             clock_.RatePpm(), probes_ok_, probes_);
      if (event_stamps_.load(std::memory_order_relaxed)) {
        Log("interpose")->info("arrival anchors: {} of {} in the last 10 s taken (bracket {} ns), the last one {:+} ns "
                               "from the event clock's prediction over {:.1f} s",
                               anchors_taken_, anchors_tried_, anchor_width_ns_, anchor_step_ns_,
                               static_cast<double>(anchor_span_ns_) * 1e-9);
        anchors_taken_ = anchors_tried_ = 0;
      }
      last_clock_log_ns_ = now;
      probes_ = probes_ok_ = 0;
    }
  }

 private:
  static const DriverFns& d() { return Driver(); }

  bool Fail(const char* what, CUresult r) {
    const char* s = nullptr;
    if (d().cuGetErrorString) d().cuGetErrorString(r, &s);
    Log("interpose")->error("GPU setup failed at {}: CUDA error {} ({}); collectives will not be emulated", what,
                            static_cast<int>(r), s ? s : "?");
    return false;
  }

  bool Setup() {
    const DriverFns& f = d();
    if (!f.loaded || f.cuLaunchKernel == nullptr || f.cuStreamWaitValue32 == nullptr) {
      Log("interpose")->error("libcuda.so.1 not found or incomplete: collectives will not be emulated");
      return false;
    }
    if (!FatbinPresent()) {
      Log("interpose")->error("the embedded fatbin is empty (built without nvcc): collectives will not be emulated");
      return false;
    }
    CUresult r = f.cuInit(0);
    if (r != CUDA_SUCCESS) return Fail("cuInit", r);
    if ((r = f.cuCtxGetCurrent(&ctx_)) != CUDA_SUCCESS) return Fail("cuCtxGetCurrent", r);
    if (ctx_ == nullptr) {
      // Why: a job that reaches NCCL before any runtime call on this thread; the runtime uses the same
      // primary context, so retaining it here matches what cudaSetDevice would do.
      CUdevice dev = 0;
      if ((r = f.cuDeviceGet(&dev, Cfg().phys_device)) != CUDA_SUCCESS) return Fail("cuDeviceGet", r);
      if ((r = f.cuDevicePrimaryCtxRetain(&ctx_, dev)) != CUDA_SUCCESS) return Fail("cuDevicePrimaryCtxRetain", r);
      if ((r = f.cuCtxSetCurrent(ctx_)) != CUDA_SUCCESS) return Fail("cuCtxSetCurrent", r);
    }
    if ((r = f.cuModuleLoadData(&module_, prism_kernels_fatbin)) != CUDA_SUCCESS) return Fail("cuModuleLoadData", r);
    if ((r = f.cuModuleGetFunction(&k_stamp_, module_, "prism_stamp")) != CUDA_SUCCESS) return Fail("prism_stamp", r);
    if ((r = f.cuModuleGetFunction(&k_spin_, module_, "prism_spin_gate")) != CUDA_SUCCESS)
      return Fail("prism_spin_gate", r);
    if ((r = f.cuModuleGetFunction(&k_probe_, module_, "prism_clock_probe")) != CUDA_SUCCESS)
      return Fail("prism_clock_probe", r);
    if (f.cuModuleGetFunction(&k_fused_, module_, "prism_stamp_step") != CUDA_SUCCESS) k_fused_ = nullptr;
    for (int k = 0; k < kNumStepKinds; ++k) {
      const char* name = payload::KernelName(static_cast<StepKind>(k));
      if (name == nullptr) continue;
      if (f.cuModuleGetFunction(&payload_[k], module_, name) != CUDA_SUCCESS) {
        payload_[k] = nullptr;
        Log("interpose")->warn("payload kernel {} missing from the fatbin: its steps are skipped", name);
      }
    }
    // Slot memory: host-mapped, so the host reads kernel-stamped arrivals and writes gates without CUDA calls.
    const size_t bytes = sizeof(uint64_t) * kGateSlots + sizeof(uint32_t) * kGateSlots + sizeof(uint64_t) * kIterSlots +
                         4 * sizeof(uint64_t);
    void* host = nullptr;
    if ((r = f.cuMemHostAlloc(&host, bytes, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE)) != CUDA_SUCCESS)
      return Fail("cuMemHostAlloc", r);
    std::memset(host, 0, bytes);
    CUdeviceptr dev = 0;
    if ((r = f.cuMemHostGetDevicePointer(&dev, host, 0)) != CUDA_SUCCESS) return Fail("cuMemHostGetDevicePointer", r);
    arrival_ = static_cast<volatile uint64_t*>(host);
    arrival_dev_ = dev;
    gate_ = reinterpret_cast<volatile uint32_t*>(arrival_ + kGateSlots);
    gate_dev_ = dev + sizeof(uint64_t) * kGateSlots;
    iter_ = reinterpret_cast<volatile uint64_t*>(gate_ + kGateSlots);
    iter_dev_ = gate_dev_ + sizeof(uint32_t) * kGateSlots;
    probe_ = iter_ + kIterSlots;  // [0] result, [1] started
    probe_dev_ = iter_dev_ + sizeof(uint64_t) * kIterSlots;
    if ((r = f.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) return Fail("cuStreamCreate", r);
    if (!Warm()) return false;
    Calibrate();
    Log("interpose")->info("GPU ready: clock offset {} ns, wait-gate release {} ns, spin-gate (1 CTA) release {} ns",
                           clock_.OffsetAt(HostNowNs()), wait_release_.load(), spin_release_[1].load());
    SetupEventStamps();
    return true;
  }

  // Launches the stamp kernel: the stream's %globaltimer into the host-mapped word at `word`.
  CUresult StampKernel(CUstream stream, CUdeviceptr word) {
    void* args[] = {&word};
    return d().cuLaunchKernel(k_stamp_, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr);
  }

  // Makes the job's context current on the calling thread once (the progress thread's event queries need it).
  void EnsureThreadContext() {
    thread_local bool done = false;
    if (done) return;
    EnsureContext();
    done = true;
  }

  // An event's time on the GPU clock: the published anchor's %globaltimer value plus the elapsed time from the
  // anchor to the event (the anchor before it when that fails); 0 while the event has not completed.
  uint64_t EventTime(CUevent ev) {
    EnsureThreadContext();
    const CUresult q = d().cuEventQuery(ev);
    if (q == CUDA_ERROR_NOT_READY) return 0;
    if (q == CUDA_SUCCESS) {
      const int cur = anchor_.load(std::memory_order_acquire);
      for (int back = 0; back < 2; ++back) {
        const Anchor& a = anchors_[(cur + kAnchors - back) % kAnchors];
        float ms = 0;
        if (a.gpu_ns > 0 && d().cuEventElapsedTime(&ms, a.start, ev) == CUDA_SUCCESS)
          return static_cast<uint64_t>(a.gpu_ns + std::llround(static_cast<double>(ms) * 1e6));
      }
    }
    // Why the host clock rather than 0: a stamp that can never be read would hold its gate for ever.
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      Log("interpose")->error("an arrival event could not be read (CUDA error {}): such arrivals take the host clock",
                              static_cast<int>(q));
    const uint64_t now = HostNowNs();
    return static_cast<uint64_t>(static_cast<int64_t>(now) + clock_.OffsetAt(now));
  }

  // Enqueues anchor `i` on the private stream: an event, the stamp kernel (into probe_[2]), an event.
  bool EnqueueAnchor(int i) {
    probe_[2] = 0;
    const DriverFns& f = d();
    return f.cuEventRecord(anchors_[i].start, stream_) == CUDA_SUCCESS &&
           StampKernel(stream_, probe_dev_ + 2 * sizeof(uint64_t)) == CUDA_SUCCESS &&
           f.cuEventRecord(anchors_[i].end, stream_) == CUDA_SUCCESS;
  }

  // Reads an enqueued anchor: 1 measured (gpu_ns, width_ns set), 0 still in flight, -1 failed. The stamp lies
  // between the two events, so the start event's time is the stamp less half the bracket, within half of it.
  int HarvestAnchor(Anchor* a) {
    const CUresult q = d().cuEventQuery(a->end);
    if (q == CUDA_ERROR_NOT_READY) return 0;
    const uint64_t t = probe_[2];
    float ms = 0;
    if (q != CUDA_SUCCESS || t <= 1 || d().cuEventElapsedTime(&ms, a->start, a->end) != CUDA_SUCCESS) return -1;
    a->width_ns = std::llround(static_cast<double>(ms) * 1e6);
    a->gpu_ns = static_cast<int64_t>(t) - a->width_ns / 2;
    return 1;
  }

  // Why re-anchor: cuEventElapsedTime is a float of milliseconds, so its error grows with the distance from the
  // anchor (half a unit in the last place: 30 ns at 1 s, 1 us at 16 s). Once a second (MaybeRecalibrate, under
  // probe_mu_) the last enqueued anchor is read and published when its bracket is about as tight as the first one
  // (or its error, half the bracket, below the float's at the current anchor's distance), and the next one is
  // enqueued; a GPU too busy to run the stamp kernel at once leaves a wide bracket and the older anchor in place.
  void RefreshAnchor() {
    if (anchor_pending_ >= 0) {
      Anchor& a = anchors_[anchor_pending_];
      const int got = HarvestAnchor(&a);
      if (got == 0) return;
      ++anchors_tried_;
      const Anchor& cur = anchors_[anchor_.load(std::memory_order_relaxed)];
      const int64_t float_err_ns = (a.gpu_ns - cur.gpu_ns) >> 24;
      if (got > 0 && (a.width_ns <= first_width_ns_ + first_width_ns_ / 2 + 500 || a.width_ns / 2 <= float_err_ns)) {
        float ms = 0;
        if (d().cuEventElapsedTime(&ms, cur.start, a.start) == CUDA_SUCCESS) {
          const int64_t predicted = cur.gpu_ns + std::llround(static_cast<double>(ms) * 1e6);
          anchor_step_ns_ = a.gpu_ns - predicted;
          anchor_span_ns_ = a.gpu_ns - cur.gpu_ns;
          // Why a quarter of the step: the event clock and %globaltimer run at one rate (on an H100, steps of -0.4 and
          // +1.7 us over 3.7 and 1.2 s, either sign), so a step is mostly this bracket's error (up to half of it);
          // a quarter keeps arrivals continuous and averages that error out. A step over 20 us is taken whole.
          if (anchor_step_ns_ > -20000 && anchor_step_ns_ < 20000) a.gpu_ns = predicted + anchor_step_ns_ / 4;
        }
        anchor_width_ns_ = a.width_ns;
        anchor_.store(anchor_pending_, std::memory_order_release);
        ++anchors_taken_;
      }
      anchor_pending_ = -1;
    }
    const int next = (anchor_.load(std::memory_order_relaxed) + 1) % kAnchors;
    if (EnqueueAnchor(next)) anchor_pending_ = next;
  }

  // Event stamps: every slot's event and the anchors' created, the first anchor taken (the narrowest bracket of
  // 7), then a check logged: an event and a stamp kernel right after it on the idle private stream, the kernel's
  // %globaltimer less the event's time read as an arrival (median of 7; the launch gap, a microsecond or two).
  // Kernel stamps stay when anything fails.
  void SetupEventStamps() {
    const DriverFns& f = d();
    const Config& c = Cfg();
    const char* off = !c.arrival_by_event ? "PRISM_ARRIVAL=kernel (the default)"
                      : c.kernels != 0   ? "PRISM_KERNELS aligns CUPTI's clock on the stamp kernels"
                      : forced_why_ != nullptr ? forced_why_
                      : f.cuEventCreate == nullptr || f.cuEventRecord == nullptr || f.cuEventQuery == nullptr ||
                              f.cuEventElapsedTime == nullptr
                          ? "the driver lacks an event entry point"
                          : nullptr;
    if (off != nullptr) {
      Log("interpose")->info("arrival stamps are kernel writes: {}", off);
      return;
    }
    const uint64_t t0 = HostNowNs();
    CUresult r = CUDA_SUCCESS;
    for (uint32_t i = 0; i < kGateSlots && r == CUDA_SUCCESS; ++i) r = f.cuEventCreate(&events_[i], CU_EVENT_DEFAULT);
    for (Anchor& a : anchors_) {
      if (r == CUDA_SUCCESS) r = f.cuEventCreate(&a.start, CU_EVENT_DEFAULT);
      if (r == CUDA_SUCCESS) r = f.cuEventCreate(&a.end, CU_EVENT_DEFAULT);
    }
    if (r != CUDA_SUCCESS) {
      Fail("cuEventCreate (arrival stamps stay kernel writes)", r);
      return;
    }
    const uint64_t created_ns = HostNowNs() - t0;
    Anchor best;
    for (int i = 0; i < 7; ++i) {
      Anchor& a = anchors_[1];
      a.gpu_ns = 0;
      if (!EnqueueAnchor(1) || f.cuStreamSynchronize(stream_) != CUDA_SUCCESS || HarvestAnchor(&a) <= 0) continue;
      if (best.gpu_ns == 0 || a.width_ns < best.width_ns) {
        std::swap(anchors_[0], anchors_[1]);
        best = anchors_[0];
      }
    }
    anchors_[1].gpu_ns = 0;
    if (best.gpu_ns == 0) {
      Log("interpose")->warn("arrival stamps are kernel writes: no anchor of the event clock could be measured");
      return;
    }
    first_width_ns_ = anchor_width_ns_ = best.width_ns;
    anchor_.store(0, std::memory_order_release);
    std::vector<int64_t> gaps;
    const uint32_t slot = kGateSlots - 3;
    for (int i = 0; i < 7; ++i) {
      arrival_[slot] = 0;
      if (f.cuEventRecord(events_[slot], stream_) != CUDA_SUCCESS ||
          StampKernel(stream_, arrival_dev_ + sizeof(uint64_t) * slot) != CUDA_SUCCESS ||
          f.cuStreamSynchronize(stream_) != CUDA_SUCCESS)
        break;
      const uint64_t ev = EventTime(events_[slot]);
      if (ev != 0 && arrival_[slot] > 1) gaps.push_back(static_cast<int64_t>(arrival_[slot]) - static_cast<int64_t>(ev));
    }
    arrival_[slot] = 0;
    std::sort(gaps.begin(), gaps.end());
    event_stamps_.store(true, std::memory_order_release);
    Log("interpose")->info("arrival stamps are event records: {} events created in {:.1f} ms; anchor bracket {} ns; "
                           "a stamp kernel right after an event read {} ns after it (median of {})",
                           kGateSlots, static_cast<double>(created_ns) * 1e-6, best.width_ns,
                           gaps.empty() ? 0 : gaps[gaps.size() / 2], gaps.size());
  }

  // Launches every own kernel once (the lazy-loading hazard of gpu-machine-findings.md: the first launch of a
  // kernel queued behind a held stream blocked the launching thread).
  bool Warm() {
    const DriverFns& f = d();
    CUresult r;
    const uint32_t slot = kGateSlots - 2;
    if ((r = StampKernel(stream_, arrival_dev_ + sizeof(uint64_t) * slot)) != CUDA_SUCCESS)
      return Fail("warm prism_stamp", r);
    if ((r = Gate(stream_, slot, 0, GateKind::kSpin, 1)) != CUDA_SUCCESS) return Fail("warm prism_spin_gate", r);
    payload::OpDesc desc;
    payload::Step noop;
    noop.kind = StepKind::kFillZero;  // zero bytes: runs, touches nothing
    if ((r = StampAndStep(stream_, slot, desc, noop)) != CUDA_SUCCESS) return Fail("warm prism_stamp_step", r);
    for (int k = 0; k < kNumStepKinds; ++k) {
      if (payload_[k] == nullptr) continue;
      payload::Step st;
      st.kind = static_cast<StepKind>(k);
      st.dtype = payload::DataType::kFloat32;
      if ((r = RunStep(stream_, desc, st)) != CUDA_SUCCESS) return Fail("warm payload kernel", r);
    }
    int64_t off;
    ProbeOffset(1000000000, &off);  // also warms prism_clock_probe
    if ((r = f.cuStreamSynchronize(stream_)) != CUDA_SUCCESS) return Fail("warm synchronize", r);
    arrival_[slot] = 0;
    return true;
  }

  // Waits (bounded) for a host-mapped word to become non-zero.
  static bool WaitNonZero(volatile uint64_t* w, int64_t timeout_ns) {
    uint64_t start = HostNowNs();
    while (*w == 0) {
      if (static_cast<int64_t>(HostNowNs() - start) > timeout_ns) return false;
    }
    return true;
  }

  // One offset measurement on the private stream: the probe kernel says it started, the host writes the flag and
  // notes its clock, the kernel reads %globaltimer when it sees the flag. False when the probe did not start within
  // `start_timeout_ns` (GPU full) or did not answer.
  bool ProbeOffset(int64_t start_timeout_ns, int64_t* offset) {
    const DriverFns& f = d();
    volatile uint32_t* flag = gate_ + (kGateSlots - 1);
    CUdeviceptr flag_dev = gate_dev_ + sizeof(uint32_t) * (kGateSlots - 1);
    const uint32_t ticket = ++probe_ticket_;
    probe_[0] = 0;
    probe_[1] = 0;
    CUdeviceptr out = probe_dev_, started = probe_dev_ + sizeof(uint64_t);
    uint64_t timeout = 2000000;  // the kernel gives up after 2 ms of GPU time
    void* args[] = {&flag_dev, const_cast<uint32_t*>(&ticket), &out, &started, &timeout};
    if (f.cuLaunchKernel(k_probe_, 1, 1, 1, 32, 1, 1, 0, stream_, args, nullptr) != CUDA_SUCCESS) return false;
    const bool ran = WaitNonZero(&probe_[1], start_timeout_ns);
    const uint64_t t_host = HostNowNs();
    __atomic_store_n(flag, ticket, __ATOMIC_RELEASE);
    if (!ran || !WaitNonZero(&probe_[0], 5000000) || probe_[0] <= 1) return false;
    *offset = static_cast<int64_t>(probe_[0]) - static_cast<int64_t>(t_host);
    return true;
  }

  void Calibrate() {
    int64_t best = INT64_MAX, off;
    for (int i = 0; i < 7; ++i) {
      if (ProbeOffset(1000000000, &off)) best = std::min(best, off);
    }
    d().cuStreamSynchronize(stream_);
    last_calib_ns_.store(HostNowNs());
    first_calib_ns_ = last_clock_log_ns_ = last_calib_ns_.load();
    clock_.Reset(first_calib_ns_, best != INT64_MAX ? best : 0);
    first_offset_ns_ = clock_.OffsetAt(first_calib_ns_);
    wait_release_.store(MeasureRelease(GateKind::kWait, 1));
    spin_release_[1].store(MeasureRelease(GateKind::kSpin, 1));
  }

  // Median time from the host's gate write to the stream running the next kernel.
  int64_t MeasureRelease(GateKind kind, int ctas) {
    const DriverFns& f = d();
    constexpr int kTrials = 7;
    std::vector<int64_t> samples;
    const uint32_t slot = kGateSlots - 2;
    for (int i = 0; i < kTrials; ++i) {
      const uint32_t ticket = ++release_ticket_;
      arrival_[slot] = 0;
      if (Gate(stream_, slot, ticket, kind, ctas) != CUDA_SUCCESS) break;
      if (StampKernel(stream_, arrival_dev_ + sizeof(uint64_t) * slot) != CUDA_SUCCESS) break;
      usleep(300);
      uint64_t t_host = HostNowNs();
      __atomic_store_n(&gate_[slot], ticket, __ATOMIC_RELEASE);
      if (!WaitNonZero(&arrival_[slot], 1000000000)) break;
      samples.push_back(static_cast<int64_t>(arrival_[slot]) - clock_.OffsetAt(t_host) - static_cast<int64_t>(t_host));
    }
    f.cuStreamSynchronize(stream_);
    arrival_[slot] = 0;
    if (samples.empty()) return 10000;
    std::sort(samples.begin(), samples.end());
    return std::max<int64_t>(0, samples[samples.size() / 2]);
  }

  std::mutex mu_;
  std::mutex probe_mu_;  // the private stream's probes (calibration, anchors)
  std::atomic<bool> ready_{false};
  bool failed_ = false;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction k_stamp_ = nullptr, k_spin_ = nullptr, k_probe_ = nullptr, k_fused_ = nullptr;
  CUfunction payload_[kNumStepKinds] = {};
  CUstream stream_ = nullptr;
  volatile uint64_t* arrival_ = nullptr;
  volatile uint32_t* gate_ = nullptr;
  volatile uint64_t* iter_ = nullptr;
  volatile uint64_t* probe_ = nullptr;
  CUdeviceptr arrival_dev_ = 0, gate_dev_ = 0, iter_dev_ = 0, probe_dev_ = 0;
  uint32_t probe_ticket_ = 0;
  uint32_t release_ticket_ = 0;
  ClockModel clock_;  // written under probe_mu_ (and in Setup before ready_), read anywhere
  std::atomic<int64_t> wait_release_{10000};
  std::atomic<int64_t> spin_release_[kMaxCtas + 1];
  std::atomic<uint64_t> last_calib_ns_{0};
  // MaybeRecalibrate's account (under probe_mu_): the first calibration, the probes since the last clock line.
  uint64_t first_calib_ns_ = 0, last_clock_log_ns_ = 0;
  int64_t first_offset_ns_ = 0;
  uint64_t probes_ = 0, probes_ok_ = 0;
  // Event stamps (SetupEventStamps). by_event_[i]: slot i's last stamp is events_[i] (else arrival_[i]), written
  // by the stamping thread before the unit is handed to the progress thread.
  std::atomic<bool> event_stamps_{false};
  const char* forced_why_ = nullptr;  // UseKernelStamps's reason (under mu_; a string literal)
  CUevent events_[kGateSlots] = {};
  uint8_t by_event_[kGateSlots] = {};
  Anchor anchors_[kAnchors];
  std::atomic<int> anchor_{0};
  // RefreshAnchor's state and account (under probe_mu_).
  int anchor_pending_ = -1;
  int64_t first_width_ns_ = 0, anchor_width_ns_ = 0, anchor_step_ns_ = 0, anchor_span_ns_ = 0;
  uint64_t anchors_taken_ = 0, anchors_tried_ = 0;
};

}  // namespace

void NoteCaptureBegan() { g_capture_began.store(true, std::memory_order_relaxed); }

Gpu& DriverGpuOfProcess() {
  static DriverGpu* g = new DriverGpu();  // Why leaked: the progress thread reads its slots until exit.
  return *g;
}

}  // namespace prism::interpose
