// Graph-driven release times: virtual ranks follow a PrismTrace (--graph) in real time.
//
// GraphRelease is a ReleasePolicy. It replays the graph with the replay engine's rules (a compute node takes its
// dur_us; a collective completes on every member at max(arrivals) + duration; a send/recv pair at max(both
// posted) + duration; `after` edges hold a node until the named nodes finished), anchored to the wall clock, where
// every operation of a *real* rank takes the arrival that rank reported (kOpArrive) instead of a simulated one,
// and completes at the release this policy decided. Virtual ranks advance only as far as their inputs allow: a
// virtual node that needs a real rank's operation not reported yet is not advanced (conservative).
//
// Mapping: a real rank's communicator matches the graph communicator with the same members; the real rank's
// per-communicator sequence number s (0-based, every operation on the communicator counts) is the s-th
// communication node bound to that communicator in the rank's class (streams in order), the graph repeated when
// s runs past its end (repetition s / K, K = the class's nodes on that slot). docs/coordinator.md, "Virtual
// ranks following a graph", has the model and its assumptions.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "coordinator/coordinator.h"
#include "prism/trace.h"

namespace prism::coord {

class GraphRelease : public ReleasePolicy {
 public:
  // `real_ranks`: the global ranks that run for real (every other rank of the trace is virtual).
  GraphRelease(trace::Trace trace, std::vector<int> real_ranks);
  // Reads `path` with replay::ReadTrace (validated). nullptr with *error naming the file and problem; also when
  // the graph's world size differs from `world_size` (0: not checked).
  static std::unique_ptr<GraphRelease> Load(const std::string& path, int world_size, std::vector<int> real_ranks,
                                            std::string* error);

  ReleaseDecision Decide(const CommView& comm, uint64_t seq, std::span<const Arrival> arrivals) override;

  // What-if straggler in emulation (`--what-if straggler=R:F`): virtual rank R's compute nodes take F times their
  // graph duration, as `prism-run simulate --what-if` scales them. False with *error for a real rank (its compute is
  // measured, not replayed), a rank outside the graph or a factor <= 0. Call before the first Decide.
  bool SetStragglers(const std::vector<std::pair<int32_t, double>>& stragglers, std::string* error);

  // Counters, for tests and status.
  struct Stats {
    uint64_t decided = 0;     // releases computed from the graph
    uint64_t unmatched = 0;   // communicator or operation not in the graph: DefaultRelease answered
    uint64_t blocked = 0;     // a virtual member could not reach the operation yet: known arrivals only (see docs)
    uint64_t no_duration = 0; // virtual-only operation with neither a recorded duration nor a shim's: 0 taken
  };
  Stats stats() const;
  // The wall-clock time (ns) graph time 0 stands for; 0 until the first real arrival set it.
  int64_t anchor_ns() const;
  // When virtual rank `rank` posts (reaches) node `node_id` of repetition `rep` in wall-clock ns; nullopt while it
  // cannot be computed yet. For tests and status.
  std::optional<int64_t> VirtualArrival(int rank, uint32_t rep, uint32_t node_id);

 private:
  struct Inst {  // one execution of a node on one rank
    int rank;
    uint32_t rep;
    uint32_t node;  // node id
    auto operator<=>(const Inst&) const = default;
  };
  struct NodeRef {
    uint32_t stream = 0, index = 0;
  };
  struct ClassInfo {
    std::map<uint32_t, NodeRef> by_id;
    std::vector<std::vector<uint32_t>> slot_nodes;  // per slot: comm node ids in stream order (the seq order)
    std::vector<std::vector<uint32_t>> slot_colls;  // per slot: coll node ids in order (collective matching)
    // Repetitions after the first start at the first node of the steady iterations (steady_iter_): per stream its
    // index in the stream, per slot its index in slot_nodes.
    std::vector<uint32_t> stream_steady, slot_steady;
    std::map<uint32_t, uint32_t> ordinal;           // node id -> ordinal among colls, or among p2p of same kind+peer
    // (slot, kind, peer) -> p2p node ids in order
    std::map<std::tuple<uint32_t, trace::NodeKind, int32_t>, std::vector<uint32_t>> p2p;
  };

  const trace::Node& NodeOf(int rank, uint32_t id) const;
  std::optional<uint32_t> SlotOf(int rank, uint32_t comm) const;
  std::optional<int> GraphComm(const CommView& comm) const;
  bool MapOp(int rank, uint32_t gcomm, uint64_t seq, Inst* out) const;
  void LogBlockedPartners(const std::vector<Inst>& parts) const;
  // The instances (one per participant) that complete together with `i`, and the graph comm they run on.
  bool Partners(const Inst& i, std::vector<Inst>* out) const;
  // Completion of the operation `i` takes part in, once every participant's arrival is known.
  std::optional<int64_t> Completion(const Inst& i, int* last_rank);
  int64_t DurationNs(const std::vector<Inst>& parts);
  int64_t LocalOffsetNs(int rank, uint32_t node);
  int64_t ComputeNs(int rank, const trace::Node& n) const;
  void Pump();
  bool IsReal(int rank) const;

  trace::Trace trace_;
  std::vector<int> real_ranks_;
  // First iteration that repeats: a graph that starts where the job starts (iteration 0, with the job's set-up
  // operations) repeats from its second iteration, any other from its first.
  uint32_t steady_iter_ = 0;
  bool Steady(int rank, uint32_t node) const;
  std::vector<ClassInfo> classes_;
  std::vector<double> compute_scale_;  // per rank (empty: every rank 1)
  // sorted members -> indices in trace_.comms, in graph order (CommView::member_twin picks one)
  std::map<std::vector<int32_t>, std::vector<int>> comm_by_members_;

  mutable std::mutex mu_;
  int64_t anchor_ns_ = 0;
  bool anchored_ = false;
  uint32_t rep_limit_ = 0;                 // furthest repetition a real rank reported; virtual ranks go 1 further
  std::map<Inst, int64_t> arrival_;        // when a rank posts a comm node (or starts any node)
  std::map<Inst, int64_t> finish_;
  std::map<Inst, int64_t> shim_dur_;       // real arrivals' model_dur_ns
  // Per virtual rank, per stream: the next node to run (repetition, index).
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> cursor_;
  Stats stats_;
};

}  // namespace prism::coord
