// Options of the emulate mode (`prism-run [OPTIONS] torchrun ...`), shared with `prism-run collect`, which runs
// the same launcher path with one data-parallel replica real and payload recording on.
#pragma once

#include <string>
#include <vector>

#include "coordinator/swap_scheduler.h"

namespace CLI {
class App;
}

namespace prism::cli {

struct EmulateOptions {
  std::string ranks;
  std::string layout;
  std::string topology;
  std::string graph;
  std::vector<std::string> what_if;  // --what-if straggler=R:F (with --graph; docs/fill.md)
  // fill's slices: communicator slots, comma-separated, whose virtual members do not hold a real rank's collectives
  // (GraphRelease::SetLockstepSlots; fill --lockstep, docs/fill.md "Tensor-parallel lockstep"); "" for none
  std::string lockstep_slots;
  std::string payload = "mirror";
  std::string payload_dir;       // --payload-dir (recorded payloads of a collect run)
  std::string payload_max_bytes;  // --payload-max-bytes: recorded payloads larger than this are not recorded/replayed
  bool one_replica = false;      // collect: run one data-parallel replica for real
  bool real_routing = false;     // collect --real-routing: also the expert-parallel peers of replica 0
  bool record_payloads = false;  // collect: every real rank records what real data gave it
  bool all_real = false;         // record: every rank real on its own GPU, everything on the real NCCL
  std::string out;
  bool dry_run = false;
  bool json = false;
  int gpus = 0;
  std::string coordinator;
  int node_rank = -1;
  bool no_preload = false;
  bool quiet = false;
  double hang_timeout = 60;
  std::string on_hang = "stop";
  int iterations = 0;  // --iterations K: stop the job once every real rank completed K iterations (0: run it out)
  bool no_passthrough = false;  // --no-passthrough
  bool kernels = false;         // --kernels: CUPTI kernel records of the real ranks (docs/kernels.md)
  bool kernels_nvtx = false;    // --kernels-nvtx: also the job's NVTX ranges
  std::string listen;        // --listen: the coordinator started here also serves other hosts on this address
  std::string remote_ranks;  // --remote-ranks: real ranks that prism-runs on other hosts run
  coord::SwapConfig swap;    // collect --swap: context switching (docs/collect.md)
};

// The options `collect` and `record` share: each runs the emulate path (RunEmulate) with its own choice of real ranks.
struct LaunchSubcommandOptions {
  std::string out;
  std::string layout;
  std::string topology;
  int gpus = 0;
  bool quiet = false;
  bool dry_run = false;
  bool json = false;
  double hang_timeout = 60;
  int iterations = 0;
  std::string payload_max_bytes;
};
// Registers them on `sub` (`default_out`: the directory name used when --out is not given).
void AddLaunchSubcommandOptions(CLI::App* sub, LaunchSubcommandOptions* o, const std::string& default_out,
                                const std::string& gpus_help);
// The emulate options they stand for; without --out, ./<default_out> (then -2, -3, ... while taken).
EmulateOptions ToEmulateOptions(const LaunchSubcommandOptions& o, const std::string& default_out);

}  // namespace prism::cli
