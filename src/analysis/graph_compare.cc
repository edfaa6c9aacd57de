#include "analysis/graph_compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "replay/cost_model.h"
#include "replay/engine.h"
#include "replay/simulate.h"
#include "replay/topology.h"
#include "replay/trace_io.h"

namespace prism::analysis {

namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ErrPct(double emulated, double simulated) { return 100.0 * (emulated / simulated - 1.0); }

}  // namespace

std::optional<RankGraphComparison> CompareWithGraph(int rank, const std::vector<std::optional<double>>& emulated,
                                                    const std::vector<int>& graph_iterations,
                                                    const std::vector<double>& simulated, std::string* error) {
  if (graph_iterations.empty() || graph_iterations.size() != simulated.size()) {
    *error = "the simulation has no per-iteration times for rank " + std::to_string(rank);
    return std::nullopt;
  }
  std::map<int, double> sim_of;  // graph iteration -> simulated seconds
  for (size_t k = 0; k < graph_iterations.size(); ++k) {
    if (simulated[k] > 0) sim_of[graph_iterations[k]] = simulated[k];
  }
  if (sim_of.empty()) {
    *error = "rank " + std::to_string(rank) + " has no iteration in the graph";
    return std::nullopt;
  }
  // Why this repetition rule: it is GraphRelease's (a graph that starts at iteration 0 holds the job's set-up and
  // repeats from its second iteration; any other graph repeats whole).
  std::vector<int> order;
  for (const auto& [g, s] : sim_of) order.push_back(g);
  const size_t first_repeat = order.size() >= 2 && order.front() == 0 ? 1 : 0;
  RankGraphComparison c;
  c.rank = rank;
  for (size_t i = 0; i < emulated.size(); ++i) {
    if (!emulated[i] || *emulated[i] <= 0) continue;
    const int it = static_cast<int>(i);
    int g;
    if (sim_of.count(it)) {
      g = it;
    } else if (it > order.back()) {
      const size_t period = order.size() - first_repeat;
      const size_t past = static_cast<size_t>(it - order.back() - 1);
      g = order[first_repeat + past % period];
    } else {
      continue;  // an iteration the graph does not hold (a graph built with --skip-iterations): nothing to match
    }
    c.pairs.push_back(IterationPair{it, g, *emulated[i], sim_of[g], false});
  }
  if (c.pairs.empty()) {
    *error = "no measured iteration of rank " + std::to_string(rank) + " matches an iteration of the graph";
    return std::nullopt;
  }
  std::vector<double> errs, sims, emus;
  for (const IterationPair& p : c.pairs) {
    errs.push_back(ErrPct(p.emulated_s, p.simulated_s));
    sims.push_back(p.simulated_s);
    emus.push_back(p.emulated_s);
  }
  c.median_error_pct = Median(errs);
  const double sim_median = Median(sims), emu_median = Median(emus);
  constexpr size_t kWarmUpPairs = 3;
  std::vector<double> se, ss;
  double abs_sum = 0;
  for (size_t i = 0; i < c.pairs.size(); ++i) {
    IterationPair& p = c.pairs[i];
    // Why the emulated side too, in the first kWarmUpPairs only: the slow warm-up iteration can fall on different
    // iteration numbers in the graph's run and in this one (seen on the GPU: rank 0's 0.6 s iteration was the
    // graph's 1st and the emulation's 2nd); a slow iteration later in the emulation is a finding and stays in.
    p.steady = p.simulated_s <= 1.5 * sim_median && (i >= kWarmUpPairs || p.emulated_s <= 1.5 * emu_median);
    if (!p.steady) continue;
    se.push_back(p.emulated_s);
    ss.push_back(p.simulated_s);
    c.steady_emulated_total_s += p.emulated_s;
    c.steady_simulated_total_s += p.simulated_s;
    abs_sum += std::fabs(ErrPct(p.emulated_s, p.simulated_s));
  }
  c.steady_count = static_cast<int>(se.size());
  if (!se.empty()) {
    c.steady_mean_abs_error_pct = abs_sum / static_cast<double>(se.size());
    c.steady_emulated_median_s = Median(std::move(se));
    c.steady_simulated_median_s = Median(std::move(ss));
    c.steady_median_error_pct = ErrPct(c.steady_emulated_median_s, c.steady_simulated_median_s);
    c.steady_total_error_pct = ErrPct(c.steady_emulated_total_s, c.steady_simulated_total_s);
  }
  return c;
}

std::vector<RankGraphComparison> CompareReports(const nlohmann::json& emulated, const nlohmann::json& simulated,
                                                std::string* error) {
  std::vector<RankGraphComparison> out;
  std::vector<int> ids;
  if (simulated.contains("iteration_ids") && simulated["iteration_ids"].is_array()) {
    for (const auto& v : simulated["iteration_ids"]) ids.push_back(v.get<int>());
  }
  std::map<int, std::vector<double>> sim_by_rank;
  if (simulated.contains("ranks") && simulated["ranks"].is_array()) {
    for (const auto& r : simulated["ranks"]) {
      std::vector<double> t;
      if (r.contains("iteration_times_s") && r["iteration_times_s"].is_array()) {
        for (const auto& v : r["iteration_times_s"]) t.push_back(v.is_number() ? v.get<double>() : 0.0);
      } else if (r.contains("iteration_time_s") && r["iteration_time_s"].is_number() && ids.size() == 1) {
        t.push_back(r["iteration_time_s"].get<double>());  // one iteration: simulate writes no list
      }
      sim_by_rank[r.value("rank", -1)] = std::move(t);
    }
  }
  std::string why;
  if (emulated.contains("ranks") && emulated["ranks"].is_array()) {
    for (const auto& r : emulated["ranks"]) {
      const int rank = r.value("rank", -1);
      std::vector<std::optional<double>> live;
      if (r.contains("iteration_times_s") && r["iteration_times_s"].is_array()) {
        for (const auto& v : r["iteration_times_s"]) {
          live.push_back(v.is_number() ? std::optional<double>(v.get<double>()) : std::nullopt);
        }
      }
      auto it = sim_by_rank.find(rank);
      if (it == sim_by_rank.end()) {
        why = "rank " + std::to_string(rank) + " is not in the simulation";
        continue;
      }
      std::string e;
      if (auto c = CompareWithGraph(rank, live, ids, it->second, &e)) {
        out.push_back(std::move(*c));
      } else {
        why = e;
      }
    }
  }
  if (out.empty()) *error = why.empty() ? "the emulation report has no ranks" : why;
  return out;
}

std::optional<nlohmann::json> SimulateGraph(const std::string& graph, const std::string& topology,
                                            const std::vector<std::pair<int32_t, double>>& stragglers,
                                            std::string* error) {
  trace::Trace t;
  if (!replay::ReadTrace(graph, &t, error)) return std::nullopt;
  return SimulateGraph(t, graph, topology, stragglers, error);
}

std::optional<nlohmann::json> SimulateGraph(const trace::Trace& t, const std::string& graph,
                                            const std::string& topology,
                                            const std::vector<std::pair<int32_t, double>>& stragglers,
                                            std::string* error) {
  const std::string spec = replay::TopologySpec(topology, t.topology);
  replay::Topology topo;
  std::string e;
  if (!replay::LoadTopology(spec, &topo, &e)) {
    *error = "topology " + spec + ": " + e;
    return std::nullopt;
  }
  replay::CostModel model;
  if (!model.Init(topo, replay::CostModelOptions{}, &e)) {
    *error = e;
    return std::nullopt;
  }
  replay::EngineOptions eo;
  eo.compute_scale = stragglers;
  eo.symmetric = true;  // every rank's results either way (the fast path copies replica 0's)
  replay::Simulator sim(t, model, eo);
  replay::SimResult res = sim.Run();
  if (res.status != replay::SimResult::Status::kOk) {
    *error = graph + ": the simulation did not finish: " + res.error;
    return std::nullopt;
  }
  return nlohmann::json::parse(replay::SimReportJson(t, res).dump());
}

std::optional<double> RunComputePerIteration(const nlohmann::json& trace_json, int rank,
                                             double latency_per_iteration_s) {
  const nlohmann::json* events = &trace_json;
  if (trace_json.is_object()) {
    auto it = trace_json.find("traceEvents");
    if (it == trace_json.end()) return std::nullopt;
    events = &*it;
  }
  if (!events->is_array()) return std::nullopt;
  std::vector<std::pair<double, double>> iters, comms;  // [start, end) in us
  for (const auto& e : *events) {
    if (!e.is_object()) continue;
    auto pid = e.find("pid"), cat = e.find("cat"), ts = e.find("ts"), dur = e.find("dur");
    if (pid == e.end() || !pid->is_number_integer() || pid->get<int>() != rank || cat == e.end() ||
        !cat->is_string() || ts == e.end() || !ts->is_number() || dur == e.end() || !dur->is_number())
      continue;
    const std::string c = cat->get<std::string>();
    if (c != "iteration" && c != "comm") continue;
    const double t0 = ts->get<double>(), d = dur->get<double>();
    (c == "iteration" ? iters : comms).emplace_back(t0, t0 + d);
  }
  if (iters.size() < 2 || comms.empty()) return std::nullopt;
  std::sort(iters.begin(), iters.end());
  std::sort(comms.begin(), comms.end());
  // Why: trace.json keeps at most 200000 operations per rank (run_report.cc); iterations after the last one kept
  // would count as all compute.
  double last_comm = 0;
  for (const auto& [cs, ce] : comms) last_comm = std::max(last_comm, ce);
  std::vector<double> own;
  for (size_t i = 1; i < iters.size(); ++i) {  // Why from the second: the first is the warm-up
    const auto [a, b] = iters[i];
    if (a >= last_comm) break;
    double busy = 0, cur_s = 0, cur_e = -1;
    for (const auto& [cs, ce] : comms) {
      const double s0 = std::max(cs, a), e0 = std::min(ce, b);
      if (e0 <= s0) continue;
      if (s0 > cur_e) {
        if (cur_e > cur_s) busy += cur_e - cur_s;
        cur_s = s0;
        cur_e = e0;
      } else {
        cur_e = std::max(cur_e, e0);
      }
    }
    if (cur_e > cur_s) busy += cur_e - cur_s;
    own.push_back(std::max(0.0, (b - a - busy) * 1e-6 - std::max(0.0, latency_per_iteration_s)));
  }
  return Median(std::move(own));
}

std::optional<double> GraphComputePerIteration(const trace::Trace& t, int rank, std::string* error) {
  if (rank < 0 || static_cast<size_t>(rank) >= t.ranks.size()) {
    *error = "rank " + std::to_string(rank) + " is not in the graph (world " + std::to_string(t.ranks.size()) + ")";
    return std::nullopt;
  }
  const trace::RoleClass& rc = t.classes[t.ranks[static_cast<size_t>(rank)].cls];
  std::map<uint32_t, double> per_iter;  // us
  for (const auto& st : rc.streams)
    for (const auto& n : st.nodes) {
      per_iter.try_emplace(n.iter, 0.0);
      if (n.kind == trace::NodeKind::kCompute && n.dur_us > 0) per_iter[n.iter] += n.dur_us;
    }
  if (per_iter.size() >= 2 && per_iter.begin()->first == 0) per_iter.erase(per_iter.begin());
  std::vector<double> v;
  for (const auto& [it, us] : per_iter) v.push_back(us * 1e-6);
  if (v.empty()) {
    *error = "rank " + std::to_string(rank) + "'s class has no iterations in the graph";
    return std::nullopt;
  }
  return Median(std::move(v));
}

nlohmann::json ToJson(const RankGraphComparison& c) {
  nlohmann::json it = nlohmann::json::array();
  for (const IterationPair& p : c.pairs) {
    it.push_back({{"iteration", p.iteration},
                  {"graph_iteration", p.graph_iteration},
                  {"emulated_s", p.emulated_s},
                  {"simulated_s", p.simulated_s},
                  {"steady", p.steady}});
  }
  return {{"rank", c.rank},
          {"median_error_pct", c.median_error_pct},
          {"steady_iterations", c.steady_count},
          {"steady_mean_abs_error_pct", c.steady_mean_abs_error_pct},
          {"steady_median_error_pct", c.steady_median_error_pct},
          {"steady_total_error_pct", c.steady_total_error_pct},
          {"iterations", std::move(it)}};
}

std::string Describe(const RankGraphComparison& c) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "rank %d: emulated vs simulate(graph): median error %+.2f %% over %zu iterations; steady (%d): mean "
                "|error| %.2f %%, median %.1f vs %.1f ms (%+.2f %%), total %.1f vs %.1f ms (%+.2f %%)",
                c.rank, c.median_error_pct, c.pairs.size(), c.steady_count, c.steady_mean_abs_error_pct,
                c.steady_emulated_median_s * 1e3, c.steady_simulated_median_s * 1e3, c.steady_median_error_pct,
                c.steady_emulated_total_s * 1e3, c.steady_simulated_total_s * 1e3, c.steady_total_error_pct);
  return buf;
}

}  // namespace prism::analysis
