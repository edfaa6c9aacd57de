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
// per-communicator sequence number s (0-based, every operation on the communicator counts but a send or receive to
// the rank itself: a local copy, which libprism does not number and the graph has no node for) is the s-th
// communication node bound to that communicator in the rank's class (streams in order), the graph repeated when
// s runs past its end (repetition s / K, K = the class's nodes on that slot). docs/coordinator.md, "Virtual
// ranks following a graph", has the model and its assumptions.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
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

namespace prism::replay {
struct Topology;
}  // namespace prism::replay

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
  // Advances the virtual ranks ahead of the real ones (up to two repetitions past the furthest real rank) for about
  // `budget_ns`, so that a decision rarely computes more than its own operation. True while work remains.
  bool Idle(int64_t budget_ns, const std::function<bool()>& stop) override;
  // Real rank `rank`'s operation `seq` on `comm`, when every other member is virtual and their arrivals are known
  // (a few members that have not reached it are advanced a few nodes; the rest is Idle's work):
  // the latest virtual arrival and the duration Decide would take. Decide, given the rank's arrival, answers
  // max(arrival, floor) + duration: the same release.
  std::optional<Prerelease> Predict(const CommView& comm, uint64_t seq, int rank) override;
  uint64_t PredictEpoch() const override;

  // What-if straggler in emulation (`--what-if straggler=R:F`): virtual rank R's compute nodes take F times their
  // graph duration, as `prism-run simulate --what-if` scales them. False with *error for a real rank (its compute is
  // measured, not replayed), a rank outside the graph or a factor <= 0. Call before the first Decide.
  bool SetStragglers(const std::vector<std::pair<int32_t, double>>& stragglers, std::string* error);

  // Fill slices (`prism-run fill`, docs/fill.md "Tensor-parallel lockstep"): on the communicator slots named here
  // (the graph's comm_slots, e.g. "tp"), a real rank's collective completes at its own arrival plus the duration,
  // however late the graph's virtual members are; they still complete at max(arrivals) + duration. Why: tensor-
  // parallel peers run in lockstep in the job, and a virtual peer that holds the real rank's gate lets the host run
  // ahead behind it, so the GPU gap measured after the gate opens loses host time (the medium GPT's stage-0 class
  // lost 36 of its ~76 ms per iteration that way on the H200). Call before the first Decide.
  void SetLockstepSlots(const std::vector<std::string>& slots);

  // An operation no real rank takes part in, whose graph node has no recorded duration (a filled graph leaves
  // communication to the cost model), takes the replay engine's cost of it on `topology`, as `prism-run simulate`
  // prices it. Why: without a model such operations took 0 and virtual ranks ran ahead of simulate (on the H200 the
  // medium GPT's virtual stage 1, whose tensor-parallel pair were both virtual, reached its sends ~3.5 ms early per
  // micro-batch: the real rank measured 3.7 % under simulate). False with *error when the model cannot be built.
  // Call before the first Decide.
  bool SetCostModel(const replay::Topology& topology, std::string* error);
  // SetCostModel on the topology `prism-run simulate` would take: `option` (--topology) when given, else the one
  // the graph names, else the default preset (replay::TopologySpec).
  bool UseTopology(const std::string& option, std::string* error);
  // The cost model's duration (ns) of communication node `node_id` of `rank`'s class, as that rank takes part in it
  // (what a shim on the same topology sends as model_dur_ns); -1 without a model or for a compute node.
  int64_t ModelNs(int rank, uint32_t node_id);

  // Counters, for tests and status.
  struct Stats {
    uint64_t decided = 0;     // releases computed from the graph
    uint64_t unmatched = 0;   // communicator or operation not in the graph: DefaultRelease answered
    uint64_t blocked = 0;     // a virtual member could not reach the operation yet: known arrivals only (see docs)
    uint64_t no_duration = 0; // virtual-only operation with no recorded duration, no shim's and no cost model: 0
    uint64_t modelled = 0;    // virtual-only operations priced by the cost model (SetCostModel)
    uint64_t decide_steps = 0;  // virtual ranks advanced while a decision waited (inside Decide)
    uint64_t idle_steps = 0;    // ... ahead of time, in Idle
    uint64_t idle_stopped = 0;  // Idle slices ended early because a message waited
    uint64_t predicted = 0;     // Predict answers (prereleases)
    uint64_t lockstep = 0;      // real ranks' collectives released on their own arrival (SetLockstepSlots)
  };
  Stats stats() const;
  // Data-parallel replicas that hold no real rank and no straggler behave alike (every collective that spans
  // replicas completes at one time for all its members), so one of them is advanced for all: the others' ranks take
  // part through their counterparts (same class, same position). On by default, when the layout is known (ep 1) and
  // the graph is parallel across replicas; false replays every rank. Call before the first Decide.
  void SetReplicaSymmetry(bool on);
  // Ranks that take part through a representative (0 without symmetry).
  int aliased_ranks() const;
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
  // Runs the virtual ranks queued in work_ as far as their inputs allow (a worklist: a rank is queued again only when
  // an input of its next node may have appeared: a partner's arrival, or a lifted repetition bound).
  void Pump();
  void QueueAll();
  void Queue(int rank);
  // Takes the queued rank with the earliest clock_ out of the worklist.
  int PopWork();
  // Queues the virtual ranks that take part with `inst` (their completion waits on its arrival).
  void QueuePartners(const Inst& inst);
  // Runs virtual rank `v`'s streams until none moves, or for at most `max_steps` nodes (then true: more may
  // follow); queues the partners of every arrival it posts.
  bool Advance(int v, uint64_t max_steps = UINT64_MAX);
  // Advances the queued ranks (at most `steps_per_rank` nodes each before it goes back in the queue, the one furthest
  // behind first) until the queue is empty, `until` passed or `stop` (if set; asked after each step) says so; counts
  // the ranks advanced in *counter. True while work remains.
  bool Drain(uint64_t steps_per_rank, std::optional<std::chrono::steady_clock::time_point> until, uint64_t* counter,
             const std::function<bool()>& stop);
  // Records that `inst` was posted at `at` (virtual: the first time only; real: as reported) and queues the virtual
  // ranks that may move now: a collective's members once its last member arrived, a p2p partner at once.
  void NoteArrival(const Inst& inst, int64_t at, bool overwrite);
  // A collective instance: (graph comm, repetition, ordinal among the comm's collectives).
  struct CollKey {
    uint32_t g, rep, k;
    auto operator<=>(const CollKey&) const = default;
  };
  std::optional<CollKey> CollKeyOf(const Inst& inst) const;
  // The members' (rank, node) of the k-th collective on graph comm g; empty when a member has no such node.
  const std::vector<std::pair<int, uint32_t>>& CollParts(uint32_t g, uint32_t k) const;
  bool IsReal(int rank) const;

  trace::Trace trace_;
  // First iteration that repeats: a graph that starts where the job starts (iteration 0, with the job's set-up
  // operations) repeats from its second iteration, any other from its first.
  uint32_t steady_iter_ = 0;
  bool Steady(int rank, uint32_t node) const;
  std::vector<ClassInfo> classes_;
  std::vector<double> compute_scale_;  // per rank (empty: every rank 1)
  // sorted members -> indices in trace_.comms, in graph order (CommView::member_twin picks one)
  std::map<std::vector<int32_t>, std::vector<int>> comm_by_members_;
  std::map<uint32_t, uint32_t> comm_index_;  // Comm::id -> index in trace_.comms
  std::vector<char> is_real_;                // per rank: runs for real (the constructor's real_ranks)

  mutable std::mutex mu_;
  int64_t anchor_ns_ = 0;
  bool anchored_ = false;
  uint32_t rep_limit_ = 0;                 // furthest repetition a real rank reported
  // Virtual ranks run up to this repetition: at least rep_limit_ + 1 (a decision can need no more); Idle raises it
  // to rep_limit_ + 2 so that the work is done before the real rank gets there.
  uint32_t bound_ = 1;
  std::map<Inst, int64_t> arrival_;        // when a rank posts a comm node (or starts any node)
  std::map<Inst, int64_t> finish_;
  std::map<Inst, int64_t> shim_dur_;       // real arrivals' model_dur_ns
  struct Model;                            // the cost model and its per-communicator tunings (SetCostModel)
  std::shared_ptr<Model> model_;
  int64_t ModelNsLocked(int rank, uint32_t node_id);
  // Per virtual rank, per stream: the next node to run (repetition, index).
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> cursor_;
  struct CollState {
    uint32_t arrived = 0;          // members whose arrival is known
    bool have = false;             // completion computed (all arrived)
    int64_t completion = 0;
    int last_rank = -1;
  };
  std::map<CollKey, CollState> coll_state_;
  mutable std::map<std::pair<uint32_t, uint32_t>, std::vector<std::pair<int, uint32_t>>> coll_parts_;
  uint64_t arrivals_noted_ = 0;  // PredictEpoch: counts the arrivals recorded
  std::vector<int> work_;       // virtual ranks to advance (Pump)
  std::vector<char> queued_;    // per rank: in work_
  std::vector<int64_t> clock_;  // per rank: the latest finish of a node it ran (the worklist's order)
  void ComputeAliases();
  bool symmetry_ = true;
  std::vector<std::vector<bool>> lockstep_;  // per class, per comm slot (SetLockstepSlots); empty: none
  bool Lockstep(const Inst& i) const;
  std::vector<int> alias_;      // per rank: itself, or the rank of the representative replica it takes part through
  int aliased_ = 0;
  Stats stats_;
};

}  // namespace prism::coord
