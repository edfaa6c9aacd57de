// Measures NCCL collectives and send/receive between the GPUs of this machine (docs/calibrate.md, "What is
// measured"). No CUDA library is linked: libcuda.so.1 (driver API) and the real NCCL are dlopen'ed at run time, so
// prism-run builds and runs anywhere and this part fails with a clear message where there is no GPU.
//
// One process, one thread per GPU, communicators from ncclCommInitAll. Per (op, communicator size, message size):
// one untimed call aligns the GPUs, then warm-up calls are timed to pick the iteration count (about target_ms per
// point), then the timed calls between two CUDA events per GPU; the time per call is the slowest GPU's.
// NVLS (NVLink SHARP, multicast) is switched off (NCCL_NVLS_ENABLE=0, NCCL_NVLINK_SHARP_ENABLE=0) unless the
// environment already sets those variables.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "calibrate/measurements.h"

namespace prism::calibrate {

struct MeasureOptions {
  int gpus = 0;                          // 0 = every visible GPU
  uint64_t min_bytes = 8;
  uint64_t max_bytes = 256ull << 20;
  int step = 4;                          // sizes min, min*step, ... and max
  std::vector<MeasuredOp> ops;           // empty = all (allreduce allgather reducescatter broadcast alltoall sendrecv)
  std::vector<int> comm_sizes;           // empty = DefaultCommSizes(gpus)
  bool all_pairs = false;                // send/receive between every ordered pair (default: 0 -> each other GPU)
  int warmup = 5;
  double target_ms = 20.0;               // timed duration per point (iterations = target / warm-up time per call)
  int min_iters = 5;
  int max_iters = 1000;
  double timeout_s = 300.0;              // one point taking longer than this aborts the process (a hung NCCL)
  std::string nccl_path;                 // "" = the PyTorch wheel's, then libnccl.so.2 (NcclCandidates)
  std::string cuda_path = "libcuda.so.1";
};

// False + *error (which says why: no driver, no GPU, one GPU, no NCCL, an NCCL or CUDA error) when nothing
// could be measured. Progress and the table go to `log`.
bool Measure(const MeasureOptions& options, MeasurementSet* out, std::ostream& log, std::string* error);

// ---- Pieces that need no GPU (unit-tested).

// min, min*step, min*step^2, ... < max, then max. Empty when min > max or step < 2.
std::vector<uint64_t> SizeLadder(uint64_t min_bytes, uint64_t max_bytes, int step);
// The S actually moved for a requested size: whole elements, and for all-gather, reduce-scatter and all-to-all a
// multiple of nranks elements (at least one per rank).
uint64_t RoundBytes(MeasuredOp op, uint64_t bytes, int nranks, int elem_size);
// 2, 4, 8, ... up to gpus, and gpus itself.
std::vector<int> DefaultCommSizes(int gpus);
// "8", "64K", "256M", "256MiB", "1G", "1GB" (binary multiples). False + *error otherwise.
bool ParseByteSize(const std::string& text, uint64_t* out, std::string* error);
// Where NCCL is looked for, in order: `explicit_path` alone when set; else "libnccl.so.2" and then the lib/ folder
// of the nvidia.nccl Python package (PyTorch's wheel) for each interpreter in $PRISM_PYTHON, $PYTHON, python3,
// then /usr/local/cuda/lib64/libnccl.so.2.
std::vector<std::string> NcclCandidates(const std::string& explicit_path);

}  // namespace prism::calibrate
