// The streams that carried units (their process-local indices, in order of first use) and the cross-stream
// dependencies the job's events make between them (NoteEventRecord, NoteStreamWaitEvent).
#include "interpose/core/streams.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "interpose/core/event_log.h"

namespace prism::interpose {
namespace {

std::atomic<uint32_t> g_stream_units[kCountedStreams];

}  // namespace

std::atomic<uint32_t>& StreamUnits(size_t idx) { return g_stream_units[idx]; }

namespace {

struct StreamTable {
  std::mutex mu;
  std::vector<CUstream> seen;
};
StreamTable& Streams() {
  static StreamTable* t = new StreamTable();  // Why leaked: used until exit
  return *t;
}

}  // namespace

// The index of a stream that carried a unit, or -1 (never adds one: only units number streams).
int KnownStreamIndex(CUstream s) {
  // Why a cache of hits only: torch records events on a few streams over and over (a hot path); an index, once
  // given, never changes, while a stream unknown now may carry a unit later.
  thread_local CUstream last = nullptr;
  thread_local int last_idx = -1;
  if (last_idx >= 0 && last == s) return last_idx;
  StreamTable& t = Streams();
  std::lock_guard<std::mutex> lock(t.mu);
  for (size_t i = 0; i < t.seen.size() && i < kCountedStreams; ++i) {
    if (t.seen[i] != s) continue;
    last = s;
    last_idx = static_cast<int>(i);
    return last_idx;
  }
  return -1;
}

// Process-local index of a stream, in order of first use (event files: the graph's per-stream order).
uint16_t StreamIndex(CUstream s) {
  thread_local CUstream last = nullptr;
  thread_local uint16_t last_idx = 0;
  thread_local bool has_last = false;
  if (has_last && last == s) return last_idx;
  StreamTable& t = Streams();
  std::vector<CUstream>* seen = &t.seen;
  std::lock_guard<std::mutex> lock(t.mu);
  size_t i = 0;
  while (i < seen->size() && (*seen)[i] != s) ++i;
  if (i == seen->size()) {
    try {
      seen->push_back(s);
    } catch (...) {
      return 0;
    }
  }
  last = s;
  last_idx = static_cast<uint16_t>(std::min<size_t>(i, 65535));
  has_last = true;
  return last_idx;
}

// Cross-stream dependencies (streams.h). Events are reused (torch pools them): a record always overwrites it with
// the recording stream's points, and a record that carries none forgets the event.
namespace {
// Points a stream depends on: per unit stream, the last of its units (max), at most kMaxPoints streams (a job has a
// handful of communicator streams; past that the oldest dependencies are dropped, which only loses graph edges).
struct Points {
  static constexpr size_t kMaxPoints = 12;
  uint8_t n = 0;
  std::array<std::pair<uint16_t, uint32_t>, kMaxPoints> p{};
  void Merge(uint16_t stream, uint32_t unit) {
    for (size_t i = 0; i < n; ++i) {
      if (p[i].first != stream) continue;
      p[i].second = std::max(p[i].second, unit);
      return;
    }
    if (n < kMaxPoints) {
      p[n++] = {stream, unit};
    } else {
      std::move(p.begin() + 1, p.end(), p.begin());
      p[kMaxPoints - 1] = {stream, unit};
    }
  }
};
struct EventPoints {
  std::mutex mu;
  std::unordered_map<cudaEvent_t, Points> at;         // event -> the points its record carries
  std::unordered_map<CUstream, Points> of_stream;     // stream -> the points it has waited for
  std::map<std::pair<uint16_t, uint16_t>, uint32_t> last_wait;  // (waiting stream, on) -> last `after` logged
};
EventPoints& EventPointTable() {
  static EventPoints* p = new EventPoints();  // Why leaked: used until exit
  return *p;
}
}  // namespace

void NoteEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return;
  const auto s = reinterpret_cast<CUstream>(stream);
  const int idx = KnownStreamIndex(s);
  const uint32_t units = idx >= 0 ? StreamUnits(static_cast<size_t>(idx)).load(std::memory_order_relaxed) : 0;
  EventPoints& t = EventPointTable();
  std::lock_guard<std::mutex> lock(t.mu);
  Points pts;
  auto own = t.of_stream.find(s);
  if (own != t.of_stream.end()) pts = own->second;
  if (units > 0) pts.Merge(static_cast<uint16_t>(idx), units - 1);
  if (pts.n == 0) {
    t.at.erase(event);
    return;
  }
  try {
    t.at[event] = pts;
  } catch (...) {
  }
}

void NoteEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return;
  EventPoints& t = EventPointTable();
  std::lock_guard<std::mutex> lock(t.mu);
  t.at.erase(event);
}

size_t EventPointsHeld() {
  EventPoints& t = EventPointTable();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.at.size();
}

void NoteStreamWaitEvent(cudaStream_t stream, cudaEvent_t event) {
  if (event == nullptr) return;
  const auto s = reinterpret_cast<CUstream>(stream);
  const int idx = KnownStreamIndex(s);
  Points to_log;
  {
    EventPoints& t = EventPointTable();
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.at.find(event);
    if (it == t.at.end()) return;
    const Points pts = it->second;
    try {
      Points& mine = t.of_stream[s];
      for (size_t i = 0; i < pts.n; ++i) {
        const auto [on, after] = pts.p[i];
        if (static_cast<int>(on) == idx) continue;
        mine.Merge(on, after);
        if (idx < 0) continue;
        // Why only new points: torch makes a stream wait for the same point again and again (one line per dependency).
        auto [last, fresh] = t.last_wait.try_emplace({static_cast<uint16_t>(idx), on}, after);
        if (!fresh && last->second >= after) continue;
        last->second = after;
        to_log.Merge(on, after);
      }
    } catch (...) {
      return;
    }
  }
  if (idx < 0) return;
  const uint32_t next = StreamUnits(static_cast<size_t>(idx)).load(std::memory_order_relaxed);
  for (size_t i = 0; i < to_log.n; ++i) LogWait(static_cast<uint16_t>(idx), next, to_log.p[i].first, to_log.p[i].second);
}

}  // namespace prism::interpose
