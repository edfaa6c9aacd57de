// A finished replay's results: per rank and per communicator, the critical path, Chrome trace events.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "replay/engine_internal.h"

namespace prism::replay {

using internal::kLabelCount;
using trace::NodeKind;

namespace {

std::string LabelName(int i) {
  if (i < kNumAlgos * kNumProtos) {
    CommCost c;
    c.method = CostMethod::kNccl;
    c.algo = static_cast<NcclAlgo>(i / kNumProtos);
    c.proto = static_cast<NcclProto>(i % kNumProtos);
    return c.Label();
  }
  if (i == kNumAlgos * kNumProtos) return "alpha-beta";
  if (i == kNumAlgos * kNumProtos + 1) return "p2p";
  return "recorded";
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

void Simulator::Impl::Collect() {
  const size_t world = t.ranks.size();
  const size_t niters = iter_values.size();
  res.iteration_ids = iter_values;
  std::vector<double> end(niters);
  std::vector<uint8_t> has(niters);
  std::vector<double> iter_max(niters, 0.0);
  res.ranks.resize(world);
  for (size_t r = 0; r < world; ++r) {
    const ClassPlan& cp = classes[r_cls[r]];
    const double* fin = finish.data() + r_node_off[r];
    std::fill(end.begin(), end.end(), 0.0);
    std::fill(has.begin(), has.end(), 0);
    RankResult& rr = res.ranks[r];
    rr.rank = static_cast<int32_t>(r);
    const float scale = compute_scale.empty() ? 1.0f : compute_scale[r];
    for (uint32_t i = 0; i < cp.nodes.size(); ++i) {
      const FlatNode& n = cp.nodes[i];
      end[n.iter_idx] = std::max(end[n.iter_idx], fin[i]);
      has[n.iter_idx] = 1;
      rr.end_s = std::max(rr.end_s, fin[i] * 1e-6);
      if (n.kind == NodeKind::kCompute) rr.compute_s += n.dur_us * scale * 1e-6;
    }
    double prev = 0.0;
    rr.iteration_times_s.assign(niters, 0.0);
    std::vector<double> mine;
    for (size_t i = 0; i < niters; ++i) {
      if (!has[i]) continue;
      double d = (end[i] - prev) * 1e-6;
      prev = end[i];
      rr.iteration_times_s[i] = d;
      mine.push_back(d);
      iter_max[i] = std::max(iter_max[i], d);
    }
    rr.iteration_time_s = Median(mine);
    for (uint32_t s = 0; s < cp.cls->comm_slots.size(); ++s) {
      double w = wait_slot[r_slot_off[r] + s];
      if (!cp.slot_used[s]) continue;
      uint32_t comm = slot_comm[r_slot_off[r] + s];
      const std::string& desc = t.comms[comm].desc;
      std::string key = desc.empty() ? "comm" + std::to_string(t.comms[comm].id) : desc;
      bool merged = false;
      for (auto& e : rr.wait_by_comm) {
        if (e.first == key) {
          e.second += w * 1e-6;
          merged = true;
        }
      }
      if (!merged) rr.wait_by_comm.emplace_back(key, w * 1e-6);
    }
    auto& wo = waited_on[r];
    std::sort(wo.begin(), wo.end(), [](auto& a, auto& b) { return a.second > b.second || (a.second == b.second && a.first < b.first); });
    for (size_t i = 0; i < wo.size() && i < 3; ++i) rr.waited_on.push_back(WaitOn{wo[i].first, wo[i].second * 1e-6});
    res.makespan_s = std::max(res.makespan_s, rr.end_s);
  }
  res.iteration_times_s = iter_max;
  res.iteration_time_s = Median(iter_max);
  res.comms.resize(t.comms.size());
  for (uint32_t ci = 0; ci < t.comms.size(); ++ci) {
    const trace::Comm& c = t.comms[ci];
    const CommStats& st = comm_stats[ci];
    CommResult& cr = res.comms[ci];
    cr.id = c.id;
    cr.desc = c.desc;
    cr.nranks = static_cast<int>(c.ranks.size());
    cr.nnodes = shapes[comm_shape[ci]].nnodes;
    cr.calls = st.calls;
    cr.bytes = st.bytes;
    cr.time_s = st.time_us * 1e-6;
    cr.wait_s = st.wait_us * 1e-6;
    int best = -1;
    for (int i = 0; i < kLabelCount; ++i) {
      if (!st.label_calls[i]) continue;
      cr.algorithms.emplace_back(LabelName(i), st.label_calls[i]);
      if (best < 0 || st.label_time[i] > st.label_time[best]) best = i;
    }
    if (best >= 0) cr.algorithm = LabelName(best);
  }
}

void Simulator::Impl::BuildCriticalPath() {
  const size_t world = t.ranks.size();
  int32_t rank = -1;
  uint32_t flat = kNone;
  double best = -1;
  for (size_t r = 0; r < world; ++r) {
    const ClassPlan& cp = classes[r_cls[r]];
    const double* fin = finish.data() + r_node_off[r];
    for (uint32_t i = 0; i < cp.nodes.size(); ++i) {
      if (fin[i] > best) {
        best = fin[i];
        rank = static_cast<int32_t>(r);
        flat = i;
      }
    }
  }
  if (rank < 0) return;
  struct Step {
    int32_t rank;
    uint32_t flat;
    double start, end;
    bool comm;
  };
  std::vector<Step> steps;
  CriticalPath& cpth = res.critical_path;
  cpth.length_s = best * 1e-6;
  uint64_t guard = total_events + 16;
  while (flat != kNone && guard-- > 0) {
    const ClassPlan& cp = classes[r_cls[rank]];
    const FlatNode& n = cp.nodes[flat];
    double fin = finish[r_node_off[rank] + flat];
    uint32_t pred;
    double arr = Arrival(rank, flat, &pred);
    if (n.kind == NodeKind::kCompute) {
      steps.push_back({rank, flat, arr, fin, false});
      flat = pred;
      continue;
    }
    // Communication: the path came through whoever arrived last.
    uint32_t comm = slot_comm[r_slot_off[rank] + n.slot];
    int32_t last = rank;
    uint32_t last_flat = flat;
    double last_arr = arr;
    if (n.kind == NodeKind::kColl) {
      for (int32_t m : t.comms[comm].ranks) {
        uint32_t slot = SlotOf(m, comm);
        uint32_t mf = classes[r_cls[m]].slot_colls[slot][n.seq];
        double a = Arrival(m, mf);
        if (a > last_arr) {
          last_arr = a;
          last = m;
          last_flat = mf;
        }
      }
    } else {
      int32_t me = slot_commrank[r_slot_off[rank] + n.slot];
      int32_t peer = t.comms[comm].ranks[n.peer];
      uint32_t pslot = SlotOf(peer, comm);
      const ClassPlan& pc = classes[r_cls[peer]];
      NodeKind want = n.kind == NodeKind::kSend ? NodeKind::kRecv : NodeKind::kSend;
      // An eager send came after its own inputs only; an eager receive after the send when the data arrived
      // after the receive was posted (its finish is later than its arrival), else after its own inputs.
      const bool eager = Eager(comm, n.bytes);
      const bool through_peer = !eager || (n.kind == NodeKind::kRecv && fin > arr);
      for (uint32_t pf = 0; through_peer && pf < pc.nodes.size(); ++pf) {
        const FlatNode& x = pc.nodes[pf];
        if (x.kind == want && x.slot == pslot && x.peer == me && x.seq == n.seq) {
          double a = Arrival(peer, pf);
          if (eager || a > last_arr) {
            last_arr = a;
            last = peer;
            last_flat = pf;
          }
          break;
        }
      }
    }
    steps.push_back({rank, flat, last_arr, fin, true});
    rank = last;
    Arrival(last, last_flat, &pred);
    flat = pred;
  }
  std::reverse(steps.begin(), steps.end());
  cpth.nodes = steps.size();
  for (const Step& s : steps) {
    const ClassPlan& cp = classes[r_cls[s.rank]];
    const FlatNode& n = cp.nodes[s.flat];
    double d = (s.end - s.start) * 1e-6;
    (s.comm ? cpth.comm_s : cpth.compute_s) += d;
    if (cpth.ranks.empty() || cpth.ranks.back() != s.rank) {
      if (std::find(cpth.ranks.begin(), cpth.ranks.end(), s.rank) == cpth.ranks.end()) cpth.ranks.push_back(s.rank);
    }
    bool extend = !cpth.segments.empty() && cpth.segments.back().rank == s.rank &&
                  cpth.segments.back().stream == cp.cls->streams[n.stream].name;
    if (!extend) {
      PathSegment seg;
      seg.rank = s.rank;
      seg.stream = cp.cls->streams[n.stream].name;
      seg.first_node = n.src->id;
      seg.first_name = n.src->name;
      seg.start_s = s.start * 1e-6;
      cpth.segments.push_back(std::move(seg));
    }
    PathSegment& seg = cpth.segments.back();
    seg.last_node = n.src->id;
    seg.last_name = n.src->name;
    seg.end_s = s.end * 1e-6;
    seg.nodes++;
    (s.comm ? seg.comm_s : seg.compute_s) += d;
  }
}

// Trace events of one rank: `r` indexes this engine's graph, `pid` is the rank the events are shown as;
// `global` (fast path) gives the communicators of rank pid in the original graph.
void Simulator::Impl::AppendRankTrace(nlohmann::json& events, int32_t r, int32_t pid, const Impl* global) const {
  using nlohmann::json;
  const ClassPlan& cp = classes[r_cls[r]];
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", "rank " + std::to_string(pid)}}}});
  events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  for (uint32_t s = 0; s < cp.nstreams(); ++s) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", s},
                      {"args", {{"name", cp.cls->streams[s].name}}}});
  }
  const double* fin = finish.data() + r_node_off[r];
  for (uint32_t i = 0; i < cp.nodes.size(); ++i) {
    if (fin[i] < 0) continue;
    const FlatNode& n = cp.nodes[i];
    double arr = Arrival(r, i);
    json e = {{"ph", "X"}, {"pid", pid}, {"tid", n.stream}, {"ts", arr}, {"dur", fin[i] - arr}};
    std::string name = n.src->name;
    json args = {{"id", n.src->id}, {"iter", n.src->iter}};
    if (n.kind == NodeKind::kCompute) {
      if (name.empty()) name = "compute";
      e["cat"] = "compute";
    } else {
      const trace::Comm& c = global ? global->t.comms[global->fold->binding[global->fold->slot_off[pid] + n.slot]]
                                    : t.comms[slot_comm[r_slot_off[r] + n.slot]];
      if (name.empty()) {
        name = n.kind == NodeKind::kColl ? std::string(trace::ToString(n.op)) : (n.kind == NodeKind::kSend ? "send" : "recv");
      }
      e["cat"] = "comm";
      args["comm"] = c.id;
      if (!c.desc.empty()) args["desc"] = c.desc;
      args["bytes"] = n.bytes;
      args["seq"] = n.seq;
      if (n.kind != NodeKind::kColl) args["peer"] = c.ranks[n.peer];
    }
    e["name"] = name;
    e["args"] = std::move(args);
    events.push_back(std::move(e));
  }
}

nlohmann::json Simulator::Impl::ChromeTrace(const std::vector<int32_t>& ranks) const {
  using nlohmann::json;
  json events = json::array();
  if (!ran) return json{{"traceEvents", events}};
  for (int32_t r : ranks) {
    if (r < 0 || static_cast<size_t>(r) >= t.ranks.size()) continue;
    if (replica) {
      replica->AppendRankTrace(events, fold->position_of[r], r, this);
    } else {
      AppendRankTrace(events, r, r, nullptr);
    }
  }
  return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

}  // namespace prism::replay
