// prism-run collect [OPTIONS] torchrun ...: stage 1 (docs/collect.md). Runs data-parallel replica 0 of the job
// (every rank with dp == 0: tp x pp x cp ranks) for real, with real data between them (exchange), records what
// each received from real data (payloads/rank<R>.bin, for `--payload recorded`), and writes the bare graph of all
// ranks (observed.prism) from their event files. The same launcher path as emulate (emulate_options.h).
//
// Expert parallelism: --real-routing adds every member of each replica-0 rank's expert-parallel group, so MoE
// routing comes from real data on every ep coordinate. Without it the ranks of other ep coordinates run virtual
// (mirrored data) and their classes repeat the nodes of the real rank that differs only in ep (EP symmetry
// assumed; the plan, the graph line and the summary say so).
//
// Context switching (--swap, docs/collect.md "Context switching"): when the replica's ranks do not all fit in GPU
// memory, ranks start as their GPU has room and ranks blocked in an exchange are swapped out to host RAM with the
// CUDA checkpoint API (coordinator/swap_scheduler.h, swap_driver.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "coordinator/swap_scheduler.h"
#include "coordinator/world.h"
#include "launcher/observed_trace.h"

#include "emulate_options.h"
#include "subcommands.h"

namespace prism::cli {
namespace fs = std::filesystem;

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

// The context-switching figures the coordinator left in status.json ("swap"), printed and copied into report.json.
void SwapSummary(const fs::path& out) {
  using nlohmann::json;
  std::ifstream in(out / "status.json");
  json st = in ? json::parse(in, nullptr, false) : json();
  if (st.is_discarded() || !st.contains("swap")) {
    std::printf("prism collect: context switching: no figures (status.json has none)\n");
    return;
  }
  const json& s = st["swap"];
  auto b = [&](const char* k) { return coord::FormatBytes(s.value(k, uint64_t{0})); };
  const int failures = s.value("failures", 0);
  const std::string failed =
      failures ? "; " + std::to_string(failures) + " swap(s) FAILED (see the lines above)" : std::string();
  // Where the footprints came from (coordinator SwapMeasure): measured per process, or the tracked peak + context.
  std::string from = s.value("footprint_source", std::string());
  const int measured = s.value("footprints_measured", 0), ranks = s.value("ranks", 0);
  if (!from.empty() && measured > 0) {
    from += measured >= ranks ? " for all " + std::to_string(ranks) + " rank(s)"
                              : " for " + std::to_string(measured) + " of " + std::to_string(ranks) +
                                    " rank(s), the others tracked peak + " + b("context_bytes") + " context";
  } else if (from.rfind("measured", 0) == 0) {
    from += ", but no rank's process was in its answer: tracked peak + " + b("context_bytes") + " context";
  }
  if (!from.empty()) from = "; footprints: " + from;
  std::printf("prism collect: context switching: %d/%d rank(s) finished; %llu swap(s) out (%s, %.1f s) and %llu in "
              "(%s, %.1f s); peak on one GPU %s of its cap %s; peak in host RAM %s of %s%s%s\n",
              s.value("finished", 0), s.value("ranks", 0),
              static_cast<unsigned long long>(s.value("swaps_out", uint64_t{0})), b("bytes_out").c_str(),
              s.value("seconds_out", 0.0), static_cast<unsigned long long>(s.value("swaps_in", uint64_t{0})),
              b("bytes_in").c_str(), s.value("seconds_in", 0.0), b("peak_gpu_bytes").c_str(),
              b("gpu_cap_bytes").c_str(), b("peak_host_bytes").c_str(),
              s.value("host_cap_bytes", uint64_t{0}) ? b("host_cap_bytes").c_str() : "no budget", from.c_str(),
              failed.c_str());
  std::ifstream rin(out / "report.json");
  json rep = rin ? json::parse(rin, nullptr, false) : json();
  rin.close();
  if (rep.is_discarded() || !rep.is_object()) return;
  rep["swap"] = s;
  std::ofstream rout(out / "report.json.tmp", std::ios::trunc);
  rout << rep.dump(2) << "\n";
  rout.close();
  std::error_code ec;
  fs::rename(out / "report.json.tmp", out / "report.json", ec);
}
// When some expert-parallel classes had no real rank: the graph repeats another ep coordinate's nodes for them
// (observed_trace.h, mirror_expert_classes). Says so, from the run's report.json (layout) and its event files.
void EpSymmetryNote(const fs::path& out, bool real_routing) {
  using nlohmann::json;
  std::ifstream in(out / "report.json");
  json rep = in ? json::parse(in, nullptr, false) : json();
  if (rep.is_discarded() || !rep.is_object() || !rep.contains("layout") || !rep["layout"].is_object()) return;
  std::string error;
  auto layout = world::ParseLayout(rep["layout"].value("spec", ""), &error);
  const int world_size = rep.value("world_size", 0);
  if (!layout || layout->ep <= 1 || world_size <= 0 ||
      !world::ResolveLayout(&*layout, world_size, std::to_string(world_size) + " ranks", &error))
    return;
  auto w = world::World::Make(*layout, std::max(1, rep.value("gpus_per_node", 8)), &error);
  if (!w) return;
  const std::vector<int> real = launcher::EventFileRanks(out.string());
  size_t mirrored = 0;
  if (launcher::CoversEveryClass(*w, real) || !launcher::CoversEveryClassOrEpStandIn(*w, real, &mirrored) ||
      mirrored == 0)
    return;
  std::printf("prism collect: note: expert parallelism (ep %d)%s: %zu expert-parallel class(es) had no real rank; "
              "the graph repeats for them the nodes of the real rank that differs only in ep (EP symmetry assumed: "
              "mirrored MoE routing)%s\n",
              layout->ep, real_routing ? "" : " without --real-routing", mirrored,
              real_routing ? "" : ". Add --real-routing to run them for real");
}
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
      ->check(CLI::NonNegativeNumber);
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
    e.one_replica = true;
    e.real_routing = o.real_routing;
    e.record_payloads = !o.no_payloads;
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
        if (!sz.text.empty() && !coord::ParseBytes(sz.text, sz.to)) {
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
    *rc = RunEmulate(e, command);
    if (o.dry_run) {
      if (e.swap.enabled && !o.json) {
        std::printf("context switching: on; GPU cap %s, host budget %s, %s per rank beyond its allocations%s; ranks "
                    "start as their GPU has room, ranks blocked in an exchange are swapped out (CUDA checkpoint API "
                    "through %s)\n",
                    e.swap.gpu_cap_bytes ? coord::FormatBytes(e.swap.gpu_cap_bytes).c_str() : "from the driver",
                    e.swap.host_cap_bytes ? coord::FormatBytes(e.swap.host_cap_bytes).c_str() : "80% of MemAvailable",
                    coord::FormatBytes(e.swap.context_bytes).c_str(),
                    e.swap.rank_estimate_bytes
                        ? (", ranks assumed " + coord::FormatBytes(e.swap.rank_estimate_bytes) + " until they report")
                              .c_str()
                        : "",
                    e.swap.driver.c_str());
      }
      return;
    }
    std::error_code ec;
    fs::path out = fs::absolute(e.out, ec);
    uint64_t bytes = 0;
    int files = 0;
    for (const auto& f : fs::directory_iterator(out / "payloads", ec)) {
      bytes += f.file_size(ec);
      ++files;
    }
    std::printf("prism collect: bare graph %s%s\n", (out / "observed.prism").string().c_str(),
                fs::exists(out / "observed.prism", ec) ? "" : " (NOT written: see the lines above)");
    if (fs::exists(out / "observed.prism", ec)) EpSymmetryNote(out, o.real_routing);
    if (e.swap.enabled) SwapSummary(out);
    if (!o.no_payloads) {
      std::printf("prism collect: payloads of %d rank(s), %.1f MiB, in %s (use: prism-run --payload recorded "
                  "--payload-dir %s --ranks R torchrun ...)\n",
                  files, static_cast<double>(bytes) / (1 << 20), (out / "payloads").string().c_str(),
                  out.string().c_str());
    }
  });
}

}  // namespace prism::cli
