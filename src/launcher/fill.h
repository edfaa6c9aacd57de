// Stages 2 and 3 of the paper's procedure on this host (docs/fill.md): `prism-run fill`, and the fill stage of the
// default procedure (launcher/stages.h).
//
// From a collect run (its event files, payloads and report.json), every class's representative rank runs for real
// alone (one rank per slice on one GPU; with G GPUs a tensor-parallel group per slice, its communicator on the real
// NCCL) while the coordinator replays every other rank from the graph as filled so far (GraphRelease). After each
// slice the class's nodes are rebuilt from that run's event file: compute gaps measured on the GPU between the
// slice's communication points, so time spent waiting for a virtual peer lies inside the communication window, not
// in the compute nodes; each compute node is then the median over every slice that ran the class so far
// (analysis/fill_samples.h). Rounds repeat while `simulate`'s iteration time moves by more than the tolerance
// (cross-slice calibration: each slice ran against its neighbours' previous estimates). Output: OUT/filled.prism
// and OUT/fill.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/world.h"
#include "analysis/fill_samples.h"
#include "prism/trace.h"

namespace prism::launcher {

// The fill's stopping rule, the same for `prism-run fill` and the default procedure's fill stage: rounds end when one
// moves simulate's estimate by at most the tolerance (percent), or after this many rounds.
inline constexpr double kDefaultFillTolerancePct = 0.5;
inline constexpr int kDefaultFillRounds = 4;

struct FillOptions {
  std::string from;  // the collect run's directory
  std::string out;
  std::string topology;
  double tolerance_pct = kDefaultFillTolerancePct;
  int max_rounds = kDefaultFillRounds;
  int gpus = 0;
  double hang_timeout = 120;
  bool quiet = true;
  bool no_preload = false;
  int iterations = 0;       // > 0: each slice stops its job after this many iterations (emulate --iterations)  // the slices' workers run without libprism (launch tests only)
  std::optional<uint64_t> payload_max_bytes;  // unset: libprism's default
  // Slots whose virtual members do not hold the slice's real rank (GraphRelease::SetLockstepSlots), comma-separated;
  // "none": all do; "auto": every slot whose group spans only the tp, cp and dp dimensions (LockstepSlots).
  std::string lockstep = "auto";
  // Tensor-parallel positions of one group whose graphs have the same shape share the slice of its first position
  // (docs/fill.md "Symmetric tensor-parallel positions"): false runs every class's own slice.
  bool share_symmetric_tp = false;
  // An earlier fill into `out` of the same collect that stopped part way (fill.json "complete": false) is continued:
  // its finished slices are reused as samples and the fill goes on after the last of them.
  bool resume = false;
  std::string prefix = "prism fill: ";  // how its lines start
};

struct FillResult {
  int exit_code = 0;
  std::string graph;      // OUT/filled.prism
  std::string summary;    // OUT/fill.json
  bool converged = false;
  int rounds = 0;         // rounds run
  double last_moved_pct = -1;
  double bare_s = -1, uncalibrated_s = -1, calibrated_s = -1;
  int slices_run = 0;
  double wall_s = 0;       // the fill's wall time over all its runs (a resumed fill includes the earlier ones)
  int classes = 0;
  int shared_classes = 0;  // classes timed by a symmetric position's slice
  double spread_pct = 0;   // the largest spread of a class's compute over its slices (FillSamples::SpreadPct)
  int spread_rank = -1;    // that class's rank
  std::string lockstep;    // the slots the slices ran in lockstep (LockstepSlots), comma-separated
};

FillResult RunFill(const FillOptions& o, const std::vector<std::string>& command);

// Sets to 0 the compute of iteration 0 (the job's set-up and first step, before its first iteration mark) of every
// class of `t` that has no sample in `samples`; returns how many classes changed (0 when the graph has no iteration
// marks). Why: those nodes are the collect's, whose ranks started side by side on one GPU and host; replayed in a
// slice they hold its real rank for seconds at start-up (docs/fill.md "Where a slice's start-up goes"). The
// simulated iteration (a median over iterations) does not depend on them, and a class's own slice replaces them.
size_t ClearUnsampledSetUp(trace::Trace* t, const analysis::FillSamples& samples);

// The lockstep slots a fill's slices use (FillOptions::lockstep): "none" -> "", "auto" -> the graph's slots whose
// group spans only the tp, cp and dp dimensions ("tp", "dp", "dp-cp", "tp#2", ... comma-separated, each once), any
// other value as given. Why those: their members are replicas or symmetric positions of the real rank's own stage,
// which do the same work in lockstep in the job; a virtual one replays an earlier slice's timing and would hold the
// real rank where the job does not (docs/fill.md "Tensor-parallel lockstep").
std::string LockstepSlots(const std::string& spec, const trace::Trace& t);

// The slices of one round. One GPU: one rank per slice. G GPUs: the classes' ranks grouped by tensor-parallel group
// (the same coordinates but tp), each group cut into chunks of at most G ranks, so that a slice's tensor-parallel
// communicator has only real members on distinct GPUs and runs on the real NCCL.
std::vector<std::vector<int>> FillSlices(const std::vector<int>& reps, const world::World& w, int gpus);

}  // namespace prism::launcher
