// prism-run fill [OPTIONS] torchrun ...: stages 2 and 3 of the paper's procedure on this host (docs/fill.md).
//
// From a collect run (its event files, payloads and report.json; --graph names its observed.prism or --from its
// directory), every class's representative rank runs for real alone (one rank per slice on one GPU; the GPUs of
// this host are not yet used for wider slices) while the coordinator replays every other rank from the graph as
// filled so far (--graph, GraphRelease). After each slice the class's nodes are rebuilt from that run's event
// file: compute gaps measured on the GPU between the slice's communication points, so time spent waiting for a
// virtual peer lies inside the communication window, not in the compute nodes; each compute node is then the median
// over every slice that ran the class so far (launcher/fill_samples.h). Rounds repeat while `simulate`'s
// iteration time moves by more than --tolerance percent (cross-slice calibration: each slice ran against its
// neighbours' previous estimates). Output: OUT/filled.prism and OUT/fill.json.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "coordinator/world.h"
#include "emulate_options.h"
#include "launcher/fill_samples.h"
#include "launcher/observed_trace.h"
#include "prism/events.h"
#include "prism/report.h"
#include "replay/simulate.h"
#include "replay/trace_io.h"
#include "subcommands.h"

namespace prism::cli {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct FillOptions {
  std::string graph;  // a collect run's observed.prism (its directory holds the events)
  std::string from;   // or the collect directory itself
  std::string out;
  std::string topology;
  double tolerance_pct = 0.5;
  int max_rounds = 3;
  int gpus = 0;
  double hang_timeout = 120;
  bool quiet = true;
  std::string payload_max_bytes;
  // Slots whose virtual members do not hold the slice's real rank (GraphRelease::SetLockstepSlots); "none": all do.
  std::string lockstep = "tp";
};

json LoadJson(const fs::path& p) {
  std::ifstream f(p);
  if (!f) return json();
  return json::parse(f, nullptr, false);
}

// Iteration time `simulate` gives for `graph` (seconds); < 0 with *error on failure.
double SimulateIteration(const std::string& graph, const std::string& out_dir, const std::string& topology,
                         std::string* error) {
  replay::SimulateOptions so;
  so.graph = graph;
  so.out_dir = out_dir;
  so.topology = topology;
  so.trace_ranks = "none";
  so.quiet = true;
  std::ostringstream out, err;
  int rc = replay::RunSimulate(so, out, err);
  if (rc != 0) {
    *error = "simulate " + graph + " failed (exit " + std::to_string(rc) + "): " + err.str();
    return -1;
  }
  json rep = LoadJson(fs::path(out_dir) / std::string(report::kFileName));
  if (!rep.is_object() || !rep.contains(std::string(report::kIterationTime))) {
    *error = "simulate wrote no iteration time in " + out_dir;
    return -1;
  }
  return rep[std::string(report::kIterationTime)].get<double>();
}

std::optional<world::World> WorldFromReport(const fs::path& dir, std::string* error) {
  json rep = LoadJson(dir / std::string(report::kFileName));
  if (!rep.is_object()) {
    *error = (dir / std::string(report::kFileName)).string() + " is missing or not JSON (a collect run writes it)";
    return std::nullopt;
  }
  const int world_size = rep.value(std::string(report::kWorldSize), 0);
  const int gpus = rep.value("gpus_per_node", 8);
  std::string spec = rep.contains("layout") && rep["layout"].is_object() ? rep["layout"].value("spec", "") : "";
  world::Layout layout;
  if (!spec.empty()) {
    auto l = world::ParseLayout(spec, error);
    if (!l) return std::nullopt;
    layout = *l;
  }
  if (!world::ResolveLayout(&layout, world_size, std::to_string(world_size) + " ranks", error)) return std::nullopt;
  auto w = world::World::Make(layout, gpus, error);
  if (!w) return std::nullopt;
  return std::move(*w);
}

// The slices of one round. One GPU: one rank per slice. G GPUs: the classes' ranks grouped by tensor-parallel group
// (the same coordinates but tp), each group cut into chunks of at most G ranks, so that a slice's tensor-parallel
// communicator has only real members on distinct GPUs and runs on the real NCCL (passthrough: its traffic, SM use
// and timing are the hardware's, issue 10).
std::vector<std::vector<int>> Slices(const std::vector<int>& reps, const world::World& w, int gpus) {
  std::vector<std::vector<int>> out;
  if (gpus <= 1) {
    for (int r : reps) out.push_back({r});
    return out;
  }
  std::map<std::vector<int>, std::vector<int>> by_group;  // coordinates but tp -> ranks, in class order
  std::vector<std::vector<int>> order;
  for (int r : reps) {
    const world::Coords c = w.CoordsOf(r);
    std::vector<int> key = {c.cp, c.dp, c.pp, c.ep, c.edp};
    if (!by_group.count(key)) order.push_back(key);
    by_group[key].push_back(r);
  }
  for (const auto& key : order) {
    const std::vector<int>& g = by_group[key];
    for (size_t i = 0; i < g.size(); i += static_cast<size_t>(gpus)) {
      out.emplace_back(g.begin() + static_cast<std::ptrdiff_t>(i),
                       g.begin() + static_cast<std::ptrdiff_t>(std::min(g.size(), i + static_cast<size_t>(gpus))));
    }
  }
  return out;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

int Fail(const std::string& m, int code) {
  std::fprintf(stderr, "prism-run fill: %s\n", m.c_str());
  return code;
}

int RunFill(const FillOptions& o, const std::vector<std::string>& command) {
  std::error_code ec;
  fs::path from = !o.from.empty() ? fs::path(o.from) : fs::path(o.graph).parent_path();
  if (o.from.empty() && o.graph.empty()) return Fail("give --graph COLLECT_DIR/observed.prism or --from COLLECT_DIR", kExitBadInput);
  from = fs::absolute(from, ec);
  std::vector<int> have = launcher::EventFileRanks(from.string());
  if (have.empty()) return Fail(from.string() + " holds no rank<R>.events.jsonl: give the directory of a collect run", kExitBadInput);
  std::string error;
  auto world = WorldFromReport(from, &error);
  if (!world) return Fail(error, kExitBadInput);

  fs::path out = fs::absolute(o.out.empty() ? fs::current_path() / "prism-fill" : fs::path(o.out), ec);
  fs::path ev_dir = out / "events";
  fs::create_directories(ev_dir, ec);
  if (ec) return Fail("cannot create " + ev_dir.string() + ": " + ec.message(), kExitBadInput);
  for (int r : have) {
    fs::copy_file(from / prism::events::FileName(r), ev_dir / prism::events::FileName(r), fs::copy_options::overwrite_existing, ec);
  }
  fs::copy_file(from / std::string(report::kFileName), ev_dir / std::string(report::kFileName),
                fs::copy_options::overwrite_existing, ec);
  const bool recorded = fs::is_directory(from / "payloads", ec);

  // Why keep every iteration (no warm-up skipped): the coordinator maps a live rank's n-th operation on a
  // communicator to the n-th node of that communicator in the graph, so the graph must start where the job does.
  launcher::ObservedTraceOptions bo;
  bo.topology = o.topology;
  const fs::path current = out / "filled.prism";
  // Every slice of a class is a sample of its compute; the graph takes each compute node's median over the samples
  // (launcher/fill_samples.h: the last slice alone keeps its noise). The collect's bare timings are no sample (its
  // ranks shared the GPU and the host exchange).
  launcher::FillSamples samples;
  auto rebuild = [&](const std::vector<int>* ran, std::string* err) -> std::optional<launcher::ObservedTrace> {
    auto g = launcher::BuildObservedTrace(ev_dir.string(), *world, bo, err);
    if (!g) return std::nullopt;
    if (ran) {
      for (uint32_t c = 0; c < g->class_ranks.size(); ++c)
        if (std::find(ran->begin(), ran->end(), g->class_ranks[c]) != ran->end()) samples.Add(g->trace, c);
      samples.Apply(&g->trace);
    }
    if (!replay::WriteTrace(g->trace, current.string(), err)) return std::nullopt;
    return g;
  };
  auto g0 = rebuild(nullptr, &error);
  if (!g0) return Fail("the collect run's graph: " + error, kExitBadInput);
  fs::copy_file(current, out / "bare.prism", fs::copy_options::overwrite_existing, ec);
  // Why each rank once: an expert-parallel class that had no real rank in the collect repeats the nodes of the rank
  // of another ep coordinate (observed_trace.h, mirror_expert_classes); that rank's slice refreshes both classes.
  std::vector<int> reps;
  for (int r : g0->class_ranks)
    if (std::find(reps.begin(), reps.end(), r) == reps.end()) reps.push_back(r);
  const double bare = SimulateIteration(current.string(), (out / "sim-bare").string(), o.topology, &error);
  if (bare < 0) return Fail(error, 1);
  std::printf("prism fill: %zu classes (ranks", g0->class_ranks.size());
  for (int r : reps) std::printf(" %d", r);
  std::printf("), bare graph from %s: simulated iteration %.3f ms\n", from.string().c_str(), bare * 1e3);
  if (!g0->mirrored_classes.empty())
    std::printf("prism fill: %zu expert-parallel class(es) repeat the nodes of a rank of another ep coordinate (the "
                "collect ran without --real-routing: EP symmetry assumed); that rank's slice times them too\n",
                g0->mirrored_classes.size());
  const std::vector<std::vector<int>> slices = Slices(reps, *world, o.gpus);
  if (o.gpus > 1) {
    std::printf("prism fill: %d GPUs: %zu slice(s) per round:", o.gpus, slices.size());
    for (const auto& sl : slices) std::printf(" [%s]", RankList(sl).c_str());
    std::printf("\n");
  }
  std::fflush(stdout);

  json rounds = json::array();
  double prev = bare, first_round = -1, last = bare;
  bool converged = false;
  int round = 1;
  for (; round <= o.max_rounds; ++round) {
    for (const std::vector<int>& sl : slices) {
      const std::string list = RankList(sl);
      EmulateOptions e;
      e.ranks = list;
      e.graph = current.string();
      e.topology = o.topology;
      e.gpus = o.gpus;
      e.quiet = o.quiet;
      e.hang_timeout = o.hang_timeout;
      e.payload_max_bytes = o.payload_max_bytes;
      if (o.lockstep != "none") e.lockstep_slots = o.lockstep;  // split where it is used (coordinator_link.cc)
      if (recorded) {
        e.payload = "recorded";
        e.payload_dir = from.string();
      }
      const std::string what = (sl.size() == 1 ? "rank " : "ranks ") + list;
      std::string tag = list;
      std::replace(tag.begin(), tag.end(), ',', '_');
      fs::path slice = out / ("round" + std::to_string(round)) / ("rank" + tag);
      e.out = slice.string();
      std::printf("prism fill: round %d, slice %s (others replay %s)\n", round, what.c_str(), current.filename().c_str());
      std::fflush(stdout);
      int rc = RunEmulate(e, command);
      if (rc != 0) return Fail("the slice of " + what + " failed (exit " + std::to_string(rc) + "); its output: " +
                               slice.string(), rc);
      for (int r : sl) {
        fs::copy_file(slice / prism::events::FileName(r), ev_dir / prism::events::FileName(r),
                      fs::copy_options::overwrite_existing, ec);
        if (ec) return Fail("rank " + std::to_string(r) + " wrote no event file in " + slice.string(), 1);
      }
      if (!rebuild(&sl, &error)) return Fail("after the slice of " + what + ": " + error, 1);
    }
    last = SimulateIteration(current.string(), (out / ("sim-round" + std::to_string(round))).string(), o.topology, &error);
    if (last < 0) return Fail(error, 1);
    if (first_round < 0) first_round = last;
    const double moved = prev > 0 ? 100.0 * std::fabs(last - prev) / prev : 100.0;
    rounds.push_back({{"round", round}, {"iteration_time_s", last}, {"moved_pct", moved}});
    std::printf("prism fill: round %d: simulated iteration %.3f ms (moved %.2f%%)\n", round, last * 1e3, moved);
    std::fflush(stdout);
    if (round > 1 && moved <= o.tolerance_pct) {
      converged = true;
      break;
    }
    prev = last;
  }
  json summary = {{"from", from.string()},
                  {"graph", current.string()},
                  {"classes", g0->class_ranks},
                  {"bare_iteration_time_s", bare},
                  {"uncalibrated_iteration_time_s", first_round},
                  {"calibrated_iteration_time_s", last},
                  {"tolerance_pct", o.tolerance_pct},
                  {"converged", converged},
                  {"rounds", rounds}};
  std::ofstream(out / "fill.json") << summary.dump(2) << "\n";
  std::printf("prism fill: estimate bare %.3f ms, after one pass (uncalibrated) %.3f ms, calibrated %.3f ms%s\n"
              "prism fill: wrote %s (use: prism-run --graph %s --ranks R torchrun ...)\n",
              bare * 1e3, first_round * 1e3, last * 1e3,
              converged ? "" : " (not converged within --rounds)", current.string().c_str(), current.string().c_str());
  return kExitOk;
}

}  // namespace

void AddFill(CLI::App& app, int* rc) {
  static FillOptions o;
  auto* sub = app.add_subcommand("fill", "time the graph of a collect run by running each class alone against the "
                                         "others replayed from the graph; calibrate across slices");
  sub->prefix_command();
  sub->add_option("--graph", o.graph, "a collect run's observed.prism (its directory holds the event files)");
  sub->add_option("--from", o.from, "the collect run's directory (instead of --graph)");
  sub->add_option("--out", o.out, "output directory (default ./prism-fill)");
  sub->add_option("--topology", o.topology, "target cluster for the modelled communication");
  sub->add_option("--tolerance", o.tolerance_pct, "stop when a round moves the estimate by at most this many percent")
      ->capture_default_str();
  sub->add_option("--rounds", o.max_rounds, "at most this many rounds")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--gpus", o.gpus,
                  "GPUs of this host: with G > 1 a slice is a tensor-parallel group (up to G ranks, each on its own "
                  "GPU, their communicator on the real NCCL); one slice runs at a time")
      ->check(CLI::PositiveNumber);
  sub->add_option("--hang-timeout", o.hang_timeout, "per slice, as for emulate")->capture_default_str();
  sub->add_option("--payload-max-bytes", o.payload_max_bytes, "per slice, as for emulate (default 4M)");
  sub->add_option("--lockstep", o.lockstep,
                  "communicator slots (comma-separated, or none) whose virtual members do not hold a slice's real "
                  "rank: its collectives there complete at its own arrival plus the duration (tensor-parallel peers "
                  "run in lockstep; docs/fill.md)")
      ->capture_default_str();
  sub->callback([sub, rc] {
    std::vector<std::string> command = sub->remaining();
    if (command.empty()) {
      std::fprintf(stderr, "prism-run fill: give the job's command: prism-run fill --graph G torchrun ...\n");
      *rc = kExitBadInput;
      return;
    }
    *rc = RunFill(o, command);
  });
}

}  // namespace prism::cli
