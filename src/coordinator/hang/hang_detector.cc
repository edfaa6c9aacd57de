#include "coordinator/hang/hang_detector.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace prism::coord {
namespace {

using json = nlohmann::json;

// Why a bounded history: a disagreement matters near where the ranks stopped; older sequences were released.
constexpr uint64_t kHistory = 16;
constexpr uint32_t kSend = 103, kRecv = 104;

bool IsP2p(uint32_t op) { return op >= 100; }

const char* DTypeName(int d) {
  // prism::trace::DType order (include/prism/trace.h); names only for messages.
  static const char* kNames[] = {"invalid", "f32", "f16", "bf16", "f64", "f8e4m3", "f8e5m2",
                                 "i8",      "u8",  "i32", "u32",  "i64", "u64"};
  if (d < 0) return "?";
  return d < static_cast<int>(std::size(kNames)) ? kNames[d] : "dtype?";
}

std::string Bytes(uint64_t b) {
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

std::string Describe(const HangOp& o) {
  std::string s = fmt::format("{} {}", HangOpName(o.op), Bytes(o.bytes));
  if (o.dtype >= 0) s += fmt::format(" {}", DTypeName(o.dtype));
  if (o.peer >= 0) s += fmt::format(" {} rank {}", o.op == kRecv ? "from" : "to", o.peer);
  return s;
}

json OpJson(const HangOp& o) {
  json j = {{"comm", o.comm_id}, {"seq", o.seq}, {"op", HangOpName(o.op)}, {"op_code", o.op}, {"bytes", o.bytes}};
  j["dtype"] = o.dtype >= 0 ? json(DTypeName(o.dtype)) : json(nullptr);
  if (o.peer >= 0) j["peer"] = o.peer;
  j["since_ns"] = o.since_ns;
  return j;
}

}  // namespace

std::string HangOpText(const HangOp& op) { return Describe(op); }

std::string RankListText(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < v.size();) {
    size_t j = i + 1;
    if (j < v.size()) {
      const int d = v[j] - v[i];
      while (j + 1 < v.size() && v[j + 1] - v[j] == d) ++j;
      if ((d == 1 && j - i + 1 >= 3) || j - i + 1 >= 4) {
        parts.push_back(d == 1 ? fmt::format("{}-{}", v[i], v[j])
                               : fmt::format("{},{}..{} (step {})", v[i], v[i] + d, v[j], d));
        i = j + 1;
        continue;
      }
    }
    parts.push_back(std::to_string(v[i]));
    ++i;
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

std::string RankListShort(const std::vector<int>& ranks, size_t max_chars) {
  std::string full = RankListText(ranks);
  if (full.size() <= max_chars) return full;
  size_t cut = full.rfind(',', max_chars);
  return full.substr(0, cut == std::string::npos ? max_chars : cut) + ",...";
}

void AddPositions(const HangDetector& d, json* status) {
  json comms = json::array();
  for (const auto& [id, c] : d.comms()) {
    std::vector<int> real;
    for (size_t i = 0; i < c.members.size(); ++i) {
      if (c.real[i]) real.push_back(c.members[i]);
    }
    comms.push_back({{"comm", id}, {"name", c.name}, {"pg_name", c.pg_name}, {"pg_desc", c.pg_desc},
                     {"size", c.members.size()}, {"members", c.members}, {"real", real}});
  }
  (*status)["communicators"] = std::move(comms);
  auto op_json = [](const HangOp& o, const char* t_key) {
    json x = {{"seq", o.seq}, {"op", HangOpName(o.op)}, {"bytes", o.bytes}};
    x["dtype"] = o.dtype >= 0 ? json(DTypeName(o.dtype)) : json(nullptr);
    if (o.peer >= 0) x["peer"] = o.peer;
    x[t_key] = o.since_ns;
    return x;
  };
  json pos = json::array();
  for (const auto& [rank, per_comm] : d.Positions()) {
    json cs = json::array();
    for (const auto& [comm, p] : per_comm) {
      json x = {{"comm", comm}};
      if (p.done) x["done"] = op_json(*p.done, "t_ns");
      if (p.pending) x["pending"] = op_json(*p.pending, "since_ns");
      cs.push_back(std::move(x));
    }
    pos.push_back({{"rank", rank}, {"state", d.State(rank)}, {"last_progress_ns", d.LastProgress(rank)},
                   {"comms", std::move(cs)}});
  }
  (*status)["positions"] = std::move(pos);
}

std::string HangOpName(uint32_t op) {
  // 0-7: prism::trace::CollOp; 8, 9: gather and scatter (only from Flight Recorder dumps).
  static const char* kColl[] = {"grouped", "all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                "reduce",  "all_to_all", "barrier",    "gather",         "scatter"};
  if (op < std::size(kColl)) return kColl[op];
  if (op == kSend) return "send";
  if (op == kRecv) return "recv";
  return fmt::format("op{}", op);
}

std::string Disagreement(const std::vector<std::pair<int, HangOp>>& ops, bool pair) {
  std::set<std::string> what;
  const HangOp* first = nullptr;
  int first_rank = -1;
  for (const auto& [rank, o] : ops) {
    if (o.op == 0) continue;  // a grouped unit (several operations): not comparable as one
    if (!first) {
      first = &o;
      first_rank = rank;
      continue;
    }
    if (IsP2p(o.op) != IsP2p(first->op)) {
      what.insert("op");
    } else if (IsP2p(o.op)) {
      // On a 2-rank communicator the two sides of sequence s pair up: a send needs a recv, sizes must match.
      if (pair && rank != first_rank && o.op == first->op) what.insert("p2p direction");
      if (pair && o.bytes != first->bytes) what.insert("size");
    } else {
      if (o.op != first->op) what.insert("op");
      if (o.bytes != first->bytes) what.insert("size");
      if (o.dtype >= 0 && first->dtype >= 0 && o.dtype != first->dtype) what.insert("dtype");
    }
  }
  return fmt::format("{}", fmt::join(what, ", "));
}

void HangDetector::Hold(uint32_t comm_id, uint64_t seq, std::string what) { held_[{comm_id, seq}] = std::move(what); }

void HangDetector::AddComm(uint32_t comm_id, std::string name, std::vector<int> members, std::vector<bool> real,
                           std::string pg_name, std::string pg_desc) {
  HangComm c;
  c.name = std::move(name);
  c.pg_name = std::move(pg_name);
  c.pg_desc = std::move(pg_desc);
  c.members = std::move(members);
  c.real = std::move(real);
  AddComm(comm_id, std::move(c));
}

void HangDetector::AddComm(uint32_t comm_id, HangComm comm) {
  comm.real.resize(comm.members.size(), true);
  comms_[comm_id] = std::move(comm);
}

HangLogEntry& HangDetector::LogEntry(Rank& r, const HangOp& op, uint64_t created_ns) {
  // Newest first: the operation is usually the last one logged (arrival then record).
  for (auto it = r.log.rbegin(); it != r.log.rend() && it - r.log.rbegin() < 64; ++it) {
    if (it->op.comm_id == op.comm_id && it->op.seq == op.seq) return *it;
  }
  if (r.log.size() >= kLogSize) r.log.pop_front();
  HangLogEntry e;
  e.id = r.next_log_id++;
  auto c = comms_.find(op.comm_id);
  std::string pg = c != comms_.end() && !c->second.pg_name.empty() ? c->second.pg_name
                                                                    : fmt::format("prism_comm_{}", op.comm_id);
  auto& counts = r.pg_counts[pg];
  if (IsP2p(op.op)) {
    e.pg_p2p_seq = ++counts.second;
    e.pg_coll_seq = counts.first;
  } else {
    e.pg_coll_seq = ++counts.first;
    e.pg_p2p_seq = counts.second;
  }
  e.op = op;
  e.created_ns = created_ns;
  r.log.push_back(e);
  return r.log.back();
}

std::map<int, std::map<uint32_t, HangPosition>> HangDetector::Positions() const {
  std::map<int, std::map<uint32_t, HangPosition>> out;
  for (const auto& [rank, r] : ranks_) {
    if (!r.at.empty()) out[rank] = r.at;
  }
  return out;
}

const std::deque<HangLogEntry>& HangDetector::Log(int rank) const {
  static const std::deque<HangLogEntry> kEmpty;
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? kEmpty : it->second.log;
}

std::vector<int> HangDetector::Ranks() const {
  std::vector<int> out;
  for (const auto& [rank, r] : ranks_) out.push_back(rank);
  return out;
}

const std::string& HangDetector::State(int rank) const {
  static const std::string kNone;
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? kNone : it->second.state;
}

uint64_t HangDetector::LastProgress(int rank) const {
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? 0 : it->second.last_progress_ns;
}

std::string HangDetector::CommName(uint32_t comm_id) const {
  auto it = comms_.find(comm_id);
  if (it == comms_.end() || it->second.name.empty()) return fmt::format("comm {}", comm_id);
  return fmt::format("comm {} ({})", comm_id, it->second.name);
}

void HangDetector::Note(int rank, const HangOp& op, uint64_t now_ns, bool progress) {
  Rank& r = ranks_[rank];
  if (progress) {
    r.last_progress_ns = now_ns;
    last_progress_ns_ = std::max(last_progress_ns_, now_ns);
    reported_ = false;
  }
  auto it = r.reached.try_emplace(op.comm_id, -1).first;
  it->second = std::max(it->second, static_cast<int64_t>(op.seq));
  HangOp& h = history_[{op.comm_id, op.seq}][rank];
  int dtype = h.dtype, peer = h.peer;
  uint64_t since = h.since_ns;
  h = op;
  if (op.dtype < 0) h.dtype = dtype;  // a record after the arrival adds the dtype
  if (op.peer < 0) h.peer = peer;     // and keeps the arrival's peer (records carry none)
  if (since != 0) h.since_ns = since;
  if (op.seq >= kHistory) {
    history_.erase(history_.lower_bound({op.comm_id, 0}), history_.lower_bound({op.comm_id, op.seq - kHistory}));
    held_.erase(held_.lower_bound({op.comm_id, 0}), held_.lower_bound({op.comm_id, op.seq - kHistory}));
  }
}

void HangDetector::Arrive(int rank, const ipc::OpArrive& a, uint64_t now_ns) {
  HangOp o{.comm_id = a.comm_id, .seq = a.seq, .op = a.op, .bytes = a.bytes};
  int32_t peer = a.peer;
  auto c = comms_.find(o.comm_id);
  if (peer >= 0 && c != comms_.end() && peer < static_cast<int32_t>(c->second.members.size())) {
    o.peer = c->second.members[static_cast<size_t>(peer)];
  }
  ArriveOp(rank, o, a.arrival_ns, now_ns);
}

void HangDetector::ArriveOp(int rank, HangOp o, uint64_t created_ns, uint64_t now_ns) {
  o.since_ns = now_ns;
  Note(rank, o, now_ns);
  Rank& r = ranks_[rank];
  r.pending = o;
  r.at[o.comm_id].pending = o;
  LogEntry(r, o, created_ns != 0 ? created_ns : now_ns);
}

void HangDetector::Release(int rank, uint32_t comm_id, uint64_t seq, uint64_t now_ns) {
  Rank& r = ranks_[rank];
  if (r.pending && r.pending->comm_id == comm_id && r.pending->seq == seq) r.pending.reset();
  auto at = r.at.find(comm_id);
  if (at != r.at.end() && at->second.pending && at->second.pending->seq == seq) {
    HangOp done = *at->second.pending;
    done.since_ns = now_ns;
    if (!at->second.done || at->second.done->seq <= seq) at->second.done = done;
    at->second.pending.reset();
  }
  r.last_progress_ns = now_ns;
  last_progress_ns_ = std::max(last_progress_ns_, now_ns);
  reported_ = false;
}

void HangDetector::Record(int rank, const ipc::OpRecord& rec, uint64_t now_ns) {
  const HangOp o{.comm_id = rec.comm_id, .seq = rec.seq, .op = rec.op, .bytes = rec.bytes, .dtype = rec.dtype};
  RecordOp(rank, o, rec.arrival_ns, rec.release_ns, now_ns);
}

void HangDetector::RecordOp(int rank, HangOp o, uint64_t arrival, uint64_t release, uint64_t now_ns) {
  Note(rank, o, now_ns);
  // A record is written when the operation completed: it no longer waits there.
  Rank& r = ranks_[rank];
  if (r.pending && r.pending->comm_id == o.comm_id && r.pending->seq <= o.seq) r.pending.reset();
  HangPosition& at = r.at[o.comm_id];
  if (at.pending && at.pending->seq <= o.seq) {
    if (at.pending->peer >= 0 && o.peer < 0) o.peer = at.pending->peer;  // a record carries no peer; the arrival did
    at.pending.reset();
  }
  HangOp done = o;
  done.since_ns = now_ns;
  if (!at.done || at.done->seq <= o.seq) at.done = done;
  HangLogEntry& e = LogEntry(r, o, arrival != 0 ? arrival : now_ns);
  if (e.op.peer >= 0 && o.peer < 0) o.peer = e.op.peer;
  e.op = o;
  e.op.since_ns = e.created_ns;
  e.completed_ns = release != 0 ? std::max(release, e.created_ns) : now_ns;
  if (release > arrival && arrival != 0) e.duration_ns = release - arrival;
}

void HangDetector::Issue(int rank, const HangOp& op, uint64_t now_ns) {
  HangOp o = op;
  o.since_ns = now_ns;
  // Why no progress: issuing behind a stuck operation is not progress.
  Note(rank, o, now_ns, /*progress=*/false);
}

void HangDetector::Progress(int rank, uint64_t now_ns) {
  ranks_[rank].last_progress_ns = now_ns;
  last_progress_ns_ = std::max(last_progress_ns_, now_ns);
  reported_ = false;
}

void HangDetector::SetState(int rank, const std::string& state) { ranks_[rank].state = state; }

std::vector<int> HangDetector::Blockers(int rank, const HangOp& op) const {
  std::vector<int> out;
  auto c = comms_.find(op.comm_id);
  auto arrived_here = [&](int m) {
    auto h = history_.find({op.comm_id, op.seq});
    return h != history_.end() && h->second.count(m) > 0;
  };
  if (IsP2p(op.op)) {
    if (op.peer < 0 || op.peer == rank) return out;
    if (c != comms_.end()) {
      auto& ms = c->second.members;
      auto i = std::find(ms.begin(), ms.end(), op.peer);
      if (i != ms.end() && !c->second.real[static_cast<size_t>(i - ms.begin())]) return out;  // virtual: mirrors
    } else if (!ranks_.count(op.peer)) {
      return out;
    }
    // The peer holds this up unless it waits at the complement (a recv from us for our send, and so on).
    auto p = ranks_.find(op.peer);
    bool complement = false;
    if (p != ranks_.end() && p->second.pending) {
      const HangOp& q = *p->second.pending;
      complement = IsP2p(q.op) && q.op != op.op && q.peer == rank;
    }
    if (!complement) out.push_back(op.peer);
    return out;
  }
  if (c == comms_.end()) return out;
  for (size_t i = 0; i < c->second.members.size(); ++i) {
    int m = c->second.members[i];
    if (m == rank || !c->second.real[i]) continue;
    if (!arrived_here(m)) out.push_back(m);
  }
  return out;
}

// Diagnose's state and steps, in its order, over the detector as it stands.
class HangDetector::Diagnoser {
 public:
  Diagnoser(const HangDetector& h, uint64_t now_ns) : h_(h), now_ns_(now_ns) {}

  void Start();
  void FindWaits();
  void FindMismatches();
  void CopyHeld();
  void FindMissing();
  void FindCycles();
  void FollowChains();
  HangDiagnosis TakeDiagnosis() { return std::move(d_); }

 private:
  void FollowChain(HangWait& w);
  void EndAtIdleRank(int at, const Rank* r, HangWait* w);
  void EndWithoutBlocker(int at, const HangOp& p, std::string line, HangWait* w);
  int NextBlocker(const std::vector<int>& bl) const;

  const HangDetector& h_;
  const uint64_t now_ns_;
  HangDiagnosis d_;
  std::map<int, std::vector<int>> edges_;  // waiting rank -> the real ranks it waits for
};

void HangDetector::Diagnoser::Start() {
  d_.t_ns = now_ns_;
  d_.timeout_s = h_.timeout_s_;
  d_.stalled_s = now_ns_ > h_.last_progress_ns_ ? static_cast<double>(now_ns_ - h_.last_progress_ns_) * 1e-9 : 0.0;
}

void HangDetector::Diagnoser::FindWaits() {
  for (const auto& [rank, r] : h_.ranks_) {
    if (!r.pending) continue;
    HangWait w;
    w.rank = rank;
    w.op = *r.pending;
    w.blocked_by = h_.Blockers(rank, w.op);
    edges_[rank] = w.blocked_by;
    d_.waits.push_back(std::move(w));
  }
}

// Disagreements at one sequence.
void HangDetector::Diagnoser::FindMismatches() {
  for (const auto& [key, by_rank] : h_.history_) {
    if (by_rank.size() < 2) continue;
    auto c = h_.comms_.find(key.first);
    bool pair = c != h_.comms_.end() && c->second.members.size() == 2;
    std::vector<std::pair<int, HangOp>> ops(by_rank.begin(), by_rank.end());
    std::string what = Disagreement(ops, pair);
    if (what.empty()) continue;
    HangMismatch m;
    m.comm_id = key.first;
    m.comm_name = c != h_.comms_.end() ? c->second.name : "";
    m.seq = key.second;
    m.what = std::move(what);
    m.ops = std::move(ops);
    d_.mismatches.push_back(std::move(m));
  }
}

void HangDetector::Diagnoser::CopyHeld() {
  for (const auto& [key, what] : h_.held_) d_.held.emplace_back(key, what);
}

// Members that never arrived where others wait (collectives).
void HangDetector::Diagnoser::FindMissing() {
  std::map<std::pair<uint32_t, uint64_t>, std::vector<int>> waiting_at;
  for (const HangWait& w : d_.waits) {
    if (!IsP2p(w.op.op)) waiting_at[{w.op.comm_id, w.op.seq}].push_back(w.rank);
  }
  for (const auto& [key, who] : waiting_at) {
    HangMissing m;
    m.comm_id = key.first;
    auto c = h_.comms_.find(key.first);
    m.comm_name = c != h_.comms_.end() ? c->second.name : "";
    m.seq = key.second;
    m.arrived = who;
    std::set<int> missing;
    for (int r : who) {
      for (int b : edges_[r]) missing.insert(b);
    }
    for (int b : missing) {
      int64_t reached = -1;
      auto r = h_.ranks_.find(b);
      if (r != h_.ranks_.end()) {
        auto it = r->second.reached.find(key.first);
        if (it != r->second.reached.end()) reached = it->second;
      }
      m.missing.emplace_back(b, reached);
    }
    if (!m.missing.empty()) d_.missing.push_back(std::move(m));
  }
}

// Wait-for cycles: DFS over edges; each cycle once, rotated to start at its smallest rank.
void HangDetector::Diagnoser::FindCycles() {
  std::set<std::vector<int>> seen;
  for (const auto& [start, _] : edges_) {
    std::vector<int> path;
    std::vector<size_t> next;
    path.push_back(start);
    next.push_back(0);
    while (!path.empty()) {
      int u = path.back();
      auto e = edges_.find(u);
      if (e == edges_.end() || next.back() >= e->second.size()) {
        path.pop_back();
        next.pop_back();
        continue;
      }
      int v = e->second[next.back()++];
      if (v == start) {
        std::vector<int> cyc = path;
        std::rotate(cyc.begin(), std::min_element(cyc.begin(), cyc.end()), cyc.end());
        if (seen.insert(cyc).second) d_.cycles.push_back(cyc);
      } else if (v > start && std::find(path.begin(), path.end(), v) == path.end() && path.size() < 64) {
        // Why v > start: every cycle is found from its smallest rank only, which bounds the search.
        path.push_back(v);
        next.push_back(0);
      }
    }
  }
}

// Chains: from each waiting rank, follow the first blocker until a rank that does not wait, or a repeat.
void HangDetector::Diagnoser::FollowChains() {
  for (HangWait& w : d_.waits) FollowChain(w);
}

void HangDetector::Diagnoser::FollowChain(HangWait& w) {
  const uint64_t now_ns = now_ns_;
  std::vector<int> visited;
  int at = w.rank;
  for (;;) {
    visited.push_back(at);
    auto r = h_.ranks_.find(at);
    const HangOp* p = (r != h_.ranks_.end() && r->second.pending) ? &*r->second.pending : nullptr;
    double waited = p ? static_cast<double>(now_ns - std::min(now_ns, p->since_ns)) * 1e-9 : 0.0;
    if (!p) {
      EndAtIdleRank(at, r != h_.ranks_.end() ? &r->second : nullptr, &w);
      break;
    }
    std::vector<int> bl = edges_.count(at) ? edges_.at(at) : h_.Blockers(at, *p);
    std::string line = fmt::format("rank {} waits {:.0f} s at {} seq {} ({})", at, waited, h_.CommName(p->comm_id),
                                   p->seq, Describe(*p));
    if (bl.empty()) {
      EndWithoutBlocker(at, *p, std::move(line), &w);
      break;
    }
    int nxt = NextBlocker(bl);
    line += bl.size() == 1 ? fmt::format(" for rank {}", nxt)
                           : fmt::format(" for ranks {} (following {})", RankListShort(bl), nxt);
    w.chain.push_back(line);
    if (std::find(visited.begin(), visited.end(), nxt) != visited.end()) {
      w.chain.push_back(fmt::format("rank {} again: a wait-for cycle", nxt));
      w.held_up_by = nxt;
      break;
    }
    at = nxt;
  }
}

// The chain ends at a rank that does not wait (r: its state, null when it reported nothing): it holds the others up.
void HangDetector::Diagnoser::EndAtIdleRank(int at, const Rank* r, HangWait* w) {
  const uint64_t now_ns = now_ns_;
  std::string where;
  if (!r || r->last_progress_ns == 0) {
    where = "has reported no operation";
  } else {
    auto it = r->reached.find(w->op.comm_id);
    where = it != r->reached.end() && it->second >= 0
                ? fmt::format("is not waiting; it last reached {} seq {}, {:.0f} s ago", h_.CommName(w->op.comm_id),
                              it->second, static_cast<double>(now_ns - std::min(now_ns, r->last_progress_ns)) * 1e-9)
                : fmt::format("is not waiting and never reached {}", h_.CommName(w->op.comm_id));
  }
  std::string state = r && !r->state.empty() ? " [" + r->state + "]" : "";
  w->chain.push_back(fmt::format("rank {}{} {}: it holds the others up", at, state, where));
  w->held_up_by = at;
}

// The chain ends at a rank that waits for no real rank: held for a disagreement, or waiting for its release.
void HangDetector::Diagnoser::EndWithoutBlocker(int at, const HangOp& p, std::string line, HangWait* w) {
  auto h = h_.held_.find({p.comm_id, p.seq});
  auto mm = std::find_if(d_.mismatches.begin(), d_.mismatches.end(), [&](const HangMismatch& m) {
    return m.comm_id == p.comm_id && m.seq == p.seq;
  });
  if (h != h_.held_.end()) {
    line += fmt::format(": every real member arrived but they disagree ({}); held there, as NCCL would hang or "
                        "corrupt",
                        h->second);
  } else if (mm != d_.mismatches.end()) {
    line += fmt::format(": every member arrived but they disagree ({})", mm->what);
  } else {
    line += " for no real rank (all real members arrived; waiting for the release)";
  }
  w->chain.push_back(line);
  w->held_up_by = at;
}

// Prefer a blocker that is not waiting itself: it is the one to look at.
int HangDetector::Diagnoser::NextBlocker(const std::vector<int>& bl) const {
  int nxt = bl.front();
  for (int b : bl) {
    auto rb = h_.ranks_.find(b);
    if (rb == h_.ranks_.end() || !rb->second.pending) {
      nxt = b;
      break;
    }
  }
  return nxt;
}

HangDiagnosis HangDetector::Diagnose(uint64_t now_ns) const {
  Diagnoser x(*this, now_ns);
  x.Start();
  x.FindWaits();
  x.FindMismatches();
  x.CopyHeld();
  x.FindMissing();
  x.FindCycles();
  x.FollowChains();
  return x.TakeDiagnosis();
}

std::optional<HangDiagnosis> HangDetector::Check(uint64_t now_ns) {
  if (timeout_s_ <= 0 || reported_) return std::nullopt;
  bool waiting = std::any_of(ranks_.begin(), ranks_.end(), [](const auto& kv) { return kv.second.pending.has_value(); });
  if (!waiting || now_ns < last_progress_ns_) return std::nullopt;
  if (static_cast<double>(now_ns - last_progress_ns_) * 1e-9 < timeout_s_) return std::nullopt;
  reported_ = true;
  return Diagnose(now_ns);
}

std::string HangDiagnosis::ToJson() const {
  json j;
  j["version"] = 1;
  j["t_ns"] = t_ns;
  j["stalled_s"] = stalled_s;
  j["hang_timeout_s"] = timeout_s;
  json ws = json::array();
  for (const HangWait& w : waits) {
    ws.push_back({{"rank", w.rank}, {"op", OpJson(w.op)}, {"waiting_for", w.blocked_by},
                  {"held_up_by", w.held_up_by}, {"chain", w.chain}});
  }
  j["waiting"] = std::move(ws);
  json ms = json::array();
  for (const HangMismatch& m : mismatches) {
    json ops = json::array();
    for (const auto& [r, o] : m.ops) {
      json x = OpJson(o);
      x["rank"] = r;
      ops.push_back(std::move(x));
    }
    ms.push_back({{"comm", m.comm_id}, {"group", m.comm_name}, {"seq", m.seq}, {"differs", m.what},
                  {"ops", std::move(ops)}, {"root", nullptr}});
  }
  j["mismatches"] = std::move(ms);
  json ns = json::array();
  for (const HangMissing& m : missing) {
    json miss = json::array();
    for (const auto& [r, reached] : m.missing) {
      miss.push_back({{"rank", r}, {"reached_seq", reached >= 0 ? json(reached) : json(nullptr)}});
    }
    ns.push_back({{"comm", m.comm_id}, {"group", m.comm_name}, {"seq", m.seq}, {"arrived", m.arrived},
                  {"never_arrived", std::move(miss)}});
  }
  j["never_arrived"] = std::move(ns);
  j["cycles"] = cycles;
  json hs = json::array();
  for (const auto& [key, what] : held) hs.push_back({{"comm", key.first}, {"seq", key.second}, {"differs", what}});
  j["held"] = std::move(hs);
  json rep = json::array();
  for (const auto& [r, reason] : ReproduceRanks(*this)) rep.push_back({{"rank", r}, {"why", reason}});
  j["reproduce_with"] = std::move(rep);
  j["text"] = ToText();
  return j.dump(2) + "\n";
}

std::string HangDiagnosis::ToText(size_t max_chains) const {
  std::string s = !header.empty() ? header + "\n"
                                  : fmt::format("prism: hang: no real rank made progress for {:.0f} s (--hang-timeout "
                                                "{:.0f}); {} rank(s) waiting\n",
                                                stalled_s, timeout_s, waits.size());
  auto comm = [](uint32_t id, const std::string& name) {
    return name.empty() ? fmt::format("comm {}", id) : fmt::format("comm {} ({})", id, name);
  };
  for (const HangMismatch& m : mismatches) {
    s += fmt::format("  {} mismatch at {} seq {}:", m.what, comm(m.comm_id, m.comm_name), m.seq);
    // (ranks that issued the same operation are one item)
    // Ranks that issued the same operation are listed together.
    std::map<std::string, std::vector<int>> by_op;
    for (const auto& [r, o] : m.ops) by_op[Describe(o)].push_back(r);
    std::vector<std::pair<std::string, std::vector<int>>> groups(by_op.begin(), by_op.end());
    std::sort(groups.begin(), groups.end(),
              [](const auto& a, const auto& b) { return a.second.front() < b.second.front(); });
    for (const auto& [what, ranks] : groups) {
      s += ranks.size() == 1 ? fmt::format(" rank {} {};", ranks[0], what)
                             : fmt::format(" {} ranks {} {};", ranks.size(), RankListShort(ranks), what);
    }
    s.back() = '\n';
  }
  for (const HangMissing& m : missing) {
    s += fmt::format("  {} seq {}: {} wait; never arrived:", comm(m.comm_id, m.comm_name), m.seq,
                     m.arrived.size() == 1 ? fmt::format("rank {}", m.arrived[0])
                                           : fmt::format("{} ranks {}", m.arrived.size(), RankListShort(m.arrived)));
    // Members are listed together when they reached the same sequence.
    std::map<int64_t, std::vector<int>> by_reached;
    for (const auto& [r, reached] : m.missing) by_reached[reached].push_back(r);
    for (const auto& [reached, ranks] : by_reached) {
      std::string where = reached >= 0 ? fmt::format("at seq {}", reached) : std::string("no op there");
      s += ranks.size() == 1 ? fmt::format(" rank {} ({});", ranks[0], where)
                             : fmt::format(" {} ranks {} ({});", ranks.size(), RankListShort(ranks), where);
    }
    s.back() = '\n';
  }
  for (const auto& c : cycles) {
    s += fmt::format("  wait-for cycle: {} -> {}\n", fmt::join(c, " -> "), c.front());
  }
  // Chains: waiting ranks whose chains differ only in the first rank are one item (a large job has many).
  struct Item {
    std::vector<int> ranks;
    const HangWait* first = nullptr;
  };
  std::vector<Item> items;
  std::map<std::string, size_t> by_key;
  for (const HangWait& w : waits) {
    std::string key = fmt::format("{}|{}|{}|{}|{}|", w.op.comm_id, w.op.seq, w.op.op, w.op.bytes,
                                  fmt::join(w.blocked_by, ","));
    for (size_t i = 1; i < w.chain.size(); ++i) key += w.chain[i] + "\n";
    auto [it, fresh] = by_key.emplace(key, items.size());
    if (fresh) items.push_back(Item{{}, &w});
    items[it->second].ranks.push_back(w.rank);
  }
  size_t shown = 0;
  for (const Item& item : items) {
    if (shown++ == max_chains) {
      s += fmt::format("  ... and {} more (hang.json has every waiting rank)\n", items.size() - max_chains);
      break;
    }
    const HangWait& w = *item.first;
    if (item.ranks.size() == 1) {
      s += fmt::format("  rank {}:\n", w.rank);
      for (const std::string& line : w.chain) s += "    " + line + "\n";
      continue;
    }
    // The first line said of rank w.rank; said of each rank here, without its own wait time.
    std::string first = w.chain.empty() ? std::string() : w.chain[0];
    size_t at = first.find(" at ");
    first = at == std::string::npos ? first : "each waits" + first.substr(at);
    s += fmt::format("  {} ranks {}:\n    {}\n", item.ranks.size(), RankListShort(item.ranks), first);
    for (size_t i = 1; i < w.chain.size(); ++i) s += "    " + w.chain[i] + "\n";
  }
  return s;
}

std::vector<std::pair<int, std::string>> ReproduceRanks(const HangDiagnosis& d) {
  std::map<int, std::string> why;
  auto add = [&](int r, const std::string& reason) {
    if (r >= 0 && !why.count(r)) why[r] = reason;
  };
  auto comm = [](uint32_t id, const std::string& name) {
    return name.empty() ? fmt::format("comm {}", id) : fmt::format("comm {} ({})", id, name);
  };
  for (const HangMismatch& m : d.mismatches) {
    std::map<std::string, std::vector<int>> by_op;
    for (const auto& [r, o] : m.ops) by_op[Describe(o)].push_back(r);
    for (const auto& [what, ranks] : by_op) {
      int r = *std::min_element(ranks.begin(), ranks.end());
      add(r, fmt::format("issued {} at {} seq {}{}", what, comm(m.comm_id, m.comm_name), m.seq,
                         ranks.size() > 1 ? fmt::format(" (as {} ranks did)", ranks.size())
                         : by_op.size() > 1 ? std::string(" (the only rank that did)")
                                            : std::string()));
    }
  }
  std::set<int> waiting;
  for (const HangWait& w : d.waits) waiting.insert(w.rank);
  for (const HangMissing& m : d.missing) {
    // Why only members that do not wait themselves: one stuck elsewhere is downstream; its own chain leads on.
    bool added = false;
    for (const auto& [r, reached] : m.missing) {
      if (waiting.count(r)) continue;
      add(r, fmt::format("never arrived at {} seq {}", comm(m.comm_id, m.comm_name), m.seq));
      added = true;
    }
    if (added && !m.arrived.empty()) {
      add(*std::min_element(m.arrived.begin(), m.arrived.end()),
          fmt::format("waits at {} seq {} (as {} rank{} do)", comm(m.comm_id, m.comm_name), m.seq, m.arrived.size(),
                      m.arrived.size() == 1 ? "" : "s"));
    }
  }
  for (const auto& c : d.cycles) {
    for (int r : c) add(r, fmt::format("in the wait-for cycle {} -> {}", fmt::join(c, " -> "), c.front()));
  }
  for (const HangWait& w : d.waits) {
    if (w.held_up_by >= 0 && w.held_up_by != w.rank && !why.count(w.held_up_by)) {
      add(w.held_up_by, fmt::format("holds up rank {} (end of its wait-for chain)", w.rank));
      add(w.rank, fmt::format("waits for rank {}", w.held_up_by));
    }
  }
  return {why.begin(), why.end()};
}

}  // namespace prism::coord
