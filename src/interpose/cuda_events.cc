// cudaEventRecord / cudaEventRecordWithFlags / cudaStreamWaitEvent / cudaEventDestroy: passed through, and noted for
// the graph (a stream that waits for an event recorded on another stream after one of its units depends on that
// unit: event file "wait" lines, core/streams.h).
#include <cuda_runtime_api.h>

#include "interpose/api.h"
#include "interpose/core/real_symbols.h"
#include "interpose/core/streams.h"

using namespace prism::interpose;

PRISM_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  const auto real = Cudart().cudaEventRecord;
  if (real == nullptr) return cudaErrorNotSupported;
  const cudaError_t e = real(event, stream);
  if (e == cudaSuccess) Guarded([&] { NoteEventRecord(event, stream); });
  return e;
}

PRISM_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  const auto real = Cudart().cudaEventRecordWithFlags;
  if (real == nullptr) return cudaErrorNotSupported;
  const cudaError_t e = real(event, stream, flags);
  if (e == cudaSuccess) Guarded([&] { NoteEventRecord(event, stream); });
  return e;
}

PRISM_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  const auto real = Cudart().cudaStreamWaitEvent;
  if (real == nullptr) return cudaErrorNotSupported;
  const cudaError_t e = real(stream, event, flags);
  if (e == cudaSuccess) Guarded([&] { NoteStreamWaitEvent(stream, event); });
  return e;
}

PRISM_API cudaError_t cudaEventDestroy(cudaEvent_t event) {
  const auto real = Cudart().cudaEventDestroy;
  if (real == nullptr) return cudaErrorNotSupported;
  // Why before: once destroyed, the driver may hand the same handle to a new event.
  Guarded([&] { NoteEventDestroy(event); });
  return real(event);
}
