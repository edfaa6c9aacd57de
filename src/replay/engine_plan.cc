// The replay engine's plan: each role class flattened once for all its ranks, ranks bound to communicators,
// collective instances counted, and a graph the walk cannot run refused with what is wrong.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "replay/engine_internal.h"

namespace prism::replay {

using trace::CollOp;
using trace::Node;
using trace::NodeKind;

bool Simulator::Impl::BuildClass(uint32_t ci, ClassPlan* cp) {
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

bool Simulator::Impl::Plan() {
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

}  // namespace prism::replay
