// Real entry points, resolved in one place (ARCHITECTURE.md "Real symbols"):
//  - libcudart and libnccl through the copy the process already loaded: dl_iterate_phdr finds the object,
//    dlopen(path, RTLD_NOLOAD | RTLD_LAZY) gives its handle, the real dlsym looks the name up there.
//    Why not RTLD_NEXT: torch loads those libraries outside the global scope; RTLD_NEXT returned NULL and the
//    process died (shared/reference/gpu-machine-findings.md).
//  - the CUDA driver (libcuda.so.1, dlopen'ed by us) through its cuGetProcAddress, so every function comes in the
//    ABI version of the headers we were built with (CUDA 13).
// libprism never links libcudart, libnccl or libcuda (no DT_NEEDED; tests/unit/exports_test.cc checks).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <string>
#include <type_traits>

namespace prism::interpose {

// glibc's dlsym, bypassing the dlsym libprism exports (dl_hooks.cc).
void* RealDlsym(void* handle, const char* name);

// Path of the first loaded object whose path contains `part` (libprism itself excluded); "" when none.
std::string FindLoadedObject(const char* part);

// dlopen(path, RTLD_NOLOAD | RTLD_LAZY) of FindLoadedObject(part); nullptr when not loaded.
void* LoadedLibraryHandle(const char* part);

// The symbol `name` from the loaded library matching `part` ("libcudart.so", "libnccl.so"); nullptr if absent.
void* LoadedSymbol(const char* part, const char* name);

// True when `addr` lies in an object whose path contains `part`.
bool AddressInObject(const void* addr, const char* part);

#define PRISM_CUDART_FUNCS(X)            \
  X(cudaGetDeviceCount)                  \
  X(cudaSetDevice)                       \
  X(cudaGetDevice)                       \
  X(cudaInitDevice)                      \
  X(cudaGetDeviceProperties)             \
  X(cudaDeviceGetAttribute)              \
  X(cudaDeviceGetPCIBusId)               \
  X(cudaDeviceGetByPCIBusId)             \
  X(cudaDeviceCanAccessPeer)             \
  X(cudaDeviceEnablePeerAccess)          \
  X(cudaDeviceDisablePeerAccess)         \
  X(cudaDeviceGetP2PAttribute)           \
  X(cudaPointerGetAttributes)            \
  X(cudaStreamGetDevice)                 \
  X(cudaDeviceGetDefaultMemPool)         \
  X(cudaDeviceGetMemPool)                \
  X(cudaDeviceSetMemPool)                \
  X(cudaMemPoolCreate)                   \
  X(cudaMemPoolSetAccess)                \
  X(cudaMemGetDefaultMemPool)            \
  X(cudaMemGetMemPool)                   \
  X(cudaMemSetMemPool)                   \
  X(cudaMemcpyPeer)                      \
  X(cudaMemcpyPeerAsync)                 \
  X(cudaKernelSetAttributeForDevice)     \
  X(cudaGetDriverEntryPoint)             \
  X(cudaGetDriverEntryPointByVersion)    \
  X(cudaFree)                            \
  X(cudaEventRecord)                     \
  X(cudaEventRecordWithFlags)            \
  X(cudaStreamWaitEvent)                 \
  X(cudaEventDestroy)                    \
  X(cudaFreeAsync)                       \
  X(cudaGetLastError)

// Functions cuda_runtime.h overloads with C++ templates (nccl.h includes it), and the per-thread-default-stream
// (_ptsz) and capture variants the headers declare only in some modes: their C signatures, spelled out.
#define PRISM_CUDART_TYPED_FUNCS(X)                                                    \
  X(cudaMalloc, cudaError_t (*)(void**, size_t))                                       \
  X(cudaMallocAsync, cudaError_t (*)(void**, size_t, cudaStream_t))                    \
  X(cudaMallocFromPoolAsync, cudaError_t (*)(void**, size_t, cudaMemPool_t, cudaStream_t)) \
  X(cudaMallocManaged, cudaError_t (*)(void**, size_t, unsigned int))                  \
  X(cudaMallocPitch, cudaError_t (*)(void**, size_t*, size_t, size_t))                 \
  X(cudaMallocAsync_ptsz, cudaError_t (*)(void**, size_t, cudaStream_t))               \
  X(cudaFreeAsync_ptsz, cudaError_t (*)(void*, cudaStream_t))                          \
  X(cudaMallocFromPoolAsync_ptsz, cudaError_t (*)(void**, size_t, cudaMemPool_t, cudaStream_t)) \
  X(cudaStreamBeginCapture, cudaError_t (*)(cudaStream_t, cudaStreamCaptureMode))      \
  X(cudaStreamBeginCapture_ptsz, cudaError_t (*)(cudaStream_t, cudaStreamCaptureMode)) \
  X(cudaStreamBeginCaptureToGraph, cudaError_t (*)(cudaStream_t, cudaGraph_t, const cudaGraphNode_t*,       \
                                                   const cudaGraphEdgeData*, size_t, cudaStreamCaptureMode))

#define PRISM_DECLARE_FN(name) decltype(&::name) name = nullptr;
#define PRISM_DECLARE_TYPED_FN(name, type) std::type_identity_t<type> name = nullptr;

struct CudartFns {
  PRISM_CUDART_FUNCS(PRISM_DECLARE_FN)
  PRISM_CUDART_TYPED_FUNCS(PRISM_DECLARE_TYPED_FN)
};

// Resolved on first call (libcudart is loaded by then: the caller of a cudart entry point linked it).
// Missing functions stay nullptr; wrappers then return cudaErrorNotSupported.
const CudartFns& Cudart();

// The real NCCL: version queries, and everything a passthrough communicator (comm.h) forwards.
#define PRISM_NCCL_FUNCS(X)      \
  X(ncclGetVersion)              \
  X(ncclGetErrorString)          \
  X(ncclGetUniqueId)             \
  X(ncclCommInitRankConfig)      \
  X(ncclCommSplit)               \
  X(ncclCommFinalize)            \
  X(ncclCommDestroy)             \
  X(ncclCommAbort)               \
  X(ncclCommGetAsyncError)       \
  X(ncclGroupStart)              \
  X(ncclGroupEnd)                \
  X(ncclAllReduce)               \
  X(ncclBroadcast)               \
  X(ncclReduce)                  \
  X(ncclAllGather)               \
  X(ncclReduceScatter)           \
  X(ncclAlltoAll)                \
  X(ncclGather)                  \
  X(ncclScatter)                 \
  X(ncclSend)                    \
  X(ncclRecv)                    \
  X(ncclRedOpCreatePreMulSum)    \
  X(ncclRedOpDestroy)            \
  X(ncclCommRegister)            \
  X(ncclCommDeregister)          \
  X(ncclCommWindowRegister)      \
  X(ncclCommWindowDeregister)    \
  X(ncclCommCount)               \
  X(ncclCommUserRank)            \
  X(ncclCommCuDevice)            \
  X(ncclBcast)                   \
  X(ncclMemAlloc)                \
  X(ncclMemFree)

struct NcclFns {
  PRISM_NCCL_FUNCS(PRISM_DECLARE_FN)
  std::string path;  // the library they came from ("" when none was found)
  // Everything a passthrough communicator needs is there.
  bool Complete() const;
};
// The real libnccl: PRISM_NCCL_LIBRARY when set (dlopen'ed, RTLD_LOCAL), else the one the job already loaded
// (PyTorch's). Resolved once; missing functions stay nullptr.
const NcclFns& LoadedNccl();
// The current runtime's NCCL table (runtime.h): LoadedNccl() unless the runtime was given a fake.
const NcclFns& RealNccl();

#define PRISM_DRIVER_FUNCS(X)             \
  X(cuInit)                               \
  X(cuDriverGetVersion)                   \
  X(cuDeviceGet)                          \
  X(cuDeviceGetCount)                     \
  X(cuDeviceGetAttribute)                 \
  X(cuDeviceGetName)                      \
  X(cuDeviceTotalMem)                     \
  X(cuDeviceGetUuid)                      \
  X(cuDeviceGetPCIBusId)                  \
  X(cuDeviceCanAccessPeer)                \
  X(cuDevicePrimaryCtxRetain)             \
  X(cuDevicePrimaryCtxRelease)            \
  X(cuDevicePrimaryCtxGetState)           \
  X(cuDevicePrimaryCtxReset)              \
  X(cuDevicePrimaryCtxSetFlags)           \
  X(cuCtxGetCurrent)                      \
  X(cuCtxSetCurrent)                      \
  X(cuCtxGetDevice)                       \
  X(cuCtxSynchronize)                     \
  X(cuModuleLoadData)                     \
  X(cuModuleGetFunction)                  \
  X(cuLaunchKernel)                       \
  X(cuMemHostAlloc)                       \
  X(cuMemHostGetDevicePointer)            \
  X(cuMemFreeHost)                        \
  X(cuStreamWaitValue32)                  \
  X(cuStreamWriteValue32)                 \
  X(cuMemcpyAsync)                        \
  X(cuMemsetD8Async)                      \
  X(cuMemAlloc)                           \
  X(cuMemFree)                            \
  X(cuMemGetInfo)                         \
  X(cuStreamCreate)                       \
  X(cuStreamDestroy)                      \
  X(cuStreamSynchronize)                  \
  X(cuStreamQuery)                        \
  X(cuStreamIsCapturing)                  \
  X(cuStreamWaitEvent)                    \
  X(cuEventCreate)                        \
  X(cuEventRecord)                        \
  X(cuEventQuery)                         \
  X(cuEventElapsedTime)                   \
  X(cuEventDestroy)                       \
  X(cuMemCreate)                          \
  X(cuMemRelease)                         \
  X(cuMemSetAccess)                       \
  X(cuMemGetAllocationGranularity)        \
  X(cuPointerGetAttribute)                \
  X(cuGetErrorString)

struct DriverFns {
  PRISM_DRIVER_FUNCS(PRISM_DECLARE_FN)
  decltype(&::cuGetProcAddress) cuGetProcAddress = nullptr;  // the real one (cuGetProcAddress_v2)
  bool loaded = false;  // libcuda.so.1 was found and cuGetProcAddress resolved
};

// dlopen("libcuda.so.1") + cuGetProcAddress for every function above, once. Never calls cuInit.
const DriverFns& LoadedDriver();
// The current runtime's driver table (runtime.h): LoadedDriver() unless the runtime was given a fake.
const DriverFns& Driver();

}  // namespace prism::interpose

#pragma GCC diagnostic pop
