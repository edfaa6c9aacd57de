#include "launcher/fill.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/text.h"
#include "launcher/emulate.h"
#include "analysis/fill_samples.h"
#include "analysis/observed_trace.h"
#include "prism/events.h"
#include "prism/report.h"
#include "replay/simulate.h"
#include "replay/trace_io.h"

namespace prism::launcher {
using namespace ::prism::analysis;  // the post-run analysis (src/analysis) this file calls
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

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
  if (!rep.is_object() || !rep.contains(std::string(report::kIterationTime)) ||
      !rep[std::string(report::kIterationTime)].is_number()) {
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

// Same operations in the same order on the same slots: class b can take class a's compute durations.
bool SameShape(const trace::RoleClass& a, const trace::RoleClass& b) {
  if (a.streams.size() != b.streams.size()) return false;
  for (size_t s = 0; s < a.streams.size(); ++s) {
    const auto& x = a.streams[s].nodes;
    const auto& y = b.streams[s].nodes;
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      const trace::Node &m = x[i], &n = y[i];
      if (m.id != n.id || m.kind != n.kind || m.op != n.op || m.peer != n.peer || m.root != n.root ||
          m.bytes != n.bytes || m.dtype != n.dtype || m.iter != n.iter || m.after != n.after)
        return false;
      if ((m.comm_slot == trace::kNoIndex) != (n.comm_slot == trace::kNoIndex)) return false;
      if (m.comm_slot != trace::kNoIndex &&
          (m.comm_slot >= a.comm_slots.size() || n.comm_slot >= b.comm_slots.size() ||
           a.comm_slots[m.comm_slot] != b.comm_slots[n.comm_slot]))
        return false;
    }
  }
  return true;
}

}  // namespace

static void PrintSliceCompute(const std::string& prefix, const ObservedTrace& g0, const FillSamples& samples,
                       const std::vector<int>& slice) {
  for (int r : slice) {
    const auto it = std::find(g0.class_ranks.begin(), g0.class_ranks.end(), r);
    if (it == g0.class_ranks.end()) continue;
    const std::vector<double> v = samples.PerIterationS(static_cast<uint32_t>(it - g0.class_ranks.begin()));
    if (v.empty()) continue;
    std::string all;
    for (double x : v) {
      char b[32];
      std::snprintf(b, sizeof b, "%s%.1f", all.empty() ? "" : ", ", 1e3 * x);
      all += b;
    }
    std::printf("%srank %d: compute %.1f ms per iteration in this slice (its class's slices so far: %s ms)\n",
                prefix.c_str(), r, 1e3 * v.back(), all.c_str());
  }
}

size_t ClearUnsampledSetUp(trace::Trace* t, const analysis::FillSamples& samples) {
  bool has_zero = false, has_later = false;
  for (const auto& cls : t->classes)
    for (const auto& st : cls.streams)
      for (const auto& n : st.nodes) (n.iter == 0 ? has_zero : has_later) = true;
  if (!has_zero || !has_later) return 0;  // no iteration marks: no set-up to tell apart
  size_t cleared = 0;
  for (uint32_t c = 0; c < t->classes.size(); ++c) {
    if (samples.Count(c) > 0) continue;
    bool any = false;
    for (auto& st : t->classes[c].streams)
      for (auto& n : st.nodes)
        if (n.kind == trace::NodeKind::kCompute && n.iter == 0 && n.dur_us > 0) {
          n.dur_us = 0;
          any = true;
        }
    cleared += any ? 1 : 0;
  }
  return cleared;
}

std::string LockstepSlots(const std::string& spec, const trace::Trace& t) {
  if (spec == "none") return "";
  if (spec != "auto") return spec;
  std::vector<std::string> out;
  for (const auto& cls : t.classes)
    for (const std::string& name : cls.comm_slots) {
      const std::string base = name.substr(0, name.find('#'));
      // Its '-'-separated dimensions ("tp-dp-cp") are all tp, cp or dp.
      std::istringstream dims(base);
      std::string dim;
      bool stage_local = !base.empty();
      while (stage_local && std::getline(dims, dim, '-')) stage_local = dim == "tp" || dim == "cp" || dim == "dp";
      if (stage_local && base.back() == '-') stage_local = false;
      if (stage_local && std::find(out.begin(), out.end(), base) == out.end()) out.push_back(base);
    }
  std::string joined;
  for (const std::string& s : out) joined += (joined.empty() ? "" : ",") + s;
  return joined;
}

namespace {

FillResult Fail(const FillOptions& o, FillResult r, const std::string& m, int code) {
  std::fprintf(stderr, "%s%s\n", o.prefix.c_str(), m.c_str());
  r.exit_code = code;
  return r;
}

// The emulation one slice runs: its ranks real, every other rank replayed from `graph`, the collect's recorded
// payloads when `payload_dir` is given.
EmulateOptions SliceOptions(const FillOptions& o, const std::string& ranks, const std::string& graph,
                            const std::string& payload_dir, const std::string& lockstep) {
  EmulateOptions e;
  e.ranks = ranks;
  e.graph = graph;
  e.topology = o.topology;
  e.gpus = o.gpus;
  e.quiet = o.quiet;
  e.no_preload = o.no_preload;
  e.iterations = o.iterations;
  e.hang_timeout = o.hang_timeout;
  e.payload_max_bytes = o.payload_max_bytes;
  e.print_report = false;
  e.label = "fill slice:";
  e.report_extra = {{"policy", "graph"}, {"mode_detail", "fill slice"}};
  e.lockstep_slots = lockstep;  // split where it is used (coordinator_link.cc)
  if (!payload_dir.empty()) {
    e.payload = "recorded";
    e.payload_dir = payload_dir;
  }
  return e;
}

// Symmetric tensor-parallel positions (docs/fill.md): a class whose rank differs from an earlier class's only in its
// tensor-parallel position, and whose graph has the same operations in the same order, takes that class's measured
// compute instead of a slice of its own. Returns target class -> source class and leaves in *reps the ranks that
// still run a slice.
std::map<uint32_t, uint32_t> SymmetricShares(const ObservedTrace& g0, const world::World& w, const std::string& prefix,
                                             std::vector<int>* reps) {
  std::map<uint32_t, uint32_t> out;
  std::vector<int> kept;
  std::vector<std::string> said;
  for (int r : *reps) {
    const world::Coords c = w.CoordsOf(r);
    const auto rc = std::find(g0.class_ranks.begin(), g0.class_ranks.end(), r) - g0.class_ranks.begin();
    bool taken = false;
    for (int k : kept) {
      const world::Coords kc = w.CoordsOf(k);
      if (kc.tp == c.tp || kc.cp != c.cp || kc.dp != c.dp || kc.pp != c.pp || kc.ep != c.ep || kc.edp != c.edp)
        continue;
      const auto kcl = std::find(g0.class_ranks.begin(), g0.class_ranks.end(), k) - g0.class_ranks.begin();
      if (!SameShape(g0.trace.classes[static_cast<size_t>(kcl)], g0.trace.classes[static_cast<size_t>(rc)]))
        continue;
      out[static_cast<uint32_t>(rc)] = static_cast<uint32_t>(kcl);
      said.push_back(std::to_string(r) + " <- " + std::to_string(k));
      taken = true;
      break;
    }
    if (!taken) kept.push_back(r);
  }
  if (!said.empty()) {
    std::string list;
    for (const auto& s : said) list += (list.empty() ? "" : ", ") + s;
    std::printf("%s%zu symmetric tensor-parallel position(s) take the compute measured by their group's slice "
                "(same operations in the same order): %s\n", prefix.c_str(), said.size(), list.c_str());
  }
  *reps = kept;
  return out;
}

}  // namespace

std::vector<std::vector<int>> FillSlices(const std::vector<int>& reps, const world::World& w, int gpus) {
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

FillResult RunFill(const FillOptions& o, const std::vector<std::string>& command) {
  using Clk = std::chrono::steady_clock;
  const auto t0 = Clk::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clk::now() - t0).count(); };
  FillResult res;
  std::error_code ec;
  if (o.from.empty()) return Fail(o, res, "give --graph COLLECT_DIR/observed.prism or --from COLLECT_DIR", kExitBadInput);
  const fs::path from = fs::absolute(o.from, ec);
  std::vector<int> have = EventFileRanks(from.string());
  if (have.empty())
    return Fail(o, res, from.string() + " holds no rank<R>.events.jsonl: give the directory of a collect run",
                kExitBadInput);
  std::string error;
  auto world = WorldFromReport(from, &error);
  if (!world) return Fail(o, res, error, kExitBadInput);

  fs::path out = fs::absolute(o.out.empty() ? fs::current_path() / "prism-fill" : fs::path(o.out), ec);
  fs::path ev_dir = out / "events";
  fs::create_directories(ev_dir, ec);
  if (ec) return Fail(o, res, "cannot create " + ev_dir.string() + ": " + ec.message(), kExitBadInput);
  for (int r : have) {
    fs::copy_file(from / prism::events::FileName(r), ev_dir / prism::events::FileName(r),
                  fs::copy_options::overwrite_existing, ec);
  }
  fs::copy_file(from / std::string(report::kFileName), ev_dir / std::string(report::kFileName),
                fs::copy_options::overwrite_existing, ec);
  const bool recorded = fs::is_directory(from / "payloads", ec);

  // Why keep every iteration (no warm-up skipped): the coordinator maps a live rank's n-th operation on a
  // communicator to the n-th node of that communicator in the graph, so the graph must start where the job does.
  ObservedTraceOptions bo;
  bo.topology = o.topology;
  const fs::path current = out / "filled.prism";
  res.graph = current.string();
  res.summary = (out / "fill.json").string();
  // Every slice of a class is a sample of its compute; the graph takes each compute node's median over the samples
  // (fill_samples.h: the last slice alone keeps its noise). The collect's bare timings are no sample (its ranks
  // shared the GPU and the host exchange).
  FillSamples samples;
  size_t set_up_cleared = 0;  // classes whose set-up compute the slices' graph leaves out (ClearUnsampledSetUp)
  // Classes timed by another class's slice: target class -> source class (symmetric tensor-parallel positions).
  std::map<uint32_t, uint32_t> shared;
  auto rebuild = [&](const std::vector<int>* ran, std::string* err) -> std::optional<ObservedTrace> {
    auto g = BuildObservedTrace(ev_dir.string(), *world, bo, err);
    if (!g) return std::nullopt;
    if (ran) {
      for (uint32_t c = 0; c < g->class_ranks.size(); ++c)
        if (std::find(ran->begin(), ran->end(), g->class_ranks[c]) != ran->end()) samples.Add(g->trace, c);
      for (const auto& [dst, src] : shared)
        if (std::find(ran->begin(), ran->end(), g->class_ranks[src]) != ran->end() &&
            SameShape(g->trace.classes[src], g->trace.classes[dst]))
          samples.AddFrom(g->trace, src, dst);
      samples.Apply(&g->trace);
    }
    if (ran) set_up_cleared = ClearUnsampledSetUp(&g->trace, samples);
    if (!replay::WriteTrace(g->trace, current.string(), err)) return std::nullopt;
    return g;
  };
  auto g0 = rebuild(nullptr, &error);
  if (!g0) return Fail(o, res, "the collect run's graph: " + error, kExitBadInput);
  fs::copy_file(current, out / "bare.prism", fs::copy_options::overwrite_existing, ec);
  res.classes = static_cast<int>(g0->class_ranks.size());
  const std::string lockstep = LockstepSlots(o.lockstep, g0->trace);
  res.lockstep = lockstep;
  const double bare = SimulateIteration(current.string(), (out / "sim-bare").string(), o.topology, &error);
  if (bare < 0) return Fail(o, res, error, 1);
  res.bare_s = bare;
  // The slices' graph from here on: the collect's set-up left out (ClearUnsampledSetUp); bare.prism keeps it.
  {
    trace::Trace slices_graph = g0->trace;
    set_up_cleared = ClearUnsampledSetUp(&slices_graph, samples);
    if (set_up_cleared > 0 && !replay::WriteTrace(slices_graph, current.string(), &error))
      return Fail(o, res, error, 1);
  }
  // Why each rank once: an expert-parallel class that had no real rank in the collect repeats the nodes of the rank
  // of another ep coordinate (observed_trace.h, mirror_expert_classes); that rank's slice refreshes both classes.
  std::vector<int> reps;
  for (int r : g0->class_ranks)
    if (std::find(reps.begin(), reps.end(), r) == reps.end()) reps.push_back(r);
  std::printf("%s%zu classes (ranks", o.prefix.c_str(), g0->class_ranks.size());
  for (int r : reps) std::printf(" %d", r);
  std::printf("), bare graph from %s: simulated iteration %.3f ms\n", from.string().c_str(), bare * 1e3);
  std::printf("%slockstep slots: %s\n", o.prefix.c_str(),
              lockstep.empty() ? "none (every virtual member holds the real rank as the graph says)"
                               : (lockstep + " (their virtual members do not hold a slice's real rank)").c_str());
  if (set_up_cleared > 0)
    std::printf("%sthe collect's set-up (iteration 0) compute is left out of the slices' graph for the %zu class(es) "
                "without a slice yet: their ranks started side by side on one GPU, so replaying it would hold each "
                "slice's rank at start-up (docs/fill.md \"Where a slice's start-up goes\")\n",
                o.prefix.c_str(), set_up_cleared);
  if (!g0->mirrored_classes.empty())
    std::printf("%s%zu expert-parallel class(es) repeat the nodes of a rank of another ep coordinate (the collect ran "
                "without --real-routing: EP symmetry assumed); that rank's slice times them too\n",
                o.prefix.c_str(), g0->mirrored_classes.size());
  if (o.share_symmetric_tp && o.gpus <= 1) shared = SymmetricShares(*g0, *world, o.prefix, &reps);
  res.shared_classes = static_cast<int>(shared.size());
  const std::vector<std::vector<int>> slices = FillSlices(reps, *world, o.gpus);
  if (o.gpus > 1) {
    std::printf("%s%d GPUs: %zu slice(s) per round:", o.prefix.c_str(), o.gpus, slices.size());
    for (const auto& sl : slices) std::printf(" [%s]", JoinRanks(sl).c_str());
    std::printf("\n");
  }
  std::fflush(stdout);

  json rounds = json::array();
  json progress = json::array();  // the slices that ended well: {round, slice}, in order (resume)
  double prev = bare, first_round = -1, last = bare, slice_time = 0;
  size_t ran_here = 0;  // slices this process ran (the estimate of what is left)
  double earlier_wall = 0;  // a resumed fill's time before this process
  auto slice_dir = [&](int round, const std::vector<int>& sl) {
    std::string tag = JoinRanks(sl);
    std::replace(tag.begin(), tag.end(), ',', '_');
    return out / ("round" + std::to_string(round)) / ("rank" + tag);
  };
  auto write_summary = [&](bool complete) {
    res.wall_s = earlier_wall + elapsed();
    json summary = {{"from", from.string()},
                    {"graph", current.string()},
                    {"classes", g0->class_ranks},
                    {"slices_per_round", slices.size()},
                    {"shared_classes", shared.size()},
                    {"bare_iteration_time_s", bare},
                    {"uncalibrated_iteration_time_s", first_round},
                    {"calibrated_iteration_time_s", last},
                    {"lockstep", lockstep},
                    {"tolerance_pct", o.tolerance_pct},
                    {"max_rounds", o.max_rounds},
                    {"converged", res.converged},
                    {"last_moved_pct", res.last_moved_pct},
                    {"complete", complete},
                    {"wall_s", res.wall_s},
                    {"rounds", rounds},
                    {"progress", progress}};
    // Each class's compute per iteration in each of its slices, oldest first (FillSamples::PerIterationS): how much
    // the machine moved it between runs, the noise the tolerance is set against.
    json per_class = json::object();
    for (uint32_t c = 0; c < samples.Classes() && c < g0->class_ranks.size(); ++c)
      if (samples.Count(c) > 0) per_class[std::to_string(g0->class_ranks[c])] = samples.PerIterationS(c);
    summary["compute_per_iteration_s"] = per_class;
    std::string e;
    if (!WriteFileAtomic(res.summary, summary.dump(2) + "\n", &e)) std::fprintf(stderr, "%s%s\n", o.prefix.c_str(), e.c_str());
  };
  int round = 1;
  size_t first_slice = 0;
  if (o.resume) {
    // An earlier fill of the same collect stopped part way (fill.json "complete": false): its slices' event files
    // are samples as good as new ones. Replay them in order, then go on after the last.
    const json old = LoadJson(out / "fill.json");
    const bool same = old.is_object() && !old.value("complete", true) && old.contains("progress") &&
                      old["progress"].is_array() && old.value("slices_per_round", size_t{0}) == slices.size() &&
                      old.contains("classes") && old["classes"] == json(g0->class_ranks);
    if (same) {
      earlier_wall = old.value("wall_s", 0.0);
      for (const json& p : old["progress"]) {
        const int r = p.value("round", 0);
        const size_t si = p.value("slice", size_t{0});
        if (r < 1 || si >= slices.size()) break;
        const fs::path dir = slice_dir(r, slices[si]);
        bool ok = true;
        for (int rank : slices[si]) {
          fs::copy_file(dir / prism::events::FileName(rank), ev_dir / prism::events::FileName(rank),
                        fs::copy_options::overwrite_existing, ec);
          ok = ok && !ec;
        }
        if (!ok || !rebuild(&slices[si], &error)) break;
        progress.push_back(p);
        round = r;
        first_slice = si + 1;
        ++res.slices_run;
      }
      if (old.contains("rounds") && old["rounds"].is_array())
        for (const json& rr : old["rounds"]) {
          if (!rr.is_object() || rr.value("round", 0) > round) break;
          rounds.push_back(rr);
          last = rr.value("iteration_time_s", last);
          if (first_round < 0) first_round = last;
          res.rounds = rr.value("round", 0);
          res.last_moved_pct = rr.value("moved_pct", -1.0);
        }
      // A round whose slices all ran and whose estimate was taken: the next one starts fresh.
      if (first_slice >= slices.size() && res.rounds == round) {
        ++round;
        first_slice = 0;
      }
      prev = bare;  // the estimate the round being continued is compared with: the round before it
      for (const json& rr : rounds)
        if (rr.value("round", 0) == round - 1) prev = rr.value("iteration_time_s", bare);
      if (!progress.empty())
        std::printf("%sresuming: %zu slice(s) of the earlier fill reused, from round %d slice %zu\n", o.prefix.c_str(),
                    progress.size(), round, first_slice + 1);
    }
  }
  for (; round <= o.max_rounds; ++round) {
    for (size_t si = first_slice; si < slices.size(); ++si) {
      const std::vector<int>& sl = slices[si];
      const std::string list = JoinRanks(sl);
      EmulateOptions e = SliceOptions(o, list, current.string(), recorded ? from.string() : std::string(), lockstep);
      const std::string what = (sl.size() == 1 ? "rank " : "ranks ") + list;
      const fs::path slice = slice_dir(round, sl);
      e.out = slice.string();
      // What is left: this round's remaining slices, and one more round while none could have converged.
      const bool another = round < 2 && o.max_rounds >= 2;  // no round can converge before the second
      const size_t left = slices.size() - si + (another ? slices.size() : 0);
      std::string eta = ran_here == 0 ? "" : ", about " + MinutesSeconds(slice_time / static_cast<double>(ran_here) *
                                                                static_cast<double>(left)) + " left";
      std::printf("%sround %d, slice %s (%zu of %zu; others replay %s); elapsed %s%s%s\n", o.prefix.c_str(), round,
                  what.c_str(), si + 1, slices.size(), current.filename().c_str(), MinutesSeconds(elapsed()).c_str(),
                  eta.c_str(), another && ran_here > 0 ? " (at least 2 rounds)" : "");
      std::fflush(stdout);
      const auto s0 = Clk::now();
      int rc = Emulate(e, command);
      slice_time += std::chrono::duration<double>(Clk::now() - s0).count();
      ++ran_here;
      ++res.slices_run;
      if (rc != 0) {
        write_summary(false);
        return Fail(o, res,
                    (rc == kExitInterrupted ? "interrupted in the slice of " : "the slice of ") + what +
                        (rc == kExitInterrupted ? "" : " failed (exit " + std::to_string(rc) + ")") +
                        "; its output: " + slice.string(),
                    rc);
      }
      for (int r : sl) {
        fs::copy_file(slice / prism::events::FileName(r), ev_dir / prism::events::FileName(r),
                      fs::copy_options::overwrite_existing, ec);
        if (ec) return Fail(o, res, "rank " + std::to_string(r) + " wrote no event file in " + slice.string(), 1);
      }
      if (!rebuild(&sl, &error)) return Fail(o, res, "after the slice of " + what + ": " + error, 1);
      PrintSliceCompute(o.prefix, *g0, samples, sl);
      progress.push_back({{"round", round}, {"slice", si}});
      write_summary(false);
    }
    first_slice = 0;
    last = SimulateIteration(current.string(), (out / ("sim-round" + std::to_string(round))).string(), o.topology,
                             &error);
    if (last < 0) return Fail(o, res, error, 1);
    if (first_round < 0) first_round = last;
    const double moved = prev > 0 ? 100.0 * std::fabs(last - prev) / prev : 100.0;
    res.rounds = round;
    res.last_moved_pct = moved;
    // The largest spread of a class's compute over its slices so far: noise the rounds' medians must outlast.
    double spread = 0;
    int spread_rank = -1;
    for (uint32_t c = 0; c < samples.Classes() && c < g0->class_ranks.size(); ++c)
      if (samples.SpreadPct(c) > spread) {
        spread = samples.SpreadPct(c);
        spread_rank = g0->class_ranks[c];
      }
    res.spread_pct = spread;
    res.spread_rank = spread_rank;
    rounds.push_back({{"round", round}, {"iteration_time_s", last}, {"moved_pct", moved}, {"elapsed_s", elapsed()},
                      {"compute_spread_pct", spread}, {"compute_spread_rank", spread_rank}});
    std::printf("%sround %d: simulated iteration %.3f ms (moved %.2f%%%s); elapsed %s\n", o.prefix.c_str(), round,
                last * 1e3, moved, round == 1 ? " from the bare graph" : "", MinutesSeconds(elapsed()).c_str());
    std::fflush(stdout);
    if (round > 1 && moved <= o.tolerance_pct) {
      res.converged = true;
      break;
    }
    write_summary(false);
    prev = last;
  }
  res.uncalibrated_s = first_round;
  res.calibrated_s = last;
  write_summary(true);
  if (res.converged) {
    std::printf("%sconverged after %d round(s): the last moved the estimate %.2f%% (tolerance %.2f%%)\n",
                o.prefix.c_str(), res.rounds, res.last_moved_pct, o.tolerance_pct);
  } else {
    std::printf("%sNOT converged: %d round(s), the last moved the estimate %.2f%% (tolerance %.2f%%); the graph is "
                "the last round's\n", o.prefix.c_str(), res.rounds, res.last_moved_pct, o.tolerance_pct);
    if (res.spread_pct > o.tolerance_pct)
      std::printf("%sthe slices' own compute moved by up to %.1f%% between runs (rank %d's class): the machine's noise "
                  "is above the tolerance; more rounds (--fill-rounds) settle the medians, a larger --fill-tolerance "
                  "accepts it\n", o.prefix.c_str(), res.spread_pct, res.spread_rank);
  }
  std::printf("%sestimate bare %.3f ms, after one pass (uncalibrated) %.3f ms, calibrated %.3f ms%s\n"
              "%swrote %s\n",
              o.prefix.c_str(), bare * 1e3, first_round * 1e3, last * 1e3,
              res.converged ? "" : " (not converged within --rounds)", o.prefix.c_str(), current.string().c_str());
  return res;
}

}  // namespace prism::launcher
