#include "interpose/core/gpu.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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
    CUdeviceptr p = arrival_dev_ + sizeof(uint64_t) * (slot % kGateSlots);
    void* args[] = {&p};
    return d().cuLaunchKernel(k_stamp_, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr);
  }

  CUresult StampAndStep(CUstream stream, uint32_t slot, const payload::OpDesc& desc,
                        const payload::Step& st) override {
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
    CUdeviceptr p = iter_dev_ + sizeof(uint64_t) * (iter_slot % kIterSlots);
    void* args[] = {&p};
    return d().cuLaunchKernel(k_stamp_, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr);
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
    // Slot memory: host-mapped, so the host reads arrivals and writes gates without CUDA calls.
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
    return true;
  }

  // Launches every own kernel once (the lazy-loading hazard of gpu-machine-findings.md: the first launch of a
  // kernel queued behind a held stream blocked the launching thread).
  bool Warm() {
    const DriverFns& f = d();
    CUresult r;
    const uint32_t slot = kGateSlots - 2;
    if ((r = Stamp(stream_, slot)) != CUDA_SUCCESS) return Fail("warm prism_stamp", r);
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
      if (Stamp(stream_, slot) != CUDA_SUCCESS) break;
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
  std::mutex probe_mu_;  // the private stream's probes (calibration)
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
};

std::atomic<Gpu*> g_fake{nullptr};

}  // namespace

void NoteCaptureBegan() { g_capture_began.store(true, std::memory_order_relaxed); }

Gpu& TheGpu() {
  if (Gpu* f = g_fake.load(std::memory_order_acquire)) return *f;
  static DriverGpu* g = new DriverGpu();  // Why leaked: the progress thread reads its slots until exit.
  return *g;
}

void SetGpuForTest(Gpu* fake) { g_fake.store(fake, std::memory_order_release); }

}  // namespace prism::interpose
