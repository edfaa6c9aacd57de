// Kernel-level timeline of a real rank (PRISM_KERNELS, `prism-run --kernels`; docs/kernels.md): CUPTI's activity
// API records every kernel, memcpy and memset (and NVTX ranges with PRISM_KERNELS=nvtx) of the process into
// $PRISM_OUT_DIR/rank<R>.kernels.jsonl (format: include/prism/kernels.h).
//
// Off the hot path: CUPTI fills buffers we hand it and delivers completed ones on its own worker thread; that
// callback only queues them, and a writer thread of ours turns records into lines. libcupti is dlopen'ed at run
// time (no link-time dependency); whatever fails (no CUPTI, wrong version, another profiler holds CUPTI) is logged
// once and the job runs on without kernel records, never fails because of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace prism::interpose {

// Starts tracing when PRISM_KERNELS is set: the first call (from cudaGetDeviceCount, which torch calls before it
// creates a context or launches anything) loads CUPTI and enables the activity kinds; later calls cost one relaxed
// atomic load. Only one process per rank traces (a lock on the kernel file), so CUDA-using children of the job do
// not write into the rank's file.
void KernelTraceAtCudaInit();

// Flushes CUPTI (forced), writes the remaining records, the last sync line and the end line, closes the file.
// Registered with atexit when tracing starts (a no-op in a forked child); tests call it directly.
void KernelTraceFinish();
// At iteration mark `iteration` (the start of that iteration): with PRISM_KERNELS_TOGGLE=N, recording is switched
// off for iterations whose (iteration / N) is odd and on again for even ones (cuptiActivityDisable/Enable of the
// enabled kinds). No-op otherwise.
void KernelTraceAtIteration(uint32_t iteration);

// "on" (tracing), "off" (not requested, or failed: KernelTraceWhy says why), "" (not started yet).
std::string KernelTraceState();
std::string KernelTraceWhy();
std::string KernelTracePath();

// Where libcupti is looked for, in order: PRISM_CUPTI_LIBRARY alone when `forced` is set; else a libcupti the
// process already loaded (a second copy would fight the first), the PyTorch wheel's (relative to the directories
// of the loaded libcudart / libtorch: nvidia/cu13/lib, nvidia/cuda_cupti/lib), the loader path, the toolkit's.
std::vector<std::string> CuptiCandidates(const std::string& forced, const std::string& loaded_cupti,
                                         const std::vector<std::string>& loaded_library_dirs);

// True when records of a libcupti reporting `runtime` (cuptiGetVersion) have the layout of the headers we were
// built with (`built`, CUPTI_API_VERSION): the same major version (13xxxx) since CUDA 13's numbering.
bool CuptiVersionCompatible(uint32_t built, uint32_t runtime);

// Demangled kernel name (the mangled one when it does not demangle, e.g. extern "C" kernels).
std::string DemangleKernelName(const char* mangled);

}  // namespace prism::interpose
