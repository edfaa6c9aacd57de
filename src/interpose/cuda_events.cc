// cudaEventRecord / cudaEventRecordWithFlags / cudaStreamWaitEvent / cudaEventDestroy: passed through, and noted for the graph (a
// stream that waits for an event recorded on another stream after one of its units depends on that unit: event file
// "wait" lines, core/streams.h).
#include <cuda_runtime_api.h>

#include "interpose/api.h"
#include "interpose/core/real_symbols.h"
#include "interpose/core/streams.h"

using namespace prism::interpose;

namespace {

// Calls the real function (cudaErrorNotSupported without one), then `note` when it succeeded.
template <typename Real, typename Note, typename... Args>
cudaError_t PassThenNote(Real real, Note note, Args... args) {
  if (real == nullptr) return cudaErrorNotSupported;
  cudaError_t e = real(args...);
  if (e == cudaSuccess) Guarded(0, [&] { note(); return 0; });
  return e;
}

}  // namespace

PRISM_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return PassThenNote(Cudart().cudaEventRecord, [&] { NoteEventRecord(event, stream); }, event, stream);
}

PRISM_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  return PassThenNote(Cudart().cudaEventRecordWithFlags, [&] { NoteEventRecord(event, stream); }, event, stream,
                      flags);
}

PRISM_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  return PassThenNote(Cudart().cudaStreamWaitEvent, [&] { NoteStreamWaitEvent(stream, event); }, stream, event,
                      flags);
}

PRISM_API cudaError_t cudaEventDestroy(cudaEvent_t event) {
  const auto real = Cudart().cudaEventDestroy;
  if (real == nullptr) return cudaErrorNotSupported;
  // Why before: once destroyed, the driver may hand the same handle to a new event.
  Guarded(0, [&] { NoteEventDestroy(event); return 0; });
  return real(event);
}
