#include "interpose/core/memory.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/log.h"
#include "interpose/core/comm.h"
#include "interpose/core/coord_client.h"

namespace prism::interpose::memory {
namespace {

struct State {
  std::mutex mu;
  std::unordered_map<uintptr_t, uint64_t> ptrs;
  std::unordered_map<uint64_t, uint64_t> handles;
  std::atomic<uint64_t> current{0};
  std::atomic<uint64_t> peak{0};
};

State& S() {
  static State* s = new State();  // Why leaked: frees can arrive from atexit paths.
  return *s;
}

void Add(State& s, uint64_t bytes) {
  uint64_t now = s.current.fetch_add(bytes) + bytes;
  uint64_t p = s.peak.load();
  while (now > p && !s.peak.compare_exchange_weak(p, now)) {
  }
}

}  // namespace

void RecordAlloc(const void* ptr, uint64_t bytes) {
  if (ptr == nullptr) return;
  State& s = S();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    try {
      s.ptrs[reinterpret_cast<uintptr_t>(ptr)] = bytes;
    } catch (...) {
      return;
    }
  }
  Add(s, bytes);
}

uint64_t RecordFree(const void* ptr) {
  if (ptr == nullptr) return 0;
  State& s = S();
  uint64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.ptrs.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == s.ptrs.end()) return 0;
    bytes = it->second;
    s.ptrs.erase(it);
  }
  s.current.fetch_sub(bytes);
  // Why: a mirrored p2p receive must never copy from memory that was freed since the matching send.
  InvalidateP2pRange(reinterpret_cast<uint64_t>(ptr), bytes);
  return bytes;
}

void RecordHandleCreate(uint64_t handle, uint64_t bytes) {
  State& s = S();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    try {
      s.handles[handle] = bytes;
    } catch (...) {
      return;
    }
  }
  Add(s, bytes);
}

uint64_t RecordHandleRelease(uint64_t handle) {
  State& s = S();
  uint64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.handles.find(handle);
    if (it == s.handles.end()) return 0;
    bytes = it->second;
    s.handles.erase(it);
  }
  s.current.fetch_sub(bytes);
  return bytes;
}

uint64_t CurrentBytes() { return S().current.load(); }
uint64_t PeakBytes() { return S().peak.load(); }
void ResetPeakForTest() { S().peak.store(S().current.load()); }

namespace {

struct Room {
  std::mutex mu;  // one request at a time: a second failing thread asks after the first's answer
  uint64_t next_id = 1;
  std::chrono::steady_clock::time_point refused{};
  bool ever_refused = false;
};

Room& R() {
  static Room* r = new Room();  // Why leaked: allocations can fail from atexit paths.
  return *r;
}

}  // namespace

bool WaitForRoom(uint64_t bytes, int attempt) {
  if (attempt >= kMaxRoomAsks || !CoordSwapOn()) return false;
  Room& r = R();
  std::lock_guard<std::mutex> lock(r.mu);
  const auto now = std::chrono::steady_clock::now();
  if (r.ever_refused && now - r.refused < std::chrono::duration<double>(kRoomQuietS)) return false;
  const uint64_t id = r.next_id++;
  Log("interpose")->info("an allocation of {} bytes failed (this rank holds {}); waiting for the coordinator to "
                         "make room on the GPU (ask {} of {})",
                         bytes, CurrentBytes(), attempt + 1, kMaxRoomAsks);
  std::string why;
  // Why an hour: the coordinator answers within its own bound (swap outs of several ranks, then --swap's room wait);
  // this only ends a wait for a coordinator that stopped answering.
  const CoordReply reply = CoordAskRoom(id, bytes, CurrentBytes(), PeakBytes(), 3600 * 1000, &why);
  if (reply == CoordReply::kOk) {
    Log("interpose")->info("room made ({}); retrying the allocation", why);
    return true;
  }
  r.refused = std::chrono::steady_clock::now();
  r.ever_refused = true;
  Log("interpose")->warn("no room for the allocation of {} bytes: {}", bytes, why);
  return false;
}

void ResetRoomForTest() {
  Room& r = R();
  std::lock_guard<std::mutex> lock(r.mu);
  r.ever_refused = false;
}

}  // namespace prism::interpose::memory
