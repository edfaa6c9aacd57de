// A fake libnvidia-ml.so.1 for swap_usage_test (coordinator/swap/swap_usage.h): the few NVML entry points the
// coordinator resolves, with the ABI of nvml.h (int return codes, pointer device handles, 24-byte process records).
// Two GPUs:
//  - GPU 0: pid 100 uses 300 MiB, pid 101's usage is NVML_VALUE_NOT_AVAILABLE, pid 102 uses 0;
//  - GPU 1: pid 100 uses 50 MiB, and pids 1000..1079 use 1 MiB each (more than one buffer of 64: the caller must
//    ask again with a larger one after NVML_ERROR_INSUFFICIENT_SIZE).
// FAKE_NVML_INIT_ERROR set: nvmlInit_v2 fails with NVML_ERROR_DRIVER_NOT_LOADED (9).
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace {

struct ProcessInfo {
  unsigned int pid;
  unsigned long long used;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
static_assert(sizeof(ProcessInfo) == 24);

constexpr unsigned long long kMiB = 1ull << 20;
int g_devices[2] = {0, 1};

std::vector<ProcessInfo> Processes(int device) {
  if (device == 0) return {{100, 300 * kMiB, 0, 0}, {101, ~0ull, 0, 0}, {102, 0, 0, 0}};
  std::vector<ProcessInfo> v = {{100, 50 * kMiB, 0, 0}};
  for (unsigned int p = 1000; p < 1080; ++p) v.push_back({p, kMiB, 0, 0});
  return v;
}

}  // namespace

extern "C" {

int nvmlInit_v2() { return std::getenv("FAKE_NVML_INIT_ERROR") ? 9 : 0; }

int nvmlDeviceGetCount_v2(unsigned int* n) {
  *n = 2;
  return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void** device) {
  if (i >= 2) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = &g_devices[i];
  return 0;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned int* count, ProcessInfo* infos) {
  const std::vector<ProcessInfo> v = Processes(*static_cast<int*>(device));
  if (*count < v.size()) {
    *count = static_cast<unsigned int>(v.size());
    return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  }
  for (size_t k = 0; k < v.size(); ++k) infos[k] = v[k];
  *count = static_cast<unsigned int>(v.size());
  return 0;
}

const char* nvmlErrorString(int rc) { return rc == 9 ? "Driver Not Loaded" : "fake NVML error"; }

}  // extern "C"
