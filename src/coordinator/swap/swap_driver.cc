#include "coordinator/swap/swap_driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

namespace prism::coord {
namespace {

// Why no cuda.h: the coordinator builds on machines without the CUDA toolkit. These match CUDA 13.0's cuda.h:
// CUresult is an int enum; each *Args struct is 64 bytes whose fields beyond Lock's timeoutMs must be zero.
using CUresult = int;
constexpr CUresult kSuccess = 0;
struct LockArgs {
  unsigned int timeout_ms;
  unsigned int reserved0;
  uint64_t reserved1[7];
};
struct ZeroArgs {
  uint64_t reserved[8];
};
static_assert(sizeof(LockArgs) == 64 && sizeof(ZeroArgs) == 64);

using InitFn = CUresult (*)(unsigned int);
using LockFn = CUresult (*)(int, LockArgs*);
using PidArgsFn = CUresult (*)(int, ZeroArgs*);
using GetStateFn = CUresult (*)(int, int*);
using ErrorStringFn = CUresult (*)(CUresult, const char**);
using ErrorNameFn = CUresult (*)(CUresult, const char**);
using DeviceGetFn = CUresult (*)(int*, int);
using TotalMemFn = CUresult (*)(size_t*, int);

class CudaCheckpointDriver final : public SwapDriver {
 public:
  ~CudaCheckpointDriver() override {
    // Why never dlclose: the driver keeps threads and state for the process's lifetime.
  }

  bool Open(const std::string& library, std::string* error) {
    handle_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      const char* e = ::dlerror();
      *error = fmt::format("cannot load the CUDA driver '{}': {}", library, e ? e : "unknown error");
      return false;
    }
    auto sym = [&](const char* name) { return ::dlsym(handle_, name); };
    init_ = reinterpret_cast<InitFn>(sym("cuInit"));
    lock_ = reinterpret_cast<LockFn>(sym("cuCheckpointProcessLock"));
    checkpoint_ = reinterpret_cast<PidArgsFn>(sym("cuCheckpointProcessCheckpoint"));
    restore_ = reinterpret_cast<PidArgsFn>(sym("cuCheckpointProcessRestore"));
    unlock_ = reinterpret_cast<PidArgsFn>(sym("cuCheckpointProcessUnlock"));
    get_state_ = reinterpret_cast<GetStateFn>(sym("cuCheckpointProcessGetState"));
    error_string_ = reinterpret_cast<ErrorStringFn>(sym("cuGetErrorString"));
    error_name_ = reinterpret_cast<ErrorNameFn>(sym("cuGetErrorName"));
    device_get_ = reinterpret_cast<DeviceGetFn>(sym("cuDeviceGet"));
    total_mem_ = reinterpret_cast<TotalMemFn>(sym("cuDeviceTotalMem_v2"));
    if (!init_ || !lock_ || !checkpoint_ || !restore_ || !unlock_) {
      *error = fmt::format("'{}' has no cuCheckpointProcess* entry points (the checkpoint API needs driver 570 or "
                           "newer)",
                           library);
      return false;
    }
    // Why cuInit: without it Restore returned CUDA_ERROR_NOT_INITIALIZED (3) on the GPU machine.
    if (CUresult rc = init_(0); rc != kSuccess) {
      *error = fmt::format("cuInit(0) in '{}': {}", library, Describe(rc));
      return false;
    }
    return true;
  }

  SwapResult SwapOut(int pid, int lock_timeout_ms) override {
    const auto t0 = std::chrono::steady_clock::now();
    SwapResult r;
    LockArgs la{};
    la.timeout_ms = static_cast<unsigned int>(std::max(lock_timeout_ms, 0));
    if (CUresult rc = lock_(pid, &la); rc != kSuccess) {
      r.error = Fail("cuCheckpointProcessLock", pid, rc);
    } else {
      ZeroArgs ca{};
      if (CUresult rc2 = checkpoint_(pid, &ca); rc2 != kSuccess) {
        r.error = Fail("cuCheckpointProcessCheckpoint", pid, rc2);
        ZeroArgs ua{};
        // Why unlock: a process left locked would block in its next CUDA call forever.
        if (CUresult rc3 = unlock_(pid, &ua); rc3 != kSuccess)
          r.error += "; then " + Fail("cuCheckpointProcessUnlock", pid, rc3);
      } else {
        r.ok = true;
      }
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  SwapResult SwapIn(int pid) override {
    const auto t0 = std::chrono::steady_clock::now();
    SwapResult r;
    ZeroArgs ra{};
    if (CUresult rc = restore_(pid, &ra); rc != kSuccess) {
      r.error = Fail("cuCheckpointProcessRestore", pid, rc);
    } else {
      ZeroArgs ua{};
      if (CUresult rc2 = unlock_(pid, &ua); rc2 != kSuccess) {
        r.error = Fail("cuCheckpointProcessUnlock", pid, rc2);
      } else {
        r.ok = true;
      }
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  uint64_t DeviceMemory(int ordinal) override {
    if (!device_get_ || !total_mem_) return 0;
    int dev = 0;
    size_t bytes = 0;
    if (device_get_(&dev, ordinal) != kSuccess || total_mem_(&bytes, dev) != kSuccess) return 0;
    return bytes;
  }

 private:
  std::string Describe(CUresult rc) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (error_name_) error_name_(rc, &name);
    if (error_string_) error_string_(rc, &text);
    return fmt::format("{} ({}){}", name ? name : "CUDA error", rc, text ? std::string(": ") + text : "");
  }
  std::string Fail(const char* call, int pid, CUresult rc) const {
    std::string state;
    int st = -1;
    if (get_state_ && get_state_(pid, &st) == kSuccess) {
      static const char* const kStates[] = {"running", "locked", "checkpointed", "failed"};
      state = fmt::format("; the process is now {}", st >= 0 && st < 4 ? kStates[st] : "in an unknown state");
    }
    return fmt::format("{}(pid {}): {}{}", call, pid, Describe(rc), state);
  }

  void* handle_ = nullptr;
  InitFn init_ = nullptr;
  LockFn lock_ = nullptr;
  PidArgsFn checkpoint_ = nullptr, restore_ = nullptr, unlock_ = nullptr;
  GetStateFn get_state_ = nullptr;
  ErrorStringFn error_string_ = nullptr;
  ErrorNameFn error_name_ = nullptr;
  DeviceGetFn device_get_ = nullptr;
  TotalMemFn total_mem_ = nullptr;
};

}  // namespace

std::unique_ptr<SwapDriver> OpenCudaCheckpointDriver(const std::string& library, std::string* error) {
  auto d = std::make_unique<CudaCheckpointDriver>();
  if (!d->Open(library, error)) return nullptr;
  return d;
}

}  // namespace prism::coord
