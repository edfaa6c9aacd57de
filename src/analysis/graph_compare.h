// Emulated vs simulated, per real rank (issue 8): after `prism-run --graph G ...`, how each real rank's measured
// iteration times compare with `prism-run simulate G` for the same rank (same topology, same what-ifs).
//
// Iterations are matched by number: live iteration i against the graph's iteration i while the graph has it, then
// against its steady iterations repeated (the graph repeats from its second iteration when it starts at iteration
// 0, as the coordinator's GraphRelease does; docs/coordinator.md). Warm-up iterations (torch compiling, first
// allocations) are in both and differ from run to run, so the summary figures are robust to them:
//   median_error_pct   the median over matched iterations of (emulated - simulated) / simulated
//   steady_*           over the matched iterations whose simulated time is within 1.5x of the median simulated
//                      time of the matched iterations, less any of the first three whose emulated time is over 1.5x
//                      the median emulated time (drops the warm-up outliers of either run; a slow emulated
//                      iteration later on stays in): mean |error|, and the error of the emulated median against the
//                      simulated median over those iterations.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "prism/trace.h"

namespace prism::analysis {

struct IterationPair {
  int iteration = 0;        // live iteration number
  int graph_iteration = 0;  // the graph's iteration it was matched with
  double emulated_s = 0, simulated_s = 0;
  bool steady = false;
};

struct RankGraphComparison {
  int rank = 0;
  std::vector<IterationPair> pairs;
  double median_error_pct = 0;
  int steady_count = 0;
  double steady_mean_abs_error_pct = 0;
  double steady_emulated_median_s = 0, steady_simulated_median_s = 0;  // over the steady pairs
  double steady_median_error_pct = 0;  // the first against the second
  // The steady iterations' total time, emulated against simulated: what the run took for them. Why besides the
  // medians: with few iterations of a bimodal spread the medians can land on different modes (docs/fill.md, "Emulated
  // vs simulated").
  double steady_emulated_total_s = 0, steady_simulated_total_s = 0;
  double steady_total_error_pct = 0;
};

// emulated: the run's per-iteration times of one rank (index = iteration number; null or <= 0 = not measured).
// graph_iterations: the graph's iteration numbers in order (SimResult::iteration_ids; simulate's report
// "iteration_ids"), simulated: that rank's time per graph iteration (same order; <= 0 = the rank has none).
// nullopt with *error when no iteration can be matched.
std::optional<RankGraphComparison> CompareWithGraph(int rank, const std::vector<std::optional<double>>& emulated,
                                                    const std::vector<int>& graph_iterations,
                                                    const std::vector<double>& simulated, std::string* error);

// Every real rank of an emulation report (report.json: ranks[].iteration_times_s) against a simulate report of the
// graph (report.json: iteration_ids, ranks[].iteration_times_s). Ranks without measured iterations are left out;
// empty with *error when none could be compared.
std::vector<RankGraphComparison> CompareReports(const nlohmann::json& emulated, const nlohmann::json& simulated,
                                                std::string* error);

// Simulates `graph` on `topology` (preset name or file; "" = the graph's own, else h100-8x400g) with virtual ranks'
// compute slowed per `stragglers` (what-if straggler=R:F), and returns simulate's report (replay::SimReportJson:
// iteration_ids and every rank's iteration_times_s). nullopt with *error naming the graph or the topology.
std::optional<nlohmann::json> SimulateGraph(const std::string& graph, const std::string& topology,
                                            const std::vector<std::pair<int32_t, double>>& stragglers,
                                            std::string* error);
// The same for a graph already read (`name` for messages).
std::optional<nlohmann::json> SimulateGraph(const trace::Trace& t, const std::string& name, const std::string& topology,
                                            const std::vector<std::pair<int32_t, double>>& stragglers,
                                            std::string* error);

// The own-speed comparison. A rank's compute speed can move between runs by more than the replay's error (a
// launch-bound model's compute follows the host's load; docs/results/fill.md), so beside the graph's own durations the emulation is also compared with simulate where each real
// rank's compute is scaled to what it measured in this run.
//
// RunComputePerIteration: `rank`'s compute per iteration in a run's trace.json (launcher's format: "iteration"
// events and "comm" events from arrival to release, pid = rank): each iteration's duration less the union of the
// communication inside it, less `latency_per_iteration_s` (report.json coordinator_latency_per_iteration_s: gates
// that opened after their release are prism's delay, not the rank's compute); the median over the iterations after
// the first, up to the rank's last communication in the file (trace.json caps operations per rank). Assumes the
// rank's communication does not overlap its compute (Megatron without --overlap-grad-reduce and without p2p overlap:
// otherwise the compute is underestimated). nullopt when the trace has fewer than two iterations of the rank or no
// communication.
std::optional<double> RunComputePerIteration(const nlohmann::json& trace_json, int rank, double latency_per_iteration_s);
// GraphComputePerIteration: the summed durations of the compute nodes of `rank`'s class per graph iteration, median
// over the steady iterations (the first left out when the graph starts at iteration 0: the job's set-up). Assumes
// the class's compute does not overlap itself across streams (Megatron's runs on one stream). nullopt when none.
std::optional<double> GraphComputePerIteration(const trace::Trace& t, int rank, std::string* error);

nlohmann::json ToJson(const RankGraphComparison& c);
// One line for people: "rank 0: emulated vs simulate(graph): median error -0.94 % over 9 iterations; steady (7):
// mean |error| 1.19 %, median 270.4 vs 274.0 ms (-1.32 %)".
std::string Describe(const RankGraphComparison& c);

}  // namespace prism::analysis
