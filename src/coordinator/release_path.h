// The release path: real ranks' arrivals (kOpArrive) gathered per (communicator, sequence number), handed to the
// ReleasePolicy once every real member came, and the decision sent back (kOpRelease); prereleases (kOpPrerelease)
// for ranks whose every peer is virtual; operations held when the real members disagree. Under
// CoordinatorState::mu unless said otherwise.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/coordinator_state.h"

namespace prism::coord {

class SwapController;

class ReleasePath {
 public:
  using Key = std::pair<uint32_t, uint64_t>;  // (comm id, sequence number)

  ReleasePath(CoordinatorState& st, const std::vector<CommView>& comms) : st_(st), comms_(comms) {}
  // Context switching takes part in releases (SwapController::LateArrival, ReleaseOut); nullptr without --swap.
  void set_swap(SwapController* swap) { swap_ = swap; }

  void OnArrive(BusId id, BusClient& c, const ipc::OpArrive& a);
  // True (and the operation is not released) when every real member arrived at (comm, seq) but they issued
  // different operations there (hang_detector.h Disagreement): real NCCL would hang or corrupt, so it is held
  // and reported at once on stderr; the hang diagnosis follows after --hang-timeout.
  bool HoldOnDisagreement(const CommView& comm, uint64_t seq, const std::vector<Arrival>& arrivals);
  // Decides (comm, seq)'s release over `decide_on` and queues the kOpRelease frame to every rank of `send_to`
  // (flushed when `flush`), taking them off their waits. Returns the frame.
  std::string SendRelease(const CommView& comm, uint64_t seq, const std::vector<Arrival>& decide_on,
                          const std::vector<Arrival>& send_to, uint64_t now_ns, bool flush);
  // (comm, seq) was released: it leaves the pending ones and counts.
  void Released(const Key& key);
  // A rank's new connection (or its loss): what was prereleased to the old one is forgotten.
  void ForgetPrereleases(int rank);
  // Between the bus's turns, without the mutex held: prereleases, and the policy's work ahead
  // (ReleasePolicy::Idle); true while more remains (the loop then polls instead of sleeping).
  bool IdleTurn();

  std::map<Key, std::vector<Arrival>>& pending() { return pending_; }
  const std::map<Key, std::vector<Arrival>>& pending() const { return pending_; }
  const std::map<Key, std::string>& held() const { return held_; }  // (comm, seq) -> what differs
  uint64_t releases() const { return releases_; }
  uint64_t prereleases_sent() const { return prereleases_sent_; }
  uint64_t prereleases_used() const { return prereleases_used_; }
  uint64_t prerelease_mismatches() const { return prerelease_mismatches_; }

 private:
  void SendPrereleases();

  CoordinatorState& st_;
  const std::vector<CommView>& comms_;  // CommRegistry's, comm_id - 1 -> view
  SwapController* swap_ = nullptr;
  std::map<Key, std::vector<Arrival>> pending_;
  std::map<Key, std::string> held_;
  // Prereleases (ipc::OpPrerelease): per communicator with one real member that takes them, the next sequence
  // number to predict and the end of the released ones; the prereleased operations until their unit arrives.
  struct PredictCursor {
    uint64_t next = 0, released = 0;
  };
  std::map<uint32_t, PredictCursor> predict_;
  std::map<Key, ReleasePolicy::Prerelease> prereleased_;
  uint64_t predict_epoch_ = UINT64_MAX;  // ReleasePolicy::PredictEpoch at the last pass that left nothing to send
  bool predict_dirty_ = false;           // a release moved a cursor since
  uint64_t prereleases_sent_ = 0, prereleases_used_ = 0, prerelease_mismatches_ = 0;
  uint64_t releases_ = 0;
};

}  // namespace prism::coord
