// Payload kernels: the GPU executor of the steps planned by src/nccl_patch/semantics.h (kernel names and
// argument layouts are listed there). The element math is nccl_patch/dtype_math.h, the same code the CPU
// executor runs, so CPU tests cover the bits these kernels write. Launched through the driver API from the
// embedded fatbin; every kernel is a 1-D grid-stride loop and accepts any grid.
#include <stdint.h>

#include "../../nccl_patch/dtype_math.h"

namespace pm = prism::payload::math;

namespace {

__device__ __forceinline__ uint64_t GlobalThread() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t GridThreads() { return static_cast<uint64_t>(gridDim.x) * blockDim.x; }

__device__ __forceinline__ bool Aligned(const void* p, uint64_t a) {
  return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0;
}

// dst[j] = src[j % tile_bytes] over `bytes`, in the widest word all of dst, src, bytes and tile allow.
__device__ __forceinline__ void TileAny(void* dst, const void* src, uint64_t bytes, uint64_t tile_bytes) {
  const uint64_t t = GlobalThread();
  const uint64_t g = GridThreads();
  if (Aligned(dst, 16) && Aligned(src, 16) && bytes % 16 == 0 && tile_bytes % 16 == 0) {
    pm::TileRange<uint4>(dst, src, t, bytes / 16, g, tile_bytes / 16);
  } else if (Aligned(dst, 4) && Aligned(src, 4) && bytes % 4 == 0 && tile_bytes % 4 == 0) {
    pm::TileRange<uint32_t>(dst, src, t, bytes / 4, g, tile_bytes / 4);
  } else {
    pm::TileRange<uint8_t>(dst, src, t, bytes, g, tile_bytes);
  }
}

}  // namespace

extern "C" __global__ void prism_payload_copy(void* dst, const void* src, uint64_t bytes) {
  if (bytes != 0) TileAny(dst, src, bytes, bytes);
}

extern "C" __global__ void prism_payload_tile(void* dst, const void* src, uint64_t bytes, uint64_t tile_bytes) {
  if (tile_bytes != 0) TileAny(dst, src, bytes, tile_bytes);
}

extern "C" __global__ void prism_payload_fill_zero(void* dst, uint64_t bytes) {
  const uint64_t t = GlobalThread();
  const uint64_t g = GridThreads();
  if (Aligned(dst, 16) && bytes % 16 == 0) {
    uint4* d = static_cast<uint4*>(dst);
    for (uint64_t j = t; j < bytes / 16; j += g) d[j] = make_uint4(0, 0, 0, 0);
  } else {
    uint8_t* d = static_cast<uint8_t*>(dst);
    for (uint64_t j = t; j < bytes; j += g) d[j] = 0;
  }
}

extern "C" __global__ void prism_payload_scale(void* dst, const void* src, uint64_t count, int dtype, uint64_t n) {
  PRISM_PAYLOAD_DTYPE_SWITCH(dtype, D, return, pm::ScaleRange<D>(dst, src, GlobalThread(), count, GridThreads(), n))
}

extern "C" __global__ void prism_payload_power(void* dst, const void* src, uint64_t count, int dtype, uint64_t n) {
  PRISM_PAYLOAD_DTYPE_SWITCH(dtype, D, return, pm::PowerRange<D>(dst, src, GlobalThread(), count, GridThreads(), n))
}

extern "C" __global__ void prism_payload_mul_scalar(void* dst, const void* src, uint64_t count, int dtype,
                                                    uint64_t scalar_bits, const void* scalar_ptr) {
  // Why read here: an ncclScalarDevice scalar is dereferenced when the operation runs, not when it is enqueued.
  const uint64_t s = pm::LoadScalarBits(dtype, scalar_bits, scalar_ptr);
  PRISM_PAYLOAD_DTYPE_SWITCH(dtype, D, return,
                             pm::MulScalarRange<D>(dst, src, GlobalThread(), count, GridThreads(), s))
}

extern "C" __global__ void prism_payload_fill_random(void* dst, uint64_t count, int dtype, uint64_t key,
                                                     uint64_t index_base) {
  PRISM_PAYLOAD_DTYPE_SWITCH(dtype, D, return,
                             pm::RandomRange<D>(dst, GlobalThread(), count, GridThreads(), key, index_base))
}
