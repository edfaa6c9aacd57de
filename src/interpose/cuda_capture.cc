// CUDA graph capture: libprism only needs to know that a capture ever began, so that units skip the per-call
// cuStreamIsCapturing query in the (usual) jobs that never capture (core/gpu.h NoteCaptureBegan).
#include <cuda_runtime_api.h>

#include "interpose/api.h"
#include "interpose/core/gpu.h"
#include "interpose/core/real_symbols.h"

using namespace prism::interpose;

PRISM_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  const auto real = Cudart().cudaStreamBeginCapture;
  if (real == nullptr) return cudaErrorNotSupported;
  NoteCaptureBegan();
  return real(stream, mode);
}

PRISM_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, cudaStreamCaptureMode mode) {
  const auto real = Cudart().cudaStreamBeginCapture_ptsz;
  if (real == nullptr) return cudaErrorNotSupported;
  NoteCaptureBegan();
  return real(stream, mode);
}

PRISM_API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                    const cudaGraphNode_t* dependencies,
                                                    const cudaGraphEdgeData* dependencyData, size_t numDependencies,
                                                    cudaStreamCaptureMode mode) {
  const auto real = Cudart().cudaStreamBeginCaptureToGraph;
  if (real == nullptr) return cudaErrorNotSupported;
  NoteCaptureBegan();
  return real(stream, graph, dependencies, dependencyData, numDependencies, mode);
}
