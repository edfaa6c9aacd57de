// One emulation run: `prism-run [OPTIONS] torchrun ...` with a fixed policy (the graph it is given, or mirror), and
// the runs `collect`, `record` and fill's slices make through the same path. Builds the plan (launcher/plan.h),
// prints it (--dry-run) or runs it (launcher/launch.h), compares a graph run with simulate of its graph, adds what
// the caller knows to report.json, and prints the report. The faithful default procedure that chooses the graph
// (collect -> fill -> emulate) is launcher/stages.h; it calls this for every run it makes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/coordinator.h"
#include "coordinator/swap/swap_scheduler.h"

namespace prism::launcher {

struct EmulateOptions {
  std::string ranks;
  std::string layout;
  std::string topology;
  std::string graph;
  std::vector<std::string> what_if;  // --what-if straggler=R:F (with a graph; docs/fill.md)
  // fill's slices: communicator slots, comma-separated, whose virtual members do not hold a real rank's collectives
  // (GraphRelease::SetLockstepSlots; fill --lockstep, docs/fill.md "Tensor-parallel lockstep"); "" for none
  std::string lockstep_slots;
  std::string payload = "mirror";
  std::string payload_dir;        // --payload-dir (recorded payloads of a collect run)
  std::optional<uint64_t> payload_max_bytes;  // --payload-max-bytes: larger recorded payloads are not recorded/replayed
  bool one_replica = false;       // collect: run one data-parallel replica for real
  bool real_routing = false;      // collect --real-routing: also the expert-parallel peers of replica 0
  bool record_payloads = false;   // collect: every real rank records what real data gave it
  bool all_real = false;          // record: every rank real on its own GPU, everything on the real NCCL
  std::string out;
  bool dry_run = false;
  bool json = false;
  int gpus = 0;
  std::string coordinator;
  int node_rank = -1;
  bool no_preload = false;
  bool quiet = false;
  double hang_timeout = coord::kDefaultHangTimeoutS;
  std::string on_hang = "stop";
  int iterations = 0;           // --iterations K: stop the job once every real rank completed K iterations
  bool no_passthrough = false;  // --no-passthrough
  bool kernels = false;         // --kernels: CUPTI kernel records of the real ranks (docs/kernels.md)
  bool kernels_nvtx = false;    // --kernels-nvtx: also the job's NVTX ranges
  std::string listen;           // --listen: the coordinator started here also serves other hosts on this address
  std::string remote_ranks;     // --remote-ranks: real ranks that prism-runs on other hosts run
  coord::SwapConfig swap;       // collect --swap: context switching (docs/collect.md)

  // What the caller adds. plan_extra: keys merged into the --dry-run JSON (and said in its text); report_extra:
  // keys merged into report.json once the run ended. print_report false: the caller prints the report itself.
  nlohmann::ordered_json plan_extra = nlohmann::ordered_json::object();
  nlohmann::json report_extra = nlohmann::json::object();
  bool print_report = true;
  // How the run is named in prism's own lines ("emulating", "fill slice", ...); "" = "emulating".
  std::string label;
};

// Exit codes of prism-run that the library returns (docs/cli.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // the job failed, a regression was found, the replay deadlocked
inline constexpr int kExitBadInput = 2;  // malformed graph/topology/command line
inline constexpr int kExitInterrupted = 130;

// Runs (or, with dry_run, prints the plan of) one emulation of `command`. Returns prism-run's exit code.
int Emulate(const EmulateOptions& opts, const std::vector<std::string>& command);

// The --ranks / --layout / ... part of a request resolved against the job without running anything: the plan's
// world size, layout spec, gpus per node and real ranks, or an error (exit 2). Used by the stage driver before it
// starts its first stage, so that a bad command line fails at once and not after a collect.
struct PlanSummary {
  int world_size = 0;
  int gpus_per_node = 0;
  int gpus = 0;  // GPUs of this host the plan uses
  std::string layout_spec;
  int tp = 1, pp = 1, dp = 1, cp = 1, ep = 1;
  std::vector<int> real_ranks;
  std::vector<std::string> job_argv;  // launcher, options, script, script args as parsed
  std::vector<std::string> script_key;  // what of the job determines its graph (launcher/graph_cache.h)
  std::string script_path;              // the training script, absolute ("" for -m modules)
  std::string cwd;
};
bool SummarizePlan(const EmulateOptions& opts, const std::vector<std::string>& command, PlanSummary* out,
                   std::string* error);

// ./prism-out/<YYYYmmdd-HHMMSS>[-N]: the first that does not exist yet.
std::string DefaultOutDir();

// Merges `extra` into the report.json at `path` (atomically). False with *error.
bool MergeIntoReport(const std::string& path, const nlohmann::json& extra, std::string* error);

}  // namespace prism::launcher
