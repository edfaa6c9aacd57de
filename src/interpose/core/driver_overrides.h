// CUDA driver functions libprism replaces when the job reaches them by name (dlsym on libcuda, cuGetProcAddress,
// cudaGetDriverEntryPoint[ByVersion]): the ones that take a device ordinal (mapped onto the physical GPU when the
// job sees virtual devices) and the VMM allocation calls PyTorch's expandable segments make (memory accounting).
// Why by name: PyTorch reaches cuDevicePrimaryCtxGetState (device guards, MaybeSetDevice) and cuMemCreate through
// handles of libcuda, never through the dynamic linker, so LD_PRELOAD alone cannot see them.
#pragma once

namespace prism::interpose {

// Our replacement for driver function `name` as named in cuGetProcAddress / cudaGetDriverEntryPoint (base name,
// no _v2 suffix), for ABI version `cuda_version`; nullptr when libprism does not replace it.
void* DriverOverrideByProcName(const char* name, int cuda_version);

// Our replacement for the exported libcuda symbol `name` (with its suffix, e.g. "cuDeviceTotalMem_v2") as found
// by dlsym; nullptr when not replaced (only symbols whose ABI our replacement has).
void* DriverOverrideBySymbol(const char* name);

// True when a dlsym call made from `caller` (a return address) should see replacements: everything but NVIDIA's
// own libraries and libprism (libcudart must keep the real driver).
bool CallerWantsOverrides(const void* caller);

}  // namespace prism::interpose
