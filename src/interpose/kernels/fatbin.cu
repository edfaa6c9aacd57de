// The one translation unit nvcc turns into libprism's embedded fatbin (nvcc --fatbin takes a single input).
// Add a kernel file here, not to CMake. Order matters: shim_fused.cuh uses payload.cu's helpers.
#include "noop.cu"
#include "shim_kernels.cuh"
#include "payload.cu"
#include "shim_fused.cuh"
