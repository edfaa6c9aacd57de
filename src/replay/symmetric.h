// The symmetric fast path of the replay: when every data-parallel replica of a graph does the same thing,
// replay one replica and account for the others exactly.
//
// FoldReplicas checks the conditions (docs/simulate.md, "Symmetric fast path") and builds replica 0 as a graph
// of its own: its ranks renumbered by position, communicators inside the replica kept, and every communicator
// that spans replicas (data-parallel, expert-parallel, expert-data-parallel groups) reduced to the replica's one
// member, which stands for all of them: by symmetry all members arrive at the same time, so the collective
// completes at that arrival plus the duration of the *whole* communicator (its placement is passed to the
// cost model). UnfoldResult turns the replica's result into the whole world's: per-rank results copied from
// the counterpart in replica 0 (waited-on ranks and communicator names translated), communicators' statistics
// copied from the communicator that stood for them.
//
// Why exact: the replay computes every node's finish as the longest path to it. The conditions make the map
// "rank at position p of replica d -> rank at position p of replica 0" preserve classes, the members,
// slots and placement pattern of every communicator a rank uses, and every duration, so by induction over
// that longest path every rank finishes every node when its counterpart does.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "prism/trace.h"
#include "replay/cost_model.h"
#include "replay/engine.h"

namespace prism::replay {

struct ReplicaFold {
  int32_t replicas = 0;   // R: data-parallel replicas (layout.dp)
  int32_t positions = 0;  // P: ranks per replica (world / R)
  std::vector<int32_t> rank_of;      // replica * P + position -> global rank
  std::vector<int32_t> position_of;  // global rank -> position (positions are in rank order in every replica)
  std::vector<int32_t> replica_of;   // global rank -> replica
  // Replica 0 as a graph of P ranks (rank = position). Communicators keep their global ids. Its `classes` are
  // left empty: they are the original graph's (class indices are kept), which the engine reads in place.
  trace::Trace replica;
  std::vector<int32_t> placement_rank;                // replica rank -> global rank (EngineOptions)
  std::vector<std::vector<int32_t>> placement_comm;   // replica comm -> global members (EngineOptions)
  std::vector<std::pair<int32_t, double>> compute_scale;  // straggler factors by position
  std::vector<uint32_t> comm_of;    // global comm index -> replica comm standing for it (kNoIndex: unused)
  std::vector<int> comm_nnodes;     // global comm index -> nodes it spans (CommResult::nnodes)
  // The original graph's bindings: binding[slot_off[rank] + slot] = comm index, kNoIndex when unknown;
  // slot_used[class][slot]: the class has communication on that slot.
  std::vector<uint32_t> slot_off, binding;
  std::vector<std::vector<uint8_t>> slot_used;
};

// Checks that the graph is data-parallel symmetric under `model` (and `baseline`, when what-if scaling of
// recorded durations uses it) with these compute factors, and builds the fold. False with *why (one line, names
// the first rank or communicator that breaks a condition) when the fast path does not apply.
bool FoldReplicas(const trace::Trace& t, const CostModel& model, const CostModel* baseline,
                  const std::vector<std::pair<int32_t, double>>& compute_scale, ReplicaFold* out, std::string* why);

// The whole world's result from the replica's (which must have finished: status kOk).
SimResult UnfoldResult(const trace::Trace& t, const ReplicaFold& fold, const SimResult& replica);

// Name of a communicator in RankResult::wait_by_comm: its description, else "comm<id>".
std::string CommKey(const trace::Comm& c);

}  // namespace prism::replay
