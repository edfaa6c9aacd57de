#include "replay/simulate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>

#include "common/rank_list.h"
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

std::string Timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
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
    ordered_json o;
    o["id"] = c.id;
    o["desc"] = c.desc;
    o["nranks"] = c.nranks;
    o["nnodes"] = c.nnodes;
    o["calls"] = c.calls;
    o["bytes"] = c.bytes;
    o["time_s"] = c.time_s;
    o["wait_s"] = c.wait_s;
    o["algorithm"] = c.algorithm;
    ordered_json a = ordered_json::object();
    for (const auto& [label, n] : c.algorithms) a[label] = n;
    o["algorithms"] = std::move(a);
    comms.push_back(std::move(o));
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
    ordered_json o;
    o["desc"] = desc;
    o["comms"] = g.comms;
    o["calls"] = g.calls;
    o["bytes"] = g.bytes;
    o["time_s"] = g.time_s;
    o["wait_s"] = g.wait_s;
    ordered_json a = ordered_json::object();
    for (const auto& [label, n] : g.algos) a[label] = n;
    o["algorithms"] = std::move(a);
    by.push_back(std::move(o));
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

}  // namespace

int RunSimulate(const SimulateOptions& o, std::ostream& out, std::ostream& err) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string me = "prism-run simulate: ";
  // Options first: a bad flag costs nothing.
  std::vector<WhatIf> what_ifs;
  for (const std::string& s : o.what_ifs) {
    WhatIf w;
    std::string e;
    if (!ParseWhatIf(s, &w, &e)) {
      err << me << e << "\n";
      return kExitBadInput;
    }
    what_ifs.push_back(std::move(w));
  }
  std::vector<int32_t> trace_ranks;
  if (!o.trace_ranks.empty() && o.trace_ranks != "none") {
    std::string e;
    auto parsed = prism::ParseRankList(o.trace_ranks, 0, "--trace-ranks", &e);
    if (!parsed) {
      err << me << e << "\n";
      return kExitBadInput;
    }
    trace_ranks.assign(parsed->begin(), parsed->end());
    std::sort(trace_ranks.begin(), trace_ranks.end());
  }
  CostModelOptions mo;
  if (o.model == "nccl") {
    mo.model = CostModelKind::kNccl;
  } else if (o.model == "alpha-beta") {
    mo.model = CostModelKind::kAlphaBeta;
  } else if (!o.model.empty()) {
    err << me << "--model must be nccl or alpha-beta (got \"" << o.model << "\")\n";
    return kExitBadInput;
  }
  mo.nccl_algo = o.nccl_algo;
  mo.nccl_proto = o.nccl_proto;
  const trace::SendCompletion send_completion = trace::ParseSendCompletion(o.send_completion);
  if (!o.send_completion.empty() && send_completion == trace::SendCompletion::kInvalid) {
    err << me << "--send-completion must be rendezvous, eager or nccl (got \"" << o.send_completion << "\")\n";
    return kExitBadInput;
  }

  // Graph.
  trace::Trace t;
  std::string e;
  if (!(o.document_reader ? ReadTraceUncheckedDom(o.graph, &t, &e) : ReadTraceUnchecked(o.graph, &t, &e))) {
    err << me << e << "\n";
    return kExitBadInput;
  }
  if (o.validate) {
    std::vector<std::string> errors = ValidateTrace(t);
    if (!errors.empty()) {
      err << me << o.graph << ": invalid graph (" << errors.size() << (errors.size() >= 20 ? "+" : "")
          << " error" << (errors.size() == 1 ? "" : "s") << "):\n";
      for (const std::string& x : errors) err << "  " << x << "\n";
      return kExitBadInput;
    }
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Topology and cost model.
  const std::string topo_spec = TopologySpec(o.topology, t.topology);
  Topology topo;
  if (!LoadTopology(topo_spec, &topo, &e)) {
    err << me << (o.topology.empty() ? o.graph + " names a topology: " : "--topology: ") << e << "\n";
    return kExitBadInput;
  }
  if (!topo.rank_node.empty() && topo.rank_node.size() < static_cast<size_t>(t.world_size)) {
    err << me << "topology " << topo.name << ": placement lists " << topo.rank_node.size()
        << " ranks but the graph has " << t.world_size << "\n";
    return kExitBadInput;
  }
  CostModel model;
  if (!model.Init(topo, mo, &e)) {
    err << me << e << "\n";
    return kExitBadInput;
  }
  // What-if topologies load before the long run, so a typo fails fast.
  std::vector<Topology> wi_topos(what_ifs.size());
  std::vector<CostModel> wi_models(what_ifs.size());
  for (size_t i = 0; i < what_ifs.size(); ++i) {
    Topology wt = topo;
    if (!what_ifs[i].topology.empty() && !LoadTopology(what_ifs[i].topology, &wt, &e)) {
      err << me << "--what-if " << what_ifs[i].spec << ": " << e << "\n";
      return kExitBadInput;
    }
    if (what_ifs[i].bw_scale != 1.0) ScaleNetworkBandwidth(&wt, what_ifs[i].bw_scale);
    for (auto [rank, f] : what_ifs[i].stragglers) {
      if (rank >= t.world_size) {
        err << me << "--what-if " << what_ifs[i].spec << ": rank " << rank << " is outside the world (size "
            << t.world_size << ")\n";
        return kExitBadInput;
      }
    }
    if (!wi_models[i].Init(wt, mo, &e)) {
      err << me << "--what-if " << what_ifs[i].spec << ": " << e << "\n";
      return kExitBadInput;
    }
    wi_topos[i] = std::move(wt);
  }

  // Output directory.
  fs::path dir = o.out_dir.empty() ? fs::path("prism-out") / Timestamp() : fs::path(o.out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    err << me << "--out " << dir.string() << ": cannot create the directory (" << ec.message() << ")\n";
    return kExitBadInput;
  }

  // Baseline.
  Progress progress(err);
  progress.what = "baseline";
  EngineOptions eo;
  eo.use_recorded = o.use_recorded;
  eo.send_completion = send_completion;
  eo.symmetric = o.symmetric;
  eo.progress = [&progress](uint64_t d, uint64_t n) { progress(d, n); };
  Simulator sim(t, model, eo);
  SimResult res = sim.Run();
  if (!o.symmetric) res.symmetric_refused = "--no-symmetric";

  ordered_json report = SimReportJson(t, res);
  report["graph"] = o.graph;
  report["topology"] = topo.name;
  report["cost_model"] = model.kind() == CostModelKind::kAlphaBeta ? "alpha-beta" : "nccl-2.28.9";
  if (!o.nccl_algo.empty()) report["nccl_algo"] = o.nccl_algo;
  if (!o.nccl_proto.empty()) report["nccl_proto"] = o.nccl_proto;
  report["use_recorded"] = o.use_recorded;
  report[std::string(trace::kSendCompletionKey)] = trace::ToString(EffectiveSendCompletion(eo, t));
  report["load_s"] = load_s;

  int rc = kExitOk;
  if (res.status == SimResult::Status::kBadGraph) {
    err << me << o.graph << ": " << res.error << "\n";
    rc = kExitBadInput;
  } else if (res.status != SimResult::Status::kOk) {
    err << me << o.graph << ": " << res.error << "\n";
    for (const std::string& l : res.wait_chain) err << "  " << l << "\n";
    rc = kExitFailure;
  }

  // What-ifs (only when the baseline finished).
  if (rc == kExitOk && !what_ifs.empty()) {
    ordered_json arr = ordered_json::array();
    for (size_t i = 0; i < what_ifs.size(); ++i) {
      EngineOptions wo = eo;
      wo.compute_scale = what_ifs[i].stragglers;
      if (what_ifs[i].bw_scale != 1.0 || !what_ifs[i].topology.empty()) wo.baseline_model = &model;
      progress.what = "what-if " + what_ifs[i].spec;
      SimResult wr = Simulate(t, wi_models[i], wo);
      if (!o.symmetric) wr.symmetric_refused = "--no-symmetric";
      ordered_json w;
      w["spec"] = what_ifs[i].spec;
      w["status"] = StatusName(wr.status);
      if (!wr.error.empty()) w["error"] = wr.error;
      w[std::string(report::kIterationTime)] = wr.iteration_time_s;
      w["ratio"] = res.iteration_time_s > 0 ? wr.iteration_time_s / res.iteration_time_s : 0.0;
      w["makespan_s"] = wr.makespan_s;
      w["critical_path_ranks"] = wr.critical_path.ranks;
      w["replay"] = ReplayPathJson(t, wr);
      if (!what_ifs[i].topology.empty()) w["topology"] = wi_topos[i].name;
      arr.push_back(std::move(w));
      if (wr.status != SimResult::Status::kOk) {
        err << me << "what-if " << what_ifs[i].spec << ": " << wr.error << "\n";
        rc = kExitFailure;
      }
    }
    report["what_if"] = std::move(arr);
  }

  // Chrome trace.
  if (!trace_ranks.empty() && res.status == SimResult::Status::kOk) {
    std::vector<int32_t> keep;
    for (int32_t r : trace_ranks) {
      if (r < t.world_size) keep.push_back(r);
    }
    if (keep.size() != trace_ranks.size()) {
      err << me << "--trace-ranks: ranks at or above the world size (" << t.world_size << ") are left out\n";
    }
    std::string we;
    if (!WriteJson(dir / "trace.json", sim.ChromeTrace(keep), -1, &we)) {
      err << me << we << "\n";
      return kExitBadInput;
    }
    report["trace"] = (dir / "trace.json").string();
    report["trace_ranks"] = keep;
  }

  report[std::string(report::kWall)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string we;
  if (!WriteJson(dir / std::string(report::kFileName), report, 1, &we)) {
    err << me << we << "\n";
    return kExitBadInput;
  }
  if (!o.quiet && res.status == SimResult::Status::kOk) {
    PrintSummary(out, o, t, topo, model, res);
    if (report.contains("what_if")) {
      for (const auto& w : report["what_if"]) {
        char buf[256];
        std::snprintf(buf, sizeof buf, "  what-if %-24s %s (x%.3f)", w["spec"].get<std::string>().c_str(),
                      Ms(w[std::string(report::kIterationTime)].get<double>()).c_str(), w["ratio"].get<double>());
        out << buf;
        const auto& path = w["replay"];
        if (path["path"] == "symmetric") {
          out << "  symmetric\n";
        } else {
          out << "  full replay (" << path["reason"].get<std::string>() << ")\n";
        }
      }
    }
    char buf[256];
    if (res.symmetric) {
      std::snprintf(buf, sizeof buf, "  simulated %llu events standing for %llu in %.3f s (%.2f M events/s); loaded in %.3f s\n",
                    static_cast<unsigned long long>(res.simulated_events), static_cast<unsigned long long>(res.events),
                    res.wall_s, res.wall_s > 0 ? res.simulated_events / res.wall_s / 1e6 : 0.0, load_s);
    } else {
      std::snprintf(buf, sizeof buf, "  simulated %llu events in %.3f s (%.2f M events/s); loaded in %.3f s\n",
                    static_cast<unsigned long long>(res.events), res.wall_s,
                    res.wall_s > 0 ? res.events / res.wall_s / 1e6 : 0.0, load_s);
    }
    out << buf;
    out << "  report: " << (dir / std::string(report::kFileName)).string();
    if (report.contains("trace")) out << "  trace: " << report["trace"].get<std::string>();
    out << "\n";
  }
  return rc;
}

}  // namespace prism::replay
