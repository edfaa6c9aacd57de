// CUDA graph capture: libprism only needs to know that a capture ever began, so that units skip the per-call
// cuStreamIsCapturing query in the (usual) jobs that never capture (core/gpu.h NoteCaptureBegan).
#include <cuda_runtime_api.h>

#include "interpose/api.h"
#include "interpose/core/gpu.h"
#include "interpose/core/real_symbols.h"

using namespace prism::interpose;

namespace {
template <typename Fn>
Fn Real(const char* name) {
  return reinterpret_cast<Fn>(LoadedSymbol("libcudart.so", name));
}
}  // namespace

PRISM_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  static const auto real = Real<cudaError_t (*)(cudaStream_t, cudaStreamCaptureMode)>("cudaStreamBeginCapture");
  NoteCaptureBegan();
  return real != nullptr ? real(stream, mode) : cudaErrorNotSupported;
}

PRISM_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, cudaStreamCaptureMode mode) {
  static const auto real = Real<cudaError_t (*)(cudaStream_t, cudaStreamCaptureMode)>("cudaStreamBeginCapture_ptsz");
  NoteCaptureBegan();
  return real != nullptr ? real(stream, mode) : cudaErrorNotSupported;
}

PRISM_API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                    const cudaGraphNode_t* dependencies,
                                                    const cudaGraphEdgeData* dependencyData, size_t numDependencies,
                                                    cudaStreamCaptureMode mode) {
  using Fn = cudaError_t (*)(cudaStream_t, cudaGraph_t, const cudaGraphNode_t*, const cudaGraphEdgeData*, size_t,
                             cudaStreamCaptureMode);
  static const auto real = Real<Fn>("cudaStreamBeginCaptureToGraph");
  NoteCaptureBegan();
  return real != nullptr ? real(stream, graph, dependencies, dependencyData, numDependencies, mode)
                         : cudaErrorNotSupported;
}
