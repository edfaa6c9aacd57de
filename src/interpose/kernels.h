// The fatbin of libprism's own kernels, embedded at build time (cmake/CudaKernels.cmake).
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
extern const unsigned char prism_kernels_fatbin[];
extern const unsigned long prism_kernels_fatbin_size;
}

namespace prism::interpose {

inline constexpr uint32_t kFatbinMagic = 0xBA55ED50u;  // fatbin container header magic

// True when the embedded image looks like a CUDA fatbin (non-empty, right magic).
inline bool FatbinPresent() {
  if (prism_kernels_fatbin_size < 16) return false;
  uint32_t magic = 0;
  for (int i = 3; i >= 0; --i) magic = (magic << 8) | prism_kernels_fatbin[i];
  return magic == kFatbinMagic;
}

}  // namespace prism::interpose
