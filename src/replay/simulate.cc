#include "replay/simulate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>

#include "common/rank_list.h"
#include "common/text.h"
#include "prism/report.h"
#include "replay/trace_io.h"
#include "replay/trace_validate.h"

namespace prism::replay {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;
namespace fs = std::filesystem;

constexpr int kExitOk = 0, kExitFailure = 1, kExitBadInput = 2;

bool ParseDouble(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool ParseInt(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

std::string Ms(double s) {
  char buf[64];
  if (s >= 1.0) {
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  } else if (s >= 1e-3) {
    std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  }
  return buf;
}

const char* StatusName(SimResult::Status s) {
  switch (s) {
    case SimResult::Status::kOk: return "ok";
    case SimResult::Status::kDeadlock: return "deadlock";
    case SimResult::Status::kMismatch: return "mismatch";
    default: return "bad_graph";
  }
}

bool WriteJson(const fs::path& path, const ordered_json& j, int indent, std::string* error) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) {
    *error = path.string() + ": cannot open for writing";
    return false;
  }
  f << j.dump(indent) << '\n';
  if (!f.good()) {
    *error = path.string() + ": write failed";
    return false;
  }
  return true;
}

// Progress for long runs: a line on stderr at most once a second, after the first two seconds.
struct Progress {
  explicit Progress(std::ostream& e) : err(e) {}
  std::ostream& err;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last = start;
  std::string what = "baseline";
  void operator()(uint64_t done, uint64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (now - start < std::chrono::seconds(2) || now - last < std::chrono::seconds(1)) return;
    last = now;
    err << "prism-run simulate: " << what << ": " << (total ? 100 * done / total : 100) << "% (" << done << " of "
        << total << " events)" << std::endl;
  }
};

// {"Ring/LL": calls, ...}, in the order given.
template <typename LabelCounts>
ordered_json AlgorithmsJson(const LabelCounts& counts) {
  ordered_json a = ordered_json::object();
  for (const auto& [label, n] : counts) a[label] = n;
  return a;
}

}  // namespace


bool ParseWhatIf(const std::string& spec, WhatIf* out, std::string* error) {
  WhatIf w;
  w.spec = spec;
  std::stringstream ss(spec);
  std::string item;
  bool any = false;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    any = true;
    size_t eq = item.find('=');
    std::string key = item.substr(0, eq), val = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "straggler") {
      size_t colon = val.find(':');
      int64_t rank = 0;
      double f = 0;
      if (colon == std::string::npos || !ParseInt(val.substr(0, colon), &rank) || rank < 0 ||
          !ParseDouble(val.substr(colon + 1), &f) || f <= 0) {
        *error = "--what-if " + spec + ": straggler wants RANK:FACTOR with FACTOR > 0 (e.g. straggler=5:1.5)";
        return false;
      }
      w.stragglers.emplace_back(static_cast<int32_t>(rank), f);
    } else if (key == "bw-scale") {
      double f = 0;
      if (!ParseDouble(val, &f) || f <= 0) {
        *error = "--what-if " + spec + ": bw-scale wants a factor > 0 (e.g. bw-scale=0.5)";
        return false;
      }
      w.bw_scale *= f;
    } else if (key == "topology") {
      if (val.empty()) {
        *error = "--what-if " + spec + ": topology wants a preset name or a file";
        return false;
      }
      w.topology = val;
    } else {
      *error = "--what-if " + spec + ": unknown what-if \"" + key + "\" (known: straggler=RANK:FACTOR, bw-scale=F, topology=FILE)";
      return false;
    }
  }
  if (!any) {
    *error = "--what-if: empty specification";
    return false;
  }
  *out = std::move(w);
  return true;
}

ordered_json ReplayPathJson(const trace::Trace& trace, const SimResult& res) {
  ordered_json p;
  p["path"] = res.symmetric ? "symmetric" : "full";
  p["replicas"] = res.replicas;
  p["ranks_replayed"] = res.replicas > 0 ? trace.world_size / res.replicas : trace.world_size;
  p["simulated_events"] = res.simulated_events;
  p["reason"] = ReplayPathReason(trace, res);
  return p;
}

std::string ReplayPathReason(const trace::Trace& trace, const SimResult& res) {
  if (res.symmetric) {
    return std::to_string(res.replicas) + " identical data-parallel replicas: replica 0 (" +
           std::to_string(trace.world_size / std::max(res.replicas, 1)) + " ranks) replayed, the others copied";
  }
  if (res.symmetric_refused.empty()) return "the fast path was not asked for";
  if (res.symmetric_refused == "--no-symmetric") return "--no-symmetric";
  return "fast path refused: " + res.symmetric_refused;
}

ordered_json SimReportJson(const trace::Trace& trace, const SimResult& res) {
  namespace rk = prism::report;
  ordered_json j;
  j[std::string(rk::kSchema)] = rk::kSchemaVersion;
  j[std::string(rk::kWorldSize)] = trace.world_size;
  j[std::string(rk::kMode)] = "simulate";
  j["status"] = StatusName(res.status);
  if (!res.error.empty()) j["error"] = res.error;
  if (!res.wait_chain.empty()) j["wait_chain"] = res.wait_chain;
  j[std::string(rk::kIterationTime)] = res.iteration_time_s;
  j[std::string(rk::kIterations)] = res.iteration_ids.size();
  j["iteration_time_definition"] =
      "median over iterations of the max over ranks of (last finish in the iteration - last finish in the previous "
      "iteration, or 0)";
  j["iteration_times_s"] = res.iteration_times_s;
  j["iteration_ids"] = res.iteration_ids;
  j["makespan_s"] = res.makespan_s;
  j["events"] = res.events;
  j["simulate_s"] = res.wall_s;
  // Why simulated_events: on the fast path `events` counts every rank, but only one replica's were computed.
  j["events_per_s"] = res.wall_s > 0 ? static_cast<double>(res.simulated_events) / res.wall_s : 0.0;
  j["replay"] = ReplayPathJson(trace, res);
  if (!res.warnings.empty()) j["warnings"] = res.warnings;

  ordered_json ranks = ordered_json::array();
  for (const RankResult& r : res.ranks) {
    ordered_json o;
    o[std::string(rk::kRank)] = r.rank;
    o[std::string(rk::kIterationTime)] = r.iteration_time_s;
    if (r.iteration_times_s.size() > 1) o["iteration_times_s"] = r.iteration_times_s;
    ordered_json w = ordered_json::object();
    for (const auto& [desc, s] : r.wait_by_comm) w[desc] = s;
    o[std::string(rk::kWait)] = std::move(w);
    ordered_json on = ordered_json::array();
    for (const WaitOn& x : r.waited_on) on.push_back({{"rank", x.rank}, {"s", x.seconds}});
    o["waited_on"] = std::move(on);
    o["compute_s"] = r.compute_s;
    o["end_s"] = r.end_s;
    ranks.push_back(std::move(o));
  }
  j[std::string(rk::kRanks)] = std::move(ranks);

  const CriticalPath& cp = res.critical_path;
  ordered_json path;
  path["length_s"] = cp.length_s;
  path["compute_s"] = cp.compute_s;
  path["comm_s"] = cp.comm_s;
  path["nodes"] = cp.nodes;
  path["ranks"] = cp.ranks;
  ordered_json segs = ordered_json::array();
  for (const PathSegment& s : cp.segments) {
    ordered_json o;
    o["rank"] = s.rank;
    o["stream"] = s.stream;
    o["first_node"] = s.first_node;
    if (!s.first_name.empty()) o["first_name"] = s.first_name;
    o["last_node"] = s.last_node;
    if (!s.last_name.empty()) o["last_name"] = s.last_name;
    o["nodes"] = s.nodes;
    o["start_s"] = s.start_s;
    o["end_s"] = s.end_s;
    o["compute_s"] = s.compute_s;
    o["comm_s"] = s.comm_s;
    segs.push_back(std::move(o));
  }
  path["segments"] = std::move(segs);
  j["critical_path"] = std::move(path);

  // Per communicator, and summed per description (Megatron group).
  ordered_json comms = ordered_json::array();
  struct Group {
    uint64_t comms = 0, calls = 0, bytes = 0;
    double time_s = 0, wait_s = 0;
    std::map<std::string, uint64_t> algos;
  };
  std::map<std::string, Group> groups;
  for (const CommResult& c : res.comms) {
    comms.push_back({{"id", c.id}, {"desc", c.desc}, {"nranks", c.nranks}, {"nnodes", c.nnodes}, {"calls", c.calls},
                     {"bytes", c.bytes}, {"time_s", c.time_s}, {"wait_s", c.wait_s}, {"algorithm", c.algorithm},
                     {"algorithms", AlgorithmsJson(c.algorithms)}});
    Group& g = groups[c.desc.empty() ? "comm" + std::to_string(c.id) : c.desc];
    g.comms++;
    g.calls += c.calls;
    g.bytes += c.bytes;
    g.time_s += c.time_s;
    g.wait_s += c.wait_s;
    for (const auto& [label, n] : c.algorithms) g.algos[label] += n;
  }
  j["comms"] = std::move(comms);
  ordered_json by = ordered_json::array();
  for (const auto& [desc, g] : groups) {
    by.push_back({{"desc", desc}, {"comms", g.comms}, {"calls", g.calls}, {"bytes", g.bytes}, {"time_s", g.time_s},
                  {"wait_s", g.wait_s}, {"algorithms", AlgorithmsJson(g.algos)}});
  }
  j["comm_groups"] = std::move(by);
  return j;
}

namespace {

void PrintSummary(std::ostream& out, const SimulateOptions& o, const trace::Trace& t, const Topology& topo,
                  const CostModel& model, const SimResult& r) {
  char buf[512];
  out << "prism-run simulate: " << o.graph << "\n";
  EngineOptions eo;
  eo.send_completion = trace::ParseSendCompletion(o.send_completion);
  std::snprintf(buf, sizeof buf, "  world %d ranks, %zu classes, %zu communicators; topology %s, %s model; %s sends\n",
                t.world_size, t.classes.size(), t.comms.size(), topo.name.c_str(),
                model.kind() == CostModelKind::kAlphaBeta ? "alpha-beta" : "NCCL 2.28",
                std::string(trace::ToString(EffectiveSendCompletion(eo, t))).c_str());
  out << buf;
  out << "  replay           " << (r.symmetric ? "symmetric fast path: " : "full: ") << ReplayPathReason(t, r) << "\n";
  out << "  iteration time   " << Ms(r.iteration_time_s) << "  (median of " << r.iteration_ids.size()
      << " iteration" << (r.iteration_ids.size() == 1 ? "" : "s") << ", slowest rank)\n";
  const CriticalPath& cp = r.critical_path;
  if (cp.length_s > 0) {
    std::snprintf(buf, sizeof buf, "  critical path    %s: compute %.1f%%, communication %.1f%%, through %zu rank%s",
                  Ms(cp.length_s).c_str(), 100 * cp.compute_s / cp.length_s, 100 * cp.comm_s / cp.length_s,
                  cp.ranks.size(), cp.ranks.size() == 1 ? "" : "s");
    out << buf;
    for (size_t i = 0; i < cp.ranks.size() && i < 8; ++i) out << (i ? ", " : " (") << cp.ranks[i];
    if (!cp.ranks.empty()) out << (cp.ranks.size() > 8 ? ", ...)" : ")");
    out << "\n";
  }
  // Who waits most, on what.
  const RankResult* worst = nullptr;
  double worst_wait = 0;
  std::string worst_desc;
  for (const RankResult& rr : r.ranks) {
    for (const auto& [desc, s] : rr.wait_by_comm) {
      if (s > worst_wait) {
        worst_wait = s;
        worst = &rr;
        worst_desc = desc;
      }
    }
  }
  if (worst) {
    out << "  longest wait     rank " << worst->rank << " waits " << Ms(worst_wait) << " on " << worst_desc;
    if (!worst->waited_on.empty()) out << " (mostly for rank " << worst->waited_on[0].rank << ")";
    out << "\n";
  }
  // Communicator groups by time.
  std::map<std::string, std::pair<double, std::map<std::string, double>>> groups;
  for (const CommResult& c : r.comms) {
    auto& g = groups[c.desc.empty() ? "comm" + std::to_string(c.id) : c.desc];
    g.first += c.time_s;
    if (!c.algorithm.empty()) g.second[c.algorithm] += c.time_s;
  }
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [d, g] : groups) order.emplace_back(g.first, d);
  std::sort(order.rbegin(), order.rend());
  for (size_t i = 0; i < order.size() && i < 4; ++i) {
    if (order[i].first <= 0) break;
    auto& algos = groups[order[i].second].second;
    std::string algo;
    double best = -1;
    for (const auto& [a, s] : algos) {
      if (s > best) {
        best = s;
        algo = a;
      }
    }
    out << (i == 0 ? "  comm time        " : "                   ") << order[i].second << ": " << Ms(order[i].first)
        << " summed over communicators (mostly " << algo << ")\n";
  }
  for (const std::string& w : r.warnings) out << "  warning: " << w << "\n";
}


// RunSimulate's steps, in its order. A step that returns false has printed why: the exit code is kExitBadInput.
class SimulateRun {
 public:
  SimulateRun(const SimulateOptions& o, std::ostream& out, std::ostream& err) : o_(o), out_(out), err_(err) {}

  bool ParseOptions();
  bool LoadGraph();
  bool LoadCostModel();
  bool LoadWhatIfModels();
  bool CreateOutDir();
  void RunBaseline();
  void RunWhatIfs();
  bool WriteChromeTrace();
  bool WriteReport();
  void PrintResult();
  int rc() const { return rc_; }

 private:
  const SimulateOptions& o_;
  std::ostream& out_;
  std::ostream& err_;
  const std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  const std::string me_ = "prism-run simulate: ";
  std::vector<WhatIf> what_ifs_;
  std::vector<int32_t> trace_ranks_;
  CostModelOptions mo_;
  trace::SendCompletion send_completion_ = trace::SendCompletion::kInvalid;
  trace::Trace t_;
  std::string e_;  // the loaders' error
  double load_s_ = 0;
  Topology topo_;
  CostModel model_;
  std::vector<Topology> wi_topos_;
  std::vector<CostModel> wi_models_;
  fs::path dir_;
  std::optional<Progress> progress_;  // Why made in RunBaseline: its first two seconds count from there
  EngineOptions eo_;
  std::optional<Simulator> sim_;
  SimResult res_;
  ordered_json report_;
  int rc_ = kExitOk;
};

bool SimulateRun::ParseOptions() {
  for (const std::string& s : o_.what_ifs) {
    WhatIf w;
    std::string e;
    if (!ParseWhatIf(s, &w, &e)) {
      err_ << me_ << e << "\n";
      return false;
    }
    what_ifs_.push_back(std::move(w));
  }
  if (!o_.trace_ranks.empty() && o_.trace_ranks != "none") {
    std::string e;
    auto parsed = prism::ParseRankList(o_.trace_ranks, 0, "--trace-ranks", &e);
    if (!parsed) {
      err_ << me_ << e << "\n";
      return false;
    }
    trace_ranks_.assign(parsed->begin(), parsed->end());
    std::sort(trace_ranks_.begin(), trace_ranks_.end());
  }
  if (o_.model == "nccl") {
    mo_.model = CostModelKind::kNccl;
  } else if (o_.model == "alpha-beta") {
    mo_.model = CostModelKind::kAlphaBeta;
  } else if (!o_.model.empty()) {
    err_ << me_ << "--model must be nccl or alpha-beta (got \"" << o_.model << "\")\n";
    return false;
  }
  mo_.nccl_algo = o_.nccl_algo;
  mo_.nccl_proto = o_.nccl_proto;
  send_completion_ = trace::ParseSendCompletion(o_.send_completion);
  if (!o_.send_completion.empty() && send_completion_ == trace::SendCompletion::kInvalid) {
    err_ << me_ << "--send-completion must be rendezvous, eager or nccl (got \"" << o_.send_completion << "\")\n";
    return false;
  }
  return true;
}

// Graph.
bool SimulateRun::LoadGraph() {
  if (!(o_.document_reader ? ReadTraceUncheckedDom(o_.graph, &t_, &e_) : ReadTraceUnchecked(o_.graph, &t_, &e_))) {
    err_ << me_ << e_ << "\n";
    return false;
  }
  if (o_.validate) {
    std::vector<std::string> errors = ValidateTrace(t_);
    if (!errors.empty()) {
      err_ << me_ << o_.graph << ": invalid graph (" << errors.size() << (errors.size() >= 20 ? "+" : "")
           << " error" << (errors.size() == 1 ? "" : "s") << "):\n";
      for (const std::string& x : errors) err_ << "  " << x << "\n";
      return false;
    }
  }
  load_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  return true;
}

// Topology and cost model.
bool SimulateRun::LoadCostModel() {
  const std::string topo_spec = TopologySpec(o_.topology, t_.topology);
  if (!LoadTopology(topo_spec, &topo_, &e_)) {
    err_ << me_ << (o_.topology.empty() ? o_.graph + " names a topology: " : "--topology: ") << e_ << "\n";
    return false;
  }
  if (!topo_.rank_node.empty() && topo_.rank_node.size() < static_cast<size_t>(t_.world_size)) {
    err_ << me_ << "topology " << topo_.name << ": placement lists " << topo_.rank_node.size()
         << " ranks but the graph has " << t_.world_size << "\n";
    return false;
  }
  if (!model_.Init(topo_, mo_, &e_)) {
    err_ << me_ << e_ << "\n";
    return false;
  }
  return true;
}

bool SimulateRun::LoadWhatIfModels() {
  wi_topos_.resize(what_ifs_.size());
  wi_models_.resize(what_ifs_.size());
  for (size_t i = 0; i < what_ifs_.size(); ++i) {
    Topology wt = topo_;
    if (!what_ifs_[i].topology.empty() && !LoadTopology(what_ifs_[i].topology, &wt, &e_)) {
      err_ << me_ << "--what-if " << what_ifs_[i].spec << ": " << e_ << "\n";
      return false;
    }
    if (what_ifs_[i].bw_scale != 1.0) ScaleNetworkBandwidth(&wt, what_ifs_[i].bw_scale);
    for (auto [rank, f] : what_ifs_[i].stragglers) {
      if (rank >= t_.world_size) {
        err_ << me_ << "--what-if " << what_ifs_[i].spec << ": rank " << rank << " is outside the world (size "
             << t_.world_size << ")\n";
        return false;
      }
    }
    if (!wi_models_[i].Init(wt, mo_, &e_)) {
      err_ << me_ << "--what-if " << what_ifs_[i].spec << ": " << e_ << "\n";
      return false;
    }
    wi_topos_[i] = std::move(wt);
  }
  return true;
}

// Output directory.
bool SimulateRun::CreateOutDir() {
  dir_ = o_.out_dir.empty() ? fs::path("prism-out") / TimeNow("%Y%m%d-%H%M%S") : fs::path(o_.out_dir);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) {
    err_ << me_ << "--out " << dir_.string() << ": cannot create the directory (" << ec.message() << ")\n";
    return false;
  }
  return true;
}

// Baseline.
void SimulateRun::RunBaseline() {
  Progress* progress = &progress_.emplace(err_);
  progress->what = "baseline";
  eo_.use_recorded = o_.use_recorded;
  eo_.send_completion = send_completion_;
  eo_.symmetric = o_.symmetric;
  eo_.progress = [progress](uint64_t d, uint64_t n) { (*progress)(d, n); };
  sim_.emplace(t_, model_, eo_);
  res_ = sim_->Run();
  if (!o_.symmetric) res_.symmetric_refused = "--no-symmetric";

  report_ = SimReportJson(t_, res_);
  report_["graph"] = o_.graph;
  report_["topology"] = topo_.name;
  report_["cost_model"] = model_.kind() == CostModelKind::kAlphaBeta ? "alpha-beta" : "nccl-2.28.9";
  if (!o_.nccl_algo.empty()) report_["nccl_algo"] = o_.nccl_algo;
  if (!o_.nccl_proto.empty()) report_["nccl_proto"] = o_.nccl_proto;
  report_["use_recorded"] = o_.use_recorded;
  report_[std::string(trace::kSendCompletionKey)] = trace::ToString(EffectiveSendCompletion(eo_, t_));
  report_["load_s"] = load_s_;

  if (res_.status == SimResult::Status::kBadGraph) {
    err_ << me_ << o_.graph << ": " << res_.error << "\n";
    rc_ = kExitBadInput;
  } else if (res_.status != SimResult::Status::kOk) {
    err_ << me_ << o_.graph << ": " << res_.error << "\n";
    for (const std::string& l : res_.wait_chain) err_ << "  " << l << "\n";
    rc_ = kExitFailure;
  }
}

// What-ifs (only when the baseline finished).
void SimulateRun::RunWhatIfs() {
  if (rc_ == kExitOk && !what_ifs_.empty()) {
    ordered_json arr = ordered_json::array();
    for (size_t i = 0; i < what_ifs_.size(); ++i) {
      EngineOptions wo = eo_;
      wo.compute_scale = what_ifs_[i].stragglers;
      if (what_ifs_[i].bw_scale != 1.0 || !what_ifs_[i].topology.empty()) wo.baseline_model = &model_;
      progress_->what = "what-if " + what_ifs_[i].spec;
      SimResult wr = Simulate(t_, wi_models_[i], wo);
      if (!o_.symmetric) wr.symmetric_refused = "--no-symmetric";
      ordered_json w;
      w["spec"] = what_ifs_[i].spec;
      w["status"] = StatusName(wr.status);
      if (!wr.error.empty()) w["error"] = wr.error;
      w[std::string(report::kIterationTime)] = wr.iteration_time_s;
      w["ratio"] = res_.iteration_time_s > 0 ? wr.iteration_time_s / res_.iteration_time_s : 0.0;
      w["makespan_s"] = wr.makespan_s;
      w["critical_path_ranks"] = wr.critical_path.ranks;
      w["replay"] = ReplayPathJson(t_, wr);
      if (!what_ifs_[i].topology.empty()) w["topology"] = wi_topos_[i].name;
      arr.push_back(std::move(w));
      if (wr.status != SimResult::Status::kOk) {
        err_ << me_ << "what-if " << what_ifs_[i].spec << ": " << wr.error << "\n";
        rc_ = kExitFailure;
      }
    }
    report_["what_if"] = std::move(arr);
  }
}

// Chrome trace.
bool SimulateRun::WriteChromeTrace() {
  if (!trace_ranks_.empty() && res_.status == SimResult::Status::kOk) {
    std::vector<int32_t> keep;
    for (int32_t r : trace_ranks_) {
      if (r < t_.world_size) keep.push_back(r);
    }
    if (keep.size() != trace_ranks_.size()) {
      err_ << me_ << "--trace-ranks: ranks at or above the world size (" << t_.world_size << ") are left out\n";
    }
    std::string we;
    if (!WriteJson(dir_ / "trace.json", sim_->ChromeTrace(keep), -1, &we)) {
      err_ << me_ << we << "\n";
      return false;
    }
    report_["trace"] = (dir_ / "trace.json").string();
    report_["trace_ranks"] = keep;
  }
  return true;
}

bool SimulateRun::WriteReport() {
  report_[std::string(report::kWall)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  std::string we;
  if (!WriteJson(dir_ / std::string(report::kFileName), report_, 1, &we)) {
    err_ << me_ << we << "\n";
    return false;
  }
  return true;
}

void SimulateRun::PrintResult() {
  if (!o_.quiet && res_.status == SimResult::Status::kOk) {
    PrintSummary(out_, o_, t_, topo_, model_, res_);
    if (report_.contains("what_if")) {
      for (const auto& w : report_["what_if"]) {
        char buf[256];
        std::snprintf(buf, sizeof buf, "  what-if %-24s %s (x%.3f)", w["spec"].get<std::string>().c_str(),
                      Ms(w[std::string(report::kIterationTime)].get<double>()).c_str(), w["ratio"].get<double>());
        out_ << buf;
        const auto& path = w["replay"];
        if (path["path"] == "symmetric") {
          out_ << "  symmetric\n";
        } else {
          out_ << "  full replay (" << path["reason"].get<std::string>() << ")\n";
        }
      }
    }
    char buf[256];
    if (res_.symmetric) {
      std::snprintf(buf, sizeof buf, "  simulated %llu events standing for %llu in %.3f s (%.2f M events/s); loaded in %.3f s\n",
                    static_cast<unsigned long long>(res_.simulated_events),
                    static_cast<unsigned long long>(res_.events), res_.wall_s,
                    res_.wall_s > 0 ? res_.simulated_events / res_.wall_s / 1e6 : 0.0, load_s_);
    } else {
      std::snprintf(buf, sizeof buf, "  simulated %llu events in %.3f s (%.2f M events/s); loaded in %.3f s\n",
                    static_cast<unsigned long long>(res_.events), res_.wall_s,
                    res_.wall_s > 0 ? res_.events / res_.wall_s / 1e6 : 0.0, load_s_);
    }
    out_ << buf;
    out_ << "  report: " << (dir_ / std::string(report::kFileName)).string();
    if (report_.contains("trace")) out_ << "  trace: " << report_["trace"].get<std::string>();
    out_ << "\n";
  }
}

}  // namespace

int RunSimulate(const SimulateOptions& o, std::ostream& out, std::ostream& err) {
  SimulateRun run(o, out, err);
  // Options first: a bad flag costs nothing.
  if (!run.ParseOptions()) return kExitBadInput;
  if (!run.LoadGraph()) return kExitBadInput;
  if (!run.LoadCostModel()) return kExitBadInput;
  // What-if topologies load before the long run, so a typo fails fast.
  if (!run.LoadWhatIfModels()) return kExitBadInput;
  if (!run.CreateOutDir()) return kExitBadInput;
  run.RunBaseline();
  run.RunWhatIfs();
  if (!run.WriteChromeTrace()) return kExitBadInput;
  if (!run.WriteReport()) return kExitBadInput;
  run.PrintResult();
  return run.rc();
}

}  // namespace prism::replay
