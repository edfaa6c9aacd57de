// The replay engine: a discrete-event simulation of every rank of a PrismTrace.
//
// Each rank has one cursor per stream. A compute node takes its dur_us; a collective completes on every member
// when all members reached it, at max(arrivals) + duration; a send/receive pair completes at max(both posted) +
// duration (rendezvous), or the send at its own posting + duration and the receive at max(posted, that) (eager:
// trace::SendCompletion says which); `after` edges hold a node until the named nodes of other streams finished. Durations of
// communication come from the graph (recorded dur_us, when use_recorded) or the cost model.
//
// Why no time-ordered event queue: streams are sequential and share no resource besides these edges, so every
// node's finish time is the longest path to it; the engine walks the graph with ready lists (a stream is retried
// only when something it waits on completed), which gives the same times as an event queue at a fraction of
// the cost. Per-rank state is two arrays (finish time per node, cursor per stream); node data is shared by all
// ranks of a role class.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/non_copyable.h"
#include "prism/trace.h"
#include "replay/cost_model.h"

namespace prism::replay {

struct EngineOptions {
  bool use_recorded = true;  // a comm node's recorded dur_us wins over the cost model
  // When sends complete; kInvalid: the graph's send_completion, else kRendezvous.
  trace::SendCompletion send_completion = trace::SendCompletion::kInvalid;
  // Compute slow-down per rank (what-if straggler): (rank, factor).
  std::vector<std::pair<int32_t, double>> compute_scale;
  // When set (what-ifs that change the network), recorded comm durations are scaled by
  // model(this run) / model(baseline) instead of being used as they are.
  const CostModel* baseline_model = nullptr;
  // Called about every million events with (events done, events in the graph).
  std::function<void(uint64_t, uint64_t)> progress;
  // Try the symmetric fast path (src/replay/symmetric.h, docs/simulate.md): when every data-parallel replica is
  // identical, replay replica 0 only and copy its results to the others. Falls back to the full replay, with
  // the reason in SimResult::symmetric_refused, when a condition does not hold.
  bool symmetric = false;
  // Placement for the cost model when the graph's ranks stand for other ranks (the fast path replays replica 0
  // as a graph of its own): the global rank of each graph rank, and the global members of each communicator
  // (index in Trace::comms). Empty: the graph's own ranks.
  std::vector<int32_t> placement_rank;
  std::vector<std::vector<int32_t>> placement_comm;
};

struct WaitOn {
  int32_t rank = -1;
  double seconds = 0.0;
};

struct RankResult {
  int32_t rank = 0;
  double iteration_time_s = 0.0;                            // median over this rank's iterations
  std::vector<double> iteration_times_s;                    // per iteration (SimResult::iteration_ids)
  double end_s = 0.0;                                       // when its last node finished
  double compute_s = 0.0;                                   // sum of compute durations
  std::vector<std::pair<std::string, double>> wait_by_comm;  // communicator description -> seconds waited
  std::vector<WaitOn> waited_on;                            // ranks it waited for most, longest first (<= 3)
};

struct CommResult {
  uint32_t id = 0;
  std::string desc;
  int nranks = 0, nnodes = 0;
  uint64_t calls = 0;   // collective instances, or p2p messages
  uint64_t bytes = 0;   // sum of S over calls
  double time_s = 0.0;  // sum of durations (transfer time, excluding waiting)
  double wait_s = 0.0;  // sum over members of time waited for the last member
  std::string algorithm;                                 // the label with the most time
  std::vector<std::pair<std::string, uint64_t>> algorithms;  // label -> calls
};

struct PathSegment {
  int32_t rank = 0;
  std::string stream;
  uint32_t first_node = 0, last_node = 0;  // node ids
  std::string first_name, last_name;
  uint32_t nodes = 0;
  double start_s = 0.0, end_s = 0.0;
  double compute_s = 0.0, comm_s = 0.0;
};

struct CriticalPath {
  double length_s = 0.0;
  double compute_s = 0.0;
  double comm_s = 0.0;
  std::vector<int32_t> ranks;  // distinct ranks in path order
  std::vector<PathSegment> segments;
  uint64_t nodes = 0;
};

struct SimResult {
  enum class Status { kOk, kDeadlock, kMismatch, kBadGraph };
  Status status = Status::kOk;
  std::string error;                    // one line: what went wrong
  std::vector<std::string> wait_chain;  // deadlock: rank waits at node for rank ... (one hop per line)

  double makespan_s = 0.0;
  double iteration_time_s = 0.0;         // median over iterations of the max over ranks
  std::vector<uint32_t> iteration_ids;   // the `iter` values present, ascending
  std::vector<double> iteration_times_s;  // per iteration: max over ranks
  uint64_t events = 0;                   // node completions over all ranks
  double wall_s = 0.0;                   // time spent simulating
  std::vector<RankResult> ranks;
  std::vector<CommResult> comms;
  CriticalPath critical_path;
  std::vector<std::string> warnings;

  // Which path ran. symmetric: replica 0 was replayed and stands for `replicas` identical replicas; events
  // still counts every rank's node completions, simulated_events those actually computed.
  bool symmetric = false;
  int32_t replicas = 1;
  uint64_t simulated_events = 0;
  std::string symmetric_refused;  // EngineOptions::symmetric was set but the full replay ran: why (one line)
};

class Simulator : NonCopyable {
 public:
  // `trace` and `model` must outlive the simulator.
  Simulator(const trace::Trace& trace, const CostModel& model, EngineOptions options = {});
  ~Simulator();

  SimResult Run();

  // After Run(): Chrome trace events (JSON object {"traceEvents": [...]}) for these ranks, loadable in Perfetto.
  nlohmann::json ChromeTrace(const std::vector<int32_t>& ranks) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The send completion a run uses: the option's, else the graph's, else kRendezvous.
trace::SendCompletion EffectiveSendCompletion(const EngineOptions& options, const trace::Trace& trace);

// Convenience: one run.
SimResult Simulate(const trace::Trace& trace, const CostModel& model, const EngineOptions& options = {});

}  // namespace prism::replay
