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

// FoldReplicas's checks and its build, in order, over their shared state: each check returns false with the
// reason in *why; Build runs only when every check passed.
class Folder {
 public:
  Folder(const trace::Trace& t, const CostModel& model, const CostModel* baseline, std::string* why)
      : t_(t), model_(model), baseline_(baseline), why_(why), world_(t.world_size), ncomms_(t.comms.size()) {}

  // Which rank is which replica's member at which position (the layout's data-parallel stride).
  bool Map() {
    if (world_ <= 0 || t_.ranks.size() != static_cast<size_t>(world_)) {
      return Refuse("rank_class does not cover the world");
    }
    const trace::Layout& l = t_.layout;
    if (l.dp < 2) return Refuse("the layout has one data-parallel replica (dp = " + std::to_string(l.dp) + ")");
    int64_t stride = 0;
    if (!ReplicaStride(l, world_, &stride, why_)) return false;
    R_ = l.dp;
    P_ = world_ / R_;
    const auto S = static_cast<int32_t>(stride);
    f_.replicas = R_;
    f_.positions = P_;
    f_.rank_of.resize(world_);
    f_.position_of.resize(world_);
    f_.replica_of.resize(world_);
    for (int32_t d = 0; d < R_; ++d) {
      for (int32_t p = 0; p < P_; ++p) {
        int32_t r = p % S + S * d + S * R_ * (p / S);
        f_.rank_of[d * P_ + p] = r;
        f_.position_of[r] = p;
        f_.replica_of[r] = d;
      }
    }
    return true;
  }

  // Classes: every replica runs the same class at every position.
  bool Classes() {
    f_.slot_off.resize(world_ + 1);
    for (int32_t r = 0; r < world_; ++r) {
      const trace::RankBinding& b = t_.ranks[r];
      if (b.cls >= t_.classes.size()) {
        return Refuse("rank " + std::to_string(r) + " names class " + std::to_string(b.cls) + ", which does not exist");
      }
      if (b.comms.size() != t_.classes[b.cls].comm_slots.size()) {
        return Refuse("rank " + std::to_string(r) + " binds " + std::to_string(b.comms.size()) + " comms for " +
                      std::to_string(t_.classes[b.cls].comm_slots.size()) + " slots");
      }
      f_.slot_off[r] = slots_;
      slots_ += static_cast<uint32_t>(b.comms.size());
    }
    f_.slot_off[world_] = slots_;
    for (int32_t r = 0; r < world_; ++r) {
      int32_t r0 = f_.rank_of[f_.position_of[r]];
      if (t_.ranks[r].cls != t_.ranks[r0].cls) {
        return Refuse(RankName(r) + " runs class '" + t_.classes[t_.ranks[r].cls].name + "' but rank " +
                      std::to_string(r0) +
                      ", its counterpart in replica 0, runs '" + t_.classes[t_.ranks[r0].cls].name + "'");
      }
    }
    return true;
  }

  // Slots that carry communication, and which carry send/receive.
  bool SlotUsage() {
    f_.slot_used.resize(t_.classes.size());
    slot_p2p_.resize(t_.classes.size());
    for (size_t ci = 0; ci < t_.classes.size(); ++ci) {
      const trace::RoleClass& c = t_.classes[ci];
      f_.slot_used[ci].assign(c.comm_slots.size(), 0);
      slot_p2p_[ci].assign(c.comm_slots.size(), 0);
      for (const trace::Stream& s : c.streams) {
        for (const trace::Node& n : s.nodes) {
          const bool comm = n.kind == trace::NodeKind::kColl || n.kind == trace::NodeKind::kSend ||
                            n.kind == trace::NodeKind::kRecv;
          if (!comm) continue;
          if (n.comm_slot >= c.comm_slots.size()) {
            return Refuse("class '" + c.name + "' has a node on a slot it does not declare");
          }
          f_.slot_used[ci][n.comm_slot] = 1;
          if (n.kind != trace::NodeKind::kColl) slot_p2p_[ci][n.comm_slot] = 1;
        }
      }
    }
    return true;
  }

  // Communicators and bindings.
  bool Bindings() {
    comm_index_.reserve(ncomms_);
    for (uint32_t c = 0; c < ncomms_; ++c) {
      if (!comm_index_.emplace(t_.comms[c].id, c).second) {
        return Refuse("comm id " + std::to_string(t_.comms[c].id) + " appears twice");
      }
    }
    std::vector<uint32_t> stamp(world_, kNone);
    for (uint32_t c = 0; c < ncomms_; ++c) {
      for (int32_t m : t_.comms[c].ranks) {
        if (m < 0 || m >= world_) {
          return Refuse(CommName(t_.comms[c]) + " has member " + std::to_string(m) + ", outside the world");
        }
        if (stamp[m] == c) return Refuse(CommName(t_.comms[c]) + " lists rank " + std::to_string(m) + " twice");
        stamp[m] = c;
      }
    }
    f_.binding.assign(slots_, kNone);
    for (int32_t r = 0; r < world_; ++r) {
      const trace::RankBinding& b = t_.ranks[r];
      for (uint32_t s = 0; s < b.comms.size(); ++s) {
        auto it = comm_index_.find(b.comms[s]);
        if (it == comm_index_.end()) {
          if (f_.slot_used[b.cls][s]) {
            return Refuse("rank " + std::to_string(r) + " binds unknown comm " + std::to_string(b.comms[s]));
          }
          continue;
        }
        for (uint32_t s2 = 0; s2 < s; ++s2) {
          if (f_.binding[f_.slot_off[r] + s2] == it->second) {
            return Refuse("rank " + std::to_string(r) + " binds one comm to two slots");
          }
        }
        f_.binding[f_.slot_off[r] + s] = it->second;
      }
    }
    // member_slot_[c][k]: the used slot at which member k binds c (kNone: it does not).
    member_slot_.resize(ncomms_);
    active_.assign(ncomms_, 0);
    std::vector<uint8_t> matched(slots_, 0);
    for (uint32_t c = 0; c < ncomms_; ++c) {
      const auto& members = t_.comms[c].ranks;
      member_slot_[c].assign(members.size(), kNone);
      for (size_t k = 0; k < members.size(); ++k) {
        int32_t m = members[k];
        for (uint32_t s = 0; s < t_.ranks[m].comms.size(); ++s) {
          if (UsedBinding(m, s) == c) {
            member_slot_[c][k] = s;
            matched[f_.slot_off[m] + s] = 1;
            active_[c] = 1;
          }
        }
      }
    }
    for (int32_t r = 0; r < world_; ++r) {
      for (uint32_t s = 0; s < t_.ranks[r].comms.size(); ++s) {
        uint32_t c = UsedBinding(r, s);
        if (c != kNone && !matched[f_.slot_off[r] + s]) {
          return Refuse("rank " + std::to_string(r) + " uses " + CommName(t_.comms[c]) +
                        " but is not one of its members");
        }
      }
    }
    return true;
  }

  // Inside one replica, or across replicas at one position (then collectives only, every member on one slot).
  bool Spans() {
    crosses_.assign(ncomms_, 0);
    for (uint32_t c = 0; c < ncomms_; ++c) {
      if (!active_[c]) continue;
      const trace::Comm& cm = t_.comms[c];
      const int32_t first = cm.ranks.front();
      bool one_replica = true, one_position = true;
      for (int32_t m : cm.ranks) {
        one_replica = one_replica && f_.replica_of[m] == f_.replica_of[first];
        one_position = one_position && f_.position_of[m] == f_.position_of[first];
      }
      if (one_replica) continue;
      if (!one_position) {
        return Refuse(CommName(cm) + " spans replicas and joins ranks of different positions (only groups such as "
                      "DATA_PARALLEL, whose members all hold one position, may span replicas)");
      }
      crosses_[c] = 1;
      for (size_t k = 0; k < cm.ranks.size(); ++k) {
        uint32_t s = member_slot_[c][k];
        if (s == kNone || s != member_slot_[c][0]) {
          return Refuse(CommName(cm) + " spans replicas but rank " + std::to_string(cm.ranks[k]) +
                        (s == kNone ? " does not use it"
                                    : " binds it to another slot than rank " + std::to_string(first)));
        }
        if (slot_p2p_[t_.ranks[cm.ranks[k]].cls][s]) {
          return Refuse(CommName(cm) + " spans replicas and carries send/receive");
        }
      }
    }
    return true;
  }

  // Counterparts: the communicator a rank uses on a slot stands in for the one its replica-0 counterpart uses.
  bool Counterparts() {
    std::vector<const Topology*> topos{&model_.topology()};
    if (baseline_) topos.push_back(&baseline_->topology());
    rep_.assign(ncomms_, kNone);
    for (int32_t d = 0; d < R_; ++d) {  // Why replica 0 first: its communicators stand for themselves
      for (int32_t p = 0; p < P_; ++p) {
        const int32_t r = f_.rank_of[d * P_ + p], r0 = f_.rank_of[p];
        for (uint32_t s = 0; s < t_.ranks[r].comms.size(); ++s) {
          const uint32_t c = UsedBinding(r, s);
          if (c == kNone) continue;
          const uint32_t c0 = UsedBinding(r0, s);
          if (rep_[c] != kNone) {
            if (rep_[c] != c0) return Refuse(CommName(t_.comms[c]) + " stands for two communicators of replica 0");
            continue;
          }
          const trace::Comm& a = t_.comms[c];
          const trace::Comm& b = t_.comms[c0];
          auto differ = [&](const std::string& what) {
            return Refuse(CommName(a) + " of " + RankName(r) + " and " + CommName(b) + " of rank " +
                          std::to_string(r0) +
                          " (replica 0) differ: " + what);
          };
          if (a.desc != b.desc) return differ("descriptions");
          if (crosses_[c] != crosses_[c0]) return differ("one spans replicas, the other does not");
          if (a.ranks.size() != b.ranks.size()) {
            return differ("sizes " + std::to_string(a.ranks.size()) + " and " + std::to_string(b.ranks.size()));
          }
          if (!crosses_[c]) {
            for (size_t k = 0; k < a.ranks.size(); ++k) {
              const bool counterparts =
                  f_.position_of[a.ranks[k]] == f_.position_of[b.ranks[k]] && member_slot_[c][k] == member_slot_[c0][k];
              if (!counterparts) {
                return differ("member " + std::to_string(k) + " is rank " + std::to_string(a.ranks[k]) + " vs rank " +
                              std::to_string(b.ranks[k]) + ", not counterparts on the same slot");
              }
            }
            for (const Topology* topo : topos) {
              if (NodePattern(*topo, a.ranks) != NodePattern(*topo, b.ranks)) {
                return differ("placement on nodes (topology " + topo->name + ")");
              }
            }
          } else {
            auto same_shape = [&](const CostModel& m) {
              return m.Shape(a.ranks.data(), a.ranks.size()) == m.Shape(b.ranks.data(), b.ranks.size());
            };
            if (!same_shape(model_) || (baseline_ && !same_shape(*baseline_))) {
              return differ("placement on nodes");
            }
          }
          rep_[c] = c0;
        }
      }
    }
    return true;
  }

  // What-if compute factors: equal for every replica at each position.
  bool Scales(const std::vector<std::pair<int32_t, double>>& compute_scale) {
    std::vector<double> scale(world_, 1.0);
    for (auto [r, x] : compute_scale) {
      if (r < 0 || r >= world_) return Refuse("straggler rank " + std::to_string(r) + " is outside the world");
      scale[r] = x;
    }
    for (int32_t r = 0; r < world_; ++r) {
      int32_t r0 = f_.rank_of[f_.position_of[r]];
      if (scale[r] != scale[r0]) {
        int32_t who = scale[r] != 1.0 ? r : r0;
        const int32_t other = who == r ? r0 : r;
        return Refuse("a what-if singles out rank " + std::to_string(who) + " (compute " + Factor(scale[who]) +
                      ", rank " + std::to_string(other) + " in another replica " + Factor(scale[other]) + ")");
      }
    }
    for (int32_t p = 0; p < P_; ++p) {
      if (scale[f_.rank_of[p]] != 1.0) f_.compute_scale.emplace_back(p, scale[f_.rank_of[p]]);
    }
    return true;
  }

  // Replica 0 as a graph.
  void Build() {
    const trace::Layout& l = t_.layout;
    trace::Trace& g = f_.replica;
    g.world_size = P_;
    g.layout = l;
    g.layout.dp = 1;
    g.topology = t_.topology;
    std::vector<uint32_t> replica_comm(ncomms_, kNone);
    uint32_t max_id = 0;
    for (uint32_t c = 0; c < ncomms_; ++c) {
      max_id = std::max(max_id, t_.comms[c].id);
      if (rep_[c] != c) continue;
      trace::Comm rc;
      rc.id = t_.comms[c].id;
      rc.desc = t_.comms[c].desc;
      if (crosses_[c]) {
        rc.ranks.push_back(f_.position_of[t_.comms[c].ranks.front()]);
      } else {
        for (int32_t m : t_.comms[c].ranks) rc.ranks.push_back(f_.position_of[m]);
      }
      replica_comm[c] = static_cast<uint32_t>(g.comms.size());
      g.comms.push_back(std::move(rc));
      f_.placement_comm.push_back(t_.comms[c].ranks);
    }
    // Why a fresh id for unused slots_: the engine ignores an unknown comm on a slot without communication.
    const uint32_t unbound = max_id + 1;
    g.ranks.resize(P_);
    f_.placement_rank.resize(P_);
    for (int32_t p = 0; p < P_; ++p) {
      const int32_t r = f_.rank_of[p];
      trace::RankBinding& b = g.ranks[p];
      b.cls = t_.ranks[r].cls;
      b.comms.resize(t_.ranks[r].comms.size());
      for (uint32_t s = 0; s < b.comms.size(); ++s) {
        uint32_t c = UsedBinding(r, s);
        b.comms[s] = c == kNone ? unbound : t_.comms[c].id;
      }
      f_.placement_rank[p] = r;
    }
    f_.comm_of.assign(ncomms_, kNone);
    f_.comm_nnodes.resize(ncomms_);
    for (uint32_t c = 0; c < ncomms_; ++c) {
      if (rep_[c] != kNone) f_.comm_of[c] = replica_comm[rep_[c]];
      f_.comm_nnodes[c] = model_.Shape(t_.comms[c].ranks.data(), t_.comms[c].ranks.size()).nnodes;
    }
  }

  ReplicaFold Take() { return std::move(f_); }

 private:
  bool Refuse(std::string s) {
    *why_ = std::move(s);
    return false;
  }
  std::string RankName(int32_t r) const {
    return "rank " + std::to_string(r) + " (replica " + std::to_string(f_.replica_of[r]) + ")";
  }
  // The communicator rank r binds at slot s when the slot carries communication (kNone otherwise).
  uint32_t UsedBinding(int32_t r, uint32_t s) const {
    return f_.slot_used[t_.ranks[r].cls][s] ? f_.binding[f_.slot_off[r] + s] : kNone;
  }

  const trace::Trace& t_;
  const CostModel& model_;
  const CostModel* baseline_;
  std::string* why_;
  const int32_t world_;
  const size_t ncomms_;
  int32_t R_ = 0, P_ = 0;  // replicas, positions per replica
  uint32_t slots_ = 0;     // communicator slots over all ranks
  ReplicaFold f_;
  std::vector<std::vector<uint8_t>> slot_p2p_;         // [class][slot]: carries send/receive
  std::unordered_map<uint32_t, uint32_t> comm_index_;  // comm id -> index in t_.comms
  std::vector<std::vector<uint32_t>> member_slot_;     // [comm][member]: the used slot it binds it at (kNone: none)
  std::vector<uint8_t> active_;                        // [comm]: some member uses it
  std::vector<uint8_t> crosses_;                       // [comm]: spans replicas (at one position)
  std::vector<uint32_t> rep_;                          // [comm]: the replica-0 communicator it stands for
};

}  // namespace

std::string CommKey(const trace::Comm& c) { return c.desc.empty() ? "comm" + std::to_string(c.id) : c.desc; }

bool FoldReplicas(const trace::Trace& t, const CostModel& model, const CostModel* baseline,
                  const std::vector<std::pair<int32_t, double>>& compute_scale, ReplicaFold* out, std::string* why) {
  Folder folder(t, model, baseline, why);
  if (!folder.Map() || !folder.Classes() || !folder.SlotUsage() || !folder.Bindings() || !folder.Spans() ||
      !folder.Counterparts() || !folder.Scales(compute_scale))
    return false;
  folder.Build();
  *out = folder.Take();
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
