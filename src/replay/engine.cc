// The replay engine's walk: streams run from ready lists, collectives and messages matched and timed (the hot
// loop), and Run with the symmetric fast path. engine.h says what the engine does, engine_internal.h how its
// files divide it.
#include "replay/engine.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "replay/engine_internal.h"
#include "replay/symmetric.h"

namespace prism::replay {

using trace::CollOp;
using trace::DType;
using trace::NodeKind;

namespace {

// Where a call counts among CommStats' labels (kLabelCount, engine_internal.h).
int LabelIndex(const CommCost& c) {
  switch (c.method) {
    case CostMethod::kNccl: return static_cast<int>(c.algo) * kNumProtos + static_cast<int>(c.proto);
    case CostMethod::kAlphaBeta: return kNumAlgos * kNumProtos;
    case CostMethod::kP2P: return kNumAlgos * kNumProtos + 1;
    default: return kNumAlgos * kNumProtos + 2;
  }
}

}  // namespace

// ---- Simulation ----------------------------------------------------------------------------------------
// Why `inline`: defined in the class before the engine was split, these keep the inlining limits of inline
// functions, so the hot loop's helpers are still inlined into it. Only this file calls them.

inline void Simulator::Impl::Push(int32_t rank, uint32_t stream) {
  uint32_t k = r_stream_off[rank] + stream;
  if (queued[k]) return;
  queued[k] = 1;
  work.push_back(static_cast<uint64_t>(rank) << 32 | stream);
}

inline void Simulator::Impl::Finished(int32_t rank, uint32_t flat, double end) {
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
inline void Simulator::Impl::CompleteMember(int32_t rank, uint32_t flat, double end) {
  const FlatNode& n = classes[r_cls[rank]].nodes[flat];
  uint32_t k = r_stream_off[rank] + n.stream;
  posted[k] = 0;
  cursor[k] = flat + 1;
  Finished(rank, flat, end);
  Push(rank, n.stream);
}

inline void Simulator::Impl::AddWait(int32_t rank, uint32_t slot, int32_t on, double us) {
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

inline const CommCost& Simulator::Impl::ModelCost(uint32_t comm, CollOp op, DType dtype, uint64_t bytes) {
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
inline double Simulator::Impl::Rescaled(double recorded_us, double model_now_us, double model_base_us) const {
  if (!opt.baseline_model || !(model_base_us > 0)) return recorded_us;
  return recorded_us * model_now_us / model_base_us;
}

inline bool Simulator::Impl::PostColl(int32_t rank, uint32_t flat, double arrival) {
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

inline bool Simulator::Impl::PostP2P(int32_t rank, uint32_t flat, double arrival) {
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

// Transfer time of one message between graph ranks src and dst: the model's, or `recorded` (>= 0; rescaled
// when a what-if changed the network).
inline double Simulator::Impl::P2PDuration(int32_t src, int32_t dst, uint64_t bytes, double recorded,
                                           CommCost* cost) const {
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

inline void Simulator::Impl::CountP2P(uint32_t comm, uint64_t bytes, double dur, const CommCost& cost) {
  CommStats& st = comm_stats[comm];
  st.calls++;
  st.bytes += bytes;
  st.time_us += dur;
  int li = LabelIndex(cost);
  st.label_calls[li]++;
  st.label_time[li] += dur;
}

// Runs one stream as far as it can go.
inline bool Simulator::Impl::Advance(int32_t rank, uint32_t stream) {
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

inline void Simulator::Impl::Simulate() {
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

// ---- Run -----------------------------------------------------------------------------------------------

SimResult Simulator::Impl::Run() {
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
bool Simulator::Impl::RunFolded(std::string* why) {
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
