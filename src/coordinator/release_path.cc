#include "coordinator/release_path.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "common/log.h"
#include "coordinator/swap_controller.h"

namespace prism::coord {

ReleaseDecision DefaultRelease(const CommView& comm, uint64_t seq, std::span<const Arrival> arrivals) {
  ReleaseDecision d;
  uint64_t latest = 0;
  uint64_t dur = 0;
  for (const Arrival& a : arrivals) {
    // Why copies: OpArrive is packed; binding a reference (std::max) to its fields is misaligned.
    uint64_t at = a.op.arrival_ns, d_ns = a.op.model_dur_ns;
    if (at >= latest) {
      latest = at;
      d.last_rank = a.rank;
    }
    dur = std::max(dur, d_ns);
  }
  if (arrivals.size() <= 1) d.last_rank = -1;  // nobody else to wait for: the duration decides
  d.release_ns = latest + dur;
  return d;
}

void ReleasePath::OnArrive(BusId id, BusClient& c, const ipc::OpArrive& a) {
  // Why copies: OpArrive is packed; references to its fields (fmt, std::pair) would be misaligned.
  const uint32_t comm_id = a.comm_id, op = a.op;
  const uint64_t seq = a.seq, arrival_ns = a.arrival_ns;
  if (comm_id == 0 || comm_id > comms_.size()) {
    st_.bus.SendJson(id, ipc::MsgType::kError, {{"what", fmt::format("kOpArrive for unknown comm {}", comm_id)}});
    return;
  }
  const CommView& comm = comms_[comm_id - 1];
  if (std::find(comm.real_members.begin(), comm.real_members.end(), c.rank) == comm.real_members.end()) {
    st_.bus.SendJson(id, ipc::MsgType::kError,
                     {{"what", fmt::format("rank {} is not a member of comm {}", c.rank, comm_id)}});
    return;
  }
  if (swap_ && swap_->LateArrival(id, c, a)) return;
  RankState& s = st_.ranks[c.rank];
  ++s.ops_arrived;
  s.waiting = true;
  s.waiting_comm = comm_id;
  s.waiting_seq = seq;
  s.waiting_op = op;
  s.waiting_since_ns = arrival_ns;
  s.last_seen_ns = NowNs();
  st_.hang.Arrive(c.rank, a, s.last_seen_ns);
  auto& arrivals = pending_[{comm_id, seq}];
  auto dup = std::find_if(arrivals.begin(), arrivals.end(), [&](const Arrival& x) { return x.rank == c.rank; });
  if (dup != arrivals.end()) {
    Log("coord")->warn("rank {} arrived twice at comm {} seq {}", c.rank, comm_id, seq);
    dup->op = a;
  } else {
    arrivals.push_back(Arrival{c.rank, a});
  }
  if (arrivals.size() < comm.real_members.size()) {
    if (swap_) swap_->ReleaseOut();
    return;
  }
  if (HoldOnDisagreement(comm, seq, arrivals)) return;
  SendRelease(comm, seq, arrivals, arrivals, s.last_seen_ns, false);
  Released({comm_id, seq});
  if (swap_) swap_->Forget({comm_id, seq});
}

void ReleasePath::Released(const Key& key) {
  pending_.erase(key);
  ++releases_;
}

std::string ReleasePath::SendRelease(const CommView& comm, uint64_t seq, const std::vector<Arrival>& decide_on,
                                     const std::vector<Arrival>& send_to, uint64_t now_ns, bool flush) {
  ReleaseDecision d = st_.opts.release_policy ? st_.opts.release_policy->Decide(comm, seq, decide_on)
                                              : DefaultRelease(comm, seq, decide_on);
  ipc::OpRelease rel{};
  rel.comm_id = comm.comm_id;
  rel.seq = seq;
  rel.release_ns = d.release_ns;
  rel.last_rank = d.last_rank;
  std::string frame = ipc::EncodePod(ipc::MsgType::kOpRelease, rel);
  for (const Arrival& x : send_to) {
    RankState& rs = st_.ranks[x.rank];
    if (rs.waiting && rs.waiting_comm == comm.comm_id && rs.waiting_seq == seq) rs.waiting = false;
    st_.hang.Release(x.rank, comm.comm_id, seq, now_ns);
    const uint64_t nops = std::max<uint32_t>(x.op.nops, 1);
    auto pc = predict_.find(comm.comm_id);
    if (pc != predict_.end()) {
      pc->second.released = std::max(pc->second.released, seq + nops);
      pc->second.next = std::max(pc->second.next, pc->second.released);
      predict_dirty_ = true;
    } else if (st_.opts.release_policy && rs.prerelease && comm.real_members.size() == 1) {
      predict_[comm.comm_id] = PredictCursor{seq + nops, seq + nops};
      predict_dirty_ = true;
    }
    // A unit whose every operation was prereleased: the rank released it itself (the same rule); no frame.
    bool all = true;
    uint64_t rule = 0;
    const uint32_t unit_op = x.op.op;
    for (uint64_t k = 0; k < nops; ++k) {
      auto it = prereleased_.find({comm.comm_id, seq + k});
      if (it == prereleased_.end()) {
        all = false;
        continue;
      }
      // The rank's test (ipc::OpPrerelease): a unit of another op than the graph's does not take it.
      if (unit_op != 0 && it->second.op != unit_op) all = false;
      const ReleasePolicy::Prerelease& p = it->second;
      rule = std::max(rule, ipc::PrereleaseAt(x.op.arrival_ns, p.floor_ns, p.dur_ns, x.op.model_dur_ns));
      prereleased_.erase(it);
    }
    if (all) {
      ++prereleases_used_;
      if (rule != d.release_ns && ++prerelease_mismatches_ <= 10) {
        Log("coord")->warn("comm {} seq {}: rank {} released itself at {} (prerelease) but the decision is {} "
                           "({:+.3f} us)",
                           comm.comm_id, seq, x.rank, rule, uint64_t{d.release_ns},
                           (static_cast<double>(d.release_ns) - static_cast<double>(rule)) * 1e-3);
      }
      continue;
    }
    BusClient* cl = st_.bus.Find(rs.conn);
    if (!cl) continue;
    cl->out.append(frame);
    if (flush) st_.bus.Flush(rs.conn, *cl);
  }
  return frame;
}

void ReleasePath::SendPrereleases() {
  if (!st_.opts.release_policy || predict_.empty()) return;
  const uint64_t epoch = st_.opts.release_policy->PredictEpoch();
  if (!predict_dirty_ && epoch == predict_epoch_) return;
  predict_dirty_ = false;
  // Why the epoch read before the pass: Predict's own advances move it, and a communicator asked before them in
  // this pass must be asked again.
  predict_epoch_ = epoch;
  // Why a window: the rank needs the next few answers before it arrives; further ones cost the virtual ranks'
  // advance now, which Idle does cheaper in bulk.
  constexpr uint64_t kAhead = 4;
  for (auto& [comm_id, pc] : predict_) {
    if (comm_id < 1 || comm_id > comms_.size()) continue;
    const CommView& comm = comms_[comm_id - 1];
    if (comm.real_members.size() != 1) continue;
    const int rank = comm.real_members[0];
    RankState& rs = st_.ranks[rank];
    BusClient* cl = st_.bus.Find(rs.conn);
    if (!cl) continue;
    bool sent = false;
    while (pc.next < pc.released + kAhead) {
      // A unit the rank already reported is decided by its arrival (pending_ holds it until all members came).
      if (pending_.count({comm_id, pc.next})) break;
      std::optional<ReleasePolicy::Prerelease> p = st_.opts.release_policy->Predict(comm, pc.next, rank);
      if (!p) break;
      ipc::OpPrerelease pr{};
      pr.comm_id = comm_id;
      pr.seq = pc.next;
      pr.floor_ns = p->floor_ns;
      pr.dur_ns = p->dur_ns;
      pr.floor_rank = p->floor_rank;
      pr.op = p->op;
      cl->out.append(ipc::EncodePod(ipc::MsgType::kOpPrerelease, pr));
      prereleased_[{comm_id, pc.next}] = *p;
      ++prereleases_sent_;
      ++pc.next;
      sent = true;
    }
    if (sent) st_.bus.Flush(rs.conn, *cl);
  }
}

void ReleasePath::ForgetPrereleases(int rank) {
  // A rank's new connection (a restarted process) numbers its operations from 0 again: what was prereleased to the
  // old one must neither be counted as taken nor suppress an answer.
  for (auto it = predict_.begin(); it != predict_.end();) {
    const uint32_t comm_id = it->first;
    const bool mine = comm_id >= 1 && comm_id <= comms_.size() && comms_[comm_id - 1].real_members.size() == 1 &&
                      comms_[comm_id - 1].real_members[0] == rank;
    if (!mine) {
      ++it;
      continue;
    }
    for (auto p = prereleased_.lower_bound({comm_id, 0}); p != prereleased_.end() && p->first.first == comm_id;)
      p = prereleased_.erase(p);
    it = predict_.erase(it);
  }
}

bool ReleasePath::HoldOnDisagreement(const CommView& comm, uint64_t seq, const std::vector<Arrival>& arrivals) {
  std::vector<std::pair<int, HangOp>> ops;
  for (const Arrival& a : arrivals) {
    HangOp o;
    o.comm_id = a.op.comm_id;
    o.seq = a.op.seq;
    o.op = a.op.op;
    o.bytes = a.op.bytes;
    int32_t peer = a.op.peer;
    if (peer >= 0 && static_cast<size_t>(peer) < comm.members.size()) o.peer = comm.members[static_cast<size_t>(peer)];
    ops.emplace_back(a.rank, o);
  }
  std::string what = Disagreement(ops, comm.members.size() == 2);
  if (what.empty()) return false;
  if (held_.emplace(std::make_pair(comm.comm_id, seq), what).second) {
    st_.hang.Hold(comm.comm_id, seq, what);
    std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string text =
        fmt::format("prism: {} seq {}: the real members disagree ({}):", st_.hang.CommName(comm.comm_id), seq, what);
    for (const auto& [rank, o] : ops) text += fmt::format(" rank {} {};", rank, HangOpText(o));
    text.back() = '\n';
    text += "  held there, as NCCL would hang or corrupt; the hang diagnosis follows after --hang-timeout\n";
    // Why stderr: the first sign of the bug the user is looking for, whatever the log level.
    std::fprintf(stderr, "%s", text.c_str());
    std::fflush(stderr);
    Log("coord")->warn("comm {} seq {}: real members disagree ({}); held", comm.comm_id, seq, what);
  }
  return true;
}

bool ReleasePath::IdleTurn() {
  ReleasePolicy* policy = st_.opts.release_policy;
  if (!policy) return false;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    SendPrereleases();
  }
  // Why 200 us: the slice's budget; a message that arrives meanwhile ends it after the current virtual rank's
  // step (EventBus::Pending), so an arrival waits microseconds, not the slice.
  bool more = policy->Idle(200'000, [this] { return st_.bus.Pending(); });
  std::lock_guard<std::mutex> lock(st_.mu);
  SendPrereleases();
  // Predict may have queued work (a member it advanced has more): one step, and poll instead of sleeping if
  // more remains.
  if (!more) more = policy->Idle(0, [this] { return st_.bus.Pending(); });
  return more;
}

}  // namespace prism::coord
