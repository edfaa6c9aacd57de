#include "interpose/core/gpu.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "common/log.h"
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

class DriverGpu final : public Gpu {
 public:
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
  ClockCalibration Calibration() const override { return calib_; }

  CUresult Stamp(CUstream stream, uint32_t slot) override {
    CUdeviceptr p = arrival_dev_ + sizeof(uint64_t) * (slot % kGateSlots);
    void* args[] = {&p};
    return d().cuLaunchKernel(k_stamp_, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr);
  }

  CUresult Gate(CUstream stream, uint32_t slot, uint32_t ticket, GateKind kind, int ctas) override {
    CUdeviceptr g = gate_dev_ + sizeof(uint32_t) * (slot % kGateSlots);
    if (kind == GateKind::kSpin) {
      void* args[] = {&g, &ticket};
      unsigned blocks = static_cast<unsigned>(std::max(1, ctas));
      return d().cuLaunchKernel(k_spin_, blocks, 1, 1, 32, 1, 1, 0, stream, args, nullptr);
    }
    // Why GEQ: tickets only grow, so a slot reused later never sees an old value as a release.
    return d().cuStreamWaitValue32(stream, g, ticket, CU_STREAM_WAIT_VALUE_GEQ);
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
    unsigned threads = payload::kPayloadThreadsPerBlock;
    switch (st.kind) {
      case StepKind::kTile: {
        void* args[] = {&dst, &src, &bytes, &tile};
        return d().cuLaunchKernel(f, payload::PayloadBlocks(bytes), 1, 1, threads, 1, 1, 0, stream, args, nullptr);
      }
      case StepKind::kScale:
      case StepKind::kPower: {
        void* args[] = {&dst, &src, &count, &dtype, &param};
        return d().cuLaunchKernel(f, payload::PayloadBlocks(count), 1, 1, threads, 1, 1, 0, stream, args, nullptr);
      }
      case StepKind::kMulScalar: {
        void* args[] = {&dst, &src, &count, &dtype, &param, &scalar};
        return d().cuLaunchKernel(f, payload::PayloadBlocks(count), 1, 1, threads, 1, 1, 0, stream, args, nullptr);
      }
      case StepKind::kFillRandom: {
        void* args[] = {&dst, &count, &dtype, &param, &base};
        return d().cuLaunchKernel(f, payload::PayloadBlocks(count), 1, 1, threads, 1, 1, 0, stream, args, nullptr);
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
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (d().cuStreamIsCapturing == nullptr || d().cuStreamIsCapturing(stream, &st) != CUDA_SUCCESS) return false;
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
  }

  void EnsureContext() override {
    CUcontext cur = nullptr;
    if (d().cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != ctx_ && ctx_ != nullptr) d().cuCtxSetCurrent(ctx_);
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
                         2 * sizeof(uint64_t);
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
    probe_ = iter_ + kIterSlots;
    probe_dev_ = iter_dev_ + sizeof(uint64_t) * kIterSlots;
    if ((r = f.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) return Fail("cuStreamCreate", r);
    if (!Warm()) return false;
    Calibrate();
    Log("interpose")->info(
        "GPU ready: clock offset {} ns, wait-gate release {} ns, spin-gate release {} ns", calib_.gpu_minus_host_ns,
        calib_.wait_release_ns, calib_.spin_release_ns);
    return true;
  }

  // Launches every own kernel once (the lazy-loading hazard of gpu-machine-findings.md: the first launch of a
  // kernel queued behind a held stream blocked the launching thread).
  bool Warm() {
    const DriverFns& f = d();
    CUresult r;
    if ((r = Stamp(stream_, kGateSlots - 1)) != CUDA_SUCCESS) return Fail("warm prism_stamp", r);
    if ((r = Gate(stream_, kGateSlots - 1, 0, GateKind::kSpin, 1)) != CUDA_SUCCESS)
      return Fail("warm prism_spin_gate", r);
    uint32_t zero = 0;
    CUdeviceptr flag = gate_dev_ + sizeof(uint32_t) * (kGateSlots - 1);
    CUdeviceptr out = probe_dev_;
    void* args[] = {&flag, &zero, &out};
    if ((r = f.cuLaunchKernel(k_probe_, 1, 1, 1, 32, 1, 1, 0, stream_, args, nullptr)) != CUDA_SUCCESS)
      return Fail("warm prism_clock_probe", r);
    payload::OpDesc desc;
    for (int k = 0; k < kNumStepKinds; ++k) {
      if (payload_[k] == nullptr) continue;
      payload::Step st;
      st.kind = static_cast<StepKind>(k);
      st.dtype = payload::DataType::kFloat32;
      if ((r = RunStep(stream_, desc, st)) != CUDA_SUCCESS) return Fail("warm payload kernel", r);
    }
    if ((r = f.cuStreamSynchronize(stream_)) != CUDA_SUCCESS) return Fail("warm synchronize", r);
    arrival_[kGateSlots - 1] = 0;
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

  void Calibrate() {
    const DriverFns& f = d();
    constexpr int kTrials = 7;
    volatile uint32_t* flag = gate_ + (kGateSlots - 1);
    CUdeviceptr flag_dev = gate_dev_ + sizeof(uint32_t) * (kGateSlots - 1);
    uint32_t ticket = 1;
    // GPU - host clock offset: the kernel reads %globaltimer right after it sees the host's write.
    int64_t best = INT64_MAX;
    for (int i = 0; i < kTrials; ++i, ++ticket) {
      *probe_ = 0;
      CUdeviceptr out = probe_dev_;
      void* args[] = {&flag_dev, &ticket, &out};
      if (f.cuLaunchKernel(k_probe_, 1, 1, 1, 32, 1, 1, 0, stream_, args, nullptr) != CUDA_SUCCESS) break;
      usleep(300);
      uint64_t t_host = HostNowNs();
      __atomic_store_n(flag, ticket, __ATOMIC_RELEASE);
      if (!WaitNonZero(probe_, 1000000000)) break;
      best = std::min<int64_t>(best, static_cast<int64_t>(*probe_) - static_cast<int64_t>(t_host));
    }
    f.cuStreamSynchronize(stream_);
    if (best != INT64_MAX) calib_.gpu_minus_host_ns = best;
    calib_.wait_release_ns = MeasureRelease(GateKind::kWait, &ticket);
    calib_.spin_release_ns = MeasureRelease(GateKind::kSpin, &ticket);
  }

  // Median time from the host's gate write to the stream running the next kernel.
  int64_t MeasureRelease(GateKind kind, uint32_t* ticket) {
    const DriverFns& f = d();
    constexpr int kTrials = 7;
    std::vector<int64_t> samples;
    const uint32_t slot = kGateSlots - 2;
    for (int i = 0; i < kTrials; ++i, ++*ticket) {
      arrival_[slot] = 0;
      if (Gate(stream_, slot, *ticket, kind, 1) != CUDA_SUCCESS) break;
      if (Stamp(stream_, slot) != CUDA_SUCCESS) break;
      usleep(300);
      uint64_t t_host = HostNowNs();
      __atomic_store_n(&gate_[slot], *ticket, __ATOMIC_RELEASE);
      if (!WaitNonZero(&arrival_[slot], 1000000000)) break;
      samples.push_back(static_cast<int64_t>(arrival_[slot]) - calib_.gpu_minus_host_ns - static_cast<int64_t>(t_host));
    }
    f.cuStreamSynchronize(stream_);
    arrival_[slot] = 0;
    if (samples.empty()) return 10000;
    std::sort(samples.begin(), samples.end());
    return std::max<int64_t>(0, samples[samples.size() / 2]);
  }

  std::mutex mu_;
  std::atomic<bool> ready_{false};
  bool failed_ = false;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction k_stamp_ = nullptr, k_spin_ = nullptr, k_probe_ = nullptr;
  CUfunction payload_[kNumStepKinds] = {};
  CUstream stream_ = nullptr;
  volatile uint64_t* arrival_ = nullptr;
  volatile uint32_t* gate_ = nullptr;
  volatile uint64_t* iter_ = nullptr;
  volatile uint64_t* probe_ = nullptr;
  CUdeviceptr arrival_dev_ = 0, gate_dev_ = 0, iter_dev_ = 0, probe_dev_ = 0;
  ClockCalibration calib_;
};

std::atomic<Gpu*> g_fake{nullptr};

}  // namespace

Gpu& TheGpu() {
  if (Gpu* f = g_fake.load(std::memory_order_acquire)) return *f;
  static DriverGpu* g = new DriverGpu();  // Why leaked: the progress thread reads its slots until exit.
  return *g;
}

void SetGpuForTest(Gpu* fake) { g_fake.store(fake, std::memory_order_release); }

}  // namespace prism::interpose
