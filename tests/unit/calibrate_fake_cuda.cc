// A fake libcuda.so.1 for calibrate_measure_test: the driver entry points the measurer resolves (by the names cuda.h
// maps them to), on host memory. Work is synchronous (the fake NCCL returns when its call is done), so an event
// records the host clock. FAKE_CUDA_GPUS (default 2) devices; FAKE_CUDA_INIT_ERROR makes cuInit fail.
#include <cuda.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

namespace {
struct FakeEvent {
  double ms = 0;
};
double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

extern "C" {

CUresult cuInit(unsigned int) { return std::getenv("FAKE_CUDA_INIT_ERROR") ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int* n) {
  const char* g = std::getenv("FAKE_CUDA_GPUS");
  *n = g ? std::atoi(g) : 2;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  *d = ordinal;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char* name, int len, CUdevice) {
  std::strncpy(name, "Fake H200", static_cast<size_t>(len));
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
  *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9 : 0;
  return CUDA_SUCCESS;
}
CUresult cuDeviceCanAccessPeer(int* can, CUdevice, CUdevice) {
  *can = 1;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  *c = reinterpret_cast<CUcontext>(static_cast<intptr_t>(d) + 1);
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext) { return CUDA_SUCCESS; }
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
  void* m = std::malloc(bytes);
  if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = reinterpret_cast<CUdeviceptr>(m);
  return CUDA_SUCCESS;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  std::free(reinterpret_cast<void*>(p));
  return CUDA_SUCCESS;
}
CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
  std::memset(reinterpret_cast<void*>(p), v, n);
  return CUDA_SUCCESS;
}
CUresult cuStreamCreate(CUstream* s, unsigned int) {
  *s = reinterpret_cast<CUstream>(new int(0));
  return CUDA_SUCCESS;
}
CUresult cuStreamDestroy_v2(CUstream s) {
  delete reinterpret_cast<int*>(s);
  return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream) { return CUDA_SUCCESS; }
CUresult cuEventCreate(CUevent* e, unsigned int) {
  *e = reinterpret_cast<CUevent>(new FakeEvent);
  return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream) {
  reinterpret_cast<FakeEvent*>(e)->ms = NowMs();
  return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent) { return CUDA_SUCCESS; }
CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
  *ms = static_cast<float>(reinterpret_cast<FakeEvent*>(b)->ms - reinterpret_cast<FakeEvent*>(a)->ms);
  return CUDA_SUCCESS;
}
CUresult cuEventDestroy_v2(CUevent e) {
  delete reinterpret_cast<FakeEvent*>(e);
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult, const char** s) {
  *s = "fake CUDA error";
  return CUDA_SUCCESS;
}

}  // extern "C"
