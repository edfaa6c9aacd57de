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

// The replacement of the exported libcuda symbol `name`, as a function of type Fn (nullptr: none).
template <typename Fn>
Fn Override(const char* name) {
  return reinterpret_cast<Fn>(DriverOverrideBySymbol(name));
}

}  // namespace

PRISM_API CUresult CUDAAPI cuDeviceGet(CUdevice* d, int o) {
  static const auto ov = Override<decltype(&cuDeviceGet)>("cuDeviceGet");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(d, o);
}

PRISM_API CUresult CUDAAPI cuDeviceGetCount(int* n) {
  static const auto ov = Override<decltype(&cuDeviceGetCount)>("cuDeviceGetCount");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(n);
}

PRISM_API CUresult CUDAAPI cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  static const auto ov = Override<decltype(&cuDeviceGetAttribute)>("cuDeviceGetAttribute");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(v, a, d);
}

PRISM_API CUresult CUDAAPI cuDeviceGetName(char* n, int l, CUdevice d) {
  static const auto ov = Override<decltype(&cuDeviceGetName)>("cuDeviceGetName");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(n, l, d);
}

PRISM_API CUresult CUDAAPI cuDeviceTotalMem(size_t* b, CUdevice d) {
  static const auto ov = Override<decltype(&cuDeviceTotalMem)>("cuDeviceTotalMem_v2");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(b, d);
}

PRISM_API CUresult CUDAAPI cuDeviceGetUuid(CUuuid* u, CUdevice d) {
  static const auto ov = Override<decltype(&cuDeviceGetUuid)>("cuDeviceGetUuid_v2");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(u, d);
}

PRISM_API CUresult CUDAAPI cuDeviceGetPCIBusId(char* b, int l, CUdevice d) {
  static const auto ov = Override<decltype(&cuDeviceGetPCIBusId)>("cuDeviceGetPCIBusId");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(b, l, d);
}

PRISM_API CUresult CUDAAPI cuDeviceCanAccessPeer(int* c, CUdevice d, CUdevice p) {
  static const auto ov = Override<decltype(&cuDeviceCanAccessPeer)>("cuDeviceCanAccessPeer");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(c, d, p);
}

PRISM_API CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  static const auto ov = Override<decltype(&cuDevicePrimaryCtxRetain)>("cuDevicePrimaryCtxRetain");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(c, d);
}

PRISM_API CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice d) {
  static const auto ov = Override<decltype(&cuDevicePrimaryCtxRelease)>("cuDevicePrimaryCtxRelease_v2");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(d);
}

PRISM_API CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice d, unsigned int* f, int* a) {
  static const auto ov = Override<decltype(&cuDevicePrimaryCtxGetState)>("cuDevicePrimaryCtxGetState");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(d, f, a);
}

PRISM_API CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice d) {
  static const auto ov = Override<decltype(&cuDevicePrimaryCtxReset)>("cuDevicePrimaryCtxReset_v2");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(d);
}

PRISM_API CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice d, unsigned int f) {
  static const auto ov = Override<decltype(&cuDevicePrimaryCtxSetFlags)>("cuDevicePrimaryCtxSetFlags_v2");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(d, f);
}

PRISM_API CUresult CUDAAPI cuCtxGetDevice(CUdevice* d) {
  static const auto ov = Override<decltype(&cuCtxGetDevice)>("cuCtxGetDevice");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(d);
}

PRISM_API CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* h, size_t s, const CUmemAllocationProp* p,
                                       unsigned long long f) {
  static const auto ov = Override<decltype(&cuMemCreate)>("cuMemCreate");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(h, s, p, f);
}

PRISM_API CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle h) {
  static const auto ov = Override<decltype(&cuMemRelease)>("cuMemRelease");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(h);
}

PRISM_API CUresult CUDAAPI cuMemSetAccess(CUdeviceptr p, size_t s, const CUmemAccessDesc* d, size_t c) {
  static const auto ov = Override<decltype(&cuMemSetAccess)>("cuMemSetAccess");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(p, s, d, c);
}

PRISM_API CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp* p,
                                                         CUmemAllocationGranularity_flags o) {
  static const auto ov = Override<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(g, p, o);
}

PRISM_API CUresult CUDAAPI cuPointerGetAttribute(void* d, CUpointer_attribute a, CUdeviceptr p) {
  static const auto ov = Override<decltype(&cuPointerGetAttribute)>("cuPointerGetAttribute");
  if (ov == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return ov(d, a, p);
}
