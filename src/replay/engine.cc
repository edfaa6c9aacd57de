#include "replay/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_map>

#include "replay/symmetric.h"

namespace prism::replay {

using trace::CollOp;
using trace::DType;
using trace::Node;
using trace::NodeKind;

namespace {

constexpr uint32_t kNone = trace::kNoIndex;

// A node as the engine walks it: the fields it needs, packed, in stream order.
struct FlatNode {
  NodeKind kind = NodeKind::kInvalid;
  CollOp op = CollOp::kInvalid;
  DType dtype = DType::kInvalid;
  uint32_t stream = 0;
  uint32_t slot = kNone;
  int32_t peer = -1;
  int32_t root = -1;
  uint32_t seq = 0;       // coll: index among the slot's collectives; p2p: among (slot, peer, direction)
  uint32_t iter_idx = 0;  // index into SimResult::iteration_ids
  uint64_t bytes = 0;
  double dur_us = -1.0;
  const Node* src = nullptr;
};

struct ClassPlan {
  const trace::RoleClass* cls = nullptr;
  std::vector<FlatNode> nodes;
  std::vector<uint32_t> stream_begin;           // nstreams + 1 offsets into nodes
  std::vector<uint32_t> after_off, after_idx;   // node -> flat nodes it waits for
  std::vector<uint32_t> wake_off, wake_stream;  // node -> streams that wait for it (to retry when it finishes)
  std::vector<std::vector<uint32_t>> slot_colls;  // slot -> its collectives (flat), in sequence order
  std::vector<uint8_t> slot_used;
  uint32_t nstreams() const { return static_cast<uint32_t>(stream_begin.size() - 1); }
};

struct PendingColl {
  uint32_t arrived = 0;
  int32_t first_rank = -1;
  uint32_t first_flat = 0;
  int32_t last_rank = -1;  // the member that arrived last (the one everybody waited for)
  double max_arrival = 0.0;
};

struct P2PKey {
  uint32_t comm;
  int32_t src, dst;
  uint32_t seq;
  bool operator==(const P2PKey&) const = default;
};
struct P2PKeyHash {
  size_t operator()(const P2PKey& k) const {
    uint64_t h = k.comm * 0x9E3779B97F4A7C15ull;
    h ^= (static_cast<uint64_t>(static_cast<uint32_t>(k.src)) << 32 | static_cast<uint32_t>(k.dst)) + 0x7F4A7C15 +
         (h << 6) + (h >> 2);
    h ^= k.seq * 0xC2B2AE3D27D4EB4Full + (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};
struct PendingP2P {
  int32_t rank;
  uint32_t flat;
  double arrival;
  double ready = -1.0;  // an eager send that completed first: when its data is at the receiver
};

struct CostKey {
  uint32_t shape;
  CollOp op;
  DType dtype;
  uint64_t bytes;
  bool operator==(const CostKey&) const = default;
};
struct CostKeyHash {
  size_t operator()(const CostKey& k) const {
    uint64_t h = k.bytes * 0x9E3779B97F4A7C15ull;
    h ^= (static_cast<uint64_t>(k.shape) << 16 | static_cast<uint64_t>(k.op) << 8 | static_cast<uint64_t>(k.dtype)) +
         (h << 6) + (h >> 2);
    return static_cast<size_t>(h);
  }
};

// Labels counted per communicator: NCCL's 21 algorithm/protocol pairs, then alpha-beta, p2p, recorded.
constexpr int kLabelCount = kNumAlgos * kNumProtos + 3;
int LabelIndex(const CommCost& c) {
  switch (c.method) {
    case CostMethod::kNccl: return static_cast<int>(c.algo) * kNumProtos + static_cast<int>(c.proto);
    case CostMethod::kAlphaBeta: return kNumAlgos * kNumProtos;
    case CostMethod::kP2P: return kNumAlgos * kNumProtos + 1;
    default: return kNumAlgos * kNumProtos + 2;
  }
}
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

struct CommStats {
  uint64_t calls = 0, bytes = 0;
  double time_us = 0.0, wait_us = 0.0;
  uint64_t label_calls[kLabelCount] = {};
  double label_time[kLabelCount] = {};
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string NodeLabel(const FlatNode& n) {
  std::string s = "node " + std::to_string(n.src->id);
  if (!n.src->name.empty()) s += " '" + n.src->name + "'";
  return s;
}

}  // namespace

struct Simulator::Impl {
  const trace::Trace& t;
  const CostModel& model;
  EngineOptions opt;
  // The role classes (the fast path's replica graph reads the original graph's in place).
  const std::vector<trace::RoleClass>& tclasses;

  // Plan (shared by ranks of a class).
  std::vector<ClassPlan> classes;
  std::vector<uint32_t> iter_values;
  std::unordered_map<uint32_t, uint32_t> comm_index;  // comm id -> index in t.comms
  // Per rank.
  std::vector<uint32_t> r_cls;
  std::vector<uint64_t> r_node_off;
  std::vector<uint32_t> r_stream_off;
  std::vector<uint32_t> r_slot_off;
  std::vector<uint32_t> slot_comm;      // (rank, slot) -> comm index (kNone: unbound)
  std::vector<int32_t> slot_commrank;   // (rank, slot) -> position in that comm (-1: not a member)
  std::vector<float> compute_scale;     // per rank (empty: all 1)
  // Per comm.
  std::vector<uint32_t> comm_shape;     // comm index -> shape id
  std::vector<CommShape> shapes;
  std::vector<CommTuning> tunings;      // per shape
  std::vector<CommTuning> base_tunings; // per shape, baseline model (what-if scaling of recorded durations)
  std::vector<uint64_t> inst_base;
  std::vector<uint32_t> inst_count;
  std::vector<CommStats> comm_stats;

  // State.
  std::vector<double> finish;    // per (rank, node); < 0: not finished
  std::vector<uint32_t> cursor;  // per (rank, stream): flat index of its next node
  std::vector<uint8_t> posted;   // per (rank, stream): its head node waits for a match
  std::vector<uint8_t> queued;
  std::vector<uint64_t> work;    // (rank << 32) | stream
  std::vector<PendingColl> pending;
  std::unordered_map<P2PKey, PendingP2P, P2PKeyHash> p2p;
  std::unordered_map<CostKey, CommCost, CostKeyHash> cost_cache;
  std::vector<double> wait_slot;                        // per (rank, slot), us
  std::vector<std::vector<std::pair<int32_t, double>>> waited_on;  // per rank: (rank, us)
  uint64_t events = 0, total_events = 0, next_progress = 0;
  bool ran = false;

  SimResult res;

  // Symmetric fast path: the fold and the engine that replays replica 0 (null: the full replay ran).
  std::unique_ptr<ReplicaFold> fold;
  std::unique_ptr<Impl> replica;

  trace::SendCompletion send_mode;

  Impl(const trace::Trace& tr, const CostModel& m, EngineOptions o, const std::vector<trace::RoleClass>* cls = nullptr)
      : t(tr), model(m), opt(std::move(o)), tclasses(cls ? *cls : tr.classes),
        send_mode(EffectiveSendCompletion(opt, tr)) {}

  bool Fail(SimResult::Status st, std::string msg) {
    if (res.status == SimResult::Status::kOk) {
      res.status = st;
      res.error = std::move(msg);
    }
    return false;
  }

  // ---- Plan ----------------------------------------------------------------------------------------------

  bool BuildClass(uint32_t ci, ClassPlan* cp) {
    const trace::RoleClass& c = tclasses[ci];
    cp->cls = &c;
    std::unordered_map<uint32_t, uint32_t> flat_of;
    cp->stream_begin.push_back(0);
    for (uint32_t si = 0; si < c.streams.size(); ++si) {
      for (const Node& n : c.streams[si].nodes) {
        uint32_t flat = static_cast<uint32_t>(cp->nodes.size());
        if (!flat_of.emplace(n.id, flat).second) {
          return Fail(SimResult::Status::kBadGraph,
                      "class '" + c.name + "' stream '" + c.streams[si].name + "': duplicate node id " + std::to_string(n.id));
        }
        auto it = std::lower_bound(iter_values.begin(), iter_values.end(), n.iter);
        cp->nodes.push_back({.kind = n.kind, .op = n.op, .dtype = n.dtype, .stream = si, .slot = n.comm_slot,
                             .peer = n.peer, .root = n.root,
                             .iter_idx = static_cast<uint32_t>(it - iter_values.begin()), .bytes = n.bytes,
                             .dur_us = n.dur_us, .src = &n});
      }
      cp->stream_begin.push_back(static_cast<uint32_t>(cp->nodes.size()));
    }
    const size_t nn = cp->nodes.size();
    cp->slot_colls.assign(c.comm_slots.size(), {});
    cp->slot_used.assign(c.comm_slots.size(), 0);
    std::unordered_map<uint64_t, uint32_t> p2p_seq;  // (slot, peer, direction) -> next seq
    std::vector<std::vector<uint32_t>> waiters(nn);
    cp->after_off.push_back(0);
    for (uint32_t i = 0; i < nn; ++i) {
      FlatNode& f = cp->nodes[i];
      const Node& n = *f.src;
      auto where = [&] { return "class '" + c.name + "' stream '" + c.streams[f.stream].name + "' " + NodeLabel(f); };
      switch (n.kind) {
        case NodeKind::kCompute:
          if (!(f.dur_us >= 0)) f.dur_us = 0.0;  // Why: unknown compute time counts as none (validator warns)
          break;
        case NodeKind::kColl:
        case NodeKind::kSend:
        case NodeKind::kRecv:
          if (f.slot >= c.comm_slots.size()) return Fail(SimResult::Status::kBadGraph, where() + ": comm slot out of range");
          cp->slot_used[f.slot] = 1;
          if (n.kind == NodeKind::kColl) {
            if (f.op == CollOp::kInvalid) return Fail(SimResult::Status::kBadGraph, where() + ": collective without an op");
            f.seq = static_cast<uint32_t>(cp->slot_colls[f.slot].size());
            cp->slot_colls[f.slot].push_back(i);
          } else {
            if (f.peer < 0) return Fail(SimResult::Status::kBadGraph, where() + ": p2p node without a peer");
            uint64_t key = (static_cast<uint64_t>(f.slot) << 33) | (static_cast<uint64_t>(f.peer) << 1) |
                           (n.kind == NodeKind::kSend ? 1u : 0u);
            f.seq = p2p_seq[key]++;
          }
          break;
        default: return Fail(SimResult::Status::kBadGraph, where() + ": invalid node kind");
      }
      for (uint32_t a : n.after) {
        auto it = flat_of.find(a);
        if (it == flat_of.end()) {
          return Fail(SimResult::Status::kBadGraph, where() + ": \"after\" names node " + std::to_string(a) + ", which does not exist");
        }
        if (it->second == i) return Fail(SimResult::Status::kBadGraph, where() + ": \"after\" names the node itself");
        cp->after_idx.push_back(it->second);
        waiters[it->second].push_back(f.stream);
      }
      cp->after_off.push_back(static_cast<uint32_t>(cp->after_idx.size()));
    }
    // A slot whose collectives lie on several streams is sequenced by node id (docs/trace-format.md), not by
    // stream order: torch issues one communicator's blocking collectives on the caller's current stream.
    for (auto& colls : cp->slot_colls) {
      bool multi = false;
      for (uint32_t k : colls) multi = multi || cp->nodes[k].stream != cp->nodes[colls.front()].stream;
      if (!multi) continue;
      std::stable_sort(colls.begin(), colls.end(),
                       [&](uint32_t a, uint32_t b) { return cp->nodes[a].src->id < cp->nodes[b].src->id; });
      for (uint32_t q = 0; q < colls.size(); ++q) cp->nodes[colls[q]].seq = q;
    }
    cp->wake_off.push_back(0);
    for (uint32_t i = 0; i < nn; ++i) {
      auto& w = waiters[i];
      std::sort(w.begin(), w.end());
      w.erase(std::unique(w.begin(), w.end()), w.end());
      for (uint32_t s : w) cp->wake_stream.push_back(s);
      cp->wake_off.push_back(static_cast<uint32_t>(cp->wake_stream.size()));
    }
    return true;
  }

  bool Plan() {
    const size_t world = static_cast<size_t>(std::max(t.world_size, 0));
    if (world == 0) return Fail(SimResult::Status::kBadGraph, "world_size is 0");
    if (t.ranks.size() != world) {
      return Fail(SimResult::Status::kBadGraph, "rank_class has " + std::to_string(t.ranks.size()) +
                                                    " entries for world_size " + std::to_string(world));
    }
    // Iterations present.
    for (const auto& c : tclasses) {
      for (const auto& s : c.streams) {
        for (const auto& n : s.nodes) iter_values.push_back(n.iter);
      }
    }
    std::sort(iter_values.begin(), iter_values.end());
    iter_values.erase(std::unique(iter_values.begin(), iter_values.end()), iter_values.end());
    if (iter_values.empty()) iter_values.push_back(0);

    classes.resize(tclasses.size());
    for (uint32_t ci = 0; ci < tclasses.size(); ++ci) {
      if (!BuildClass(ci, &classes[ci])) return false;
    }
    for (uint32_t i = 0; i < t.comms.size(); ++i) {
      if (!comm_index.emplace(t.comms[i].id, i).second) {
        return Fail(SimResult::Status::kBadGraph, "comm id " + std::to_string(t.comms[i].id) + " appears twice");
      }
    }
    // Ranks.
    r_cls.resize(world);
    r_node_off.resize(world + 1);
    r_stream_off.resize(world + 1);
    r_slot_off.resize(world + 1);
    uint64_t node_off = 0;
    uint32_t stream_off = 0, slot_off = 0;
    for (size_t r = 0; r < world; ++r) {
      const trace::RankBinding& b = t.ranks[r];
      if (b.cls >= classes.size()) {
        return Fail(SimResult::Status::kBadGraph, "rank " + std::to_string(r) + ": class " + std::to_string(b.cls) + " does not exist");
      }
      const ClassPlan& cp = classes[b.cls];
      if (b.comms.size() != cp.cls->comm_slots.size()) {
        return Fail(SimResult::Status::kBadGraph, "rank " + std::to_string(r) + ": binds " + std::to_string(b.comms.size()) +
                                                      " comms but class '" + cp.cls->name + "' has " +
                                                      std::to_string(cp.cls->comm_slots.size()) + " slots");
      }
      r_cls[r] = b.cls;
      r_node_off[r] = node_off;
      r_stream_off[r] = stream_off;
      r_slot_off[r] = slot_off;
      node_off += cp.nodes.size();
      stream_off += cp.nstreams();
      slot_off += static_cast<uint32_t>(b.comms.size());
    }
    r_node_off[world] = node_off;
    r_stream_off[world] = stream_off;
    r_slot_off[world] = slot_off;
    total_events = node_off;

    slot_comm.assign(slot_off, kNone);
    slot_commrank.assign(slot_off, -1);
    for (size_t r = 0; r < world; ++r) {
      const trace::RankBinding& b = t.ranks[r];
      const ClassPlan& cp = classes[b.cls];
      for (uint32_t s = 0; s < b.comms.size(); ++s) {
        auto it = comm_index.find(b.comms[s]);
        if (it == comm_index.end()) {
          if (!cp.slot_used[s]) continue;
          return Fail(SimResult::Status::kBadGraph, "rank " + std::to_string(r) + ": slot '" + cp.cls->comm_slots[s] +
                                                        "' bound to unknown comm " + std::to_string(b.comms[s]));
        }
        for (uint32_t s2 = 0; s2 < s; ++s2) {
          if (slot_comm[r_slot_off[r] + s2] == it->second) {
            return Fail(SimResult::Status::kBadGraph, "rank " + std::to_string(r) + ": comm " + std::to_string(b.comms[s]) +
                                                          " bound to two slots");
          }
        }
        slot_comm[r_slot_off[r] + s] = it->second;
      }
    }
    std::vector<uint32_t> seen_in(world, kNone);
    for (uint32_t ci = 0; ci < t.comms.size(); ++ci) {
      const trace::Comm& c = t.comms[ci];
      for (size_t i = 0; i < c.ranks.size(); ++i) {
        int32_t m = c.ranks[i];
        if (m < 0 || static_cast<size_t>(m) >= world) {
          return Fail(SimResult::Status::kBadGraph, "comm " + std::to_string(c.id) + ": member rank " + std::to_string(m) +
                                                        " is outside the world");
        }
        if (seen_in[m] == ci) {
          return Fail(SimResult::Status::kBadGraph, "comm " + std::to_string(c.id) + " lists rank " + std::to_string(m) + " twice");
        }
        seen_in[m] = ci;
        for (uint32_t s = r_slot_off[m]; s < r_slot_off[m + 1]; ++s) {
          if (slot_comm[s] == ci) slot_commrank[s] = static_cast<int32_t>(i);
        }
      }
    }
    for (size_t r = 0; r < world; ++r) {
      const ClassPlan& cp = classes[r_cls[r]];
      for (uint32_t s = 0; s < cp.slot_used.size(); ++s) {
        if (cp.slot_used[s] && slot_commrank[r_slot_off[r] + s] < 0) {
          return Fail(SimResult::Status::kBadGraph, "rank " + std::to_string(r) + " uses slot '" + cp.cls->comm_slots[s] +
                                                        "' (comm " + std::to_string(t.ranks[r].comms[s]) +
                                                        ") but is not one of its members");
        }
      }
    }
    // Communicators: shapes, collective instances.
    comm_shape.resize(t.comms.size());
    inst_base.resize(t.comms.size() + 1);
    inst_count.resize(t.comms.size());
    comm_stats.resize(t.comms.size());
    uint64_t base = 0;
    for (uint32_t ci = 0; ci < t.comms.size(); ++ci) {
      const trace::Comm& c = t.comms[ci];
      // Placement: the communicator's own members, or the global ones it stands for (fast path).
      const std::vector<int32_t>& place = ci < opt.placement_comm.size() ? opt.placement_comm[ci] : c.ranks;
      CommShape sh = model.Shape(place.data(), place.size());
      auto it = std::find(shapes.begin(), shapes.end(), sh);
      if (it == shapes.end()) {
        shapes.push_back(sh);
        tunings.push_back(model.Tune(sh));
        if (opt.baseline_model) base_tunings.push_back(opt.baseline_model->Tune(opt.baseline_model->Shape(place.data(), place.size())));
        it = shapes.end() - 1;
      }
      comm_shape[ci] = static_cast<uint32_t>(it - shapes.begin());
      uint32_t count = 0;
      for (int32_t m : c.ranks) {
        uint32_t slot = SlotOf(m, ci);
        if (slot != kNone) count = std::max(count, static_cast<uint32_t>(classes[r_cls[m]].slot_colls[slot].size()));
      }
      if (count > 0) {
        for (int32_t m : c.ranks) {
          if (SlotOf(m, ci) == kNone) {
            return Fail(SimResult::Status::kBadGraph, "rank " + std::to_string(m) + " is a member of comm " +
                                                          std::to_string(c.id) + ", which has collectives, but binds it to no slot");
          }
        }
      }
      inst_base[ci] = base;
      inst_count[ci] = count;
      base += count;
    }
    inst_base[t.comms.size()] = base;
    pending.assign(base, PendingColl{});
    if (!opt.compute_scale.empty()) {
      compute_scale.assign(world, 1.0f);
      for (auto [rank, f] : opt.compute_scale) {
        if (rank < 0 || static_cast<size_t>(rank) >= world) {
          return Fail(SimResult::Status::kBadGraph, "straggler rank " + std::to_string(rank) + " is outside the world (size " +
                                                        std::to_string(world) + ")");
        }
        compute_scale[rank] = static_cast<float>(f);
      }
    }
    finish.assign(node_off, -1.0);
    cursor.resize(stream_off);
    posted.assign(stream_off, 0);
    queued.assign(stream_off, 0);
    for (size_t r = 0; r < world; ++r) {
      const ClassPlan& cp = classes[r_cls[r]];
      for (uint32_t s = 0; s < cp.nstreams(); ++s) cursor[r_stream_off[r] + s] = cp.stream_begin[s];
    }
    wait_slot.assign(slot_off, 0.0);
    waited_on.assign(world, {});
    return true;
  }

  uint32_t SlotOf(int32_t rank, uint32_t comm) const {
    for (uint32_t s = r_slot_off[rank]; s < r_slot_off[rank + 1]; ++s) {
      if (slot_comm[s] == comm) return s - r_slot_off[rank];
    }
    return kNone;
  }

  // ---- Simulation ----------------------------------------------------------------------------------------

  void Push(int32_t rank, uint32_t stream) {
    uint32_t k = r_stream_off[rank] + stream;
    if (queued[k]) return;
    queued[k] = 1;
    work.push_back(static_cast<uint64_t>(rank) << 32 | stream);
  }

  // When the node's inputs were ready: its stream predecessor and its `after` nodes finished. pred: the node
  // that set it (kNone: none, the node could start at 0).
  double Arrival(int32_t rank, uint32_t flat, uint32_t* pred = nullptr) const {
    const ClassPlan& cp = classes[r_cls[rank]];
    const double* fin = finish.data() + r_node_off[rank];
    double arr = 0.0;
    uint32_t p = kNone;
    const FlatNode& n = cp.nodes[flat];
    if (flat > cp.stream_begin[n.stream]) {
      arr = fin[flat - 1];
      p = flat - 1;
    }
    for (uint32_t i = cp.after_off[flat]; i < cp.after_off[flat + 1]; ++i) {
      uint32_t a = cp.after_idx[i];
      if (p == kNone || fin[a] > arr) {
        p = a;
        arr = std::max(arr, fin[a]);
      }
    }
    if (pred) *pred = p;
    return arr;
  }

  void Finished(int32_t rank, uint32_t flat, double end) {
    const ClassPlan& cp = classes[r_cls[rank]];
    finish[r_node_off[rank] + flat] = end;
    ++events;
    for (uint32_t i = cp.wake_off[flat]; i < cp.wake_off[flat + 1]; ++i) Push(rank, cp.wake_stream[i]);
    if (opt.progress && events >= next_progress) {
      opt.progress(events, total_events);
      next_progress = events + (1u << 20);
    }
  }

  // Completes a member's posted comm node: records its finish, frees its stream.
  void CompleteMember(int32_t rank, uint32_t flat, double end) {
    const FlatNode& n = classes[r_cls[rank]].nodes[flat];
    uint32_t k = r_stream_off[rank] + n.stream;
    posted[k] = 0;
    cursor[k] = flat + 1;
    Finished(rank, flat, end);
    Push(rank, n.stream);
  }

  void AddWait(int32_t rank, uint32_t slot, int32_t on, double us) {
    if (!(us > 0)) return;
    wait_slot[r_slot_off[rank] + slot] += us;
    auto& v = waited_on[rank];
    for (auto& e : v) {
      if (e.first == on) {
        e.second += us;
        return;
      }
    }
    v.emplace_back(on, us);
  }

  const CommCost& ModelCost(uint32_t comm, CollOp op, DType dtype, uint64_t bytes) {
    CostKey key{comm_shape[comm], op, dtype, bytes};
    auto it = cost_cache.find(key);
    if (it != cost_cache.end()) return it->second;
    CommCost c = model.Collective(tunings[key.shape], op, bytes, dtype);
    if (c.fallback) {
      res.warnings.push_back(std::string("NCCL_ALGO/NCCL_PROTO leave no algorithm for ") + std::string(trace::ToString(op)) +
                             " on a communicator of " + std::to_string(shapes[key.shape].nranks) +
                             " ranks: NCCL would fail this call; Ring/Simple assumed");
    }
    return cost_cache.emplace(key, c).first->second;
  }

  // A recorded duration, rescaled when a what-if changed the network (model now / model at baseline).
  double Rescaled(double recorded_us, double model_now_us, double model_base_us) const {
    if (!opt.baseline_model || !(model_base_us > 0)) return recorded_us;
    return recorded_us * model_now_us / model_base_us;
  }

  bool PostColl(int32_t rank, uint32_t flat, double arrival) {
    const ClassPlan& cp = classes[r_cls[rank]];
    const FlatNode& n = cp.nodes[flat];
    uint32_t comm = slot_comm[r_slot_off[rank] + n.slot];
    PendingColl& p = pending[inst_base[comm] + n.seq];
    if (p.arrived == 0) {
      p.first_rank = rank;
      p.first_flat = flat;
      p.max_arrival = arrival;
      p.last_rank = rank;
    } else {
      const FlatNode& f = classes[r_cls[p.first_rank]].nodes[p.first_flat];
      bool same = f.op == n.op && (n.op == CollOp::kAllToAll || f.bytes == n.bytes) && f.root == n.root;
      if (!same) {
        const trace::Comm& c = t.comms[comm];
        auto desc = [&](int32_t r, const FlatNode& x) {
          return "rank " + std::to_string(r) + " " + NodeLabel(x) + " is " + std::string(trace::ToString(x.op)) + " of " +
                 std::to_string(x.bytes) + " bytes" + (x.root >= 0 ? " root " + std::to_string(x.root) : "");
        };
        return Fail(SimResult::Status::kMismatch,
                    "collective mismatch on comm " + std::to_string(c.id) + (c.desc.empty() ? "" : " (" + c.desc + ")") +
                        " at sequence " + std::to_string(n.seq) + ": " + desc(p.first_rank, f) + ", but " + desc(rank, n));
      }
      // Why the lower rank on a tie: who everybody waited for must not depend on the order of the walk.
      if (arrival > p.max_arrival || (arrival == p.max_arrival && rank < p.last_rank)) {
        p.max_arrival = arrival;
        p.last_rank = rank;
      }
    }
    posted[r_stream_off[rank] + n.stream] = 1;
    const trace::Comm& c = t.comms[comm];
    if (++p.arrived < c.ranks.size()) return true;

    // Everybody is here: duration, then every member completes.
    double recorded = -1.0;
    if (opt.use_recorded) {
      for (int32_t m : c.ranks) {
        uint32_t slot = SlotOf(m, comm);
        const FlatNode& mn = classes[r_cls[m]].nodes[classes[r_cls[m]].slot_colls[slot][n.seq]];
        recorded = std::max(recorded, mn.dur_us);
      }
    }
    CommCost cost = ModelCost(comm, n.op, n.dtype, n.bytes);
    double dur = cost.time_us;
    if (recorded >= 0) {
      double base = opt.baseline_model
                        ? opt.baseline_model->Collective(base_tunings[comm_shape[comm]], n.op, n.bytes, n.dtype).time_us
                        : 0.0;
      dur = Rescaled(recorded, cost.time_us, base);
      cost.method = CostMethod::kRecorded;
    }
    double end = p.max_arrival + dur;
    CommStats& st = comm_stats[comm];
    st.calls++;
    st.bytes += n.bytes;
    st.time_us += dur;
    int li = LabelIndex(cost);
    st.label_calls[li]++;
    st.label_time[li] += dur;
    for (int32_t m : c.ranks) {
      uint32_t slot = SlotOf(m, comm);
      uint32_t mf = classes[r_cls[m]].slot_colls[slot][n.seq];
      double w = p.max_arrival - Arrival(m, mf);
      if (w > 0) {
        st.wait_us += w;
        AddWait(m, slot, p.last_rank, w);
      }
      CompleteMember(m, mf, end);
    }
    return true;
  }

  bool PostP2P(int32_t rank, uint32_t flat, double arrival) {
    const ClassPlan& cp = classes[r_cls[rank]];
    const FlatNode& n = cp.nodes[flat];
    uint32_t comm = slot_comm[r_slot_off[rank] + n.slot];
    int32_t me = slot_commrank[r_slot_off[rank] + n.slot];
    const trace::Comm& c = t.comms[comm];
    if (n.peer < 0 || static_cast<size_t>(n.peer) >= c.ranks.size()) {
      return Fail(SimResult::Status::kBadGraph, "rank " + std::to_string(rank) + " " + NodeLabel(n) + ": peer " +
                                                    std::to_string(n.peer) + " is outside comm " + std::to_string(c.id) +
                                                    " (size " + std::to_string(c.ranks.size()) + ")");
    }
    bool send = n.kind == NodeKind::kSend;
    P2PKey key{comm, send ? me : n.peer, send ? n.peer : me, n.seq};
    posted[r_stream_off[rank] + n.stream] = 1;
    const bool eager = Eager(comm, n.bytes);
    auto [it, inserted] = p2p.try_emplace(key, PendingP2P{rank, flat, arrival});
    if (inserted) {
      if (eager && send) {
        // The send completes now, into the receiver's buffer; its receive finds `ready` when it is posted.
        CommCost cost;
        double dur = P2PDuration(rank, c.ranks[n.peer], n.bytes, opt.use_recorded ? n.dur_us : -1.0, &cost);
        CountP2P(comm, n.bytes, dur, cost);
        it->second.ready = arrival + dur;
        CompleteMember(rank, flat, arrival + dur);
      }
      return true;
    }
    PendingP2P other = it->second;
    p2p.erase(it);
    const FlatNode& o = classes[r_cls[other.rank]].nodes[other.flat];
    if (o.kind == n.kind) {
      return Fail(SimResult::Status::kBadGraph, "rank " + std::to_string(rank) + " " + NodeLabel(n) + " and rank " +
                                                    std::to_string(other.rank) + " " + NodeLabel(o) + " are both " +
                                                    (send ? "sends" : "receives") + " of one message");
    }
    if (o.bytes != n.bytes) {
      return Fail(SimResult::Status::kMismatch, "p2p size mismatch on comm " + std::to_string(c.id) + ": rank " +
                                                    std::to_string(other.rank) + " " + NodeLabel(o) + " has " +
                                                    std::to_string(o.bytes) + " bytes, rank " + std::to_string(rank) + " " +
                                                    NodeLabel(n) + " has " + std::to_string(n.bytes));
    }
    CommStats& st = comm_stats[comm];
    if (eager) {
      // The receive completes when it is posted and the data is there; only the receiver ever waits.
      const PendingP2P mine{rank, flat, arrival};
      const PendingP2P& s = send ? mine : other;
      const PendingP2P& r = send ? other : mine;
      double ready = other.ready;
      if (send) {
        CommCost cost;
        double dur = P2PDuration(rank, other.rank, n.bytes, opt.use_recorded ? n.dur_us : -1.0, &cost);
        CountP2P(comm, n.bytes, dur, cost);
        ready = arrival + dur;
        CompleteMember(rank, flat, ready);
      }
      if (r.arrival < s.arrival) {
        st.wait_us += s.arrival - r.arrival;
        AddWait(r.rank, classes[r_cls[r.rank]].nodes[r.flat].slot, s.rank, s.arrival - r.arrival);
      }
      CompleteMember(r.rank, r.flat, std::max(r.arrival, ready));
      return true;
    }
    CommCost cost;
    double dur = P2PDuration(send ? rank : other.rank, send ? other.rank : rank, n.bytes,
                             opt.use_recorded ? std::max(n.dur_us, o.dur_us) : -1.0, &cost);
    CountP2P(comm, n.bytes, dur, cost);
    double end = std::max(arrival, other.arrival) + dur;
    if (arrival < other.arrival) {
      st.wait_us += other.arrival - arrival;
      AddWait(rank, n.slot, other.rank, other.arrival - arrival);
    } else if (other.arrival < arrival) {
      st.wait_us += arrival - other.arrival;
      AddWait(other.rank, o.slot, rank, arrival - other.arrival);
    }
    CompleteMember(other.rank, other.flat, end);
    CompleteMember(rank, flat, end);
    return true;
  }

  // Whether a message on this communicator completes eagerly (its send does not wait for the receive).
  bool Eager(uint32_t comm, uint64_t bytes) const {
    switch (send_mode) {
      case trace::SendCompletion::kEager: return true;
      case trace::SendCompletion::kNccl: return bytes <= model.SendBufferBytes(shapes[comm_shape[comm]]);
      default: return false;
    }
  }

  // Transfer time of one message between graph ranks src and dst: the model's, or `recorded` (>= 0; rescaled
  // when a what-if changed the network).
  double P2PDuration(int32_t src, int32_t dst, uint64_t bytes, double recorded, CommCost* cost) const {
    if (!opt.placement_rank.empty()) {
      src = opt.placement_rank[src];
      dst = opt.placement_rank[dst];
    }
    *cost = model.SendRecv(bytes, src, dst);
    if (!(recorded >= 0)) return cost->time_us;
    double base = opt.baseline_model ? opt.baseline_model->SendRecv(bytes, src, dst).time_us : 0.0;
    double dur = Rescaled(recorded, cost->time_us, base);
    cost->method = CostMethod::kRecorded;
    return dur;
  }

  void CountP2P(uint32_t comm, uint64_t bytes, double dur, const CommCost& cost) {
    CommStats& st = comm_stats[comm];
    st.calls++;
    st.bytes += bytes;
    st.time_us += dur;
    int li = LabelIndex(cost);
    st.label_calls[li]++;
    st.label_time[li] += dur;
  }

  // Runs one stream as far as it can go.
  bool Advance(int32_t rank, uint32_t stream) {
    const ClassPlan& cp = classes[r_cls[rank]];
    const uint32_t k = r_stream_off[rank] + stream;
    const uint32_t end = cp.stream_begin[stream + 1];
    const double* fin = finish.data() + r_node_off[rank];
    const float scale = compute_scale.empty() ? 1.0f : compute_scale[rank];
    while (cursor[k] < end && !posted[k]) {
      const uint32_t flat = cursor[k];
      const FlatNode& n = cp.nodes[flat];
      double arr = flat > cp.stream_begin[stream] ? fin[flat - 1] : 0.0;
      for (uint32_t i = cp.after_off[flat]; i < cp.after_off[flat + 1]; ++i) {
        double f = fin[cp.after_idx[i]];
        if (f < 0) return true;  // retried when that node finishes
        arr = std::max(arr, f);
      }
      switch (n.kind) {
        case NodeKind::kCompute:
          cursor[k] = flat + 1;
          Finished(rank, flat, arr + n.dur_us * scale);
          break;
        case NodeKind::kColl: return PostColl(rank, flat, arr);
        default: return PostP2P(rank, flat, arr);
      }
    }
    return true;
  }

  void Simulate() {
    const size_t world = t.ranks.size();
    work.reserve(r_stream_off[world]);
    for (size_t r = world; r-- > 0;) {
      for (uint32_t s = classes[r_cls[r]].nstreams(); s-- > 0;) Push(static_cast<int32_t>(r), s);
    }
    while (!work.empty()) {
      uint64_t w = work.back();
      work.pop_back();
      int32_t rank = static_cast<int32_t>(w >> 32);
      uint32_t stream = static_cast<uint32_t>(w);
      queued[r_stream_off[rank] + stream] = 0;
      if (!Advance(rank, stream)) return;
    }
  }

  // ---- Deadlock diagnosis --------------------------------------------------------------------------------

  std::string Where(int32_t rank, uint32_t flat) const {
    const ClassPlan& cp = classes[r_cls[rank]];
    const FlatNode& n = cp.nodes[flat];
    return "rank " + std::to_string(rank) + " stream '" + cp.cls->streams[n.stream].name + "' " + NodeLabel(n);
  }

  std::string CommName(uint32_t comm) const {
    const trace::Comm& c = t.comms[comm];
    return "comm " + std::to_string(c.id) + (c.desc.empty() ? "" : " (" + c.desc + ")");
  }

  // The (rank, stream) the head of (rank, stream) waits for; returns false for a terminal with *line set.
  struct Hop {
    int32_t rank = -1;
    uint32_t stream = 0;
  };
  bool WaitsFor(int32_t rank, uint32_t stream, std::string* line, Hop* next) const {
    const ClassPlan& cp = classes[r_cls[rank]];
    const uint32_t flat = cursor[r_stream_off[rank] + stream];
    const FlatNode& n = cp.nodes[flat];
    const double* fin = finish.data() + r_node_off[rank];
    std::string here = Where(rank, flat);
    if (!posted[r_stream_off[rank] + stream]) {
      for (uint32_t i = cp.after_off[flat]; i < cp.after_off[flat + 1]; ++i) {
        uint32_t a = cp.after_idx[i];
        if (fin[a] < 0) {
          *line = here + " waits (after) for " + Where(rank, a);
          *next = Hop{rank, cp.nodes[a].stream};
          return true;
        }
      }
      *line = here + " is ready but was never run (internal error)";
      return false;
    }
    uint32_t comm = slot_comm[r_slot_off[rank] + n.slot];
    const trace::Comm& c = t.comms[comm];
    if (n.kind == NodeKind::kColl) {
      std::string what = std::string(trace::ToString(n.op)) + " #" + std::to_string(n.seq) + " on " + CommName(comm);
      for (int32_t m : c.ranks) {
        uint32_t slot = SlotOf(m, comm);
        const ClassPlan& mc = classes[r_cls[m]];
        if (n.seq >= mc.slot_colls[slot].size()) {
          *line = here + " waits at " + what + " for rank " + std::to_string(m) + ", which issues only " +
                  std::to_string(mc.slot_colls[slot].size()) + " collectives on that communicator";
          return false;
        }
        uint32_t mf = mc.slot_colls[slot][n.seq];
        uint32_t ms = mc.nodes[mf].stream;
        uint32_t mk = r_stream_off[m] + ms;
        if (cursor[mk] == mf && posted[mk]) continue;  // arrived
        if (finish[r_node_off[m] + mf] >= 0) continue;
        *line = here + " waits at " + what + " for rank " + std::to_string(m);
        *next = Hop{m, ms};
        return true;
      }
      *line = here + " waits at " + what + " although every member arrived (internal error)";
      return false;
    }
    bool send = n.kind == NodeKind::kSend;
    int32_t me = slot_commrank[r_slot_off[rank] + n.slot];
    int32_t peer = c.ranks[n.peer];
    std::string what = std::string(send ? "send to" : "recv from") + " rank " + std::to_string(peer) + " (message #" +
                       std::to_string(n.seq) + " on " + CommName(comm) + ")";
    uint32_t pslot = SlotOf(peer, comm);
    const ClassPlan& pc = classes[r_cls[peer]];
    for (uint32_t pf = 0; pf < pc.nodes.size(); ++pf) {
      const FlatNode& x = pc.nodes[pf];
      if (x.slot == pslot && x.peer == me && x.seq == n.seq &&
          x.kind == (send ? NodeKind::kRecv : NodeKind::kSend)) {
        *line = here + " waits at " + what + " for rank " + std::to_string(peer);
        *next = Hop{peer, x.stream};
        return true;
      }
    }
    *line = here + " waits at " + what + ", which rank " + std::to_string(peer) + " never posts";
    return false;
  }

  void DiagnoseDeadlock() {
    const size_t world = t.ranks.size();
    std::vector<Hop> blocked;
    std::vector<uint8_t> rank_blocked(world, 0);
    for (size_t r = 0; r < world; ++r) {
      const ClassPlan& cp = classes[r_cls[r]];
      for (uint32_t s = 0; s < cp.nstreams(); ++s) {
        if (cursor[r_stream_off[r] + s] < cp.stream_begin[s + 1]) {
          blocked.push_back(Hop{static_cast<int32_t>(r), s});
          rank_blocked[r] = 1;
        }
      }
    }
    if (blocked.empty()) return;
    size_t nblocked = std::count(rank_blocked.begin(), rank_blocked.end(), 1);
    res.status = SimResult::Status::kDeadlock;
    res.error = "the graph cannot finish: " + std::to_string(nblocked) + " of " + std::to_string(world) +
                " ranks are stuck (wait-for chain below)";
    // Follow the chain from the lowest stuck rank until it loops or ends.
    std::vector<Hop> seen;
    Hop cur = blocked.front();
    for (int hops = 0; hops < 64; ++hops) {
      for (size_t i = 0; i < seen.size(); ++i) {
        if (seen[i].rank == cur.rank && seen[i].stream == cur.stream) {
          res.wait_chain.push_back("... back to rank " + std::to_string(cur.rank) + ": a cycle of " +
                                   std::to_string(seen.size() - i) + " waits");
          return;
        }
      }
      seen.push_back(cur);
      const ClassPlan& cp = classes[r_cls[cur.rank]];
      if (cursor[r_stream_off[cur.rank] + cur.stream] >= cp.stream_begin[cur.stream + 1]) {
        res.wait_chain.push_back("rank " + std::to_string(cur.rank) + " stream '" + cp.cls->streams[cur.stream].name +
                                 "' finished without reaching it");
        return;
      }
      std::string line;
      Hop next;
      bool more = WaitsFor(cur.rank, cur.stream, &line, &next);
      res.wait_chain.push_back(line);
      if (!more) return;
      cur = next;
    }
    res.wait_chain.push_back("... (chain truncated at 64 hops)");
  }

  // Every stream finished, yet an eager send is still waiting for its receive (possible only in a graph that
  // skipped the validator): a message nobody receives is an error, not a result.
  void ReportUnreceived() {
    const PendingP2P* first = nullptr;
    for (const auto& [key, p] : p2p) {
      if (!first || p.rank < first->rank || (p.rank == first->rank && p.flat < first->flat)) first = &p;
    }
    if (!first) return;
    const FlatNode& n = classes[r_cls[first->rank]].nodes[first->flat];
    uint32_t comm = slot_comm[r_slot_off[first->rank] + n.slot];
    Fail(SimResult::Status::kMismatch, Where(first->rank, first->flat) + ": " +
                                           (n.kind == NodeKind::kSend ? "send to rank " : "recv from rank ") +
                                           std::to_string(t.comms[comm].ranks[n.peer]) + " (message #" +
                                           std::to_string(n.seq) + " on " + CommName(comm) +
                                           ") is never matched, and every stream finished");
  }

  // ---- Results -------------------------------------------------------------------------------------------

  void Collect() {
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

  void BuildCriticalPath() {
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

  SimResult Run() {
    auto t0 = std::chrono::steady_clock::now();
    std::string refused;
    if (opt.symmetric && RunFolded(&refused)) {
      res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return res;
    }
    res = SimResult{};
    if (Plan()) {
      Simulate();
      ran = true;
      if (res.status == SimResult::Status::kOk) DiagnoseDeadlock();
      if (res.status == SimResult::Status::kOk) ReportUnreceived();
      if (res.status == SimResult::Status::kOk) {
        Collect();
        BuildCriticalPath();
      }
    }
    res.events = events;
    res.simulated_events = events;
    res.symmetric_refused = std::move(refused);
    res.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (opt.progress) opt.progress(events, total_events);
    return res;
  }

  // The symmetric fast path: replica 0 replayed as a graph of its own, its result copied to every replica.
  // False with *why when a condition does not hold or the replica does not finish (the full replay then runs
  // and, for a graph that cannot finish, names every rank in its diagnosis).
  bool RunFolded(std::string* why) {
    auto f = std::make_unique<ReplicaFold>();
    if (!FoldReplicas(t, model, opt.baseline_model, opt.compute_scale, f.get(), why)) return false;
    EngineOptions ro = opt;
    ro.symmetric = false;
    ro.send_completion = send_mode;
    ro.compute_scale = f->compute_scale;
    ro.placement_rank = std::move(f->placement_rank);
    ro.placement_comm = std::move(f->placement_comm);
    auto rep = std::make_unique<Impl>(f->replica, model, std::move(ro), &tclasses);
    SimResult rr = rep->Run();
    if (rr.status != SimResult::Status::kOk) {
      *why = "replica 0 did not finish (" + rr.error + ")";
      return false;
    }
    res = UnfoldResult(t, *f, rr);
    fold = std::move(f);
    replica = std::move(rep);
    ran = true;
    return true;
  }

  // Trace events of one rank: `r` indexes this engine's graph, `pid` is the rank the events are shown as;
  // `global` (fast path) gives the communicators of rank pid in the original graph.
  void AppendRankTrace(nlohmann::json& events, int32_t r, int32_t pid, const Impl* global) const {
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

  nlohmann::json ChromeTrace(const std::vector<int32_t>& ranks) const {
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
};

Simulator::Simulator(const trace::Trace& trace, const CostModel& model, EngineOptions options)
    : impl_(std::make_unique<Impl>(trace, model, std::move(options))) {}
Simulator::~Simulator() = default;
SimResult Simulator::Run() { return impl_->Run(); }
nlohmann::json Simulator::ChromeTrace(const std::vector<int32_t>& ranks) const { return impl_->ChromeTrace(ranks); }

trace::SendCompletion EffectiveSendCompletion(const EngineOptions& options, const trace::Trace& trace) {
  if (options.send_completion != trace::SendCompletion::kInvalid) return options.send_completion;
  if (trace.send_completion != trace::SendCompletion::kInvalid) return trace.send_completion;
  return trace::SendCompletion::kRendezvous;
}

SimResult Simulate(const trace::Trace& trace, const CostModel& model, const EngineOptions& options) {
  Simulator sim(trace, model, options);
  return sim.Run();
}

}  // namespace prism::replay
