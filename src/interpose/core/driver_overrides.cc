#include "interpose/core/driver_overrides.h"

#include <dlfcn.h>

#include <cstring>

#include "interpose/core/device_map.h"
#include "interpose/core/memory.h"
#include "interpose/core/real_symbols.h"

namespace prism::interpose {
namespace {

const DriverFns& D() { return Driver(); }

CUdevice PhysicalDevice() {
  static CUdevice dev = [] {
    CUdevice d = 0;
    if (D().cuDeviceGet != nullptr) D().cuDeviceGet(&d, devices::Physical());
    return d;
  }();
  return dev;
}

// A virtual device handle (== its ordinal) to the physical one; anything else goes through unchanged so the real
// driver reports the error.
CUdevice Map(CUdevice v) {
  if (!devices::Virtualized() || !devices::Valid(static_cast<int>(v))) return v;
  return PhysicalDevice();
}

void MapLocation(CUmemLocation* loc) {
  if (devices::Virtualized() && loc->type == CU_MEM_LOCATION_TYPE_DEVICE && devices::Valid(loc->id)) {
    loc->id = static_cast<int>(PhysicalDevice());
  }
}

CUresult CUDAAPI OvDeviceGet(CUdevice* dev, int ordinal) {
  if (!devices::Virtualized()) {
    const auto real = D().cuDeviceGet;
    if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return real(dev, ordinal);
  }
  if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!devices::Valid(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *dev = static_cast<CUdevice>(ordinal);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI OvDeviceGetCount(int* count) {
  const auto real = D().cuDeviceGetCount;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(count);
  if (r == CUDA_SUCCESS && devices::Virtualized()) *count = devices::Count();
  return r;
}

CUresult CUDAAPI OvDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice dev) {
  const auto real = D().cuDeviceGetAttribute;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return real(v, a, Map(dev));
}

CUresult CUDAAPI OvDeviceGetName(char* name, int len, CUdevice dev) {
  const auto real = D().cuDeviceGetName;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return real(name, len, Map(dev));
}

CUresult CUDAAPI OvDeviceTotalMem(size_t* bytes, CUdevice dev) {
  const auto real = D().cuDeviceTotalMem;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return real(bytes, Map(dev));
}

CUresult CUDAAPI OvDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  const auto real = D().cuDeviceGetUuid;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return real(uuid, Map(dev));
}

CUresult CUDAAPI OvDeviceGetPCIBusId(char* bus, int len, CUdevice dev) {
  const auto real = D().cuDeviceGetPCIBusId;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return real(bus, len, Map(dev));
}

CUresult CUDAAPI OvDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  if (!devices::Virtualized()) {
    const auto real = D().cuDeviceCanAccessPeer;
    if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    return real(can, dev, peer);
  }
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!devices::Valid(dev) || !devices::Valid(peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = dev != peer ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI OvPrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  const auto real = D().cuDevicePrimaryCtxRetain;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return real(ctx, Map(dev));
}

CUresult CUDAAPI OvPrimaryCtxRelease(CUdevice dev) {
  const auto real = D().cuDevicePrimaryCtxRelease;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return real(Map(dev));
}

CUresult CUDAAPI OvPrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  const auto real = D().cuDevicePrimaryCtxGetState;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return real(Map(dev), flags, active);
}

CUresult CUDAAPI OvPrimaryCtxReset(CUdevice dev) {
  const auto real = D().cuDevicePrimaryCtxReset;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return real(Map(dev));
}

CUresult CUDAAPI OvPrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  const auto real = D().cuDevicePrimaryCtxSetFlags;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return real(Map(dev), flags);
}

CUresult CUDAAPI OvCtxGetDevice(CUdevice* dev) {
  const auto real = D().cuCtxGetDevice;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(dev);
  if (r == CUDA_SUCCESS && devices::Virtualized()) *dev = static_cast<CUdevice>(devices::Current());
  return r;
}

CUresult CUDAAPI OvMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long flags) {
  const auto real = D().cuMemCreate;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (prop == nullptr) return real(handle, size, prop, flags);
  CUmemAllocationProp p = *prop;
  MapLocation(&p.location);
  CUresult r = real(handle, size, &p, flags);
  // Under context switching: wait for the coordinator to make room, then retry (core/memory.h).
  if (r == CUDA_ERROR_OUT_OF_MEMORY && p.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    r = memory::RetryWithRoom(size, CUDA_ERROR_OUT_OF_MEMORY, [&] { return real(handle, size, &p, flags); });
  }
  if (r == CUDA_SUCCESS && handle != nullptr && p.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    memory::RecordHandleCreate(static_cast<uint64_t>(*handle), size);
  }
  return r;
}

CUresult CUDAAPI OvMemRelease(CUmemGenericAllocationHandle handle) {
  const auto real = D().cuMemRelease;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(handle);
  if (r == CUDA_SUCCESS) memory::RecordHandleRelease(static_cast<uint64_t>(handle));
  return r;
}

CUresult CUDAAPI OvMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  const auto real = D().cuMemSetAccess;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  constexpr size_t kMax = 64;
  if (desc == nullptr || count == 0 || count > kMax) return real(ptr, size, desc, count);
  CUmemAccessDesc copy[kMax];
  for (size_t i = 0; i < count; ++i) {
    copy[i] = desc[i];
    MapLocation(&copy[i].location);
  }
  return real(ptr, size, copy, count);
}

CUresult CUDAAPI OvMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  const auto real = D().cuMemGetAllocationGranularity;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  if (prop == nullptr) return real(g, prop, option);
  CUmemAllocationProp p = *prop;
  MapLocation(&p.location);
  return real(g, &p, option);
}

CUresult CUDAAPI OvPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  const auto real = D().cuPointerGetAttribute;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(data, attr, ptr);
  if (r == CUDA_SUCCESS && data != nullptr && attr == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL && devices::Virtualized()) {
    int* ord = static_cast<int*>(data);
    if (*ord == devices::Physical()) *ord = devices::Current();
  }
  return r;
}

CUresult CUDAAPI OvGetProcAddressV2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* status) {
  const auto real = D().cuGetProcAddress;
  if (real == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = real(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr && symbol != nullptr) {
    if (void* o = DriverOverrideByProcName(symbol, version)) *pfn = o;
  }
  return r;
}

// cuGetProcAddress's first ABI (CUDA 11.3-11.8): no status argument.
CUresult CUDAAPI OvGetProcAddressV1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return OvGetProcAddressV2(symbol, pfn, version, flags, nullptr);
}

// Where a name is looked up: as a base name (cuGetProcAddress / cudaGetDriverEntryPoint spelling), as an exported
// libcuda symbol name whose ABI matches the replacement, or both.
enum Lookup : uint8_t { kProcName = 1, kSymbol = 2, kBoth = kProcName | kSymbol };

struct Entry {
  const char* name;
  void* fn;
  uint8_t lookup;
};

const Entry kOverrides[] = {
    {"cuDeviceGet", reinterpret_cast<void*>(&OvDeviceGet), kBoth},
    {"cuDeviceGetCount", reinterpret_cast<void*>(&OvDeviceGetCount), kBoth},
    {"cuDeviceGetAttribute", reinterpret_cast<void*>(&OvDeviceGetAttribute), kBoth},
    {"cuDeviceGetName", reinterpret_cast<void*>(&OvDeviceGetName), kBoth},
    {"cuDeviceTotalMem", reinterpret_cast<void*>(&OvDeviceTotalMem), kProcName},
    {"cuDeviceTotalMem_v2", reinterpret_cast<void*>(&OvDeviceTotalMem), kSymbol},
    {"cuDeviceGetUuid", reinterpret_cast<void*>(&OvDeviceGetUuid), kBoth},
    {"cuDeviceGetUuid_v2", reinterpret_cast<void*>(&OvDeviceGetUuid), kSymbol},
    {"cuDeviceGetPCIBusId", reinterpret_cast<void*>(&OvDeviceGetPCIBusId), kBoth},
    {"cuDeviceCanAccessPeer", reinterpret_cast<void*>(&OvDeviceCanAccessPeer), kBoth},
    {"cuDevicePrimaryCtxRetain", reinterpret_cast<void*>(&OvPrimaryCtxRetain), kBoth},
    {"cuDevicePrimaryCtxRelease", reinterpret_cast<void*>(&OvPrimaryCtxRelease), kBoth},
    {"cuDevicePrimaryCtxRelease_v2", reinterpret_cast<void*>(&OvPrimaryCtxRelease), kSymbol},
    {"cuDevicePrimaryCtxGetState", reinterpret_cast<void*>(&OvPrimaryCtxGetState), kBoth},
    {"cuDevicePrimaryCtxReset", reinterpret_cast<void*>(&OvPrimaryCtxReset), kBoth},
    {"cuDevicePrimaryCtxReset_v2", reinterpret_cast<void*>(&OvPrimaryCtxReset), kSymbol},
    {"cuDevicePrimaryCtxSetFlags", reinterpret_cast<void*>(&OvPrimaryCtxSetFlags), kBoth},
    {"cuDevicePrimaryCtxSetFlags_v2", reinterpret_cast<void*>(&OvPrimaryCtxSetFlags), kSymbol},
    {"cuCtxGetDevice", reinterpret_cast<void*>(&OvCtxGetDevice), kBoth},
    {"cuMemCreate", reinterpret_cast<void*>(&OvMemCreate), kBoth},
    {"cuMemRelease", reinterpret_cast<void*>(&OvMemRelease), kBoth},
    {"cuMemSetAccess", reinterpret_cast<void*>(&OvMemSetAccess), kBoth},
    {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&OvMemGetAllocationGranularity), kBoth},
    {"cuPointerGetAttribute", reinterpret_cast<void*>(&OvPointerGetAttribute), kBoth},
    // The exported cuGetProcAddress has the first ABI (no status argument); its base name means the second.
    {"cuGetProcAddress", reinterpret_cast<void*>(&OvGetProcAddressV2), kProcName},
    {"cuGetProcAddress", reinterpret_cast<void*>(&OvGetProcAddressV1), kSymbol},
    {"cuGetProcAddress_v2", reinterpret_cast<void*>(&OvGetProcAddressV2), kSymbol},
};

void* Find(Lookup lookup, const char* name) {
  for (const Entry& e : kOverrides) {
    if ((e.lookup & lookup) != 0 && std::strcmp(e.name, name) == 0) return e.fn;
  }
  return nullptr;
}

}  // namespace

void* DriverOverrideByProcName(const char* name, int cuda_version) {
  if (name == nullptr || name[0] != 'c' || name[1] != 'u') return nullptr;
  // Why >= 12000: below, some of these names resolve to older ABIs (cuGetProcAddress without status).
  if (cuda_version < 12000) return nullptr;
  return Find(kProcName, name);
}

void* DriverOverrideBySymbol(const char* name) {
  if (name == nullptr || name[0] != 'c' || name[1] != 'u') return nullptr;
  return Find(kSymbol, name);
}

bool CallerWantsOverrides(const void* caller) {
  Dl_info info{};
  if (caller == nullptr || dladdr(caller, &info) == 0 || info.dli_fname == nullptr) return true;
  static const char* const kNvidia[] = {"libcuda.", "libcudart", "libnccl", "libcublas", "libcudnn",  "libcufft",
                                        "libcurand", "libcusolver", "libcusparse", "libnvrtc", "libnvJitLink",
                                        "libcupti", "libnvidia", "libprism"};
  for (const char* n : kNvidia) {
    if (std::strstr(info.dli_fname, n) != nullptr) return false;
  }
  return true;
}

}  // namespace prism::interpose
