// prism-run collect [OPTIONS] torchrun ...: stage 1 (launcher/collect.h, docs/collect.md). Parses, checks the
// context-switching sizes and calls launcher::Collect.
#include <cstdio>
#include <string>
#include <vector>

#include "common/sizes.h"
#include "coordinator/swap/swap_scheduler.h"
#include "launcher/collect.h"

#include "emulate_options.h"
#include "subcommands.h"

namespace prism::cli {

namespace {
struct CollectOptions : LaunchSubcommandOptions {
  bool no_payloads = false;
  bool real_routing = false;
  std::string swap;  // on | off | "" (on when --gpu-mem-cap is given)
  std::string gpu_mem_cap, host_mem_cap, rank_mem, context_mem = "512M";
  std::string swap_driver = "libcuda.so.1";
  double swap_stall = 30;
  bool no_preload = false;
};
}  // namespace

void AddCollect(CLI::App& app, int* rc) {
  static CollectOptions o;
  auto* sub = app.add_subcommand(
      "collect", "run data-parallel replica 0 for real (real data between its ranks); write the bare graph of all "
                 "ranks and the payloads each rank received");
  sub->prefix_command();
  AddLaunchSubcommandOptions(sub, &o, "prism-collect", "GPUs of this host to use (default: all visible)");
  sub->add_flag("--no-payloads", o.no_payloads, "do not record payloads (no `--payload recorded` later)");
  sub->add_flag("--real-routing", o.real_routing,
                "MoE jobs: also run the expert-parallel peers of replica 0 for real (every member of each of its "
                "ranks' expert-parallel group), so routing comes from real data; without it those ranks run "
                "virtual and their classes repeat the ep-0 rank's nodes (EP symmetry assumed)");
  sub->add_option("--swap", o.swap,
                  "context switching: on = ranks start as their GPU has room and ranks blocked in an exchange are "
                  "swapped out to host RAM (CUDA checkpoint API); off (default, unless --gpu-mem-cap is given)")
      ->check(CLI::IsMember({"on", "off"}));
  sub->add_option("--gpu-mem-cap", o.gpu_mem_cap,
                  "with --swap: bytes of each GPU the ranks may hold together, e.g. 60G (default: the GPU's memory "
                  "less max(2 GiB, 5 %)); implies --swap on");
  sub->add_option("--host-mem-cap", o.host_mem_cap,
                  "with --swap: host RAM swapped-out ranks may hold in all, e.g. 100G (default: 80 % of MemAvailable)");
  sub->add_option("--rank-mem", o.rank_mem,
                  "with --swap: footprint assumed for a rank before it reports memory (default: the largest learned, "
                  "and ranks of unknown size start one at a time per GPU)");
  sub->add_option("--context-mem", o.context_mem,
                  "with --swap: GPU memory per rank beyond its allocations (CUDA context), default 512M");
  sub->add_option("--swap-stall", o.swap_stall,
                  "with --swap: seconds a rank may stay silent outside an exchange before its GPU counts as stalled "
                  "(default 30)")
      ->check(NonNegative());
  sub->add_flag("--no-preload", o.no_preload, "run the workers without libprism.so (launch debugging, tests)");
  sub->add_option("--swap-driver", o.swap_driver,
                  "with --swap: the CUDA driver library to load (default libcuda.so.1)");
  sub->callback([sub, rc] {
    std::vector<std::string> command = sub->remaining();
    if (command.empty()) {
      std::fprintf(stderr, "prism-run collect: give the job's command: prism-run collect [OPTIONS] torchrun ...\n");
      *rc = kExitBadInput;
      return;
    }
    EmulateOptions e = ToEmulateOptions(o, "prism-collect");
    e.no_preload = o.no_preload;
    e.swap.enabled = o.swap == "on" || (o.swap.empty() && !o.gpu_mem_cap.empty());
    if (e.swap.enabled) {
      struct {
        const char* name;
        const std::string& text;
        uint64_t* to;
      } sizes[] = {{"--gpu-mem-cap", o.gpu_mem_cap, &e.swap.gpu_cap_bytes},
                   {"--host-mem-cap", o.host_mem_cap, &e.swap.host_cap_bytes},
                   {"--rank-mem", o.rank_mem, &e.swap.rank_estimate_bytes},
                   {"--context-mem", o.context_mem, &e.swap.context_bytes}};
      for (const auto& sz : sizes) {
        if (!sz.text.empty() && !ParseBytes(sz.text, sz.to)) {
          std::fprintf(stderr, "prism-run collect: %s %s: expected bytes such as 60G, 512M or 1073741824\n", sz.name,
                       sz.text.c_str());
          *rc = kExitBadInput;
          return;
        }
      }
      e.swap.driver = o.swap_driver;
      e.swap.stall_s = o.swap_stall;
      // Why: a process holding a real NCCL communicator cannot be checkpointed; every communicator stays libprism's.
      e.no_passthrough = true;
    } else if (!o.host_mem_cap.empty() || !o.rank_mem.empty()) {
      std::fprintf(stderr, "prism-run collect: --host-mem-cap and --rank-mem apply with --swap on only\n");
      *rc = kExitBadInput;
      return;
    }
    *rc = launcher::Collect(e, o.real_routing, o.no_payloads, command).exit_code;
  });
}

}  // namespace prism::cli
