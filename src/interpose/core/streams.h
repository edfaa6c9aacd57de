// Process-local stream indices of the streams that carried units (event files: the graph's per-stream order).
#pragma once

#include <cuda.h>

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

}  // namespace prism::interpose
