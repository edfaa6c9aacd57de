#include "replay/symmetric.h"

#include <algorithm>
#include <cstdio>
#include <unordered_map>

namespace prism::replay {
namespace {

constexpr uint32_t kNone = trace::kNoIndex;

std::string CommName(const trace::Comm& c) {
  return "comm " + std::to_string(c.id) + (c.desc.empty() ? "" : " (" + c.desc + ")");
}

std::string Factor(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "x%g", f);
  return buf;
}

// Distance between consecutive data-parallel replicas in rank numbers, from the layout's order (leftmost
// dimension fastest). Why ep and etp count 1: they subdivide dp and tp for expert layers (Megatron's expert
// rank generator); the dense layout is tp*cp*dp*pp = world_size.
bool ReplicaStride(const trace::Layout& l, int32_t world, int64_t* stride, std::string* why) {
  if (l.tp < 1 || l.cp < 1 || l.pp < 1 || l.dp < 1) {
    *why = "the layout has a dimension below 1";
    return false;
  }
  int64_t s = 1;
  bool seen_dp = false;
  std::vector<std::string> seen;
  size_t start = 0;
  while (start <= l.order.size()) {
    size_t dash = l.order.find('-', start);
    std::string tok = l.order.substr(start, dash == std::string::npos ? std::string::npos : dash - start);
    start = dash == std::string::npos ? l.order.size() + 1 : dash + 1;
    if (std::find(seen.begin(), seen.end(), tok) != seen.end()) {
      *why = "layout order \"" + l.order + "\" names " + tok + " twice";
      return false;
    }
    seen.push_back(tok);
    int64_t size = 0;
    if (tok == "tp") size = l.tp;
    else if (tok == "cp") size = l.cp;
    else if (tok == "pp") size = l.pp;
    else if (tok == "ep" || tok == "etp") size = 1;
    else if (tok == "dp") {
      seen_dp = true;
      *stride = s;
      size = l.dp;
    } else {
      *why = "layout order \"" + l.order + "\" has an unknown dimension \"" + tok + "\"";
      return false;
    }
    s *= size;
  }
  for (const char* need : {"tp", "cp", "pp"}) {
    int size = std::string(need) == "tp" ? l.tp : std::string(need) == "cp" ? l.cp : l.pp;
    if (size > 1 && std::find(seen.begin(), seen.end(), need) == seen.end()) {
      *why = "layout order \"" + l.order + "\" has no " + need + " although " + need + " = " + std::to_string(size);
      return false;
    }
  }
  if (!seen_dp) {
    *why = "layout order \"" + l.order + "\" has no dp dimension";
    return false;
  }
  if (s != world) {
    *why = "layout tp*cp*dp*pp = " + std::to_string(s) + " is not the world size " + std::to_string(world);
    return false;
  }
  return true;
}

// Which members share a node: member k -> index of the first member on its node. Equal patterns give equal
// shapes (CostModel::Shape) and equal send/receive costs between any two members (CostModel::SendRecv).
std::vector<int32_t> NodePattern(const Topology& topo, const std::vector<int32_t>& ranks) {
  std::vector<int32_t> pat(ranks.size());
  std::vector<std::pair<int, int32_t>> first;  // node -> first member (communicators are small: linear search)
  for (size_t k = 0; k < ranks.size(); ++k) {
    int node = topo.NodeOf(ranks[k]);
    auto it = std::find_if(first.begin(), first.end(), [&](const auto& e) { return e.first == node; });
    if (it == first.end()) {
      first.emplace_back(node, static_cast<int32_t>(k));
      pat[k] = static_cast<int32_t>(k);
    } else {
      pat[k] = it->second;
    }
  }
  return pat;
}

}  // namespace

std::string CommKey(const trace::Comm& c) { return c.desc.empty() ? "comm" + std::to_string(c.id) : c.desc; }

bool FoldReplicas(const trace::Trace& t, const CostModel& model, const CostModel* baseline,
                  const std::vector<std::pair<int32_t, double>>& compute_scale, ReplicaFold* out, std::string* why) {
  auto refuse = [why](std::string s) {
    *why = std::move(s);
    return false;
  };
  ReplicaFold f;
  const int32_t world = t.world_size;
  if (world <= 0 || t.ranks.size() != static_cast<size_t>(world)) return refuse("rank_class does not cover the world");
  const trace::Layout& l = t.layout;
  if (l.dp < 2) return refuse("the layout has one data-parallel replica (dp = " + std::to_string(l.dp) + ")");
  int64_t stride = 0;
  if (!ReplicaStride(l, world, &stride, why)) return false;
  const int32_t R = l.dp, P = world / R;
  const auto S = static_cast<int32_t>(stride);
  f.replicas = R;
  f.positions = P;
  f.rank_of.resize(world);
  f.position_of.resize(world);
  f.replica_of.resize(world);
  for (int32_t d = 0; d < R; ++d) {
    for (int32_t p = 0; p < P; ++p) {
      int32_t r = p % S + S * d + S * R * (p / S);
      f.rank_of[d * P + p] = r;
      f.position_of[r] = p;
      f.replica_of[r] = d;
    }
  }
  auto rank_name = [&](int32_t r) {
    return "rank " + std::to_string(r) + " (replica " + std::to_string(f.replica_of[r]) + ")";
  };

  // Classes: every replica runs the same class at every position.
  f.slot_off.resize(world + 1);
  uint32_t slots = 0;
  for (int32_t r = 0; r < world; ++r) {
    const trace::RankBinding& b = t.ranks[r];
    if (b.cls >= t.classes.size()) return refuse("rank " + std::to_string(r) + " names class " + std::to_string(b.cls) + ", which does not exist");
    if (b.comms.size() != t.classes[b.cls].comm_slots.size()) {
      return refuse("rank " + std::to_string(r) + " binds " + std::to_string(b.comms.size()) + " comms for " +
                    std::to_string(t.classes[b.cls].comm_slots.size()) + " slots");
    }
    f.slot_off[r] = slots;
    slots += static_cast<uint32_t>(b.comms.size());
  }
  f.slot_off[world] = slots;
  for (int32_t r = 0; r < world; ++r) {
    int32_t r0 = f.rank_of[f.position_of[r]];
    if (t.ranks[r].cls != t.ranks[r0].cls) {
      return refuse(rank_name(r) + " runs class '" + t.classes[t.ranks[r].cls].name + "' but rank " + std::to_string(r0) +
                    ", its counterpart in replica 0, runs '" + t.classes[t.ranks[r0].cls].name + "'");
    }
  }
  // Slots that carry communication, and which carry send/receive.
  f.slot_used.resize(t.classes.size());
  std::vector<std::vector<uint8_t>> slot_p2p(t.classes.size());
  for (size_t ci = 0; ci < t.classes.size(); ++ci) {
    const trace::RoleClass& c = t.classes[ci];
    f.slot_used[ci].assign(c.comm_slots.size(), 0);
    slot_p2p[ci].assign(c.comm_slots.size(), 0);
    for (const trace::Stream& s : c.streams) {
      for (const trace::Node& n : s.nodes) {
        if (n.kind != trace::NodeKind::kColl && n.kind != trace::NodeKind::kSend && n.kind != trace::NodeKind::kRecv) continue;
        if (n.comm_slot >= c.comm_slots.size()) return refuse("class '" + c.name + "' has a node on a slot it does not declare");
        f.slot_used[ci][n.comm_slot] = 1;
        if (n.kind != trace::NodeKind::kColl) slot_p2p[ci][n.comm_slot] = 1;
      }
    }
  }

  // Communicators and bindings.
  const size_t ncomms = t.comms.size();
  std::unordered_map<uint32_t, uint32_t> comm_index;
  comm_index.reserve(ncomms);
  for (uint32_t c = 0; c < ncomms; ++c) {
    if (!comm_index.emplace(t.comms[c].id, c).second) return refuse("comm id " + std::to_string(t.comms[c].id) + " appears twice");
  }
  std::vector<uint32_t> stamp(world, kNone);
  for (uint32_t c = 0; c < ncomms; ++c) {
    for (int32_t m : t.comms[c].ranks) {
      if (m < 0 || m >= world) return refuse(CommName(t.comms[c]) + " has member " + std::to_string(m) + ", outside the world");
      if (stamp[m] == c) return refuse(CommName(t.comms[c]) + " lists rank " + std::to_string(m) + " twice");
      stamp[m] = c;
    }
  }
  f.binding.assign(slots, kNone);
  for (int32_t r = 0; r < world; ++r) {
    const trace::RankBinding& b = t.ranks[r];
    for (uint32_t s = 0; s < b.comms.size(); ++s) {
      auto it = comm_index.find(b.comms[s]);
      if (it == comm_index.end()) {
        if (f.slot_used[b.cls][s]) return refuse("rank " + std::to_string(r) + " binds unknown comm " + std::to_string(b.comms[s]));
        continue;
      }
      for (uint32_t s2 = 0; s2 < s; ++s2) {
        if (f.binding[f.slot_off[r] + s2] == it->second) return refuse("rank " + std::to_string(r) + " binds one comm to two slots");
      }
      f.binding[f.slot_off[r] + s] = it->second;
    }
  }
  auto used_binding = [&](int32_t r, uint32_t s) {
    return f.slot_used[t.ranks[r].cls][s] ? f.binding[f.slot_off[r] + s] : kNone;
  };
  // member_slot[c][k]: the used slot at which member k binds c (kNone: it does not).
  std::vector<std::vector<uint32_t>> member_slot(ncomms);
  std::vector<uint8_t> active(ncomms, 0);
  std::vector<uint8_t> matched(slots, 0);
  for (uint32_t c = 0; c < ncomms; ++c) {
    const auto& members = t.comms[c].ranks;
    member_slot[c].assign(members.size(), kNone);
    for (size_t k = 0; k < members.size(); ++k) {
      int32_t m = members[k];
      for (uint32_t s = 0; s < t.ranks[m].comms.size(); ++s) {
        if (used_binding(m, s) == c) {
          member_slot[c][k] = s;
          matched[f.slot_off[m] + s] = 1;
          active[c] = 1;
        }
      }
    }
  }
  for (int32_t r = 0; r < world; ++r) {
    for (uint32_t s = 0; s < t.ranks[r].comms.size(); ++s) {
      uint32_t c = used_binding(r, s);
      if (c != kNone && !matched[f.slot_off[r] + s]) {
        return refuse("rank " + std::to_string(r) + " uses " + CommName(t.comms[c]) + " but is not one of its members");
      }
    }
  }
  // Inside one replica, or across replicas at one position (then collectives only, every member on one slot).
  std::vector<uint8_t> crosses(ncomms, 0);
  for (uint32_t c = 0; c < ncomms; ++c) {
    if (!active[c]) continue;
    const trace::Comm& cm = t.comms[c];
    const int32_t first = cm.ranks.front();
    bool one_replica = true, one_position = true;
    for (int32_t m : cm.ranks) {
      one_replica = one_replica && f.replica_of[m] == f.replica_of[first];
      one_position = one_position && f.position_of[m] == f.position_of[first];
    }
    if (one_replica) continue;
    if (!one_position) {
      return refuse(CommName(cm) + " spans replicas and joins ranks of different positions (only groups such as "
                    "DATA_PARALLEL, whose members all hold one position, may span replicas)");
    }
    crosses[c] = 1;
    for (size_t k = 0; k < cm.ranks.size(); ++k) {
      uint32_t s = member_slot[c][k];
      if (s == kNone || s != member_slot[c][0]) {
        return refuse(CommName(cm) + " spans replicas but rank " + std::to_string(cm.ranks[k]) +
                      (s == kNone ? " does not use it" : " binds it to another slot than rank " + std::to_string(first)));
      }
      if (slot_p2p[t.ranks[cm.ranks[k]].cls][s]) return refuse(CommName(cm) + " spans replicas and carries send/receive");
    }
  }

  // Counterparts: the communicator a rank uses on a slot stands in for the one its replica-0 counterpart uses.
  std::vector<const Topology*> topos{&model.topology()};
  if (baseline) topos.push_back(&baseline->topology());
  std::vector<uint32_t> rep(ncomms, kNone);
  for (int32_t d = 0; d < R; ++d) {  // Why replica 0 first: its communicators stand for themselves
    for (int32_t p = 0; p < P; ++p) {
      const int32_t r = f.rank_of[d * P + p], r0 = f.rank_of[p];
      for (uint32_t s = 0; s < t.ranks[r].comms.size(); ++s) {
        const uint32_t c = used_binding(r, s);
        if (c == kNone) continue;
        const uint32_t c0 = used_binding(r0, s);
        if (rep[c] != kNone) {
          if (rep[c] != c0) return refuse(CommName(t.comms[c]) + " stands for two communicators of replica 0");
          continue;
        }
        const trace::Comm& a = t.comms[c];
        const trace::Comm& b = t.comms[c0];
        auto differ = [&](const std::string& what) {
          return refuse(CommName(a) + " of " + rank_name(r) + " and " + CommName(b) + " of rank " + std::to_string(r0) +
                        " (replica 0) differ: " + what);
        };
        if (a.desc != b.desc) return differ("descriptions");
        if (crosses[c] != crosses[c0]) return differ("one spans replicas, the other does not");
        if (a.ranks.size() != b.ranks.size()) return differ("sizes " + std::to_string(a.ranks.size()) + " and " + std::to_string(b.ranks.size()));
        if (!crosses[c]) {
          for (size_t k = 0; k < a.ranks.size(); ++k) {
            if (f.position_of[a.ranks[k]] != f.position_of[b.ranks[k]] || member_slot[c][k] != member_slot[c0][k]) {
              return differ("member " + std::to_string(k) + " is rank " + std::to_string(a.ranks[k]) + " vs rank " +
                            std::to_string(b.ranks[k]) + ", not counterparts on the same slot");
            }
          }
          for (const Topology* topo : topos) {
            if (NodePattern(*topo, a.ranks) != NodePattern(*topo, b.ranks)) return differ("placement on nodes (topology " + topo->name + ")");
          }
        } else {
          if (!(model.Shape(a.ranks.data(), a.ranks.size()) == model.Shape(b.ranks.data(), b.ranks.size())) ||
              (baseline && !(baseline->Shape(a.ranks.data(), a.ranks.size()) == baseline->Shape(b.ranks.data(), b.ranks.size())))) {
            return differ("placement on nodes");
          }
        }
        rep[c] = c0;
      }
    }
  }

  // What-if compute factors: equal for every replica at each position.
  std::vector<double> scale(world, 1.0);
  for (auto [r, x] : compute_scale) {
    if (r < 0 || r >= world) return refuse("straggler rank " + std::to_string(r) + " is outside the world");
    scale[r] = x;
  }
  for (int32_t r = 0; r < world; ++r) {
    int32_t r0 = f.rank_of[f.position_of[r]];
    if (scale[r] != scale[r0]) {
      int32_t who = scale[r] != 1.0 ? r : r0;
      return refuse("a what-if singles out rank " + std::to_string(who) + " (compute " + Factor(scale[who]) + ", rank " +
                    std::to_string(who == r ? r0 : r) + " in another replica " + Factor(scale[who == r ? r0 : r]) + ")");
    }
  }
  for (int32_t p = 0; p < P; ++p) {
    if (scale[f.rank_of[p]] != 1.0) f.compute_scale.emplace_back(p, scale[f.rank_of[p]]);
  }

  // Replica 0 as a graph.
  trace::Trace& g = f.replica;
  g.world_size = P;
  g.layout = l;
  g.layout.dp = 1;
  g.topology = t.topology;
  std::vector<uint32_t> replica_comm(ncomms, kNone);
  uint32_t max_id = 0;
  for (uint32_t c = 0; c < ncomms; ++c) {
    max_id = std::max(max_id, t.comms[c].id);
    if (rep[c] != c) continue;
    trace::Comm rc;
    rc.id = t.comms[c].id;
    rc.desc = t.comms[c].desc;
    if (crosses[c]) {
      rc.ranks.push_back(f.position_of[t.comms[c].ranks.front()]);
    } else {
      for (int32_t m : t.comms[c].ranks) rc.ranks.push_back(f.position_of[m]);
    }
    replica_comm[c] = static_cast<uint32_t>(g.comms.size());
    g.comms.push_back(std::move(rc));
    f.placement_comm.push_back(t.comms[c].ranks);
  }
  // Why a fresh id for unused slots: the engine ignores an unknown comm on a slot without communication.
  const uint32_t unbound = max_id + 1;
  g.ranks.resize(P);
  f.placement_rank.resize(P);
  for (int32_t p = 0; p < P; ++p) {
    const int32_t r = f.rank_of[p];
    trace::RankBinding& b = g.ranks[p];
    b.cls = t.ranks[r].cls;
    b.comms.resize(t.ranks[r].comms.size());
    for (uint32_t s = 0; s < b.comms.size(); ++s) {
      uint32_t c = used_binding(r, s);
      b.comms[s] = c == kNone ? unbound : t.comms[c].id;
    }
    f.placement_rank[p] = r;
  }
  f.comm_of.assign(ncomms, kNone);
  f.comm_nnodes.resize(ncomms);
  for (uint32_t c = 0; c < ncomms; ++c) {
    if (rep[c] != kNone) f.comm_of[c] = replica_comm[rep[c]];
    f.comm_nnodes[c] = model.Shape(t.comms[c].ranks.data(), t.comms[c].ranks.size()).nnodes;
  }
  *out = std::move(f);
  return true;
}

SimResult UnfoldResult(const trace::Trace& t, const ReplicaFold& f, const SimResult& rr) {
  // The replica's outcome, times and warnings hold for the world as they are (the replica ran without the fold, so
  // it has no symmetric_refused; wall_s is the caller's). Its ranks, communicators and critical path are mapped below.
  SimResult res = rr;
  res.symmetric = true;
  res.replicas = f.replicas;
  res.simulated_events = rr.events;
  res.events = rr.events * static_cast<uint64_t>(f.replicas);

  const int32_t world = t.world_size, P = f.positions;
  res.ranks.assign(world, RankResult{});
  std::vector<std::pair<std::string, std::string>> rename;
  for (int32_t r = 0; r < world; ++r) {
    const int32_t p = f.position_of[r], d = f.replica_of[r], r0 = f.rank_of[p];
    RankResult& x = res.ranks[r];
    x = rr.ranks[p];
    x.rank = r;
    for (WaitOn& w : x.waited_on) w.rank = f.rank_of[d * P + w.rank];
    if (d == 0) continue;
    // Communicators without a description are named by id, which differs between counterparts.
    rename.clear();
    const auto& used = f.slot_used[t.ranks[r].cls];
    for (uint32_t s = 0; s < used.size(); ++s) {
      uint32_t c = f.binding[f.slot_off[r] + s], c0 = f.binding[f.slot_off[r0] + s];
      if (!used[s] || c == kNone || c0 == kNone) continue;
      if (t.comms[c].desc.empty()) rename.emplace_back(CommKey(t.comms[c0]), CommKey(t.comms[c]));
    }
    for (auto& [key, s] : x.wait_by_comm) {
      for (const auto& [from, to] : rename) {
        if (key == from) {
          key = to;
          break;
        }
      }
    }
  }

  res.comms.assign(t.comms.size(), CommResult{});
  for (size_t c = 0; c < t.comms.size(); ++c) {
    CommResult& x = res.comms[c];
    if (f.comm_of[c] != kNone) x = rr.comms[f.comm_of[c]];
    x.id = t.comms[c].id;
    x.desc = t.comms[c].desc;
    x.nranks = static_cast<int>(t.comms[c].ranks.size());
    x.nnodes = f.comm_nnodes[c];
  }

  for (int32_t& r : res.critical_path.ranks) r = f.rank_of[r];
  for (PathSegment& s : res.critical_path.segments) s.rank = f.rank_of[s.rank];
  return res;
}

}  // namespace prism::replay
