#include "coordinator/graph_closed_loop.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include "prism/ipc.h"

namespace prism::coord {

constexpr int64_t kT0 = kClosedLoopT0;

namespace {

uint32_t IpcOp(const trace::Node& n) {
  if (n.kind == trace::NodeKind::kColl) return static_cast<uint32_t>(n.op);
  return 100 + static_cast<uint32_t>(n.kind);
}


// The iteration repetitions start from (GraphRelease's rule): the second when the graph starts at iteration 0.
uint32_t SteadyIter(const trace::Trace& t) {
  std::set<uint32_t> iters;
  for (const auto& c : t.classes)
    for (const auto& s : c.streams)
      for (const auto& n : s.nodes) iters.insert(n.iter);
  if (iters.size() >= 2 && *iters.begin() == 0) return *std::next(iters.begin());
  return iters.empty() ? 0 : *iters.begin();
}

}  // namespace

// Plays `real` through `reps` repetitions of its class against GraphRelease, as the live rank would: communication
// nodes take what GraphRelease decides; their per-communicator sequence is their issue order (node id order within
// the slot), as libprism counts them; repetitions after the first skip the set-up iteration (the job does not
// repeat it).
LoopResult ClosedLoop(const trace::Trace& t, int real, const ClosedLoopOptions& opt) {
  const uint32_t reps = opt.reps;
  GraphRelease gr(t, {real});
  LoopResult out;
  gr.SetReplicaSymmetry(opt.symmetry);
  if (!gr.SetStragglers(opt.stragglers, &out.error)) return out;
  if (!opt.topology.empty() && !gr.UseTopology(opt.topology, &out.error)) return out;
  out.aliased_ranks = gr.aliased_ranks();
  const trace::RoleClass& rc = t.classes[t.ranks[real].cls];
  const uint32_t steady = SteadyIter(t);
  std::map<uint32_t, uint32_t> iter_of;
  std::map<uint32_t, std::vector<uint32_t>> slot_ids;
  for (const auto& s : rc.streams)
    for (const auto& n : s.nodes) {
      iter_of[n.id] = n.iter;
      if (n.kind != trace::NodeKind::kCompute) slot_ids[n.comm_slot].push_back(n.id);
    }
  std::map<uint32_t, uint64_t> seq_in_slot, slot_start;
  for (auto& [slot, ids] : slot_ids) {
    std::sort(ids.begin(), ids.end());
    uint64_t start = ids.size();
    for (size_t k = 0; k < ids.size(); ++k) {
      seq_in_slot[ids[k]] = k;
      if (start == ids.size() && iter_of[ids[k]] >= steady) start = k;
    }
    slot_start[slot] = start == ids.size() ? 0 : start;
  }
  // The coordinator's view of each communicator: members, and how many with the same members came before it.
  std::vector<CommView> views(rc.comm_slots.size());
  for (uint32_t s = 0; s < rc.comm_slots.size(); ++s) {
    const uint32_t cid = t.ranks[real].comms[s];
    for (size_t g = 0; g < t.comms.size(); ++g) {
      if (t.comms[g].id != cid) continue;
      views[s] = CommView{s + 1, "slot" + std::to_string(s), {t.comms[g].ranks.begin(), t.comms[g].ranks.end()}, {real}};
      std::vector<int32_t> mine = t.comms[g].ranks;
      std::sort(mine.begin(), mine.end());
      for (size_t o = 0; o < g; ++o) {
        std::vector<int32_t> other = t.comms[o].ranks;
        std::sort(other.begin(), other.end());
        if (other == mine) ++views[s].member_twin;
        if (other == mine && t.comms[o].desc == t.comms[g].desc) ++views[s].desc_twin;
      }
      views[s].desc = t.comms[g].desc;
    }
  }
  struct Cursor {
    uint32_t rep = 0, idx = 0, first_steady = 0;
    int64_t free = kT0;
  };
  std::vector<Cursor> cur(rc.streams.size());
  for (size_t s = 0; s < rc.streams.size(); ++s) {
    const auto& nodes = rc.streams[s].nodes;
    uint32_t k = 0;
    while (k < nodes.size() && nodes[k].iter < steady) ++k;
    cur[s].first_steady = k < nodes.size() ? k : 0;
  }
  std::map<std::pair<uint32_t, uint32_t>, int64_t> finish;  // (rep, node id) -> ns
  // opt.predict_ahead: per slot, the coordinator's cursor (next to predict, end of the released), and what it sent.
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> cursor;
  std::map<std::pair<uint32_t, uint64_t>, ReleasePolicy::Prerelease> sent;
  auto send_prereleases = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& [slot, cur] : cursor) {
      auto& [next, released] = cur;
      while (next < released + 4) {
        std::optional<ReleasePolicy::Prerelease> p = gr.Predict(views[slot], next, real);
        if (!p) break;
        sent[{slot, next}] = *p;
        ++next;
      }
    }
    out.prerelease_pass_ns.push_back(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  };
  out.rep_end_ns.assign(reps, 0);
  for (;;) {
    int best = -1;
    int64_t best_start = 0;
    for (size_t s = 0; s < rc.streams.size(); ++s) {
      const auto& nodes = rc.streams[s].nodes;
      if (nodes.empty() || cur[s].rep >= reps) continue;
      const trace::Node& n = nodes[cur[s].idx];
      int64_t start = cur[s].free;
      bool ready = true;
      for (uint32_t a : n.after) {
        if (cur[s].rep > 0 && iter_of[a] < steady) continue;
        auto it = finish.find({cur[s].rep, a});
        if (it == finish.end()) {
          ready = false;
          break;
        }
        start = std::max(start, it->second);
      }
      if (ready && (best < 0 || start < best_start)) {
        best = static_cast<int>(s);
        best_start = start;
      }
    }
    if (best < 0) break;
    Cursor& c = cur[static_cast<size_t>(best)];
    const auto& nodes = rc.streams[static_cast<size_t>(best)].nodes;
    const trace::Node& n = nodes[c.idx];
    int64_t end = best_start;
    if (n.kind == trace::NodeKind::kCompute) {
      end += static_cast<int64_t>(n.dur_us * 1000.0);
      if (opt.idle_realtime) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(n.dur_us * 1000.0));
        for (bool more = true; more && std::chrono::steady_clock::now() < until;) {
          const auto i0 = std::chrono::steady_clock::now();
          const int64_t left = std::chrono::duration_cast<std::chrono::nanoseconds>(until - i0).count();
          more = gr.Idle(std::min(opt.idle_slice_ns, left), {});
          out.idle_slice_ns.push_back(
              std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - i0).count());
        }
        if (opt.predict_ahead) send_prereleases();
      }
    } else {
      const uint64_t k = slot_ids[n.comm_slot].size(), start = slot_start[n.comm_slot];
      const uint64_t seq = c.rep == 0 ? seq_in_slot[n.id] : k + (c.rep - 1) * (k - start) + (seq_in_slot[n.id] - start);
      // The shim's duration: none (the graph's recorded one decides), or the cost model's, as libprism prices it.
      const int64_t model_ns = opt.topology.empty() ? 0 : std::max<int64_t>(0, gr.ModelNs(real, n.id));
      Arrival a{real, ipc::OpArrive{views[n.comm_slot].comm_id, IpcOp(n), seq, n.bytes,
                                    static_cast<uint64_t>(best_start), static_cast<uint64_t>(model_ns), n.peer, 0}};
      std::optional<ReleasePolicy::Prerelease> pre;
      if (opt.predict_ahead) {
        auto ps = sent.find({n.comm_slot, seq});
        if (ps != sent.end()) {
          ++out.prereleased;
          pre = ps->second;
          sent.erase(ps);
        } else {
          char what[160];
          std::snprintf(what, sizeof what, "slot %u (%s) seq %llu rep %u %s %s", n.comm_slot,
                        rc.comm_slots[n.comm_slot].c_str(), static_cast<unsigned long long>(seq), c.rep,
                        std::string(trace::ToString(n.kind)).c_str(),
                        n.kind == trace::NodeKind::kColl ? std::string(trace::ToString(n.op)).c_str() : "");
          out.not_prereleased.push_back(what);
        }
      }
      if (opt.predict) pre = gr.Predict(views[n.comm_slot], seq, real);
      const auto t0 = std::chrono::steady_clock::now();
      ReleaseDecision d = gr.Decide(views[n.comm_slot], seq, {&a, 1});
      out.decide_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                                   t0).count());
      out.decide_rep.push_back(c.rep);
      end = std::max(best_start, static_cast<int64_t>(d.release_ns));
      out.decisions.push_back(d.release_ns);
      if (pre) {
        // ipc::OpPrerelease's rule, as libprism applies it (the arrival's model duration is 0 here).
        const uint64_t rule = ipc::PrereleaseAt(static_cast<uint64_t>(best_start), pre->floor_ns, pre->dur_ns, 0);
        ++out.predicted;
        if (rule != d.release_ns) {
          ++out.mispredicted;
          if (std::getenv("CLOSED_LOOP_DEBUG"))
            std::printf("MISPREDICT rep %u node %u rule %.3f decided %.3f\n", c.rep, n.id, (static_cast<int64_t>(rule) - kT0) / 1e6,
                        (static_cast<int64_t>(d.release_ns) - kT0) / 1e6);
        }
      }
      if (opt.predict_ahead) {
        auto [it, fresh] = cursor.try_emplace(n.comm_slot, seq + 1, seq + 1);
        if (!fresh) {
          it->second.second = std::max(it->second.second, seq + 1);
          it->second.first = std::max(it->second.first, it->second.second);
        }
        send_prereleases();
      }
      // The coordinator's event loop calls Idle in slices while the real rank computes (here: until nothing is left).
      if (opt.idle && !opt.idle_realtime) {
        for (bool more = true; more;) {
          const auto i0 = std::chrono::steady_clock::now();
          more = gr.Idle(opt.idle_slice_ns, {});
          out.idle_slice_ns.push_back(
              std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - i0).count());
        }
      }
      if (opt.predict_ahead) send_prereleases();
    }
    finish[{c.rep, n.id}] = end;
    if (std::getenv("CLOSED_LOOP_DEBUG"))
      std::printf("LOOP %d rep %u node %u %s start %.3f end %.3f\n", best, c.rep, n.id,
                  std::string(trace::ToString(n.kind)).c_str(), (best_start - kT0) / 1e6, (end - kT0) / 1e6);
    out.rep_end_ns[c.rep] = std::max(out.rep_end_ns[c.rep], end - kT0);
    out.end_ns = std::max(out.end_ns, end - kT0);
    c.free = end;
    if (++c.idx == nodes.size()) {
      c.idx = c.first_steady;
      ++c.rep;
    }
  }
  out.stats = gr.stats();
  return out;
}

}  // namespace prism::coord
