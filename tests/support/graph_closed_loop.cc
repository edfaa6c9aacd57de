#include "support/graph_closed_loop.h"

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

// ClosedLoop's state and steps, in its order.
class ClosedLoopRun {
 public:
  ClosedLoopRun(const trace::Trace& t, int real, const ClosedLoopOptions& opt)
      : t_(t), real_(real), opt_(opt), reps_(opt.reps), gr_(t, {real}) {}

  bool SetUpRelease();
  void NumberSlotOperations();
  void ViewComms();
  void StartCursors();
  void Play();
  void TakeStats() { out_.stats = gr_.stats(); }
  LoopResult TakeResult() { return std::move(out_); }

 private:
  struct Cursor {
    uint32_t rep = 0, idx = 0, first_steady = 0;
    int64_t free = kT0;
  };

  int NextStream(int64_t* start);
  int64_t PlayCompute(const trace::Node& n, int64_t start);
  int64_t PlayComm(const Cursor& c, const trace::Node& n, int64_t start);
  uint64_t Sequence(const Cursor& c, const trace::Node& n);
  std::optional<ReleasePolicy::Prerelease> TakePrerelease(const Cursor& c, const trace::Node& n, uint64_t seq);
  void CheckPrediction(const Cursor& c, const trace::Node& n, int64_t start,
                       const std::optional<ReleasePolicy::Prerelease>& pre, const ReleaseDecision& d);
  void AdvancePredictCursor(uint32_t slot, uint64_t seq);
  void IdleToCompletion();
  void SendPrereleases();
  void Finish(int stream, Cursor& c, const trace::Node& n, int64_t start, int64_t end);

  const trace::Trace& t_;
  const int real_;
  const ClosedLoopOptions& opt_;
  const uint32_t reps_;
  GraphRelease gr_;
  LoopResult out_;
  const trace::RoleClass* rc_ = nullptr;  // the real rank's class
  uint32_t steady_ = 0;
  std::map<uint32_t, uint32_t> iter_of_;
  std::map<uint32_t, std::vector<uint32_t>> slot_ids_;
  std::map<uint32_t, uint64_t> seq_in_slot_, slot_start_;
  std::vector<CommView> views_;
  std::vector<Cursor> cur_;
  std::map<std::pair<uint32_t, uint32_t>, int64_t> finish_;  // (rep, node id) -> ns
  // opt.predict_ahead: per slot, the coordinator's cursor (next to predict, end of the released), and what it sent.
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> cursor_;
  std::map<std::pair<uint32_t, uint64_t>, ReleasePolicy::Prerelease> sent_;
};

bool ClosedLoopRun::SetUpRelease() {
  gr_.SetReplicaSymmetry(opt_.symmetry);
  if (!gr_.SetStragglers(opt_.stragglers, &out_.error)) return false;
  if (!opt_.topology.empty() && !gr_.UseTopology(opt_.topology, &out_.error)) return false;
  out_.aliased_ranks = gr_.aliased_ranks();
  return true;
}

// Each communication node's place in its slot's sequence, and where the steady iterations start in it.
void ClosedLoopRun::NumberSlotOperations() {
  rc_ = &t_.classes[t_.ranks[real_].cls];
  steady_ = SteadyIter(t_);
  for (const auto& s : rc_->streams)
    for (const auto& n : s.nodes) {
      iter_of_[n.id] = n.iter;
      if (n.kind != trace::NodeKind::kCompute) slot_ids_[n.comm_slot].push_back(n.id);
    }
  for (auto& [slot, ids] : slot_ids_) {
    std::sort(ids.begin(), ids.end());
    uint64_t start = ids.size();
    for (size_t k = 0; k < ids.size(); ++k) {
      seq_in_slot_[ids[k]] = k;
      if (start == ids.size() && iter_of_[ids[k]] >= steady_) start = k;
    }
    slot_start_[slot] = start == ids.size() ? 0 : start;
  }
}

// The coordinator's view of each communicator: members, and how many with the same members came before it.
void ClosedLoopRun::ViewComms() {
  const trace::Trace& t = t_;
  views_.resize(rc_->comm_slots.size());
  for (uint32_t s = 0; s < rc_->comm_slots.size(); ++s) {
    const uint32_t cid = t.ranks[real_].comms[s];
    for (size_t g = 0; g < t.comms.size(); ++g) {
      if (t.comms[g].id != cid) continue;
      views_[s] = CommView{s + 1, "slot" + std::to_string(s), {t.comms[g].ranks.begin(), t.comms[g].ranks.end()},
                           {real_}};
      std::vector<int32_t> mine = t.comms[g].ranks;
      std::sort(mine.begin(), mine.end());
      for (size_t o = 0; o < g; ++o) {
        std::vector<int32_t> other = t.comms[o].ranks;
        std::sort(other.begin(), other.end());
        if (other == mine) ++views_[s].member_twin;
        if (other == mine && t.comms[o].desc == t.comms[g].desc) ++views_[s].desc_twin;
      }
      views_[s].desc = t.comms[g].desc;
    }
  }
}

// Each stream starts at its first node; later repetitions restart at its first steady one.
void ClosedLoopRun::StartCursors() {
  cur_.resize(rc_->streams.size());
  for (size_t s = 0; s < rc_->streams.size(); ++s) {
    const auto& nodes = rc_->streams[s].nodes;
    uint32_t k = 0;
    while (k < nodes.size() && nodes[k].iter < steady_) ++k;
    cur_[s].first_steady = k < nodes.size() ? k : 0;
  }
}

// Node after node, the one that can start first, until every stream has done its repetitions.
void ClosedLoopRun::Play() {
  out_.rep_end_ns.assign(reps_, 0);
  for (;;) {
    int64_t start = 0;
    const int best = NextStream(&start);
    if (best < 0) break;
    Cursor& c = cur_[static_cast<size_t>(best)];
    const trace::Node& n = rc_->streams[static_cast<size_t>(best)].nodes[c.idx];
    const int64_t end = n.kind == trace::NodeKind::kCompute ? PlayCompute(n, start) : PlayComm(c, n, start);
    Finish(best, c, n, start, end);
  }
}

// The stream whose next node is ready (its cross-stream waits finished) and starts first; -1 when none is.
int ClosedLoopRun::NextStream(int64_t* best_start) {
  int best = -1;
  for (size_t s = 0; s < rc_->streams.size(); ++s) {
    const auto& nodes = rc_->streams[s].nodes;
    if (nodes.empty() || cur_[s].rep >= reps_) continue;
    const trace::Node& n = nodes[cur_[s].idx];
    int64_t start = cur_[s].free;
    bool ready = true;
    for (uint32_t a : n.after) {
      if (cur_[s].rep > 0 && iter_of_[a] < steady_) continue;
      auto it = finish_.find({cur_[s].rep, a});
      if (it == finish_.end()) {
        ready = false;
        break;
      }
      start = std::max(start, it->second);
    }
    if (ready && (best < 0 || start < *best_start)) {
      best = static_cast<int>(s);
      *best_start = start;
    }
  }
  return best;
}

int64_t ClosedLoopRun::PlayCompute(const trace::Node& n, int64_t start) {
  const int64_t end = start + static_cast<int64_t>(n.dur_us * 1000.0);
  if (opt_.idle_realtime) {
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::nanoseconds(static_cast<int64_t>(n.dur_us * 1000.0));
    for (bool more = true; more && std::chrono::steady_clock::now() < until;) {
      const auto i0 = std::chrono::steady_clock::now();
      const int64_t left = std::chrono::duration_cast<std::chrono::nanoseconds>(until - i0).count();
      more = gr_.Idle(std::min(opt_.idle_slice_ns, left), {});
      out_.idle_slice_ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - i0).count());
    }
    if (opt_.predict_ahead) SendPrereleases();
  }
  return end;
}

int64_t ClosedLoopRun::PlayComm(const Cursor& c, const trace::Node& n, int64_t start) {
  const uint64_t seq = Sequence(c, n);
  // The shim's duration: none (the graph's recorded one decides), or the cost model's, as libprism prices it.
  const int64_t model_ns = opt_.topology.empty() ? 0 : std::max<int64_t>(0, gr_.ModelNs(real_, n.id));
  Arrival a{real_, ipc::OpArrive{views_[n.comm_slot].comm_id, IpcOp(n), seq, n.bytes, static_cast<uint64_t>(start),
                                 static_cast<uint64_t>(model_ns), n.peer, 0}};
  std::optional<ReleasePolicy::Prerelease> pre;
  if (opt_.predict_ahead) pre = TakePrerelease(c, n, seq);
  if (opt_.predict) pre = gr_.Predict(views_[n.comm_slot], seq, real_);
  const auto t0 = std::chrono::steady_clock::now();
  ReleaseDecision d = gr_.Decide(views_[n.comm_slot], seq, {&a, 1});
  out_.decide_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                                t0).count());
  out_.decide_rep.push_back(c.rep);
  const int64_t end = std::max(start, static_cast<int64_t>(d.release_ns));
  out_.decisions.push_back(d.release_ns);
  CheckPrediction(c, n, start, pre, d);
  if (opt_.predict_ahead) {
    AdvancePredictCursor(n.comm_slot, seq);
    SendPrereleases();
  }
  // The coordinator's event loop calls Idle in slices while the real rank computes (here: until nothing is left).
  if (opt_.idle && !opt_.idle_realtime) IdleToCompletion();
  if (opt_.predict_ahead) SendPrereleases();
  return end;
}

// The node's sequence on its communicator as libprism counts it: repetitions after the first skip the set-up
// iteration's operations.
uint64_t ClosedLoopRun::Sequence(const Cursor& c, const trace::Node& n) {
  const uint64_t k = slot_ids_[n.comm_slot].size(), start = slot_start_[n.comm_slot];
  return c.rep == 0 ? seq_in_slot_[n.id] : k + (c.rep - 1) * (k - start) + (seq_in_slot_[n.id] - start);
}

// opt.predict_ahead: the prerelease sent before the arrival, or a note that there was none.
std::optional<ReleasePolicy::Prerelease> ClosedLoopRun::TakePrerelease(const Cursor& c, const trace::Node& n,
                                                                      uint64_t seq) {
  std::optional<ReleasePolicy::Prerelease> pre;
  auto ps = sent_.find({n.comm_slot, seq});
  if (ps != sent_.end()) {
    ++out_.prereleased;
    pre = ps->second;
    sent_.erase(ps);
  } else {
    char what[160];
    std::snprintf(what, sizeof what, "slot %u (%s) seq %llu rep %u %s %s", n.comm_slot,
                  rc_->comm_slots[n.comm_slot].c_str(), static_cast<unsigned long long>(seq), c.rep,
                  std::string(trace::ToString(n.kind)).c_str(),
                  n.kind == trace::NodeKind::kColl ? std::string(trace::ToString(n.op)).c_str() : "");
    out_.not_prereleased.push_back(what);
  }
  return pre;
}

void ClosedLoopRun::CheckPrediction(const Cursor& c, const trace::Node& n, int64_t start,
                                    const std::optional<ReleasePolicy::Prerelease>& pre, const ReleaseDecision& d) {
  if (!pre) return;
  // ipc::OpPrerelease's rule, as libprism applies it (the arrival's model duration is 0 here).
  const uint64_t rule = ipc::PrereleaseAt(static_cast<uint64_t>(start), pre->floor_ns, pre->dur_ns, 0);
  ++out_.predicted;
  if (rule != d.release_ns) {
    ++out_.mispredicted;
    if (std::getenv("CLOSED_LOOP_DEBUG"))
      std::printf("MISPREDICT rep %u node %u rule %.3f decided %.3f\n", c.rep, n.id,
                  (static_cast<int64_t>(rule) - kT0) / 1e6, (static_cast<int64_t>(d.release_ns) - kT0) / 1e6);
  }
}

// opt.predict_ahead: the slot's operations up to seq are released; prediction resumes past them.
void ClosedLoopRun::AdvancePredictCursor(uint32_t slot, uint64_t seq) {
  auto [it, fresh] = cursor_.try_emplace(slot, seq + 1, seq + 1);
  if (!fresh) {
    it->second.second = std::max(it->second.second, seq + 1);
    it->second.first = std::max(it->second.first, it->second.second);
  }
}

void ClosedLoopRun::IdleToCompletion() {
  for (bool more = true; more;) {
    const auto i0 = std::chrono::steady_clock::now();
    more = gr_.Idle(opt_.idle_slice_ns, {});
    out_.idle_slice_ns.push_back(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - i0).count());
  }
}

// opt.predict_ahead: for every slot, predict up to 4 past the last released operation.
void ClosedLoopRun::SendPrereleases() {
  const auto t0 = std::chrono::steady_clock::now();
  for (auto& [slot, cur] : cursor_) {
    auto& [next, released] = cur;
    while (next < released + 4) {
      std::optional<ReleasePolicy::Prerelease> p = gr_.Predict(views_[slot], next, real_);
      if (!p) break;
      sent_[{slot, next}] = *p;
      ++next;
    }
  }
  out_.prerelease_pass_ns.push_back(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

// The node finished at `end`: record it and move the stream's cursor on (to the next repetition at its end).
void ClosedLoopRun::Finish(int stream, Cursor& c, const trace::Node& n, int64_t start, int64_t end) {
  finish_[{c.rep, n.id}] = end;
  if (std::getenv("CLOSED_LOOP_DEBUG"))
    std::printf("LOOP %d rep %u node %u %s start %.3f end %.3f\n", stream, c.rep, n.id,
                std::string(trace::ToString(n.kind)).c_str(), (start - kT0) / 1e6, (end - kT0) / 1e6);
  out_.rep_end_ns[c.rep] = std::max(out_.rep_end_ns[c.rep], end - kT0);
  out_.end_ns = std::max(out_.end_ns, end - kT0);
  c.free = end;
  if (++c.idx == rc_->streams[static_cast<size_t>(stream)].nodes.size()) {
    c.idx = c.first_steady;
    ++c.rep;
  }
}

}  // namespace

// Plays `real` through `reps` repetitions of its class against GraphRelease, as the live rank would: communication
// nodes take what GraphRelease decides; their per-communicator sequence is their issue order (node id order within
// the slot), as libprism counts them; repetitions after the first skip the set-up iteration (the job does not
// repeat it).
LoopResult ClosedLoop(const trace::Trace& t, int real, const ClosedLoopOptions& opt) {
  ClosedLoopRun run(t, real, opt);
  if (!run.SetUpRelease()) return run.TakeResult();
  run.NumberSlotOperations();
  run.ViewComms();
  run.StartCursors();
  run.Play();
  run.TakeStats();
  return run.TakeResult();
}

}  // namespace prism::coord
