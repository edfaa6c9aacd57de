// Arrival stamp fused with the first payload step of a unit: one launch instead of two on the hot path (host
// overhead per collective). Included after payload.cu (fatbin.cu): the element work is exactly payload.cu's
// (the same nccl_patch/dtype_math.h functions and copy helper), so the bits match the CPU reference.
// Argument layout: (uint64_t* stamp, int kind, void* dst, const void* src, uint64_t bytes, uint64_t tile_bytes,
//                   uint64_t count, int dtype, uint64_t param, uint64_t index_base, const void* scalar_ptr)
// kind = payload::StepKind (1 copy, 2 tile, 3 scale, 4 power, 5 mul_scalar, 6 fill_zero, 7 fill_random).
extern "C" __global__ void prism_stamp_step(uint64_t* stamp, int kind, void* dst, const void* src, uint64_t bytes,
                                            uint64_t tile_bytes, uint64_t count, int dtype, uint64_t param,
                                            uint64_t index_base, const void* scalar_ptr) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    uint64_t t = prism_shim_kernels::GlobalTimerNs();
    *reinterpret_cast<volatile uint64_t*>(stamp) = t == 0 ? 1 : t;
    __threadfence_system();
  }
  const uint64_t t = GlobalThread();
  const uint64_t g = GridThreads();
  switch (kind) {
    case 1:
      if (bytes != 0) TileAny(dst, src, bytes, bytes);
      break;
    case 2:
      if (tile_bytes != 0) TileAny(dst, src, bytes, tile_bytes);
      break;
    case 3:
      PRISM_PAYLOAD_DTYPE_SWITCH(dtype, D, return, pm::ScaleRange<D>(dst, src, t, count, g, param))
      break;
    case 4:
      PRISM_PAYLOAD_DTYPE_SWITCH(dtype, D, return, pm::PowerRange<D>(dst, src, t, count, g, param))
      break;
    case 5: {
      const uint64_t s = pm::LoadScalarBits(dtype, param, scalar_ptr);
      PRISM_PAYLOAD_DTYPE_SWITCH(dtype, D, return, pm::MulScalarRange<D>(dst, src, t, count, g, s))
      break;
    }
    case 6: {
      uint8_t* d = static_cast<uint8_t*>(dst);
      for (uint64_t j = t; j < bytes; j += g) d[j] = 0;
      break;
    }
    case 7:
      PRISM_PAYLOAD_DTYPE_SWITCH(dtype, D, return, pm::RandomRange<D>(dst, t, count, g, param, index_base))
      break;
    default:
      break;
  }
}
