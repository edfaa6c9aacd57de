// The same driver replacements (core/driver_overrides.h) as exported symbols, for code linked against libcuda
// directly: Triton's compiled driver utilities call cuDeviceGet(&dev, torch.cuda.current_device()) and
// cuDeviceGetAttribute(dev), which must see virtual devices too. No CUDA or NCCL library links libcuda directly
// (checked on the CUDA 13 toolkit), and libcudart resolves the driver through cuGetProcAddress, so only such
// user code binds here. ABI: the names cuda.h maps to (the _v2 entry points where it has them).
#include <cuda.h>

#include "interpose/api.h"
#include "interpose/core/driver_overrides.h"

using namespace prism::interpose;

namespace {
template <typename Fn>
Fn Ov(const char* name) {
  return reinterpret_cast<Fn>(DriverOverrideBySymbol(name));
}
}  // namespace

#define PRISM_FORWARD(ret, name, symbol, params, args)                          \
  PRISM_API ret CUDAAPI name params {                                            \
    static const auto fn = Ov<ret(CUDAAPI*) params>(symbol);                     \
    return fn != nullptr ? fn args : CUDA_ERROR_NOT_SUPPORTED;                   \
  }

PRISM_FORWARD(CUresult, cuDeviceGet, "cuDeviceGet", (CUdevice * d, int o), (d, o))
PRISM_FORWARD(CUresult, cuDeviceGetCount, "cuDeviceGetCount", (int* n), (n))
PRISM_FORWARD(CUresult, cuDeviceGetAttribute, "cuDeviceGetAttribute", (int* v, CUdevice_attribute a, CUdevice d),
              (v, a, d))
PRISM_FORWARD(CUresult, cuDeviceGetName, "cuDeviceGetName", (char* n, int l, CUdevice d), (n, l, d))
PRISM_FORWARD(CUresult, cuDeviceTotalMem, "cuDeviceTotalMem_v2", (size_t * b, CUdevice d), (b, d))
PRISM_FORWARD(CUresult, cuDeviceGetUuid, "cuDeviceGetUuid_v2", (CUuuid * u, CUdevice d), (u, d))
PRISM_FORWARD(CUresult, cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", (char* b, int l, CUdevice d), (b, l, d))
PRISM_FORWARD(CUresult, cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", (int* c, CUdevice d, CUdevice p), (c, d, p))
PRISM_FORWARD(CUresult, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext * c, CUdevice d), (c, d))
PRISM_FORWARD(CUresult, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice d), (d))
PRISM_FORWARD(CUresult, cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState",
              (CUdevice d, unsigned int* f, int* a), (d, f, a))
PRISM_FORWARD(CUresult, cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset_v2", (CUdevice d), (d))
PRISM_FORWARD(CUresult, cuDevicePrimaryCtxSetFlags, "cuDevicePrimaryCtxSetFlags_v2", (CUdevice d, unsigned int f),
              (d, f))
PRISM_FORWARD(CUresult, cuCtxGetDevice, "cuCtxGetDevice", (CUdevice * d), (d))
PRISM_FORWARD(CUresult, cuMemCreate, "cuMemCreate",
              (CUmemGenericAllocationHandle * h, size_t s, const CUmemAllocationProp* p, unsigned long long f),
              (h, s, p, f))
PRISM_FORWARD(CUresult, cuMemRelease, "cuMemRelease", (CUmemGenericAllocationHandle h), (h))
PRISM_FORWARD(CUresult, cuMemSetAccess, "cuMemSetAccess",
              (CUdeviceptr p, size_t s, const CUmemAccessDesc* d, size_t c), (p, s, d, c))
PRISM_FORWARD(CUresult, cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity",
              (size_t * g, const CUmemAllocationProp* p, CUmemAllocationGranularity_flags o), (g, p, o))
PRISM_FORWARD(CUresult, cuPointerGetAttribute, "cuPointerGetAttribute",
              (void* d, CUpointer_attribute a, CUdeviceptr p), (d, a, p))

#undef PRISM_FORWARD
