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

#define PRISM_REAL_OR_FAIL(fn) \
  if (D().fn == nullptr) return CUDA_ERROR_NOT_SUPPORTED;

CUresult CUDAAPI OvDeviceGet(CUdevice* dev, int ordinal) {
  if (!devices::Virtualized()) {
    PRISM_REAL_OR_FAIL(cuDeviceGet)
    return D().cuDeviceGet(dev, ordinal);
  }
  if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!devices::Valid(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *dev = static_cast<CUdevice>(ordinal);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI OvDeviceGetCount(int* count) {
  PRISM_REAL_OR_FAIL(cuDeviceGetCount)
  CUresult r = D().cuDeviceGetCount(count);
  if (r == CUDA_SUCCESS && devices::Virtualized()) *count = devices::Count();
  return r;
}

CUresult CUDAAPI OvDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice dev) {
  PRISM_REAL_OR_FAIL(cuDeviceGetAttribute)
  return D().cuDeviceGetAttribute(v, a, Map(dev));
}

CUresult CUDAAPI OvDeviceGetName(char* name, int len, CUdevice dev) {
  PRISM_REAL_OR_FAIL(cuDeviceGetName)
  return D().cuDeviceGetName(name, len, Map(dev));
}

CUresult CUDAAPI OvDeviceTotalMem(size_t* bytes, CUdevice dev) {
  PRISM_REAL_OR_FAIL(cuDeviceTotalMem)
  return D().cuDeviceTotalMem(bytes, Map(dev));
}

CUresult CUDAAPI OvDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  PRISM_REAL_OR_FAIL(cuDeviceGetUuid)
  return D().cuDeviceGetUuid(uuid, Map(dev));
}

CUresult CUDAAPI OvDeviceGetPCIBusId(char* bus, int len, CUdevice dev) {
  PRISM_REAL_OR_FAIL(cuDeviceGetPCIBusId)
  return D().cuDeviceGetPCIBusId(bus, len, Map(dev));
}

CUresult CUDAAPI OvDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  if (!devices::Virtualized()) {
    PRISM_REAL_OR_FAIL(cuDeviceCanAccessPeer)
    return D().cuDeviceCanAccessPeer(can, dev, peer);
  }
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!devices::Valid(dev) || !devices::Valid(peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = dev != peer ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI OvPrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  PRISM_REAL_OR_FAIL(cuDevicePrimaryCtxRetain)
  return D().cuDevicePrimaryCtxRetain(ctx, Map(dev));
}

CUresult CUDAAPI OvPrimaryCtxRelease(CUdevice dev) {
  PRISM_REAL_OR_FAIL(cuDevicePrimaryCtxRelease)
  return D().cuDevicePrimaryCtxRelease(Map(dev));
}

CUresult CUDAAPI OvPrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  PRISM_REAL_OR_FAIL(cuDevicePrimaryCtxGetState)
  return D().cuDevicePrimaryCtxGetState(Map(dev), flags, active);
}

CUresult CUDAAPI OvPrimaryCtxReset(CUdevice dev) {
  PRISM_REAL_OR_FAIL(cuDevicePrimaryCtxReset)
  return D().cuDevicePrimaryCtxReset(Map(dev));
}

CUresult CUDAAPI OvPrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  PRISM_REAL_OR_FAIL(cuDevicePrimaryCtxSetFlags)
  return D().cuDevicePrimaryCtxSetFlags(Map(dev), flags);
}

CUresult CUDAAPI OvCtxGetDevice(CUdevice* dev) {
  PRISM_REAL_OR_FAIL(cuCtxGetDevice)
  CUresult r = D().cuCtxGetDevice(dev);
  if (r == CUDA_SUCCESS && devices::Virtualized()) *dev = static_cast<CUdevice>(devices::Current());
  return r;
}

CUresult CUDAAPI OvMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long flags) {
  PRISM_REAL_OR_FAIL(cuMemCreate)
  if (prop == nullptr) return D().cuMemCreate(handle, size, prop, flags);
  CUmemAllocationProp p = *prop;
  MapLocation(&p.location);
  CUresult r = D().cuMemCreate(handle, size, &p, flags);
  // Under context switching: wait for the coordinator to make room, then retry (core/memory.h).
  if (r == CUDA_ERROR_OUT_OF_MEMORY && p.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    r = memory::RetryWithRoom(size, CUDA_ERROR_OUT_OF_MEMORY, [&] { return D().cuMemCreate(handle, size, &p, flags); });
  }
  if (r == CUDA_SUCCESS && handle != nullptr && p.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    memory::RecordHandleCreate(static_cast<uint64_t>(*handle), size);
  }
  return r;
}

CUresult CUDAAPI OvMemRelease(CUmemGenericAllocationHandle handle) {
  PRISM_REAL_OR_FAIL(cuMemRelease)
  CUresult r = D().cuMemRelease(handle);
  if (r == CUDA_SUCCESS) memory::RecordHandleRelease(static_cast<uint64_t>(handle));
  return r;
}

CUresult CUDAAPI OvMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  PRISM_REAL_OR_FAIL(cuMemSetAccess)
  constexpr size_t kMax = 64;
  if (desc == nullptr || count == 0 || count > kMax) return D().cuMemSetAccess(ptr, size, desc, count);
  CUmemAccessDesc copy[kMax];
  for (size_t i = 0; i < count; ++i) {
    copy[i] = desc[i];
    MapLocation(&copy[i].location);
  }
  return D().cuMemSetAccess(ptr, size, copy, count);
}

CUresult CUDAAPI OvMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  PRISM_REAL_OR_FAIL(cuMemGetAllocationGranularity)
  if (prop == nullptr) return D().cuMemGetAllocationGranularity(g, prop, option);
  CUmemAllocationProp p = *prop;
  MapLocation(&p.location);
  return D().cuMemGetAllocationGranularity(g, &p, option);
}

CUresult CUDAAPI OvPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  PRISM_REAL_OR_FAIL(cuPointerGetAttribute)
  CUresult r = D().cuPointerGetAttribute(data, attr, ptr);
  if (r == CUDA_SUCCESS && data != nullptr && attr == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL && devices::Virtualized()) {
    int* ord = static_cast<int*>(data);
    if (*ord == devices::Physical()) *ord = devices::Current();
  }
  return r;
}

CUresult CUDAAPI OvGetProcAddressV2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* status) {
  PRISM_REAL_OR_FAIL(cuGetProcAddress)
  CUresult r = D().cuGetProcAddress(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr && symbol != nullptr) {
    if (void* o = DriverOverrideByProcName(symbol, version)) *pfn = o;
  }
  return r;
}

// cuGetProcAddress's first ABI (CUDA 11.3-11.8): no status argument.
CUresult CUDAAPI OvGetProcAddressV1(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return OvGetProcAddressV2(symbol, pfn, version, flags, nullptr);
}

#undef PRISM_REAL_OR_FAIL

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
