// GPU parity: the payload kernels in the embedded fatbin, launched through the driver API exactly as semantics.h
// prescribes for the shim, must write the same bytes as the CPU executor, for every op x dtype x policy x redop,
// on random bit patterns (NaN payloads, Inf, subnormals included). Skips where there is no CUDA driver or GPU
// (CI); meant for the GPU machine. This file doubles as a worked example of the GPU executor.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "interpose/kernels.h"
#include "nccl_patch/semantics.h"

namespace prism::payload {
namespace {

// The few driver API entry points we need, resolved from libcuda.so.1 (no link dependency, no cuda.h).
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;

struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**);
  CUresult (*cuCtxSynchronize)();
  CUfunction kernels[8] = {};  // by StepKind
  bool ready = false;
  std::string why_not;
};

template <typename F>
bool Resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

Driver& GetDriver() {
  static Driver driver = [] {
    Driver d{};
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      d.why_not = "no CUDA driver (libcuda.so.1)";
      return d;
    }
    bool ok = Resolve(lib, "cuInit", &d.cuInit) && Resolve(lib, "cuDeviceGet", &d.cuDeviceGet) &&
              Resolve(lib, "cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain) &&
              Resolve(lib, "cuCtxSetCurrent", &d.cuCtxSetCurrent) &&
              Resolve(lib, "cuModuleLoadData", &d.cuModuleLoadData) &&
              Resolve(lib, "cuModuleGetFunction", &d.cuModuleGetFunction) &&
              Resolve(lib, "cuMemAlloc_v2", &d.cuMemAlloc) && Resolve(lib, "cuMemFree_v2", &d.cuMemFree) &&
              Resolve(lib, "cuMemcpyHtoD_v2", &d.cuMemcpyHtoD) && Resolve(lib, "cuMemcpyDtoH_v2", &d.cuMemcpyDtoH) &&
              Resolve(lib, "cuMemcpyDtoDAsync_v2", &d.cuMemcpyDtoDAsync) &&
              Resolve(lib, "cuMemsetD8Async", &d.cuMemsetD8Async) &&
              Resolve(lib, "cuLaunchKernel", &d.cuLaunchKernel) &&
              Resolve(lib, "cuCtxSynchronize", &d.cuCtxSynchronize);
    if (!ok) {
      d.why_not = "driver API entry points missing";
      return d;
    }
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    if (d.cuInit(0) != 0 || d.cuDeviceGet(&dev, 0) != 0) {
      d.why_not = "no GPU (cuInit/cuDeviceGet failed)";
      return d;
    }
    if (d.cuDevicePrimaryCtxRetain(&ctx, dev) != 0 || d.cuCtxSetCurrent(ctx) != 0) {
      d.why_not = "no context";
      return d;
    }
    CUmodule mod = nullptr;
    if (!interpose::FatbinPresent() || d.cuModuleLoadData(&mod, prism_kernels_fatbin) != 0) {
      d.why_not = "embedded fatbin missing or not loadable";
      return d;
    }
    for (StepKind k : {StepKind::kCopy, StepKind::kTile, StepKind::kScale, StepKind::kPower, StepKind::kMulScalar,
                       StepKind::kFillZero, StepKind::kFillRandom}) {
      if (d.cuModuleGetFunction(&d.kernels[static_cast<int>(k)], mod, KernelName(k)) != 0) {
        d.why_not = std::string("kernel ") + KernelName(k) + " not in the embedded fatbin";
        return d;
      }
    }
    d.ready = true;
    return d;
  }();
  return driver;
}

// The GPU executor, as the shim runs it (stream 0 here).
bool ExecuteGpu(Driver& drv, const OpDesc& d, const Step& s) {
  CUdeviceptr dst = StepAddr(d, s.dst_buf, s.dst_offset);
  CUdeviceptr src = StepAddr(d, s.src_buf, s.src_offset);
  int dtype = static_cast<int>(s.dtype);
  uint64_t count = s.count;
  uint64_t bytes = s.bytes;
  uint64_t tile = s.tile_bytes;
  uint64_t param = s.param;
  uint64_t index_base = s.index_base;
  CUdeviceptr scalar_ptr = s.scalar_addr;
  CUfunction f = drv.kernels[static_cast<int>(s.kind)];
  uint64_t work = count;
  std::vector<void*> args;
  switch (s.kind) {
    case StepKind::kCopy: return drv.cuMemcpyDtoDAsync(dst, src, bytes, nullptr) == 0;
    case StepKind::kFillZero: return drv.cuMemsetD8Async(dst, 0, bytes, nullptr) == 0;
    case StepKind::kTile: args = {&dst, &src, &bytes, &tile}; work = bytes; break;
    case StepKind::kScale: case StepKind::kPower: args = {&dst, &src, &count, &dtype, &param}; break;
    case StepKind::kMulScalar: args = {&dst, &src, &count, &dtype, &param, &scalar_ptr}; break;
    case StepKind::kFillRandom: args = {&dst, &count, &dtype, &param, &index_base}; break;
    case StepKind::kNoop: return true;
  }
  return drv.cuLaunchKernel(f, PayloadBlocks(work), 1, 1, kPayloadThreadsPerBlock, 1, 1, 0, nullptr, args.data(),
                            nullptr) == 0;
}

TEST(PayloadGpu, KernelsMatchCpuExecutorBitForBit) {
  Driver& drv = GetDriver();
  if (!drv.ready) GTEST_SKIP() << drv.why_not;

  std::mt19937_64 gen(3);
  int cases = 0;
  for (int op = static_cast<int>(OpKind::kAllReduce); op <= static_cast<int>(OpKind::kRecv); ++op) {
    for (int dt = 0; dt < kNumDataTypes; ++dt) {
      for (Policy policy : {Policy::kMirror, Policy::kZeros, Policy::kRandom}) {
        for (int redop = 0; redop <= static_cast<int>(RedOp::kPreMulSum); ++redop) {
          const OpKind k = static_cast<OpKind>(op);
          const bool reduction = k == OpKind::kAllReduce || k == OpKind::kReduce || k == OpKind::kReduceScatter;
          if (!reduction && redop != 0) continue;
          for (uint64_t count : {uint64_t{1}, uint64_t{1001}, uint64_t{100003}}) {
            for (int in_place = 0; in_place < 2; ++in_place) {
              const int n = 5;
              const int rank = 3;
              const size_t es = DataTypeSize(static_cast<DataType>(dt));
              const size_t region = n * count * es;
              // Host arena: [send region][recv region][mirror send]; random bits everywhere.
              std::vector<uint8_t> host(3 * region);
              for (auto& b : host) b = static_cast<uint8_t>(gen());
              OpDesc d;
              d.op = k;
              d.dtype = static_cast<DataType>(dt);
              d.redop = static_cast<RedOp>(redop);
              d.policy = policy;
              d.nranks = n;
              d.rank = rank;
              d.root = (op % 2 == 0) ? rank : 0;
              d.peer = 1;
              d.count = count;
              d.seed = 11;
              d.comm_id = 12;
              d.seq = static_cast<uint64_t>(++cases);
              d.premul_scalar_bits = gen();
              size_t send_off = 0;
              size_t recv_off = in_place ? 0 : region;
              // NCCL's in-place layouts.
              const size_t chunk = count * es;
              if (in_place && k == OpKind::kAllGather) send_off = rank * chunk;
              if (in_place && k == OpKind::kGather) send_off = d.root * chunk;
              if (in_place && k == OpKind::kReduceScatter) recv_off = rank * chunk;
              if (in_place && k == OpKind::kScatter) recv_off = d.root * chunk;
              const size_t mirror_off = 2 * region;
              CUdeviceptr dev = 0;
              ASSERT_EQ(drv.cuMemAlloc(&dev, host.size()), 0);
              ASSERT_EQ(drv.cuMemcpyHtoD(dev, host.data(), host.size()), 0);
              OpDesc dd = d;
              dd.send_addr = dev + send_off;
              dd.recv_addr = dev + recv_off;
              dd.mirror_send_addr = (cases % 2) ? dev + mirror_off : 0;
              d.send_addr = reinterpret_cast<uint64_t>(host.data() + send_off);
              d.recv_addr = reinterpret_cast<uint64_t>(host.data() + recv_off);
              d.mirror_send_addr = (cases % 2) ? reinterpret_cast<uint64_t>(host.data() + mirror_off) : 0;

              StepList steps;
              ASSERT_EQ(Plan(dd, &steps), Status::kOk);
              for (uint32_t i = 0; i < steps.size; ++i) ASSERT_TRUE(ExecuteGpu(drv, dd, steps.steps[i]));
              ASSERT_EQ(drv.cuCtxSynchronize(), 0);
              std::vector<uint8_t> got(host.size());
              ASSERT_EQ(drv.cuMemcpyDtoH(got.data(), dev, got.size()), 0);
              drv.cuMemFree(dev);

              ASSERT_EQ(RunCpu(d), Status::kOk);
              size_t first_diff = host.size();
              for (size_t i = 0; i < host.size(); ++i) {
                if (host[i] != got[i]) {
                  first_diff = i;
                  break;
                }
              }
              ASSERT_EQ(first_diff, host.size())
                  << OpKindName(k) << " " << DataTypeName(d.dtype) << " " << PolicyName(policy) << " "
                  << RedOpName(d.redop) << " count " << count << (in_place ? " in-place" : "") << ": byte "
                  << first_diff << " gpu " << int{got[first_diff]} << " cpu " << int{host[first_diff]};
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 1000);
}

}  // namespace
}  // namespace prism::payload
