// Process-local stream indices of the streams that carried units (event files: the graph's per-stream order), and
// the cross-stream dependencies the job's events make between them.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace prism::interpose {

// Units issued per stream index so far (the next unit's OpEvent::stream_seq); streams past the table are not
// counted (their units carry stream_seq 0 and no "wait" line names them).
inline constexpr size_t kCountedStreams = 256;
std::atomic<uint32_t>& StreamUnits(size_t idx);  // idx < kCountedStreams

// The index of a stream that carried a unit, or -1 (never adds one: only units number streams).
int KnownStreamIndex(CUstream s);
// Process-local index of a stream, in order of first use (adds it).
uint16_t StreamIndex(CUstream s);

// Cross-stream dependencies for the graph (event file "wait" lines): cudaEventRecord / cudaStreamWaitEvent as the job
// made them. Cheap (a mutex and a map entry). Dependencies pass through streams without units (torch's compute
// stream): a stream carries the points it waited for, an event recorded on it carries them on, and a unit stream
// that waits for such an event depends on every one of them (a pipeline receive issued after a forward pass depends
// on that pass's tensor-parallel all-reduces, through the compute stream).
void NoteEventRecord(cudaEvent_t event, cudaStream_t stream);
void NoteStreamWaitEvent(cudaStream_t stream, cudaEvent_t event);
// Forgets a destroyed event's points (the table would otherwise grow with every event torch creates).
void NoteEventDestroy(cudaEvent_t event);
// Events with points held (the table's size).
size_t EventPointsHeld();

}  // namespace prism::interpose
