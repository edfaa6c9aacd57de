// CUDA runtime device virtualisation: the job sees PRISM_GPUS_PER_NODE devices, all of them the physical GPU
// (core/device_map.h). Without PRISM_GPUS_PER_NODE every function passes straight through. libtorch binds these
// names versioned (libcudart.so.13); an unversioned definition in a preloaded object satisfies such references.
#include <cuda_runtime_api.h>

#include <cstring>

#include "interpose/api.h"
#include "interpose/core/device_map.h"
#include "interpose/core/kernel_trace.h"
#include "interpose/core/real_symbols.h"

using namespace prism::interpose;
namespace dev = prism::interpose::devices;

namespace {

int Phys() { return dev::Physical(); }

// Maps a location that names a virtual device onto the physical one.
void MapLocation(cudaMemLocation* loc) {
  if (loc != nullptr && dev::Virtualized() && loc->type == cudaMemLocationTypeDevice && dev::Valid(loc->id)) {
    loc->id = Phys();
  }
}

}  // namespace

PRISM_API cudaError_t cudaGetDeviceCount(int* count) {
  KernelTraceAtCudaInit();  // PRISM_KERNELS: torch asks this before it creates a context (docs/kernels.md)
  const auto real = Cudart().cudaGetDeviceCount;
  if (real == nullptr) return cudaErrorNotSupported;
  cudaError_t e = real(count);
  if (e == cudaSuccess && dev::Virtualized()) *count = dev::Count();
  return e;
}

PRISM_API cudaError_t cudaSetDevice(int device) {
  const auto real = Cudart().cudaSetDevice;
  if (real == nullptr) return cudaErrorNotSupported;
  if (!dev::Virtualized()) return real(device);
  if (!dev::Valid(device)) return cudaErrorInvalidDevice;
  cudaError_t e = real(Phys());
  if (e == cudaSuccess) dev::SetCurrent(device);
  return e;
}

PRISM_API cudaError_t cudaGetDevice(int* device) {
  if (!dev::Virtualized()) {
    const auto real = Cudart().cudaGetDevice;
    if (real == nullptr) return cudaErrorNotSupported;
    return real(device);
  }
  if (device == nullptr) return cudaErrorInvalidValue;
  *device = dev::Current();  // Why no CUDA call: torch asks on every device guard
  return cudaSuccess;
}

PRISM_API cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags) {
  const auto real = Cudart().cudaInitDevice;
  if (real == nullptr) return cudaErrorNotSupported;
  if (!dev::Virtualized()) return real(device, deviceFlags, flags);
  if (!dev::Valid(device)) return cudaErrorInvalidDevice;
  return real(Phys(), deviceFlags, flags);
}

PRISM_API cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  const auto real = Cudart().cudaGetDeviceProperties;
  if (real == nullptr) return cudaErrorNotSupported;
  if (!dev::Virtualized()) return real(prop, device);
  if (!dev::Valid(device)) return cudaErrorInvalidDevice;
  return real(prop, Phys());
}

PRISM_API cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  const auto real = Cudart().cudaDeviceGetAttribute;
  if (real == nullptr) return cudaErrorNotSupported;
  if (!dev::Virtualized()) return real(value, attr, device);
  if (!dev::Valid(device)) return cudaErrorInvalidDevice;
  return real(value, attr, Phys());
}

PRISM_API cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device) {
  const auto real = Cudart().cudaDeviceGetPCIBusId;
  if (real == nullptr) return cudaErrorNotSupported;
  if (!dev::Virtualized()) return real(pciBusId, len, device);
  if (!dev::Valid(device)) return cudaErrorInvalidDevice;
  return real(pciBusId, len, Phys());
}

PRISM_API cudaError_t cudaDeviceGetByPCIBusId(int* device, const char* pciBusId) {
  const auto real = Cudart().cudaDeviceGetByPCIBusId;
  if (real == nullptr) return cudaErrorNotSupported;
  cudaError_t e = real(device, pciBusId);
  // Every virtual device has the physical bus id; the calling thread's device is the sensible answer.
  if (e == cudaSuccess && dev::Virtualized() && *device == Phys()) *device = dev::Current();
  return e;
}

PRISM_API cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice) {
  if (!dev::Virtualized()) {
    const auto real = Cudart().cudaDeviceCanAccessPeer;
    if (real == nullptr) return cudaErrorNotSupported;
    return real(canAccessPeer, device, peerDevice);
  }
  if (canAccessPeer == nullptr) return cudaErrorInvalidValue;
  if (!dev::Valid(device) || !dev::Valid(peerDevice)) return cudaErrorInvalidDevice;
  *canAccessPeer = device != peerDevice ? 1 : 0;
  return cudaSuccess;
}

PRISM_API cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  if (!dev::Virtualized()) {
    const auto real = Cudart().cudaDeviceEnablePeerAccess;
    if (real == nullptr) return cudaErrorNotSupported;
    return real(peerDevice, flags);
  }
  if (flags != 0) return cudaErrorInvalidValue;
  if (!dev::Valid(peerDevice) || peerDevice == dev::Current()) return cudaErrorInvalidDevice;
  return dev::SetPeerAccess(dev::Current(), peerDevice, true) ? cudaSuccess : cudaErrorPeerAccessAlreadyEnabled;
}

PRISM_API cudaError_t cudaDeviceDisablePeerAccess(int peerDevice) {
  if (!dev::Virtualized()) {
    const auto real = Cudart().cudaDeviceDisablePeerAccess;
    if (real == nullptr) return cudaErrorNotSupported;
    return real(peerDevice);
  }
  if (!dev::Valid(peerDevice)) return cudaErrorInvalidDevice;
  return dev::SetPeerAccess(dev::Current(), peerDevice, false) ? cudaSuccess : cudaErrorPeerAccessNotEnabled;
}

PRISM_API cudaError_t cudaDeviceGetP2PAttribute(int* value, cudaDeviceP2PAttr attr, int srcDevice, int dstDevice) {
  if (!dev::Virtualized()) {
    const auto real = Cudart().cudaDeviceGetP2PAttribute;
    if (real == nullptr) return cudaErrorNotSupported;
    return real(value, attr, srcDevice, dstDevice);
  }
  if (value == nullptr) return cudaErrorInvalidValue;
  if (!dev::Valid(srcDevice) || !dev::Valid(dstDevice) || srcDevice == dstDevice) return cudaErrorInvalidDevice;
  // Virtual peers behave as NVLink peers: full access and native atomics, best performance rank.
  switch (attr) {
    case cudaDevP2PAttrPerformanceRank: *value = 0; break;
    case cudaDevP2PAttrOnlyPartialNativeAtomicSupported: *value = 0; break;
    default: *value = 1; break;
  }
  return cudaSuccess;
}

PRISM_API cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  const auto real = Cudart().cudaPointerGetAttributes;
  if (real == nullptr) return cudaErrorNotSupported;
  cudaError_t e = real(attributes, ptr);
  if (e == cudaSuccess && dev::Virtualized() && attributes->device == Phys()) attributes->device = dev::Current();
  return e;
}

PRISM_API cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int* device) {
  const auto real = Cudart().cudaStreamGetDevice;
  if (real == nullptr) return cudaErrorNotSupported;
  cudaError_t e = real(hStream, device);
  if (e == cudaSuccess && dev::Virtualized() && *device == Phys()) *device = dev::Current();
  return e;
}

PRISM_API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* memPool, int device) {
  const auto real = Cudart().cudaDeviceGetDefaultMemPool;
  if (real == nullptr) return cudaErrorNotSupported;
  if (!dev::Virtualized()) return real(memPool, device);
  if (!dev::Valid(device)) return cudaErrorInvalidDevice;
  return real(memPool, Phys());
}

PRISM_API cudaError_t cudaDeviceGetMemPool(cudaMemPool_t* memPool, int device) {
  const auto real = Cudart().cudaDeviceGetMemPool;
  if (real == nullptr) return cudaErrorNotSupported;
  if (!dev::Virtualized()) return real(memPool, device);
  if (!dev::Valid(device)) return cudaErrorInvalidDevice;
  return real(memPool, Phys());
}

PRISM_API cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool) {
  const auto real = Cudart().cudaDeviceSetMemPool;
  if (real == nullptr) return cudaErrorNotSupported;
  if (!dev::Virtualized()) return real(device, memPool);
  if (!dev::Valid(device)) return cudaErrorInvalidDevice;
  return real(Phys(), memPool);
}

PRISM_API cudaError_t cudaMemPoolCreate(cudaMemPool_t* memPool, const cudaMemPoolProps* poolProps) {
  const auto real = Cudart().cudaMemPoolCreate;
  if (real == nullptr) return cudaErrorNotSupported;
  if (poolProps == nullptr) return real(memPool, poolProps);
  cudaMemPoolProps p = *poolProps;
  MapLocation(&p.location);
  return real(memPool, &p);
}

PRISM_API cudaError_t cudaMemPoolSetAccess(cudaMemPool_t memPool, const cudaMemAccessDesc* descList, size_t count) {
  const auto real = Cudart().cudaMemPoolSetAccess;
  if (real == nullptr) return cudaErrorNotSupported;
  constexpr size_t kMax = 64;
  if (!dev::Virtualized() || descList == nullptr || count == 0 || count > kMax) return real(memPool, descList, count);
  cudaMemAccessDesc copy[kMax];
  size_t n = 0;
  for (size_t i = 0; i < count; ++i) {
    cudaMemAccessDesc d = descList[i];
    MapLocation(&d.location);
    // Why skip: several virtual devices collapse onto one physical device; granting it twice is an error.
    bool dup = false;
    for (size_t k = 0; k < n; ++k) dup |= std::memcmp(&copy[k].location, &d.location, sizeof(d.location)) == 0;
    if (!dup) copy[n++] = d;
  }
  return real(memPool, copy, n);
}

namespace {

// cudaMemGetDefaultMemPool and cudaMemGetMemPool: the real call on the mapped location (MapLocation).
template <typename Real>
cudaError_t PoolAtMappedLocation(Real real, cudaMemPool_t* memPool, cudaMemLocation* location,
                                 cudaMemAllocationType type) {
  if (location == nullptr) return real(memPool, location, type);
  cudaMemLocation l = *location;
  MapLocation(&l);
  return real(memPool, &l, type);
}

}  // namespace

PRISM_API cudaError_t cudaMemGetDefaultMemPool(cudaMemPool_t* memPool, cudaMemLocation* location,
                                               cudaMemAllocationType type) {
  const auto real = Cudart().cudaMemGetDefaultMemPool;
  if (real == nullptr) return cudaErrorNotSupported;
  return PoolAtMappedLocation(real, memPool, location, type);
}

PRISM_API cudaError_t cudaMemGetMemPool(cudaMemPool_t* memPool, cudaMemLocation* location,
                                        cudaMemAllocationType type) {
  const auto real = Cudart().cudaMemGetMemPool;
  if (real == nullptr) return cudaErrorNotSupported;
  return PoolAtMappedLocation(real, memPool, location, type);
}

PRISM_API cudaError_t cudaMemSetMemPool(cudaMemLocation* location, cudaMemAllocationType type,
                                        cudaMemPool_t memPool) {
  const auto real = Cudart().cudaMemSetMemPool;
  if (real == nullptr) return cudaErrorNotSupported;
  if (location == nullptr) return real(location, type, memPool);
  cudaMemLocation l = *location;
  MapLocation(&l);
  return real(&l, type, memPool);
}

PRISM_API cudaError_t cudaMemcpyPeer(void* dst, int dstDevice, const void* src, int srcDevice, size_t count) {
  const auto real = Cudart().cudaMemcpyPeer;
  if (real == nullptr) return cudaErrorNotSupported;
  if (dev::Virtualized()) {
    if (!dev::Valid(dstDevice) || !dev::Valid(srcDevice)) return cudaErrorInvalidDevice;
    dstDevice = srcDevice = Phys();
  }
  return real(dst, dstDevice, src, srcDevice, count);
}

PRISM_API cudaError_t cudaMemcpyPeerAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                                          cudaStream_t stream) {
  const auto real = Cudart().cudaMemcpyPeerAsync;
  if (real == nullptr) return cudaErrorNotSupported;
  if (dev::Virtualized()) {
    if (!dev::Valid(dstDevice) || !dev::Valid(srcDevice)) return cudaErrorInvalidDevice;
    dstDevice = srcDevice = Phys();
  }
  return real(dst, dstDevice, src, srcDevice, count, stream);
}

PRISM_API cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t kernel, cudaFuncAttribute attr, int value,
                                                      int device) {
  const auto real = Cudart().cudaKernelSetAttributeForDevice;
  if (real == nullptr) return cudaErrorNotSupported;
  if (!dev::Virtualized()) return real(kernel, attr, value, device);
  if (!dev::Valid(device)) return cudaErrorInvalidDevice;
  return real(kernel, attr, value, Phys());
}

