#include "launcher/stages.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "common/text.h"
#include "launcher/collect.h"
#include "launcher/fill.h"
#include "launcher/graph_cache.h"
#include "analysis/report_compare.h"
#include "prism/limits.h"
#include "prism/report.h"
#include "replay/simulate.h"

namespace prism::launcher {
using namespace ::prism::analysis;  // the post-run analysis (src/analysis) this file calls
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using Clk = std::chrono::steady_clock;

double Since(Clk::time_point t) { return std::chrono::duration<double>(Clk::now() - t).count(); }

// The collect's options: what of the user's options applies to it (placement, model of the target, limits).
EmulateOptions CollectOptionsOf(const StagedOptions& o, const std::string& out, int iterations) {
  EmulateOptions c;
  c.out = out;
  c.layout = o.emulate.layout;
  c.topology = o.emulate.topology;
  c.gpus = o.emulate.gpus;
  c.hang_timeout = std::max(120.0, o.emulate.hang_timeout);
  c.payload_max_bytes = o.emulate.payload_max_bytes;
  c.iterations = iterations;
  c.no_preload = o.emulate.no_preload;
  c.quiet = true;
  c.print_report = false;
  return c;
}

json CacheJson(const std::string& root, const CacheEntry& e, const GraphKey& k, bool hit) {
  return {{"root", root}, {"dir", e.dir}, {"key", k.digest}, {"hit", hit}, {"graph", e.graph},
          {"collected", e.collected}};
}

json FillJson(const json& state) {
  if (!state.is_object() || !state.contains("fill") || !state["fill"].is_object()) return nullptr;
  const json& f = state["fill"];
  json out = json::object();
  for (const char* k : {"rounds", "converged", "last_moved_pct", "compute_spread_pct", "tolerance_pct", "max_rounds",
                        "calibrated_iteration_time_s", "slices_run", "shared_classes", "wall_s"})
    if (f.contains(k)) out[k] = f[k];
  return out;
}

std::string CollectWhat(const PlanSummary& cps, bool real_routing) {
  return "ranks " + JoinRanks(cps.real_ranks) + " (data-parallel replica 0" +
         (real_routing ? " and its expert-parallel peers: real routing" : "") + ")";
}

// The emulation stage's --what-if: straggler= of a virtual rank inside the world, or exit 2 with the reason.
int CheckWhatIf(const StagedOptions& o, const PlanSummary& ps) {
  if (o.emulate.what_if.empty()) return kExitOk;
  std::string error;
  std::string spec;
  for (const std::string& w : o.emulate.what_if) spec += (spec.empty() ? "" : ",") + w;
  replay::WhatIf wi;
  if (!replay::ParseWhatIf(spec, &wi, &error)) {
    std::fprintf(stderr, "prism-run: --what-if: %s\n", error.c_str());
    return kExitBadInput;
  }
  if (wi.bw_scale != 1.0 || !wi.topology.empty()) {
    std::fprintf(stderr, "prism-run: --what-if %s: only straggler= applies to an emulation (bw-scale= and topology= "
                         "change the cost model: use --topology)\n", spec.c_str());
    return kExitBadInput;
  }
  for (auto [rank, f] : wi.stragglers) {
    const bool real = std::find(ps.real_ranks.begin(), ps.real_ranks.end(), rank) != ps.real_ranks.end();
    if (real || rank >= ps.world_size) {
      std::fprintf(stderr, "prism-run: --what-if straggler=%d:%g: %s\n", rank, f,
                   real ? "that rank runs for real: its compute is measured on the GPU, not replayed; name a "
                          "virtual rank"
                        : "outside the world");
      return kExitBadInput;
    }
  }
  return kExitOk;
}

// Stages 1 and 2 into the cache entry (under its lock): the collect unless the entry has it, then the fill (resumed
// when an earlier run stopped in it). Returns the exit code of the stage that failed, else kExitOk.
int BuildGraph(const StagedOptions& o, const std::vector<std::string>& command, const GraphKey& key,
               const std::string& root, const PlanSummary& cps, int iterations, Clk::time_point t0, CacheEntry* e,
               bool* hit, json* stages_out, double* collect_s_out, double* fill_s_out) {
  CacheEntry& entry = *e;
  json& stages = *stages_out;
  double& collect_s = *collect_s_out;
  double& fill_s = *fill_s_out;
  std::string error;
  const bool real_routing = cps.ep > 1;
  const std::string collect_what = CollectWhat(cps, real_routing);
  EntryLock lock;
  if (!lock.Acquire(entry.dir, [&] {
        std::printf("prism: another prism-run is building this graph (%s/lock): waiting for it\n", entry.dir.c_str());
        std::fflush(stdout);
      }, &error)) {
    std::fprintf(stderr, "prism-run: graph cache: %s\n", error.c_str());
    return kExitFailure;
  }
  entry = LookupEntry(root, key);
  if (o.refresh && !ResetEntry(&entry, &error)) {
    std::fprintf(stderr, "prism-run: graph cache: %s\n", error.c_str());
    return kExitFailure;
  }
  *hit = entry.filled;
  if (!entry.collected) {
    if (!ResetEntry(&entry, &error)) {
      std::fprintf(stderr, "prism-run: graph cache: %s\n", error.c_str());
      return kExitFailure;
    }
    const auto s0 = Clk::now();
    std::printf("prism: stage 1/3 collect: %s for real, %d iterations; elapsed %s\n", collect_what.c_str(),
                iterations, MinutesSeconds(Since(t0)).c_str());
    std::fflush(stdout);
    EmulateOptions c = CollectOptionsOf(o, entry.collect_dir, iterations);
    c.swap.enabled = o.collect_swap == "on";
    if (c.swap.enabled) c.no_passthrough = true;  // a process holding a real NCCL communicator cannot be swapped
    CollectResult cr = Collect(c, real_routing, false, command);
    if (cr.exit_code != 0 && cr.out_of_memory && o.collect_swap == "auto") {
      std::printf("prism: stage 1/3 collect: the replica's ranks ran out of GPU memory together: collecting again "
                  "with context switching (docs/collect.md)\n");
      std::fflush(stdout);
      std::error_code ec;
      fs::remove_all(entry.collect_dir, ec);
      c.swap.enabled = true;
      c.no_passthrough = true;
      cr = Collect(c, real_routing, false, command);
      stages[0]["swap"] = "on (retried after out of memory)";
    }
    collect_s = Since(s0);
    if (cr.exit_code != 0 || cr.graph.empty()) {
      std::printf("prism: stage 1/3 collect %s (exit %d) after %s; its output: %s; nothing was cached\n",
                  cr.exit_code == kExitInterrupted ? "interrupted" : "FAILED", cr.exit_code, MinutesSeconds(collect_s).c_str(),
                  entry.collect_dir.c_str());
      return cr.exit_code != 0 ? cr.exit_code : kExitFailure;
    }
    json info = {{"wall_s", collect_s}, {"dir", entry.collect_dir}, {"ranks", cps.real_ranks},
                 {"payload_bytes", cr.payload_bytes}, {"swap", c.swap.enabled}};
    if (!RecordStage(&entry, key, "collect", info, &error))
      std::fprintf(stderr, "prism-run: graph cache: %s\n", error.c_str());
    std::printf("prism: stage 1/3 collect: done in %s\n", MinutesSeconds(collect_s).c_str());
  } else {
    std::printf("prism: stage 1/3 collect: cached (%s)\n", entry.collect_dir.c_str());
  }
  stages[0]["cached"] = collect_s == 0;
  if (!entry.filled) {
    const auto s0 = Clk::now();
    std::printf("prism: stage 2/3 fill: until the estimate moves by at most %.2f %% (at most %d rounds); elapsed "
                "%s\n", o.tolerance_pct, o.max_rounds, MinutesSeconds(Since(t0)).c_str());
    std::fflush(stdout);
    FillOptions f;
    f.from = entry.collect_dir;
    f.out = entry.fill_dir;
    f.topology = o.emulate.topology;
    f.tolerance_pct = o.tolerance_pct;
    f.max_rounds = o.max_rounds;
    f.gpus = o.emulate.gpus;
    f.hang_timeout = std::max(120.0, o.emulate.hang_timeout);
    f.no_preload = o.emulate.no_preload;
    f.payload_max_bytes = o.emulate.payload_max_bytes;
    f.iterations = iterations;
    f.share_symmetric_tp = true;
    f.resume = true;  // a fill this entry began and did not finish (Ctrl-C, a failed slice) goes on where it stopped
    FillResult fr = RunFill(f, command);
    fill_s = Since(s0);
    if (fr.exit_code != 0) {
      std::printf("prism: stage 2/3 fill %s (exit %d) after %s; the collect stays cached (%s): the same command "
                  "resumes at the fill\n",
                  fr.exit_code == kExitInterrupted ? "interrupted" : "FAILED", fr.exit_code, MinutesSeconds(fill_s).c_str(),
                  entry.collect_dir.c_str());
      return fr.exit_code;
    }
    json info = {{"wall_s", fr.wall_s > 0 ? fr.wall_s : fill_s}, {"rounds", fr.rounds}, {"converged", fr.converged},
                 {"last_moved_pct", fr.last_moved_pct}, {"tolerance_pct", o.tolerance_pct},
                 {"max_rounds", o.max_rounds}, {"slices_run", fr.slices_run}, {"classes", fr.classes},
                 {"shared_classes", fr.shared_classes}, {"compute_spread_pct", fr.spread_pct},
                 {"bare_iteration_time_s", fr.bare_s},
                 {"uncalibrated_iteration_time_s", fr.uncalibrated_s},
                 {"calibrated_iteration_time_s", fr.calibrated_s}, {"graph", fr.graph}};
    if (!RecordStage(&entry, key, "fill", info, &error))
      std::fprintf(stderr, "prism-run: graph cache: %s\n", error.c_str());
    std::printf("prism: stage 2/3 fill: done in %s, %s after %d round(s) (last move %.2f %%)\n", MinutesSeconds(fill_s).c_str(),
                fr.converged ? "converged" : "NOT converged", fr.rounds, fr.last_moved_pct);
  }
  return kExitOk;
}

}  // namespace

int RunStaged(const StagedOptions& o, const std::vector<std::string>& command) {
  const auto t0 = Clk::now();
  std::string error;
  PlanSummary ps;
  EmulateOptions checked = o.emulate;
  checked.what_if.clear();  // checked below: the graph they need comes from the fill
  if (!SummarizePlan(checked, command, &ps, &error)) {
    std::fprintf(stderr, "prism-run: %s\n", error.c_str());
    return kExitBadInput;
  }
  // --what-if applies to the emulation stage; refuse a bad one now, not after the collect and the fill.
  if (int rc = CheckWhatIf(o, ps); rc != kExitOk) return rc;

  const int iterations = o.emulate.iterations > 0 ? o.emulate.iterations : o.graph_iterations;
  const GraphKey key = MakeGraphKey({.world_size = ps.world_size, .gpus_per_node = ps.gpus_per_node,
                                     .layout_spec = ps.layout_spec, .script_key = ps.script_key,
                                     .script_path = ps.script_path, .cwd = ps.cwd, .environment = o.environment,
                                     .topology = o.emulate.topology, .gpus = ps.gpus,
                                     .payload_max_bytes = o.emulate.payload_max_bytes.value_or(limits::kDefaultPayloadMaxBytes), .iterations = iterations,
                                     .gpu_models = HostGpuModels()});
  const std::string root = GraphCacheRoot(o.cache_root);
  CacheEntry entry = LookupEntry(root, key);
  bool hit = entry.filled && !o.refresh;

  // The collect's real ranks (replica 0, and its expert-parallel peers when ep > 1), for the plan and the lines.
  const bool real_routing = ps.ep > 1;
  EmulateOptions cprobe = CollectOptionsOf(o, entry.collect_dir, iterations);
  cprobe.one_replica = true;
  cprobe.real_routing = real_routing;
  cprobe.ranks.clear();
  PlanSummary cps;
  if (!SummarizePlan(cprobe, command, &cps, &error)) {
    std::fprintf(stderr, "prism-run: the collect stage: %s\n", error.c_str());
    return kExitBadInput;
  }
  const std::string collect_what = CollectWhat(cps, real_routing);
  json stages = json::array();
  stages.push_back({{"name", "collect"}, {"ranks", cps.real_ranks}, {"real_routing", real_routing},
                    {"iterations", iterations}, {"swap", o.collect_swap}, {"cached", hit || entry.collected}});
  stages.push_back({{"name", "fill"}, {"tolerance_pct", o.tolerance_pct}, {"max_rounds", o.max_rounds},
                    {"cached", hit}});
  stages.push_back({{"name", "emulate"}, {"ranks", ps.real_ranks},
                    {"payload", o.payload_given ? o.emulate.payload : "recorded"}});

  if (o.emulate.dry_run) {
    EmulateOptions e = o.emulate;
    e.plan_extra = {{"policy", "graph"}, {"stages", stages}, {"graph_cache", CacheJson(root, entry, key, hit)}};
    // The what-ifs need the graph the fill will write; the plan shown is the emulation's without them.
    if (!e.what_if.empty()) e.plan_extra["what_if"] = e.what_if;
    e.what_if.clear();
    if (!e.json) {
      std::printf("policy graph (the faithful default; --policy mirror is the quick one): 3 stages\n"
                  "  1. collect: %s for real, %d iterations%s\n"
                  "  2. fill: rounds of slices until the estimate moves by at most %.2f %% (at most %d rounds)%s\n"
                  "  3. emulate: rank(s) %s against the filled graph, %s payloads\n"
                  "graph cache: %s (%s)\n\nthe emulation's plan:\n",
                  collect_what.c_str(), iterations, hit || entry.collected ? " [cached]" : "", o.tolerance_pct,
                  o.max_rounds, hit ? " [cached]" : "", JoinRanks(ps.real_ranks).c_str(),
                  o.payload_given ? o.emulate.payload.c_str() : "the collect's recorded", entry.dir.c_str(),
                  hit ? "hit: the run starts at stage 3" : (o.refresh ? "refresh: a new graph" : "miss"));
    }
    return Emulate(e, command);
  }

  std::printf("prism: policy graph (the faithful default): collect -> fill -> emulate; graph cache %s (%s)\n",
              entry.dir.c_str(),
              hit ? "hit" : o.refresh ? "refresh requested" : entry.collected ? "collect cached, fill missing" : "miss");
  std::fflush(stdout);
  double collect_s = 0, fill_s = 0;
  if (!hit) {
    if (int rc = BuildGraph(o, command, key, root, cps, iterations, t0, &entry, &hit, &stages, &collect_s, &fill_s);
        rc != kExitOk)
      return rc;
  } else {
    std::printf("prism: stage 1/3 collect: cached (%s)\nprism: stage 2/3 fill: cached (%s)\n",
                entry.collect_dir.c_str(), entry.fill_dir.c_str());
  }
  stages[0]["wall_s"] = collect_s;
  stages[1]["wall_s"] = fill_s;
  // What building the graph took when it was built (the collect's, and the fill's over all its runs).
  for (size_t i = 0; i < 2; ++i) {
    const char* name = i == 0 ? "collect" : "fill";
    if (entry.state.contains(name) && entry.state[name].is_object() && entry.state[name].contains("wall_s"))
      stages[i]["built_s"] = entry.state[name]["wall_s"];
  }
  stages[1]["cached"] = fill_s == 0;
  const json fill = FillJson(entry.state);

  // Stage 3: the requested ranks against the filled graph, each with its class's recorded payloads.
  EmulateOptions e = o.emulate;
  e.graph = entry.graph;
  std::error_code aec;
  e.out = e.out.empty() ? DefaultOutDir() : fs::absolute(e.out, aec).string();
  std::string payload_note;
  if (!o.payload_given) {
    EmulateOptions probe = e;
    probe.payload = "recorded";
    probe.payload_dir = entry.collect_dir;
    PlanSummary unused;
    std::string perr;
    if (SummarizePlan(probe, command, &unused, &perr)) {
      e.payload = "recorded";
      e.payload_dir = entry.collect_dir;
    } else {
      payload_note = perr;
      stages[2]["payload"] = "mirror";
      std::printf("prism: stage 3/3 emulate: no recorded payloads for every requested rank (%s): mirror payloads\n",
                  perr.c_str());
    }
  }
  json cache = CacheJson(root, entry, key, hit);
  e.report_extra = {{"policy", "graph"}, {"graph", entry.graph}, {"graph_cache", cache}, {"fill", fill}};
  e.print_report = false;
  const auto s0 = Clk::now();
  std::printf("prism: stage 3/3 emulate: rank(s) %s against %s (%s payloads); elapsed %s\n",
              JoinRanks(ps.real_ranks).c_str(), entry.graph.c_str(), e.payload.c_str(), MinutesSeconds(Since(t0)).c_str());
  std::fflush(stdout);
  const int rc = Emulate(e, command);
  stages[2]["wall_s"] = Since(s0);
  stages[2]["cached"] = false;
  const std::string rep_path = (fs::path(e.out) / std::string(report::kFileName)).string();
  if (fs::exists(rep_path)) {
    if (!MergeIntoReport(rep_path, {{"stages", stages}, {"procedure_wall_s", Since(t0)}}, &error))
      std::printf("prism: report.json: %s\n", error.c_str());
    if (auto rep = LoadReport(rep_path, &error)) std::printf("\n%s", ShowReport(*rep, 16).c_str());
    std::printf("prism: report %s (exit %d)\n", rep_path.c_str(), rc);
  }
  return rc;
}

}  // namespace prism::launcher
