#include "interpose/core/memory.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/log.h"
#include "interpose/core/comm.h"
#include "interpose/core/coord_client.h"
#include "interpose/core/real_symbols.h"
#include "interpose/core/runtime.h"

namespace prism::interpose {

// The rank's device memory and the last refusal of room (a part of the runtime, runtime.h).
struct MemoryState {
  std::mutex mu;
  std::unordered_map<uintptr_t, uint64_t> ptrs;
  std::unordered_map<uint64_t, uint64_t> handles;
  std::atomic<uint64_t> current{0};
  std::atomic<uint64_t> peak{0};
  // WaitForRoom's state: one request at a time (a second failing thread asks after the first's answer).
  std::mutex room_mu;
  uint64_t next_room_id = 1;
  std::chrono::steady_clock::time_point refused{};
  bool ever_refused = false;
};

MemoryState* NewMemoryState() { return new MemoryState(); }
void DestroyPart(MemoryState* p) { delete p; }

namespace memory {
namespace {

using State = MemoryState;

State& S() { return Rt().memory(); }

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

namespace {

// Makes this rank's GPU idle before it waits for room: the calling thread's context (the device the allocation is
// for) is synchronised through the real driver (Driver(): cuCtxSynchronize, not an interposed symbol), so when the
// coordinator checkpoints the process while it waits (another rank's room, no rank blocked in an exchange to swap
// out), cuCheckpointProcessLock finds no work in flight. True when it synchronised.
// Why this is safe on this path: torch's caching allocator synchronises the device itself when it frees its cache
// after a failed allocation, so this wait is one torch makes anyway. The risk is a stream that waits for something
// only another rank's progress brings: under collect, passthrough (real NCCL) is off with --swap, and collectives
// among real ranks are host-synchronous exchanges through the coordinator; what a stream may still hold is the
// gate of a collective whose exchange already completed, which opens once every real member's kOpArrive came (each
// sends it right after its own exchange returned, or the coordinator releases it for a member swapped out there),
// so it does not wait for this rank's allocation. A job that gates its streams on its peers otherwise (its own
// device-side waits) would block here instead of asking; a failed synchronisation asks without idle.
bool MakeGpuIdle() {
  const DriverFns& d = Driver();
  if (d.cuCtxSynchronize == nullptr) return false;
  const auto t0 = std::chrono::steady_clock::now();
  const CUresult e = d.cuCtxSynchronize();
  if (e != CUDA_SUCCESS) {
    const char* name = nullptr;
    if (d.cuGetErrorString == nullptr || d.cuGetErrorString(e, &name) != CUDA_SUCCESS) name = nullptr;
    Log("interpose")->warn("cuCtxSynchronize before asking for room failed ({} {}); asking without idle",
                           static_cast<int>(e), name != nullptr ? name : "");
    return false;
  }
  Log("interpose")->debug("device synchronised before asking for room in {:.3f} s",
                          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return true;
}

bool AskForRoom(uint64_t bytes, int attempt) {
  State& r = S();
  std::lock_guard<std::mutex> lock(r.room_mu);
  const auto now = std::chrono::steady_clock::now();
  if (r.ever_refused && now - r.refused < std::chrono::duration<double>(kRoomQuietS)) return false;
  const uint64_t id = r.next_room_id++;
  Log("interpose")->info("an allocation of {} bytes failed (this rank holds {}); waiting for the coordinator to "
                         "make room on the GPU (ask {} of {})",
                         bytes, CurrentBytes(), attempt + 1, kMaxRoomAsks);
  std::string why;
  const bool idle = MakeGpuIdle();
  // Why an hour: the coordinator answers within its own bound (swap outs of several ranks, then --swap's room wait);
  // this only ends a wait for a coordinator that stopped answering (and a rank swapped out while it waits, for
  // another rank's room, is answered once restored).
  const CoordReply reply = CoordAskRoom(id, bytes, CurrentBytes(), PeakBytes(), 3600 * 1000, &why, idle);
  if (reply == CoordReply::kOk) {
    Log("interpose")->info("room made ({}); retrying the allocation", why);
    return true;
  }
  r.refused = std::chrono::steady_clock::now();
  r.ever_refused = true;
  Log("interpose")->warn("no room for the allocation of {} bytes: {}", bytes, why);
  return false;
}

}  // namespace

// Why the catch: callers are exported functions (cudaMalloc, cuMemCreate); nothing may throw into the job, and an
// ask that failed is an allocation that stays failed.
bool WaitForRoom(uint64_t bytes, int attempt) {
  if (attempt >= kMaxRoomAsks || !CoordSwapOn()) return false;
  try {
    return AskForRoom(bytes, attempt);
  } catch (...) {
    return false;
  }
}

}  // namespace memory
}  // namespace prism::interpose
