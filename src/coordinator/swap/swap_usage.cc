#include "coordinator/swap/swap_usage.h"

#include <dlfcn.h>

#include <memory>
#include <vector>

#include <fmt/format.h>

namespace prism::coord {
namespace {

// Why no nvml.h: the coordinator builds on machines without the CUDA toolkit. These match nvml.h of CUDA 12/13:
// nvmlReturn_t is an int enum, nvmlDevice_t a pointer, and the _v2/_v3 process queries fill this 24-byte struct.
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ull;
using NvmlDevice = void*;
struct NvmlProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
static_assert(sizeof(NvmlProcessInfo) == 24);

using InitFn = NvmlReturn (*)();
using CountFn = NvmlReturn (*)(unsigned int*);
using HandleFn = NvmlReturn (*)(unsigned int, NvmlDevice*);
using ProcessesFn = NvmlReturn (*)(NvmlDevice, unsigned int*, NvmlProcessInfo*);
using ErrorStringFn = const char* (*)(NvmlReturn);

class Nvml {
 public:
  // Why never dlclose or nvmlShutdown: the coordinator asks until it ends, and the library keeps its own state.
  bool Open(const std::string& library, std::string* error) {
    void* h = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = ::dlerror();
      *error = e ? fmt::format("cannot load {}", e) : fmt::format("cannot load '{}'", library);
      return false;
    }
    auto init = reinterpret_cast<InitFn>(::dlsym(h, "nvmlInit_v2"));
    auto count = reinterpret_cast<CountFn>(::dlsym(h, "nvmlDeviceGetCount_v2"));
    auto handle = reinterpret_cast<HandleFn>(::dlsym(h, "nvmlDeviceGetHandleByIndex_v2"));
    processes_ = reinterpret_cast<ProcessesFn>(::dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3"));
    if (!processes_) processes_ = reinterpret_cast<ProcessesFn>(::dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v2"));
    error_string_ = reinterpret_cast<ErrorStringFn>(::dlsym(h, "nvmlErrorString"));
    if (!init || !count || !handle || !processes_) {
      *error = fmt::format("'{}' lacks nvmlInit_v2, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2 or "
                           "nvmlDeviceGetComputeRunningProcesses_v3/_v2",
                           library);
      return false;
    }
    if (NvmlReturn rc = init(); rc != kNvmlSuccess) {
      *error = fmt::format("nvmlInit_v2: {}", Describe(rc));
      return false;
    }
    unsigned int n = 0;
    if (NvmlReturn rc = count(&n); rc != kNvmlSuccess) {
      *error = fmt::format("nvmlDeviceGetCount_v2: {}", Describe(rc));
      return false;
    }
    for (unsigned int i = 0; i < n; ++i) {
      NvmlDevice d = nullptr;
      if (NvmlReturn rc = handle(i, &d); rc != kNvmlSuccess) {
        *error = fmt::format("nvmlDeviceGetHandleByIndex_v2({}): {}", i, Describe(rc));
        return false;
      }
      devices_.push_back(d);
    }
    if (devices_.empty()) {
      *error = "NVML sees no GPU";
      return false;
    }
    return true;
  }

  bool Query(std::map<int, uint64_t>* by_pid, std::string* error) {
    by_pid->clear();
    for (size_t i = 0; i < devices_.size(); ++i) {
      unsigned int n = static_cast<unsigned int>(buf_.size());
      NvmlReturn rc = processes_(devices_[i], &n, buf_.data());
      // Why a loop: processes may start between the two calls; n says how many there are now.
      for (int tries = 0; rc == kNvmlInsufficientSize && tries < 4; ++tries) {
        buf_.resize(static_cast<size_t>(n) + 16);
        n = static_cast<unsigned int>(buf_.size());
        rc = processes_(devices_[i], &n, buf_.data());
      }
      if (rc != kNvmlSuccess) {
        *error = fmt::format("nvmlDeviceGetComputeRunningProcesses (GPU {}): {}", i, Describe(rc));
        return false;
      }
      for (unsigned int k = 0; k < n && k < buf_.size(); ++k) {
        const NvmlProcessInfo& p = buf_[k];
        if (p.used_gpu_memory == kNvmlValueNotAvailable || p.used_gpu_memory == 0) continue;
        (*by_pid)[static_cast<int>(p.pid)] += p.used_gpu_memory;
      }
    }
    return true;
  }

 private:
  std::string Describe(NvmlReturn rc) const {
    const char* s = error_string_ ? error_string_(rc) : nullptr;
    return fmt::format("error {}{}{}", rc, s ? ": " : "", s ? s : "");
  }

  ProcessesFn processes_ = nullptr;
  ErrorStringFn error_string_ = nullptr;
  std::vector<NvmlDevice> devices_;
  std::vector<NvmlProcessInfo> buf_ = std::vector<NvmlProcessInfo>(64);
};

}  // namespace

GpuUsageFn OpenNvmlUsage(const std::string& library, std::string* error) {
  auto nvml = std::make_shared<Nvml>();
  if (!nvml->Open(library, error)) return {};
  return [nvml](std::map<int, uint64_t>* by_pid, std::string* err) { return nvml->Query(by_pid, err); };
}

}  // namespace prism::coord
