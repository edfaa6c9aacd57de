// Version (the real library's), error strings, last error, PreMulSum operators, ncclMemAlloc/ncclMemFree (real
// device memory through the driver, counted in the rank's peak), ncclResetDebugInit.
#include <dlfcn.h>
#include <nccl.h>

#include <string>

#include "interpose/api.h"
#include "interpose/core/comm.h"
#include "interpose/core/gpu.h"
#include "interpose/core/memory.h"
#include "interpose/core/real_symbols.h"
#include "interpose/core/redops.h"

using namespace prism::interpose;

namespace prism::interpose {
bool CalledFromRealNccl(const void* return_address) {
  const std::string& real = RealNccl().path;
  if (real.empty() || return_address == nullptr) return false;
  Dl_info info{};
  if (dladdr(return_address, &info) == 0 || info.dli_fname == nullptr) return false;
  return real == info.dli_fname;
}
}  // namespace prism::interpose

PRISM_API ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  const NcclFns& real = RealNccl();
  // Why the real one: torch checks feature support by version; it must match the library it was built against.
  if (real.ncclGetVersion != nullptr && real.ncclGetVersion(version) == ncclSuccess) return ncclSuccess;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

PRISM_API const char* ncclGetErrorString(ncclResult_t code) {
  switch (code) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

PRISM_API const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return LastError();
}

PRISM_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                ncclScalarResidence_t residence, ncclComm_t comm) {
  Comm* c = ToComm(comm);
  if (c == nullptr) return ForwardForeign(RealNccl().ncclRedOpCreatePreMulSum, op, scalar, datatype, residence, comm);
  return Guarded(ncclInternalError, [&] { return RedOpCreatePreMulSum(op, scalar, datatype, residence, c); });
}

PRISM_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  Comm* c = ToComm(comm);
  if (c == nullptr) return ForwardForeign(RealNccl().ncclRedOpDestroy, op, comm);
  return Guarded(ncclInternalError, [&] { return RedOpDestroy(op, c); });
}

PRISM_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  // Why the caller: libnccl's own copy-engine and RMA code calls this for memory it frees with its own ncclMemFree.
  if (CalledFromRealNccl(__builtin_return_address(0))) return ForwardForeign(RealNccl().ncclMemAlloc, ptr, size);
  if (ptr == nullptr) return ncclInvalidArgument;
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  const DriverFns& d = Driver();
  if (!TheGpu().EnsureReady() || d.cuMemAlloc == nullptr) return ncclUnhandledCudaError;
  TheGpu().EnsureContext();
  CUdeviceptr p = 0;
  if (d.cuMemAlloc(&p, size) != CUDA_SUCCESS) return ncclUnhandledCudaError;
  *ptr = reinterpret_cast<void*>(p);
  memory::RecordAlloc(*ptr, size);
  return ncclSuccess;
}

PRISM_API ncclResult_t ncclMemFree(void* ptr) {
  if (CalledFromRealNccl(__builtin_return_address(0))) return ForwardForeign(RealNccl().ncclMemFree, ptr);
  if (ptr == nullptr) return ncclSuccess;
  const DriverFns& d = Driver();
  if (d.cuMemFree == nullptr) return ncclUnhandledCudaError;
  memory::RecordFree(ptr);
  return d.cuMemFree(reinterpret_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS ? ncclSuccess : ncclUnhandledCudaError;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
PRISM_API void ncclResetDebugInit() {}
#pragma GCC diagnostic pop

#define PRISM_ALIAS(name) __attribute__((alias(#name), visibility("default")))
extern "C" {
ncclResult_t pncclGetVersion(int*) PRISM_ALIAS(ncclGetVersion);
const char* pncclGetErrorString(ncclResult_t) PRISM_ALIAS(ncclGetErrorString);
const char* pncclGetLastError(ncclComm_t) PRISM_ALIAS(ncclGetLastError);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t)
    PRISM_ALIAS(ncclRedOpCreatePreMulSum);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t, ncclComm_t) PRISM_ALIAS(ncclRedOpDestroy);
ncclResult_t pncclMemAlloc(void**, size_t) PRISM_ALIAS(ncclMemAlloc);
ncclResult_t pncclMemFree(void*) PRISM_ALIAS(ncclMemFree);
void pncclResetDebugInit() PRISM_ALIAS(ncclResetDebugInit);
}
