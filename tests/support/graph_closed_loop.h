// GraphRelease in closed loop, without a GPU: one rank of a graph plays the real rank (its own compute durations,
// its streams in time order, every communication released by GraphRelease as the coordinator would), every other
// rank virtual. With exact durations the real rank finishes where the replay engine says (tests/unit/
// graph_closed_loop_test.cc); bench/graph_release_bench.cc times the decisions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/release/graph_release.h"

namespace prism::coord {

// Graph time 0 on the loop's "wall clock" (ns).
constexpr int64_t kClosedLoopT0 = 1'000'000'000'000;

struct ClosedLoopOptions {
  uint32_t reps = 1;                                    // repetitions of the real rank's class
  // A topology to price communication without a recorded duration (GraphRelease::UseTopology); the real rank's
  // operations then carry the same model's duration as a shim would send. Empty: no model (recorded durations only).
  std::string topology;
  std::vector<std::pair<int32_t, double>> stragglers;  // GraphRelease::SetStragglers
  bool idle = false;  // call GraphRelease::Idle after each decision until nothing is left (the coordinator's loop)
  int64_t idle_slice_ns = 200'000;  // the budget of each Idle call (the coordinator's)
  // Ask GraphRelease::Predict before each decision, as the coordinator does for a rank that takes prereleases, and
  // check the rule it gives (ipc::OpPrerelease) against the decision.
  bool predict = false;
  // Ask Predict as the coordinator does, ahead of time: after each decision (and after the idle work), for every
  // communicator of the real rank from its second operation on, the next operations up to 4 past the last released
  // one; count the decisions whose prerelease was known before the rank arrived (structurally: the loop does all of it
  // at the decision's instant, so a short compute gap that the real coordinator would miss counts as in time).
  bool predict_ahead = false;
  // Real time instead of idle work to completion: while the real rank runs a compute node of D us, Idle gets D us of
  // this machine's time (in idle_slice_ns slices), and nothing after a decision; what was not done by the next
  // decision is paid inside it (decide_ns). Takes precedence over `idle`. The decisions stay the same; their cost
  // depends on this machine's speed.
  bool idle_realtime = false;
  bool symmetry = true;  // GraphRelease::SetReplicaSymmetry
};

struct LoopResult {
  std::string error;                 // SetStragglers refused
  int64_t end_ns = 0;                // when the real rank's last node finished, relative to kClosedLoopT0
  std::vector<int64_t> rep_end_ns;   // per repetition: when its last node finished, relative to kClosedLoopT0
  std::vector<uint64_t> decisions;   // every release GraphRelease decided, in order
  std::vector<int64_t> decide_ns;    // how long each Decide call took (host time)
  std::vector<uint32_t> decide_rep;  // the repetition each decision belongs to
  std::vector<int64_t> idle_slice_ns;  // how long each Idle call took (with opt.idle)
  uint64_t predicted = 0;            // decisions Predict knew ahead (with opt.predict)
  uint64_t mispredicted = 0;         // ... whose rule gave another release than Decide
  uint64_t prereleased = 0;          // decisions prereleased before the arrival (opt.predict_ahead)
  std::vector<int64_t> prerelease_pass_ns;  // how long each pass over the communicators took (the coordinator's
                                            // event loop is held that long; opt.predict_ahead)
  std::vector<std::string> not_prereleased;  // the others: "slot S seq Q rep R <kind> <op>" (opt.predict_ahead)
  GraphRelease::Stats stats;
  int aliased_ranks = 0;             // GraphRelease::aliased_ranks
};

// Plays `real` through opt.reps repetitions of its class against GraphRelease, as the live rank would:
// communication nodes take what GraphRelease decides; their per-communicator sequence is their issue order (node id
// order within the slot), as libprism counts them; repetitions after the first skip the set-up iteration.
LoopResult ClosedLoop(const trace::Trace& t, int real, const ClosedLoopOptions& opt);

}  // namespace prism::coord
