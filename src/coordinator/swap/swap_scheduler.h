// Context switching for `prism-run collect` (issue 7, docs/collect.md "Context switching"): which real rank is on
// which GPU, and when one is swapped out of GPU memory (cuCheckpointProcessLock + Checkpoint: its GPU memory moves to
// host RAM) or back in (Restore + Unlock), or allowed to start at all. Pure logic, no driver and no clock: the
// coordinator feeds it what it learns from the ranks (hello, memory samples, exchange waits, activity, goodbye) and
// runs the one action it returns at a time on a worker thread (swap_driver.h), then reports the outcome.
//
// Rules (each one is a unit test in swap_scheduler_test.cc):
//  - A GPU never holds more than its cap: the sum of the footprints of its resident ranks. A rank's footprint is its
//    peak tracked device bytes (its memory samples) plus what the allocator does not see: measured when the driver
//    says how much GPU memory the process uses (Measured, from NVML: the most any measurement exceeded the tracked
//    peak of its time, so at least every measurement), else the assumed `context_bytes`; the estimate (--rank-mem,
//    or the largest footprint known) for a rank that reported nothing yet.
//    The exceptions are printed as notices: a rank that alone is bigger than the cap, and a stalled GPU whose
//    resident ranks all wait outside an exchange (they cannot be swapped), where the next rank starts over the cap.
//  - Only a rank blocked in an exchange (a collective or a receive with real peers; it has synchronised its stream
//    and waits on the host, no GPU work in flight) is swapped out, and only while the host budget (the sum of the
//    footprints of swapped-out ranks) stays within its cap; otherwise the scheduler waits and says why.
//  - A rank is started only when its GPU has room for it (start-at-admission: the launcher asks before spawning).
//  - Who goes on the GPU next: ranks whose exchange completed while they were out, and ranks not started yet; first
//    those that most blocked ranks wait for (a pending collective or receive needs them: the paper's Appendix A),
//    then swapped-out ranks before new ones, then the one that waited longest.
//  - No deadlock: a GPU is stalled when every resident rank is blocked (in an exchange or a store WAIT, or has been
//    silent for `stall_s`); only then
//    does a resident rank make room for a waiting one. A GPU with nothing resident always takes the next rank.
//  - Allocation admission (RequestRoom, ipc.h kMemRoom): a rank whose device allocation failed for lack of memory
//    waits for room. Its footprint becomes at least what it holds plus the request; blocked ranks of its GPU are
//    swapped out until they freed the request's bytes (the oldest request first), and nothing is started or
//    restored on that GPU meanwhile; then the answer is yes. When no blocked rank can go, another rank that waits
//    for room and said its GPU is idle (`idle`: libprism synchronised its device before asking) is swapped out,
//    the largest first, never the oldest asker (the one being served) and never one restored for room that has not
//    blocked in an exchange since (no two ranks swapping each other out for ever); its request stays pending while
//    it is out, it comes back like a rank whose exchange completed, and its answer is yes once it is restored
//    (its footprint already holds the request). The answer is no when no other rank is on the GPU, or when nothing
//    could be swapped out for `room_wait_s` (never while the asker itself is swapped out).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace prism::coord {

struct SwapConfig {
  bool enabled = false;
  uint64_t gpu_cap_bytes = 0;   // per GPU; the coordinator fills it from the driver when 0 (total memory - margin)
  uint64_t host_cap_bytes = 0;  // bytes of host RAM swapped-out ranks may hold in all; 0: unlimited
  // Added to each rank's tracked bytes (CUDA context, cuBLAS workspaces) until its GPU memory is measured.
  uint64_t context_bytes = 512ull << 20;
  // Footprint assumed for a rank that reported no memory yet; 0: the largest footprint learned so far, and at most
  // one such rank resident per GPU unless the GPU is stalled.
  uint64_t rank_estimate_bytes = 0;
  double stall_s = 30;  // a resident rank silent this long (no bus message) counts as blocked for the stall rule
  std::map<int, std::string> rank_gpu;  // rank -> GPU key (host/device); a rank not listed uses its hello's
  std::string driver = "libcuda.so.1";  // the library the checkpoint driver dlopens
  // cuCheckpointProcessLock's timeout: it waits for the process's work in flight (other streams' kernels); a rank
  // whose lock times out stays on the GPU and is not picked again until its waits change.
  int lock_timeout_ms = 10000;
  // How long a room request (RequestRoom) waits for a rank of its GPU that can be swapped out before it is refused.
  double room_wait_s = 60;
  // Per-process GPU memory (swap_usage.h): the NVML library the coordinator dlopens ("" = do not measure), and how
  // often it asks (seconds).
  std::string usage_library = "libnvidia-ml.so.1";
  double usage_interval_s = 1;
};

enum class SwapPhase { kUnstarted, kAdmitted, kResident, kSwappingOut, kOut, kSwappingIn, kDone };
const char* SwapPhaseName(SwapPhase p);

struct SwapAction {
  enum Kind { kAdmit, kSwapOut, kSwapIn } kind = kAdmit;
  int rank = -1;
  int pid = 0;
  uint64_t bytes = 0;  // the footprint the decision used
  std::string gpu;
  std::string why;  // one line for people
};
const char* SwapActionName(SwapAction::Kind k);

// The answer to a room request (RequestRoom): the coordinator sends it as kMemRoomAnswer.
struct RoomAnswer {
  int rank = -1;
  uint64_t id = 0;  // the request's id (the rank's)
  bool ok = false;
  uint64_t bytes = 0;  // requested
  uint64_t freed = 0;  // footprints swapped out (or ended) on its GPU since the request
  std::string why;
};

struct SwapStats {
  uint64_t swaps_out = 0, swaps_in = 0, admits = 0, failures = 0;
  uint64_t rooms_granted = 0, rooms_refused = 0;  // room requests answered yes / no
  uint64_t room_swaps_out = 0;  // swaps out of a rank that waited for room itself (for another's request)
  uint64_t bytes_out = 0, bytes_in = 0;
  double seconds_out = 0, seconds_in = 0;
  uint64_t peak_gpu_bytes = 0;   // the largest GpuHeld of any GPU (the ranks' reported peaks + context)
  uint64_t peak_host_bytes = 0;  // the largest swapped-out sum
  int ranks = 0, finished = 0, resident = 0, out = 0, unstarted = 0;
  int measured = 0;  // ranks whose footprint comes from a measurement of their process's GPU memory (Measured)
};

class SwapScheduler {
 public:
  explicit SwapScheduler(SwapConfig cfg);

  const SwapConfig& config() const { return cfg_; }
  void SetGpuCap(uint64_t bytes) { cfg_.gpu_cap_bytes = bytes; }

  // A real rank of the run, not started yet (the launcher asks Admitted before starting it).
  void AddRank(int rank, const std::string& gpu);
  // The rank said hello (its process id is what the checkpoint calls take). A rank never added is added resident
  // (e.g. started by another launcher); `gpu` is used when AddRank gave none.
  void Started(int rank, int pid, const std::string& gpu, uint64_t now_ns);
  // A memory sample: the rank's peak tracked device bytes so far.
  void Memory(int rank, uint64_t peak_bytes);
  // The GPU memory the rank's process uses now as the driver counts it (context, allocator reservations, library
  // workspaces). Taken only while the rank is resident (a checkpoint in progress or a swapped-out process shows
  // less); 0 is no measurement.
  void Measured(int rank, uint64_t bytes);
  bool IsMeasured(int rank) const;
  // Any message from the rank.
  void Activity(int rank, uint64_t now_ns);
  // The real ranks `rank` now waits for in exchanges (empty: it is not blocked). Only waits that block the rank's
  // host thread count (collectives, receives).
  void SetWaits(int rank, std::vector<int> waiting_for);
  // Whether the rank is blocked in a store WAIT now (a torch barrier, a communicator's unique id: it waits for ranks
  // that have not set the key yet). Such a rank counts as blocked for the stall rule at once, but is not swapped out:
  // its streams may hold work that waits on other ranks (a gate), which the checkpoint lock would wait for.
  void SetStoreWait(int rank, bool waiting);
  // The rank is gone (goodbye, lost connection, exited).
  void Done(int rank);
  // The rank's device allocation of `bytes` failed for lack of memory while it held `current` tracked bytes
  // (kMemRoom); it waits for TakeRoomAnswers to say whether to retry. A second request of the rank replaces its
  // first. `idle`: the rank synchronised its device before asking (no GPU work in flight), so it may be swapped out
  // for another rank's request while it waits.
  // False for a rank the scheduler does not know (or that is done): answer no at once.
  bool RequestRoom(int rank, uint64_t id, uint64_t bytes, uint64_t current, uint64_t now_ns, bool idle = false);
  // Requests decided since the last call (granted: enough was swapped out; refused: see RoomAnswer::why).
  std::vector<RoomAnswer> TakeRoomAnswers(uint64_t now_ns);
  bool WaitsForRoom(int rank) const;

  // The next action, or nullopt (nothing to do, or an action is still running). The caller runs it and calls
  // Finished; admissions finish at once (the launcher starts the process).
  std::optional<SwapAction> Next(uint64_t now_ns);
  void Finished(const SwapAction& a, bool ok, double seconds, uint64_t now_ns);

  bool Admitted(int rank) const;  // may the launcher start it
  std::vector<int> Starting() const;  // admitted ranks that have not said hello yet
  bool busy() const { return in_flight_; }
  SwapPhase phase(int rank) const;
  uint64_t Footprint(int rank) const;
  // "" or, when the started ranks need more than the GPUs' caps and the host budget hold together, a clause saying so.
  std::string DoesNotFit() const;
  uint64_t GpuUsed(const std::string& gpu) const;  // as admission counts: estimates for ranks not sampled yet
  // As the ranks said: peak + measured overhead (or context), the overhead alone before a sample.
  uint64_t GpuHeld(const std::string& gpu) const;
  uint64_t HostUsed() const;
  SwapStats Stats() const;
  // Lines for people that appeared since the last call (budget waits, over-cap starts); each said once per cause.
  std::vector<std::string> TakeNotices();

 private:
  struct Rank {
    int rank = -1;
    std::string gpu;
    SwapPhase phase = SwapPhase::kUnstarted;
    int pid = 0;
    uint64_t peak = 0;
    bool sampled = false;
    // Measured: the most a measurement of the process's GPU memory exceeded the tracked peak of its time (negative:
    // the measurement was below it).
    bool measured = false;
    int64_t overhead = 0;
    std::vector<int> waiting_for;
    uint64_t last_activity_ns = 0;
    uint64_t ready_since_ns = 0;  // out with its wait over, or unstarted: since when it wants the GPU
    uint64_t out_bytes = 0;       // what it holds in host RAM while out
    bool out_failed = false;      // a swap out failed in its current waits: not picked again until they change
    bool store_wait = false;      // blocked in a store WAIT (SetStoreWait)
    // A pending room request (RequestRoom). A victim while it waits only when `room_idle` (and no blocked rank can
    // go); `room_restored`: it was swapped out for another's room and restored, and has not blocked in an exchange
    // since: not such a victim again until then. `room_back`: restored with its request pending (answered yes).
    bool room = false, room_idle = false, room_restored = false, room_back = false;
    uint64_t room_id = 0, room_bytes = 0, room_freed = 0, room_since_ns = 0;
  };
  bool OnGpu(const Rank& r) const {
    return r.phase == SwapPhase::kAdmitted || r.phase == SwapPhase::kResident || r.phase == SwapPhase::kSwappingIn ||
           r.phase == SwapPhase::kSwappingOut;
  }
  bool Blocked(const Rank& r) const { return !r.waiting_for.empty(); }
  uint64_t Estimate() const;
  bool Known(const Rank& r) const { return r.sampled || r.measured; }
  uint64_t Overhead(const Rank& r) const {
    return r.measured ? static_cast<uint64_t>(std::max<int64_t>(r.overhead, 0)) : cfg_.context_bytes;
  }
  int Needers(int rank) const;
  class GpuDecision;  // DecideGpu's steps (swap_scheduler.cc)
  std::optional<SwapAction> DecideGpu(const std::string& gpu, uint64_t now_ns);
  void Notice(const std::string& key, const std::string& text);
  void UpdatePeaks();
  // Credits `bytes` freed on `gpu` to the resident ranks waiting for room there, oldest request first.
  void CreditRoom(const std::string& gpu, uint64_t bytes);

  SwapConfig cfg_;
  std::map<int, Rank> ranks_;
  bool in_flight_ = false;
  SwapStats stats_;
  std::vector<std::string> notices_;
  std::map<std::string, bool> noticed_;
};

}  // namespace prism::coord
