// cudaGetDriverEntryPoint[ByVersion]: how PyTorch (c10/cuda/driver_api.cpp) reaches the driver's VMM calls and
// device functions; libprism hands back its replacements (core/driver_overrides.h).
#include <cuda_runtime_api.h>

#include "interpose/api.h"
#include "interpose/core/driver_overrides.h"
#include "interpose/core/real_symbols.h"

using namespace prism::interpose;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

PRISM_API cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                                              cudaDriverEntryPointQueryResult* driverStatus) {
  const auto real = Cudart().cudaGetDriverEntryPoint;
  if (real == nullptr) return cudaErrorNotSupported;
  cudaError_t e = real(symbol, funcPtr, flags, driverStatus);
  if (e == cudaSuccess && funcPtr != nullptr && *funcPtr != nullptr) {
    if (void* o = DriverOverrideByProcName(symbol, CUDART_VERSION)) *funcPtr = o;
  }
  return e;
}

PRISM_API cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                                       unsigned long long flags,
                                                       cudaDriverEntryPointQueryResult* driverStatus) {
  const auto real = Cudart().cudaGetDriverEntryPointByVersion;
  if (real == nullptr) return cudaErrorNotSupported;
  cudaError_t e = real(symbol, funcPtr, cudaVersion, flags, driverStatus);
  if (e == cudaSuccess && funcPtr != nullptr && *funcPtr != nullptr) {
    if (void* o = DriverOverrideByProcName(symbol, static_cast<int>(cudaVersion))) *funcPtr = o;
  }
  return e;
}

#pragma GCC diagnostic pop
