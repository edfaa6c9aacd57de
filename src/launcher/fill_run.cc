// RunFill (launcher/fill.h): the procedure of a fill, as the sequence of its steps on a FillRun.
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
#include "launcher/fill.h"
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

namespace {

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


using Clk = std::chrono::steady_clock;

// RunFill's state and steps, in its order. A step that returns false has failed the fill: it printed the error and
// set the result's exit code (Fail), as RunFill's early returns did.
class FillRun {
 public:
  FillRun(const FillOptions& o, const std::vector<std::string>& command) : o_(o), command_(command) {}

  bool ReadCollect();
  bool PrepareEventDir();
  bool BuildBareGraph();
  bool SimulateBare();
  bool LeaveOutSetUp();
  void PickRanks();
  void PrintPlan();
  void PlanSlices();
  void Resume();
  bool RunRounds();
  void WriteFinalSummary();
  void PrintConclusion();
  FillResult TakeResult() { return std::move(res_); }

 private:
  double Elapsed() const { return std::chrono::duration<double>(Clk::now() - t0_).count(); }
  bool Fail(const std::string& m, int code);
  std::optional<ObservedTrace> Rebuild(const std::vector<int>* ran, std::string* err);
  fs::path SliceDir(int round, const std::vector<int>& sl) const;
  void WriteSummary(bool complete);
  void ReuseSlices(const json& old);
  void ReuseRounds(const json& old);
  bool RunSlice(size_t si);
  void PrintSliceStart(size_t si, const std::string& what);
  bool TakeSlice(size_t si, const std::string& what, const fs::path& slice);
  bool EstimateRound(double* moved_pct);
  void TakeSpread();

  const FillOptions& o_;
  const std::vector<std::string>& command_;
  const Clk::time_point t0_ = Clk::now();
  FillResult res_;
  std::string error_;
  fs::path from_;           // the collect run's directory
  std::vector<int> have_;   // the ranks whose event files it holds
  std::optional<world::World> world_;
  bool recorded_ = false;   // it recorded payloads (from_/payloads): the slices replay them
  fs::path out_, ev_dir_;   // OUT and OUT/events, the event files the graph is built from
  fs::path current_;        // OUT/filled.prism
  ObservedTraceOptions bo_;
  // Every slice of a class is a sample of its compute; the graph takes each compute node's median over the samples
  // (fill_samples.h: the last slice alone keeps its noise). The collect's bare timings are no sample (its ranks
  // shared the GPU and the host exchange).
  FillSamples samples_;
  size_t set_up_cleared_ = 0;  // classes whose set-up compute the slices' graph leaves out (ClearUnsampledSetUp)
  // Classes timed by another class's slice: target class -> source class (symmetric tensor-parallel positions).
  std::map<uint32_t, uint32_t> shared_;
  std::optional<ObservedTrace> g0_;  // the collect's graph
  std::string lockstep_;
  double bare_ = 0;                // its simulated iteration (s)
  std::vector<int> reps_;          // the ranks that run a slice
  std::vector<std::vector<int>> slices_;
  json rounds_ = json::array();
  json progress_ = json::array();  // the slices that ended well: {round, slice}, in order (resume)
  double prev_ = 0;           // the estimate the current round is compared with
  double first_round_ = -1;   // round 1's estimate (uncalibrated)
  double last_ = 0;           // the latest estimate (calibrated)
  double slice_time_ = 0;     // the time of the slices this process ran
  size_t ran_here_ = 0;       // slices this process ran (the estimate of what is left)
  double earlier_wall_ = 0;   // a resumed fill's time before this process
  int round_ = 1;             // the round being run
  size_t first_slice_ = 0;    // the slice it starts at (after a resumed fill's last)
};

bool FillRun::Fail(const std::string& m, int code) {
  std::fprintf(stderr, "%s%s\n", o_.prefix.c_str(), m.c_str());
  res_.exit_code = code;
  return false;
}

// The graph of OUT/events, written to OUT/filled.prism. After a slice (`ran`: its ranks), its classes' compute is
// a sample, and each compute node the median of its class's samples so far.
std::optional<ObservedTrace> FillRun::Rebuild(const std::vector<int>* ran, std::string* err) {
  auto g = BuildObservedTrace(ev_dir_.string(), *world_, bo_, err);
  if (!g) return std::nullopt;
  if (ran) {
    for (uint32_t c = 0; c < g->class_ranks.size(); ++c)
      if (std::find(ran->begin(), ran->end(), g->class_ranks[c]) != ran->end()) samples_.Add(g->trace, c);
    for (const auto& [dst, src] : shared_)
      if (std::find(ran->begin(), ran->end(), g->class_ranks[src]) != ran->end() &&
          SameShape(g->trace.classes[src], g->trace.classes[dst]))
        samples_.AddFrom(g->trace, src, dst);
    samples_.Apply(&g->trace);
  }
  if (ran) set_up_cleared_ = ClearUnsampledSetUp(&g->trace, samples_);
  if (!replay::WriteTrace(g->trace, current_.string(), err)) return std::nullopt;
  return g;
}

fs::path FillRun::SliceDir(int round, const std::vector<int>& sl) const {
  std::string tag = JoinRanks(sl);
  std::replace(tag.begin(), tag.end(), ',', '_');
  return out_ / ("round" + std::to_string(round)) / ("rank" + tag);
}

// The collect run's event files, and its world from its report.
bool FillRun::ReadCollect() {
  std::error_code ec;
  if (o_.from.empty()) return Fail("give --graph COLLECT_DIR/observed.prism or --from COLLECT_DIR", kExitBadInput);
  from_ = fs::absolute(o_.from, ec);
  have_ = EventFileRanks(from_.string());
  if (have_.empty())
    return Fail(from_.string() + " holds no rank<R>.events.jsonl: give the directory of a collect run",
                kExitBadInput);
  world_ = WorldFromReport(from_, &error_);
  if (!world_) return Fail(error_, kExitBadInput);
  return true;
}

// OUT/events: the collect's event files and report, whose files each slice's then replace.
bool FillRun::PrepareEventDir() {
  std::error_code ec;
  out_ = fs::absolute(o_.out.empty() ? fs::current_path() / "prism-fill" : fs::path(o_.out), ec);
  ev_dir_ = out_ / "events";
  fs::create_directories(ev_dir_, ec);
  if (ec) return Fail("cannot create " + ev_dir_.string() + ": " + ec.message(), kExitBadInput);
  for (int r : have_) {
    fs::copy_file(from_ / prism::events::FileName(r), ev_dir_ / prism::events::FileName(r),
                  fs::copy_options::overwrite_existing, ec);
  }
  fs::copy_file(from_ / std::string(report::kFileName), ev_dir_ / std::string(report::kFileName),
                fs::copy_options::overwrite_existing, ec);
  recorded_ = fs::is_directory(from_ / "payloads", ec);
  return true;
}

// The collect's graph (OUT/filled.prism, kept as OUT/bare.prism), its classes and the lockstep slots.
bool FillRun::BuildBareGraph() {
  // Why keep every iteration (no warm-up skipped): the coordinator maps a live rank's n-th operation on a
  // communicator to the n-th node of that communicator in the graph, so the graph must start where the job does.
  bo_.topology = o_.topology;
  current_ = out_ / "filled.prism";
  res_.graph = current_.string();
  res_.summary = (out_ / "fill.json").string();
  g0_ = Rebuild(nullptr, &error_);
  if (!g0_) return Fail("the collect run's graph: " + error_, kExitBadInput);
  std::error_code ec;
  fs::copy_file(current_, out_ / "bare.prism", fs::copy_options::overwrite_existing, ec);
  res_.classes = static_cast<int>(g0_->class_ranks.size());
  lockstep_ = LockstepSlots(o_.lockstep, g0_->trace);
  res_.lockstep = lockstep_;
  return true;
}

// The bare graph's simulated iteration: the estimate the first round is compared with.
bool FillRun::SimulateBare() {
  bare_ = SimulateIteration(current_.string(), (out_ / "sim-bare").string(), o_.topology, &error_);
  if (bare_ < 0) return Fail(error_, 1);
  res_.bare_s = bare_;
  prev_ = bare_;
  last_ = bare_;
  return true;
}

// The slices' graph from here on: the collect's set-up left out (ClearUnsampledSetUp); bare.prism keeps it.
bool FillRun::LeaveOutSetUp() {
  trace::Trace slices_graph = g0_->trace;
  set_up_cleared_ = ClearUnsampledSetUp(&slices_graph, samples_);
  if (set_up_cleared_ > 0 && !replay::WriteTrace(slices_graph, current_.string(), &error_)) return Fail(error_, 1);
  return true;
}

// Why each rank once: an expert-parallel class that had no real rank in the collect repeats the nodes of the rank
// of another ep coordinate (observed_trace.h, mirror_expert_classes); that rank's slice refreshes both classes.
void FillRun::PickRanks() {
  for (int r : g0_->class_ranks)
    if (std::find(reps_.begin(), reps_.end(), r) == reps_.end()) reps_.push_back(r);
}

void FillRun::PrintPlan() {
  std::printf("%s%zu classes (ranks", o_.prefix.c_str(), g0_->class_ranks.size());
  for (int r : reps_) std::printf(" %d", r);
  std::printf("), bare graph from %s: simulated iteration %.3f ms\n", from_.string().c_str(), bare_ * 1e3);
  std::printf("%slockstep slots: %s\n", o_.prefix.c_str(),
              lockstep_.empty() ? "none (every virtual member holds the real rank as the graph says)"
                                : (lockstep_ + " (their virtual members do not hold a slice's real rank)").c_str());
  if (set_up_cleared_ > 0)
    std::printf("%sthe collect's set-up (iteration 0) compute is left out of the slices' graph for the %zu class(es) "
                "without a slice yet: their ranks started side by side on one GPU, so replaying it would hold each "
                "slice's rank at start-up (docs/fill.md \"Where a slice's start-up goes\")\n",
                o_.prefix.c_str(), set_up_cleared_);
  if (!g0_->mirrored_classes.empty())
    std::printf("%s%zu expert-parallel class(es) repeat the nodes of a rank of another ep coordinate (the collect ran "
                "without --real-routing: EP symmetry assumed); that rank's slice times them too\n",
                o_.prefix.c_str(), g0_->mirrored_classes.size());
}

// The symmetric positions that share a slice, and the slices of a round.
void FillRun::PlanSlices() {
  if (o_.share_symmetric_tp && o_.gpus <= 1) shared_ = SymmetricShares(*g0_, *world_, o_.prefix, &reps_);
  res_.shared_classes = static_cast<int>(shared_.size());
  slices_ = FillSlices(reps_, *world_, o_.gpus);
  if (o_.gpus > 1) {
    std::printf("%s%d GPUs: %zu slice(s) per round:", o_.prefix.c_str(), o_.gpus, slices_.size());
    for (const auto& sl : slices_) std::printf(" [%s]", JoinRanks(sl).c_str());
    std::printf("\n");
  }
  std::fflush(stdout);
}

void FillRun::WriteSummary(bool complete) {
  res_.wall_s = earlier_wall_ + Elapsed();
  json summary = {{"from", from_.string()},
                  {"graph", current_.string()},
                  {"classes", g0_->class_ranks},
                  {"slices_per_round", slices_.size()},
                  {"shared_classes", shared_.size()},
                  {"bare_iteration_time_s", bare_},
                  {"uncalibrated_iteration_time_s", first_round_},
                  {"calibrated_iteration_time_s", last_},
                  {"lockstep", lockstep_},
                  {"tolerance_pct", o_.tolerance_pct},
                  {"max_rounds", o_.max_rounds},
                  {"converged", res_.converged},
                  {"last_moved_pct", res_.last_moved_pct},
                  {"complete", complete},
                  {"wall_s", res_.wall_s},
                  {"rounds", rounds_},
                  {"progress", progress_}};
  // Each class's compute per iteration in each of its slices, oldest first (FillSamples::PerIterationS): how much
  // the machine moved it between runs, the noise the tolerance is set against.
  json per_class = json::object();
  for (uint32_t c = 0; c < samples_.Classes() && c < g0_->class_ranks.size(); ++c)
    if (samples_.Count(c) > 0) per_class[std::to_string(g0_->class_ranks[c])] = samples_.PerIterationS(c);
  summary["compute_per_iteration_s"] = per_class;
  std::string e;
  if (!WriteFileAtomic(res_.summary, summary.dump(2) + "\n", &e))
    std::fprintf(stderr, "%s%s\n", o_.prefix.c_str(), e.c_str());
}

// An earlier fill of the same collect stopped part way (fill.json "complete": false): its slices' event files
// are samples as good as new ones. Replay them in order, then go on after the last.
void FillRun::Resume() {
  if (!o_.resume) return;
  const json old = LoadJson(out_ / "fill.json");
  const bool same = old.is_object() && !old.value("complete", true) && old.contains("progress") &&
                    old["progress"].is_array() && old.value("slices_per_round", size_t{0}) == slices_.size() &&
                    old.contains("classes") && old["classes"] == json(g0_->class_ranks);
  if (!same) return;
  earlier_wall_ = old.value("wall_s", 0.0);
  ReuseSlices(old);
  ReuseRounds(old);
  // A round whose slices all ran and whose estimate was taken: the next one starts fresh.
  if (first_slice_ >= slices_.size() && res_.rounds == round_) {
    ++round_;
    first_slice_ = 0;
  }
  prev_ = bare_;  // the estimate the round being continued is compared with: the round before it
  for (const json& rr : rounds_)
    if (rr.value("round", 0) == round_ - 1) prev_ = rr.value("iteration_time_s", bare_);
  if (!progress_.empty())
    std::printf("%sresuming: %zu slice(s) of the earlier fill reused, from round %d slice %zu\n", o_.prefix.c_str(),
                progress_.size(), round_, first_slice_ + 1);
}

// The earlier fill's slices, in order, until one whose event files or graph fail.
void FillRun::ReuseSlices(const json& old) {
  std::error_code ec;
  for (const json& p : old["progress"]) {
    const int r = p.value("round", 0);
    const size_t si = p.value("slice", size_t{0});
    if (r < 1 || si >= slices_.size()) break;
    const fs::path dir = SliceDir(r, slices_[si]);
    bool ok = true;
    for (int rank : slices_[si]) {
      fs::copy_file(dir / prism::events::FileName(rank), ev_dir_ / prism::events::FileName(rank),
                    fs::copy_options::overwrite_existing, ec);
      ok = ok && !ec;
    }
    if (!ok || !Rebuild(&slices_[si], &error_)) break;
    progress_.push_back(p);
    round_ = r;
    first_slice_ = si + 1;
    ++res_.slices_run;
  }
}

// The earlier fill's rounds up to the one its last reused slice belongs to.
void FillRun::ReuseRounds(const json& old) {
  if (old.contains("rounds") && old["rounds"].is_array())
    for (const json& rr : old["rounds"]) {
      if (!rr.is_object() || rr.value("round", 0) > round_) break;
      rounds_.push_back(rr);
      last_ = rr.value("iteration_time_s", last_);
      if (first_round_ < 0) first_round_ = last_;
      res_.rounds = rr.value("round", 0);
      res_.last_moved_pct = rr.value("moved_pct", -1.0);
    }
}

// Round after round of every slice, until the estimate moves by at most the tolerance or the rounds are done.
bool FillRun::RunRounds() {
  for (; round_ <= o_.max_rounds; ++round_) {
    for (size_t si = first_slice_; si < slices_.size(); ++si)
      if (!RunSlice(si)) return false;
    first_slice_ = 0;
    double moved = 0;
    if (!EstimateRound(&moved)) return false;
    if (round_ > 1 && moved <= o_.tolerance_pct) {
      res_.converged = true;
      break;
    }
    WriteSummary(false);
    prev_ = last_;
  }
  return true;
}

// One slice: its ranks run for real, every other rank replays the graph so far.
bool FillRun::RunSlice(size_t si) {
  const std::vector<int>& sl = slices_[si];
  const std::string list = JoinRanks(sl);
  EmulateOptions e = SliceOptions(o_, list, current_.string(), recorded_ ? from_.string() : std::string(), lockstep_);
  const std::string what = (sl.size() == 1 ? "rank " : "ranks ") + list;
  const fs::path slice = SliceDir(round_, sl);
  e.out = slice.string();
  PrintSliceStart(si, what);
  const auto s0 = Clk::now();
  int rc = Emulate(e, command_);
  slice_time_ += std::chrono::duration<double>(Clk::now() - s0).count();
  ++ran_here_;
  ++res_.slices_run;
  if (rc != 0) {
    WriteSummary(false);
    return Fail((rc == kExitInterrupted ? "interrupted in the slice of " : "the slice of ") + what +
                    (rc == kExitInterrupted ? "" : " failed (exit " + std::to_string(rc) + ")") +
                    "; its output: " + slice.string(),
                rc);
  }
  return TakeSlice(si, what, slice);
}

void FillRun::PrintSliceStart(size_t si, const std::string& what) {
  // What is left: this round's remaining slices, and one more round while none could have converged.
  const bool another = round_ < 2 && o_.max_rounds >= 2;  // no round can converge before the second
  const size_t left = slices_.size() - si + (another ? slices_.size() : 0);
  std::string eta = ran_here_ == 0 ? "" : ", about " + MinutesSeconds(slice_time_ / static_cast<double>(ran_here_) *
                                                             static_cast<double>(left)) + " left";
  std::printf("%sround %d, slice %s (%zu of %zu; others replay %s); elapsed %s%s%s\n", o_.prefix.c_str(), round_,
              what.c_str(), si + 1, slices_.size(), current_.filename().c_str(), MinutesSeconds(Elapsed()).c_str(),
              eta.c_str(), another && ran_here_ > 0 ? " (at least 2 rounds)" : "");
  std::fflush(stdout);
}

// The slice's event files replace its ranks' in OUT/events, and the graph is rebuilt with them as samples.
bool FillRun::TakeSlice(size_t si, const std::string& what, const fs::path& slice) {
  const std::vector<int>& sl = slices_[si];
  std::error_code ec;
  for (int r : sl) {
    fs::copy_file(slice / prism::events::FileName(r), ev_dir_ / prism::events::FileName(r),
                  fs::copy_options::overwrite_existing, ec);
    if (ec) return Fail("rank " + std::to_string(r) + " wrote no event file in " + slice.string(), 1);
  }
  if (!Rebuild(&sl, &error_)) return Fail("after the slice of " + what + ": " + error_, 1);
  PrintSliceCompute(o_.prefix, *g0_, samples_, sl);
  progress_.push_back({{"round", round_}, {"slice", si}});
  WriteSummary(false);
  return true;
}

// The round's estimate: the graph's simulated iteration, and how far it moved from the round before (*moved_pct).
bool FillRun::EstimateRound(double* moved_pct) {
  last_ = SimulateIteration(current_.string(), (out_ / ("sim-round" + std::to_string(round_))).string(), o_.topology,
                            &error_);
  if (last_ < 0) return Fail(error_, 1);
  if (first_round_ < 0) first_round_ = last_;
  const double moved = prev_ > 0 ? 100.0 * std::fabs(last_ - prev_) / prev_ : 100.0;
  res_.rounds = round_;
  res_.last_moved_pct = moved;
  TakeSpread();
  rounds_.push_back({{"round", round_}, {"iteration_time_s", last_}, {"moved_pct", moved}, {"elapsed_s", Elapsed()},
                     {"compute_spread_pct", res_.spread_pct}, {"compute_spread_rank", res_.spread_rank}});
  std::printf("%sround %d: simulated iteration %.3f ms (moved %.2f%%%s); elapsed %s\n", o_.prefix.c_str(), round_,
              last_ * 1e3, moved, round_ == 1 ? " from the bare graph" : "", MinutesSeconds(Elapsed()).c_str());
  std::fflush(stdout);
  *moved_pct = moved;
  return true;
}

// The largest spread of a class's compute over its slices so far: noise the rounds' medians must outlast.
void FillRun::TakeSpread() {
  double spread = 0;
  int spread_rank = -1;
  for (uint32_t c = 0; c < samples_.Classes() && c < g0_->class_ranks.size(); ++c)
    if (samples_.SpreadPct(c) > spread) {
      spread = samples_.SpreadPct(c);
      spread_rank = g0_->class_ranks[c];
    }
  res_.spread_pct = spread;
  res_.spread_rank = spread_rank;
}

void FillRun::WriteFinalSummary() {
  res_.uncalibrated_s = first_round_;
  res_.calibrated_s = last_;
  WriteSummary(true);
}

void FillRun::PrintConclusion() {
  if (res_.converged) {
    std::printf("%sconverged after %d round(s): the last moved the estimate %.2f%% (tolerance %.2f%%)\n",
                o_.prefix.c_str(), res_.rounds, res_.last_moved_pct, o_.tolerance_pct);
  } else {
    std::printf("%sNOT converged: %d round(s), the last moved the estimate %.2f%% (tolerance %.2f%%); the graph is "
                "the last round's\n", o_.prefix.c_str(), res_.rounds, res_.last_moved_pct, o_.tolerance_pct);
    if (res_.spread_pct > o_.tolerance_pct)
      std::printf("%sthe slices' own compute moved by up to %.1f%% between runs (rank %d's class): the machine's noise "
                  "is above the tolerance; more rounds (--fill-rounds) settle the medians, a larger --fill-tolerance "
                  "accepts it\n", o_.prefix.c_str(), res_.spread_pct, res_.spread_rank);
  }
  std::printf("%sestimate bare %.3f ms, after one pass (uncalibrated) %.3f ms, calibrated %.3f ms%s\n"
              "%swrote %s\n",
              o_.prefix.c_str(), bare_ * 1e3, first_round_ * 1e3, last_ * 1e3,
              res_.converged ? "" : " (not converged within --rounds)", o_.prefix.c_str(), current_.string().c_str());
}

}  // namespace

FillResult RunFill(const FillOptions& o, const std::vector<std::string>& command) {
  FillRun run(o, command);
  if (!run.ReadCollect() || !run.PrepareEventDir() || !run.BuildBareGraph() || !run.SimulateBare() ||
      !run.LeaveOutSetUp())
    return run.TakeResult();
  run.PickRanks();
  run.PrintPlan();
  run.PlanSlices();
  run.Resume();
  if (run.RunRounds()) {
    run.WriteFinalSummary();
    run.PrintConclusion();
  }
  return run.TakeResult();
}

}  // namespace prism::launcher
