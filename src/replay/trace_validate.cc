#include "replay/trace_validate.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace prism::replay {
namespace {

using trace::CollOp;
using trace::Node;
using trace::NodeKind;
using trace::RoleClass;
using trace::Trace;

class Validator {
 public:
  Validator(const Trace& t, const ValidationOptions& opts) : t_(t), opts_(opts) {}

  std::vector<std::string> Run() {
    if (t_.world_size <= 0) {
      Error("world_size is " + std::to_string(t_.world_size) + ": must be positive");
      return errors_;
    }
    CheckLayout();
    CheckComms();
    CheckClasses();
    if (!Full()) CheckBindings();
    if (errors_.empty()) CheckCollectiveSequences();
    if (errors_.empty()) CheckP2p();
    return errors_;
  }

 private:
  bool Full() const { return errors_.size() >= opts_.max_errors; }
  void Error(std::string msg) {
    if (!Full()) errors_.push_back(std::move(msg));
  }

  std::string Where(int rank, uint32_t cls, size_t stream, const Node& n) const {
    const RoleClass& c = t_.classes[cls];
    std::string s;
    if (rank >= 0) s = "rank " + std::to_string(rank) + " ";
    s += "class '" + c.name + "' stream '" + c.streams[stream].name + "' node " + std::to_string(n.id);
    if (!n.name.empty()) s += " (" + n.name + ")";
    return s;
  }

  void CheckLayout() {
    const trace::Layout& l = t_.layout;
    for (auto [name, v] : {std::pair{"tp", l.tp}, {"pp", l.pp}, {"dp", l.dp}, {"cp", l.cp}, {"ep", l.ep}, {"etp", l.etp}}) {
      if (v <= 0) Error(std::string("layout.") + name + " is " + std::to_string(v) + ": must be positive");
    }
    long product = static_cast<long>(l.tp) * l.pp * l.dp * l.cp;
    if (product != t_.world_size) {
      Error("layout tp*pp*dp*cp = " + std::to_string(l.tp) + "*" + std::to_string(l.pp) + "*" + std::to_string(l.dp) +
            "*" + std::to_string(l.cp) + " = " + std::to_string(product) + " but world_size is " +
            std::to_string(t_.world_size));
    }
  }

  void CheckComms() {
    for (size_t i = 0; i < t_.comms.size(); ++i) {
      const trace::Comm& c = t_.comms[i];
      std::string where = "comm " + std::to_string(c.id) + (c.desc.empty() ? "" : " (" + c.desc + ")");
      if (!comm_index_.emplace(c.id, i).second) Error(where + ": duplicate comm id");
      if (c.ranks.empty()) Error(where + ": has no member ranks");
      std::unordered_map<int32_t, int32_t> pos;
      for (size_t k = 0; k < c.ranks.size(); ++k) {
        int32_t r = c.ranks[k];
        if (r < 0 || r >= t_.world_size) {
          Error(where + ": member rank " + std::to_string(r) + " is outside the world (size " +
                std::to_string(t_.world_size) + ")");
        } else if (!pos.emplace(r, static_cast<int32_t>(k)).second) {
          Error(where + ": rank " + std::to_string(r) + " appears twice");
        }
      }
      comm_pos_.push_back(std::move(pos));
    }
  }

  void CheckClasses() {
    for (uint32_t ci = 0; ci < t_.classes.size(); ++ci) {
      const RoleClass& c = t_.classes[ci];
      std::unordered_map<uint32_t, size_t> stream_of;  // node id -> stream index
      std::unordered_map<uint32_t, size_t> coll_stream_of_slot;
      for (size_t si = 0; si < c.streams.size(); ++si) {
        for (const Node& n : c.streams[si].nodes) {
          if (!stream_of.emplace(n.id, si).second) Error(Where(-1, ci, si, n) + ": duplicate node id");
          CheckNode(ci, si, n);
          (void)coll_stream_of_slot;  // collectives of one slot may span streams: sequenced by node id
        }
      }
      for (size_t si = 0; si < c.streams.size(); ++si) {
        for (const Node& n : c.streams[si].nodes) {
          for (uint32_t a : n.after) {
            if (a == n.id) {
              Error(Where(-1, ci, si, n) + ": \"after\" names the node itself");
            } else if (!stream_of.count(a)) {
              Error(Where(-1, ci, si, n) + ": dangling \"after\" " + std::to_string(a) + " (no such node in the class)");
            }
          }
        }
      }
    }
  }

  void CheckNode(uint32_t ci, size_t si, const Node& n) {
    const RoleClass& c = t_.classes[ci];
    // Why a lambda: the place is only spelled out for an error (building it for every node cost more than the checks).
    auto where = [&] { return Where(-1, ci, si, n); };
    switch (n.kind) {
      case NodeKind::kCompute:
        if (!(n.dur_us >= 0)) Error(where() + ": compute node without a duration (dur_us)");
        return;
      case NodeKind::kColl:
        if (n.op == CollOp::kInvalid) Error(where() + ": collective without a valid op");
        break;
      case NodeKind::kSend:
      case NodeKind::kRecv:
        if (n.peer < 0) Error(where() + ": p2p node without a peer");
        break;
      default:
        Error(where() + ": invalid node kind");
        return;
    }
    if (n.comm_slot >= c.comm_slots.size()) Error(where() + ": comm slot out of range");
    if (n.dtype == trace::DType::kInvalid) Error(where() + ": invalid dtype");
    if (n.op == CollOp::kBroadcast || n.op == CollOp::kReduce) {
      if (n.root < 0) Error(where() + ": " + std::string(trace::ToString(n.op)) + " without a root");
    }
  }

  void CheckBindings() {
    if (t_.ranks.size() != static_cast<size_t>(t_.world_size)) {
      Error("rank_class has " + std::to_string(t_.ranks.size()) + " entries but world_size is " +
            std::to_string(t_.world_size));
      return;
    }
    for (int r = 0; r < t_.world_size && !Full(); ++r) {
      const trace::RankBinding& b = t_.ranks[r];
      if (b.cls >= t_.classes.size()) {
        Error("rank " + std::to_string(r) + ": class " + std::to_string(b.cls) + " does not exist (" +
              std::to_string(t_.classes.size()) + " classes)");
        continue;
      }
      const RoleClass& c = t_.classes[b.cls];
      if (b.comms.size() != c.comm_slots.size()) {
        Error("rank " + std::to_string(r) + ": binds " + std::to_string(b.comms.size()) + " comms but class '" +
              c.name + "' has " + std::to_string(c.comm_slots.size()) + " comm slots");
        continue;
      }
      std::unordered_set<uint32_t> seen;
      for (size_t s = 0; s < b.comms.size(); ++s) {
        auto it = comm_index_.find(b.comms[s]);
        if (it == comm_index_.end()) {
          Error("rank " + std::to_string(r) + ": slot '" + c.comm_slots[s] + "' bound to unknown comm " +
                std::to_string(b.comms[s]));
        } else if (!comm_pos_[it->second].count(r)) {
          Error("rank " + std::to_string(r) + ": slot '" + c.comm_slots[s] + "' bound to comm " +
                std::to_string(b.comms[s]) + " which does not contain rank " + std::to_string(r));
        } else if (!seen.insert(b.comms[s]).second) {
          Error("rank " + std::to_string(r) + ": comm " + std::to_string(b.comms[s]) + " bound to two slots");
        }
      }
    }
  }

  // Position of `rank` in the comm bound to `slot` for that rank.
  const trace::Comm& BoundComm(int rank, uint32_t slot, size_t* index) const {
    *index = comm_index_.at(t_.ranks[rank].comms[slot]);
    return t_.comms[*index];
  }

  // The k-th collective of a comm must agree across members. Ranks of one class share their node lists, so
  // compare per (class, slot) sequence once per distinct pair in each comm.
  void CheckCollectiveSequences() {
    std::map<std::pair<uint32_t, uint32_t>, std::vector<std::pair<size_t, const Node*>>> seqs;
    auto sequence = [&](uint32_t cls, uint32_t slot) -> const std::vector<std::pair<size_t, const Node*>>& {
      auto [it, fresh] = seqs.try_emplace({cls, slot});
      if (fresh) {
        const RoleClass& c = t_.classes[cls];
        for (size_t si = 0; si < c.streams.size(); ++si) {
          for (const Node& n : c.streams[si].nodes) {
            if (n.kind == NodeKind::kColl && n.comm_slot == slot) it->second.push_back({si, &n});
          }
        }
      }
      return it->second;
    };
    for (size_t ci = 0; ci < t_.comms.size() && !Full(); ++ci) {
      const trace::Comm& comm = t_.comms[ci];
      std::map<std::pair<uint32_t, uint32_t>, int> pairs;  // (class, slot) -> first rank with it
      for (int32_t r : comm.ranks) {
        const trace::RankBinding& b = t_.ranks[r];
        for (uint32_t s = 0; s < b.comms.size(); ++s) {
          if (b.comms[s] == comm.id) pairs.emplace(std::pair{b.cls, s}, r);
        }
      }
      if (pairs.size() < 2) continue;
      auto first = pairs.begin();
      const auto& ref = sequence(first->first.first, first->first.second);
      for (auto it = std::next(first); it != pairs.end() && !Full(); ++it) {
        const auto& other = sequence(it->first.first, it->first.second);
        CompareSequences(comm, first->second, first->first.first, ref, it->second, it->first.first, other);
      }
    }
  }

  void CompareSequences(const trace::Comm& comm, int ra, uint32_t ca, const std::vector<std::pair<size_t, const Node*>>& a,
                        int rb, uint32_t cb, const std::vector<std::pair<size_t, const Node*>>& b) {
    std::string cname = "comm " + std::to_string(comm.id) + (comm.desc.empty() ? "" : " (" + comm.desc + ")");
    size_t n = std::min(a.size(), b.size());
    for (size_t k = 0; k < n; ++k) {
      const Node& x = *a[k].second;
      const Node& y = *b[k].second;
      std::string what;
      if (x.op != y.op) {
        what = "op " + std::string(trace::ToString(x.op)) + " vs " + std::string(trace::ToString(y.op));
      } else if (x.bytes != y.bytes && x.op != CollOp::kAllToAll) {
        what = "bytes " + std::to_string(x.bytes) + " vs " + std::to_string(y.bytes);
      } else if (x.dtype != y.dtype) {
        what = "dtype " + std::string(trace::ToString(x.dtype)) + " vs " + std::string(trace::ToString(y.dtype));
      } else if (x.root != y.root) {
        what = "root " + std::to_string(x.root) + " vs " + std::to_string(y.root);
      }
      if (!what.empty()) {
        Error(cname + ": members disagree at sequence " + std::to_string(k) + " (" + what + "): " +
              Where(ra, ca, a[k].first, x) + " vs " + Where(rb, cb, b[k].first, y));
        return;
      }
    }
    if (a.size() != b.size()) {
      bool a_longer = a.size() > b.size();
      const auto& longer = a_longer ? a : b;
      Error(cname + ": rank " + std::to_string(a_longer ? ra : rb) + " issues " + std::to_string(longer.size()) +
            " collectives but rank " + std::to_string(a_longer ? rb : ra) + " only " +
            std::to_string(std::min(a.size(), b.size())) + "; first unmatched: " +
            Where(a_longer ? ra : rb, a_longer ? ca : cb, longer[n].first, *longer[n].second));
    }
  }

  // The k-th send from src to dst on a comm pairs with the k-th receive at dst from src, with the same size.
  // Why per class: ranks of one class share their node lists, so each class's sends and receives are grouped
  // once by (slot, peer, direction); every rank then compares its groups with its peers' (no per-message
  // hashing or copying, which cost 2/3 of the validator on 8192 ranks).
  struct Msg {
    size_t stream;
    const Node* node;
  };
  struct Group {
    uint32_t slot;
    int32_t peer;
    bool send;
    std::vector<Msg> msgs;  // in issue order (stream by stream), as the engine numbers them
  };

  const std::vector<Group>& ClassGroups(uint32_t cls) {
    if (p2p_groups_.empty()) {
      p2p_groups_.resize(t_.classes.size());
      p2p_built_.assign(t_.classes.size(), 0);
    }
    std::vector<Group>& gs = p2p_groups_[cls];
    if (p2p_built_[cls]) return gs;
    p2p_built_[cls] = 1;
    const RoleClass& c = t_.classes[cls];
    for (size_t si = 0; si < c.streams.size(); ++si) {
      for (const Node& n : c.streams[si].nodes) {
        if (n.kind != NodeKind::kSend && n.kind != NodeKind::kRecv) continue;
        bool send = n.kind == NodeKind::kSend;
        auto it = std::find_if(gs.begin(), gs.end(), [&](const Group& g) {
          return g.slot == n.comm_slot && g.peer == n.peer && g.send == send;
        });
        if (it == gs.end()) it = gs.insert(gs.end(), Group{n.comm_slot, n.peer, send, {}});
        it->msgs.push_back({si, &n});
      }
    }
    return gs;
  }

  void CheckP2p() {
    for (int r = 0; r < t_.world_size; ++r) {
      const trace::RankBinding& b = t_.ranks[r];
      const std::vector<Group>& gs = ClassGroups(b.cls);
      for (const Group& g : gs) {
        size_t ci;
        const trace::Comm& comm = BoundComm(r, g.slot, &ci);
        int32_t me = comm_pos_[ci].at(r);
        if (g.peer >= static_cast<int32_t>(comm.ranks.size()) || g.peer == me) {
          for (const Msg& m : g.msgs) {
            Error(Where(r, b.cls, m.stream, *m.node) + ": peer " + std::to_string(g.peer) + " is " +
                  (g.peer == me ? "the rank itself" : "outside comm " + std::to_string(comm.id) + " (size " +
                                                          std::to_string(comm.ranks.size()) + ")"));
          }
          continue;
        }
        // The peer's group for this channel: its slot bound to this comm, peer == me, the other direction.
        const int other = comm.ranks[g.peer];
        const trace::RankBinding& ob = t_.ranks[other];
        const Group* og = nullptr;
        for (uint32_t s = 0; s < ob.comms.size() && !og; ++s) {
          if (ob.comms[s] != comm.id) continue;
          for (const Group& x : ClassGroups(ob.cls)) {
            if (x.slot == s && x.peer == me && x.send != g.send) {
              og = &x;
              break;
            }
          }
        }
        if (!g.send && og) continue;  // checked from the sending side
        static const std::vector<Msg> kNone;
        const std::vector<Msg>& sends = g.send ? g.msgs : kNone;
        const std::vector<Msg>& recvs = g.send ? (og ? og->msgs : kNone) : g.msgs;
        const int src = g.send ? r : other, dst = g.send ? other : r;
        size_t n = std::min(sends.size(), recvs.size());
        for (size_t k = 0; k < n; ++k) {
          if (sends[k].node->bytes != recvs[k].node->bytes) {
            Error("p2p size mismatch at message " + std::to_string(k) + ": " +
                  Where(src, t_.ranks[src].cls, sends[k].stream, *sends[k].node) + " sends " +
                  std::to_string(sends[k].node->bytes) + " bytes, " +
                  Where(dst, t_.ranks[dst].cls, recvs[k].stream, *recvs[k].node) + " receives " +
                  std::to_string(recvs[k].node->bytes));
            break;
          }
        }
        if (sends.size() != recvs.size()) {
          bool more_sends = sends.size() > recvs.size();
          const Msg& m = more_sends ? sends[n] : recvs[n];
          int mr = more_sends ? src : dst;
          Error(std::string(more_sends ? "unmatched send" : "unmatched recv") + ": " +
                Where(mr, t_.ranks[mr].cls, m.stream, *m.node) + "; rank " + std::to_string(src) + " sends " +
                std::to_string(sends.size()) + " messages to rank " + std::to_string(dst) + " on comm " +
                std::to_string(comm.id) + ", which posts " + std::to_string(recvs.size()) + " receives");
        }
        if (Full()) return;
      }
    }
  }

  const Trace& t_;
  ValidationOptions opts_;
  std::vector<std::string> errors_;
  std::unordered_map<uint32_t, size_t> comm_index_;            // comm id -> index in t_.comms
  std::vector<std::unordered_map<int32_t, int32_t>> comm_pos_;  // per comm index: global rank -> comm rank
  std::vector<std::vector<Group>> p2p_groups_;                 // per class: its sends/receives by channel
  std::vector<uint8_t> p2p_built_;                             // per class: p2p_groups_ filled
};

}  // namespace

std::vector<std::string> ValidateTrace(const Trace& t, const ValidationOptions& opts) {
  return Validator(t, opts).Run();
}

}  // namespace prism::replay
