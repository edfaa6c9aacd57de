// Moves a whole process's GPU memory to host RAM and back with the CUDA driver's checkpoint API (CUDA 12.8+,
// driver 570+): cuCheckpointProcessLock + cuCheckpointProcessCheckpoint to swap out, cuCheckpointProcessRestore +
// cuCheckpointProcessUnlock to swap in. Measured on an H200 with driver 580 (shared/reference/gpu-machine-findings.md):
// ~2 GB/s out, ~5 GB/s in, lock/unlock ~1 ms; the controlling process must call cuInit(0) first.
//
// CudaCheckpointDriver dlopens the driver library ("libcuda.so.1", or a fake in tests) at Open; prism never links
// libcuda (CI machines have no driver). Every call is timed; errors name the call, the pid and the driver's text.
// A process holding real NCCL communicators or CUDA IPC memory cannot be checkpointed (NVIDIA/cuda-checkpoint
// issues 30 and 45): under prism a rank's NCCL is virtual unless its communicator passes through.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace prism::coord {

struct SwapResult {
  bool ok = false;
  double seconds = 0;  // the whole operation
  std::string error;   // "cuCheckpointProcessCheckpoint(pid 123): CUDA_ERROR_...: text"
};

class SwapDriver {
 public:
  virtual ~SwapDriver() = default;
  // Lock (waiting up to lock_timeout_ms for the process's in-flight work) then checkpoint. On a failed checkpoint
  // the process is unlocked again, so it keeps running.
  virtual SwapResult SwapOut(int pid, int lock_timeout_ms) = 0;
  // Restore then unlock.
  virtual SwapResult SwapIn(int pid) = 0;
  // Total memory of device `ordinal` as this process sees it (0 when unknown).
  virtual uint64_t DeviceMemory(int ordinal) = 0;
};

// nullptr with *error when the library cannot be loaded, lacks the checkpoint entry points (driver older than 570),
// or cuInit fails.
std::unique_ptr<SwapDriver> OpenCudaCheckpointDriver(const std::string& library, std::string* error);

}  // namespace prism::coord
