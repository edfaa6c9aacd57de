// Why a replay cannot finish: the wait-for chain from the lowest stuck rank, or a message nobody receives.
#include <algorithm>
#include <string>
#include <vector>

#include "replay/engine_internal.h"

namespace prism::replay {

using trace::NodeKind;

std::string Simulator::Impl::Where(int32_t rank, uint32_t flat) const {
  const ClassPlan& cp = classes[r_cls[rank]];
  const FlatNode& n = cp.nodes[flat];
  return "rank " + std::to_string(rank) + " stream '" + cp.cls->streams[n.stream].name + "' " + NodeLabel(n);
}

std::string Simulator::Impl::CommName(uint32_t comm) const {
  const trace::Comm& c = t.comms[comm];
  return "comm " + std::to_string(c.id) + (c.desc.empty() ? "" : " (" + c.desc + ")");
}

// The (rank, stream) the head of (rank, stream) waits for; returns false for a terminal with *line set.
bool Simulator::Impl::WaitsFor(int32_t rank, uint32_t stream, std::string* line, Hop* next) const {
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

void Simulator::Impl::DiagnoseDeadlock() {
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
void Simulator::Impl::ReportUnreceived() {
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

}  // namespace prism::replay
