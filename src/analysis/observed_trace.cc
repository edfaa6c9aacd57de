#include "analysis/observed_trace.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "analysis/class_key.h"
#include "model/megatron_membership.h"
#include "analysis/observed_trace_builder.h"
#include "prism/events.h"
#include "prism/limits.h"
#include "replay/trace_io.h"
#include "replay/trace_validate.h"

namespace prism::analysis {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Join(const std::vector<int>& v, size_t max_items = 8) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > max_items) s += ", ...";
  return s;
}

// Slot names are labels: keep them short and printable.
std::string SlotLabel(std::string_view s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':') ? c : '_';
  if (out.size() > 48) out.resize(48);
  return out.empty() ? std::string("comm") : out;
}

// Preferred kinds when several Megatron groups have the same members (pp and embd for pp = 2, dp and dp-cp for
// cp = 1, ...) and the communicator's description does not say which.
const std::vector<std::string>& KindPreference() {
  static const std::vector<std::string> k = {"tp",  "pp",    "dp",   "cp",  "dp-cp", "ep",       "etp",  "edp",
                                             "tp-ep", "mp", "embd", "pos-embd", "tp-dp", "tp-dp-cp", "tp-cp"};
  return k;
}

}  // namespace

namespace detail {

void Builder::IndexRealOps() {
  for (const RankEventLog& log : logs_) {
    for (const ObservedOp& op : log.ops) {
      if (!op.passthrough || op.nops != 1 || op.seq < 0) continue;
      auto c = log.comms.find(op.comm_id);
      if (c == log.comms.end() || c->second.key.empty()) continue;
      // Why members too: the key names the communicator on every member, but a file may reuse it for another group.
      auto [it, fresh] =
          real_ops_.try_emplace({c->second.key, SortedMembers(c->second), op.seq}, op.arrival_ns, op.release_ns, 1);
      if (fresh) continue;
      auto& [arrival, release, n] = it->second;
      arrival = std::max(arrival, op.arrival_ns);
      release = std::min(release, op.release_ns);
      ++n;
    }
  }
}

bool Builder::Run(std::string* error) {
  bool ok = PickRepresentatives() && IterationRange();
  if (ok) {
    trace::Trace& t = out_->trace;
    t.world_size = w_.size();
    const world::Layout& l = w_.layout();
    // Why tp * gtp: Megatron injects gtp_remat right after tp, so together they act as one wider tp dimension.
    t.layout.tp = l.tp * l.gtp;
    t.layout.pp = l.pp;
    t.layout.dp = l.dp;
    t.layout.cp = l.cp;
    t.layout.ep = l.ep;
    t.layout.etp = l.ExpertTp();
    t.layout.order = l.order;
    t.topology = o_.topology;
    IndexRealOps();
    // Why two passes: a class that repeats another's nodes copies them (and their slots) once that one is built.
    std::vector<trace::RoleClass> built(classes_.size());
    for (size_t c = 0; ok && c < classes_.size(); ++c)
      if (classes_[c].mirror_of < 0) ok = BuildClass(classes_[c], &built[c]);
    for (size_t c = 0; ok && c < classes_.size(); ++c) {
      ClassInfo& ci = classes_[c];
      if (ci.mirror_of < 0) continue;
      const ClassInfo& from = classes_[static_cast<size_t>(ci.mirror_of)];
      // Point-to-point operations on the expert-parallel communicator have peers and sizes of the source rank's
      // position there: rebuild the class from the source's file with them borrowed (BorrowEpP2p).
      bool ep_p2p = false;
      for (size_t s = 0; s < from.families.size(); ++s) {
        const Family& f = from.families[s];
        ep_p2p = ep_p2p || (from.p2p_slot[s] && f.type == Family::kGroup && f.kind == "ep");
      }
      if (ep_p2p) {
        int r = 0;
        while (key_of_[r] != ci.key) ++r;
        const std::vector<int>& members = groups_.Group("ep", groups_.IndexOf("ep", r));
        ci.ep_position = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
        // Why restore: the source's file was counted and warned about when its own class was built.
        const size_t warnings = out_->warnings.size(), dropped = out_->dropped_ops, waits = out_->wait_edges,
                     skipped = out_->waits_skipped, recorded = out_->recorded_comm;
        const auto latency = out_->coordinator_latency_ns;
        ok = BuildClass(ci, &built[c]);
        out_->warnings.resize(std::min(out_->warnings.size(), warnings));
        out_->dropped_ops = dropped;
        out_->wait_edges = waits;
        out_->waits_skipped = skipped;
        out_->recorded_comm = recorded;
        out_->coordinator_latency_ns = latency;
      } else {
        built[c] = built[static_cast<size_t>(ci.mirror_of)];
        built[c].name = ClassName(w_, ci.key);
        ci.families = from.families;
        ci.p2p_slot = from.p2p_slot;
      }
      out_->mirrored_classes.push_back(static_cast<uint32_t>(c));
    }
    for (size_t c = 0; ok && c < classes_.size(); ++c) {
      for (const trace::Stream& s : built[c].streams) out_->nodes += s.nodes.size();
      t.classes.push_back(std::move(built[c]));
      out_->class_ranks.push_back(classes_[c].rep);
    }
  }
  ok = ok && Bind();
  if (ok && o_.validate) {
    replay::ValidationOptions vo;
    vo.max_errors = 12;
    std::vector<std::string> errs = replay::ValidateTrace(out_->trace, vo);
    if (!errs.empty()) {
      std::string m = "the graph built from the event files does not validate (" + std::to_string(errs.size()) +
                      (errs.size() >= vo.max_errors ? "+" : "") + " errors; the files disagree, e.g. a rank's file is "
                      "cut short or its iteration marks fall elsewhere):";
      for (const std::string& e : errs) m += "\n  " + e;
      ok = Fail(m);
    }
  }
  if (!ok) *error = error_;
  return ok;
}

bool Builder::PickRepresentatives() {
  const int n = w_.size();
  key_of_.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    key_of_[r] = KeyOf(w_.CoordsOf(r));
    auto [it, fresh] = class_of_key_.try_emplace(key_of_[r], static_cast<int>(classes_.size()));
    if (fresh) {
      ClassInfo ci;
      ci.key = key_of_[r];
      classes_.push_back(ci);
    }
  }
  std::set<int> seen;
  for (const RankEventLog& log : logs_) {
    if (log.rank < 0 || log.rank >= n)
      return Fail("events of rank " + std::to_string(log.rank) + ": outside the world (" + std::to_string(n) +
                  " ranks)");
    if (!seen.insert(log.rank).second) return Fail("two event logs for rank " + std::to_string(log.rank));
    if (log.world_size > 0 && log.world_size != n)
      return Fail("rank " + std::to_string(log.rank) + "'s events say world size " + std::to_string(log.world_size) +
                  " but the layout gives " + std::to_string(n));
    ClassInfo& ci = classes_[class_of_key_.at(key_of_[log.rank])];
    // Prefer the lowest rank that recorded operations.
    bool better = ci.log == nullptr || (ci.log->ops.empty() && !log.ops.empty()) ||
                  (ci.log->ops.empty() == log.ops.empty() && log.rank < ci.rep);
    if (better) {
      ci.rep = log.rank;
      ci.log = &log;
    }
  }
  if (o_.mirror_expert_classes && w_.layout().ep > 1) {
    std::map<ClassKey, int> have;
    for (size_t c = 0; c < classes_.size(); ++c)
      if (classes_[c].log) have[classes_[c].key] = static_cast<int>(c);
    std::vector<std::string> mirrored;
    for (ClassInfo& ci : classes_) {
      if (ci.log) continue;
      const int from = EpStandIn(ci.key, have);
      if (from < 0) continue;
      ci.mirror_of = from;
      ci.rep = classes_[static_cast<size_t>(from)].rep;
      ci.log = classes_[static_cast<size_t>(from)].log;
      mirrored.push_back(KeyText(w_, ci.key) + " from rank " + std::to_string(ci.rep));
    }
    if (!mirrored.empty()) {
      std::string m = std::to_string(mirrored.size()) + " expert-parallel class(es) have no real rank and repeat the "
                      "nodes of the real rank that differs from them only in ep (EP symmetry assumed: mirrored MoE "
                      "routing, every expert-parallel rank routes tokens like that one): ";
      for (size_t i = 0; i < mirrored.size() && i < 6; ++i) m += (i ? "; " : "") + mirrored[i];
      if (mirrored.size() > 6) m += "; ... (" + std::to_string(mirrored.size() - 6) + " more)";
      m += ". Run `prism-run collect --real-routing` to record them from real routing";
      Warn(m);
    }
  }
  std::vector<std::string> missing;
  for (const ClassInfo& ci : classes_) {
    if (ci.log) continue;
    std::vector<int> examples;
    for (int r = 0; r < n && examples.size() < 4; ++r)
      if (key_of_[r] == ci.key) examples.push_back(r);
    missing.push_back(KeyText(w_, ci.key) + " (ranks " + Join(examples, 3) + ")");
  }
  if (!missing.empty()) {
    std::vector<int> have;
    for (const RankEventLog& log : logs_) have.push_back(log.rank);
    std::sort(have.begin(), have.end());
    std::string m = "the real ranks do not cover every class of the world: " + std::to_string(missing.size()) + " of " +
                    std::to_string(classes_.size()) + " classes have no events; missing coordinates: ";
    for (size_t i = 0; i < missing.size() && i < 8; ++i) m += (i ? "; " : "") + missing[i];
    if (missing.size() > 8) m += "; ... (" + std::to_string(missing.size() - 8) + " more)";
    m += ". Real ranks with events: " + (have.empty() ? std::string("none") : Join(have, 16)) +
         ". Run one data-parallel replica for real (one rank of each class) to get the whole graph.";
    return Fail(m);
  }
  for (const RankEventLog& log : logs_) {
    const ClassInfo& ci = classes_[class_of_key_.at(key_of_[log.rank])];
    if (ci.rep != log.rank) out_->unused_ranks.push_back(log.rank);
  }
  std::sort(out_->unused_ranks.begin(), out_->unused_ranks.end());
  if (!out_->unused_ranks.empty())
    Warn("ranks " + Join(out_->unused_ranks) + " share their class with a lower real rank: their events were not used");
  return true;
}

bool Builder::IterationRange() {
  int with = 0, without = 0, example_without = -1;
  for (const ClassInfo& ci : classes_) {
    if (ci.log->marks.empty()) {
      ++without;
      if (example_without < 0) example_without = ci.rep;
    } else {
      ++with;
    }
  }
  if (with == 0) {
    use_marks_ = false;
    first_ = last_ = 0;
    Warn("no iteration marks in the event files: everything recorded is one iteration (0)");
    if (o_.skip_iterations > 0 || o_.max_iterations > 0)
      Warn("--skip-iterations/--iterations ignored: there are no iteration marks");
    return true;
  }
  if (without > 0) {
    use_marks_ = false;
    first_ = last_ = 0;
    Warn("rank " + std::to_string(example_without) + " has no iteration marks while others have: everything "
         "recorded is taken as one iteration (0)");
    return true;
  }
  use_marks_ = true;
  int64_t lo = INT64_MIN, hi = INT64_MAX;
  int hi_rank = -1;
  for (const ClassInfo& ci : classes_) {
    int64_t mn = INT64_MAX, mx = INT64_MIN;
    for (const ObservedMark& m : ci.log->marks) {
      mn = std::min(mn, m.iteration);
      mx = std::max(mx, m.iteration);
    }
    lo = std::max(lo, mn);
    if (mx < hi) {
      hi = mx;
      hi_rank = ci.rep;
    }
  }
  first_ = lo + std::max<int64_t>(0, o_.skip_iterations);
  last_ = hi;
  if (o_.max_iterations > 0) last_ = std::min(last_, first_ + o_.max_iterations - 1);
  if (first_ > last_) {
    return Fail("no complete iteration to keep: the real ranks completed iterations " + std::to_string(lo) + ".." +
                std::to_string(hi) + " (rank " + std::to_string(hi_rank) + " stops first)" +
                (o_.skip_iterations > 0 ? " and " + std::to_string(o_.skip_iterations) + " are skipped" : ""));
  }
  out_->first_iteration = first_;
  out_->last_iteration = last_;
  return true;
}

bool Builder::Resolve(const RankEventLog& log, const ObservedComm& c, Family* f) {
  const int r = log.rank, n = w_.size();
  std::string where = "rank " + std::to_string(r) + " communicator " + std::to_string(c.id) +
                      (c.desc.empty() ? "" : " (" + c.desc + ")");
  std::vector<int> members = c.members;
  if (!members.empty() && c.nranks > 0 && static_cast<int>(members.size()) != c.nranks)
    return Fail(where + ": " + std::to_string(members.size()) + " members listed for " + std::to_string(c.nranks) +
                " ranks");
  for (int m : members)
    if (m < 0 || m >= n) return Fail(where + ": member " + std::to_string(m) + " outside the world");
  std::string desc_kind = groups_.KindOfDesc(c.desc);
  if (members.empty()) {
    if (c.nranks == n) {
      if (c.rank >= 0 && c.rank != r)
        return Fail(where + ": a communicator of all " + std::to_string(n) + " ranks whose members are not " +
                    "recorded and where this rank is communicator rank " + std::to_string(c.rank) + ", not " +
                    std::to_string(r));
      members.resize(static_cast<size_t>(n));
      std::iota(members.begin(), members.end(), 0);
    } else if (!desc_kind.empty()) {
      int gi = groups_.IndexOf(desc_kind, r);
      if (gi >= 0) members = groups_.Group(desc_kind, gi);
    } else if (auto m = membership_.Members(c.name); m && std::find(m->begin(), m->end(), r) != m->end()) {
      // torch's group name "k" is Megatron's (k-1)-th new_group when nothing created a group before it.
      members = *m;
      desc_kind = groups_.KindOfDesc(membership_.Desc(c.name));
    }
    if (members.empty() || (c.nranks > 0 && static_cast<int>(members.size()) != c.nranks))
      return Fail(where + " (key '" + c.key + "', " + std::to_string(c.nranks) + " ranks): its members are not "
                  "recorded and it is no Megatron group of this layout; load the Prism Python hook so that groups "
                  "register their members");
    if (c.rank >= 0 && (c.rank >= static_cast<int>(members.size()) || members[c.rank] != r))
      return Fail(where + ": resolved to the members [" + Join(members) + "] but this rank is communicator rank " +
                  std::to_string(c.rank) + " there");
  }
  auto me = std::find(members.begin(), members.end(), r);
  if (me == members.end()) return Fail(where + ": the rank is not among its members [" + Join(members) + "]");
  f->members = members;
  f->position = static_cast<int>(me - members.begin());

  // A Megatron group named by the description wins, also over "all ranks" (Megatron's distributed-optimizer
  // instance group can hold every rank).
  if (!desc_kind.empty()) {
    int gi = groups_.IndexOf(desc_kind, r);
    if (gi >= 0 && groups_.Group(desc_kind, gi) == members) {
      f->type = Family::kGroup;
      f->kind = desc_kind;
      f->slot = desc_kind;
      f->desc = groups_.Desc(desc_kind, gi);
      return true;
    }
  }
  bool is_world = static_cast<int>(members.size()) == n;
  for (int i = 0; is_world && i < n; ++i) is_world = members[i] == i;
  if (is_world) {
    f->type = Family::kWorld;
    f->slot = "world";
    f->desc = c.desc.empty() ? "WORLD" : c.desc;
    return true;
  }
  // Megatron kinds whose group containing r has exactly these members, in this order.
  std::vector<std::string> candidates;
  for (const std::string& k : groups_.Kinds()) {
    int gi = groups_.IndexOf(k, r);
    if (gi >= 0 && groups_.Group(k, gi) == members) candidates.push_back(k);
  }
  if (!candidates.empty()) {
    std::string kind;
    for (const std::string& k : KindPreference())
      if (kind.empty() && std::find(candidates.begin(), candidates.end(), k) != candidates.end()) kind = k;
    if (kind.empty()) kind = candidates.front();
    f->type = Family::kGroup;
    f->kind = kind;
    f->slot = kind;
    f->desc = groups_.Desc(kind, groups_.IndexOf(kind, r));
    return true;
  }
  // Any other communicator (torch's pairwise p2p communicators, groups the script made itself): the same
  // communicator moved to each data-parallel replica.
  f->type = Family::kMoved;
  // Why a hash of the members last: the label must be the same on every real rank of the communicator, and its
  // key can be rank-local (a split's parent id).
  std::string label;
  if (!c.desc.empty()) {
    label = c.desc;
  } else if (!c.name.empty()) {
    label = "group" + c.name;
  } else {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (int m : members) h = (h ^ static_cast<uint64_t>(static_cast<uint32_t>(m))) * 1099511628211ull;
    char buf[24];
    std::snprintf(buf, sizeof buf, "comm-%08llx", static_cast<unsigned long long>(h & 0xffffffffull));
    label = buf;
  }
  f->slot = SlotLabel(label);
  f->desc = !c.desc.empty() ? c.desc : f->slot;
  return true;
}

bool Builder::Expand(const RankEventLog& log, const ObservedOp& op, std::vector<Piece>* pieces,
                     std::vector<Piece>* local) {
  auto where = [&](int64_t comm, int64_t seq) {
    return "rank " + std::to_string(log.rank) + " event file line " + std::to_string(op.line) + " (comm " +
           std::to_string(comm) + " seq " + std::to_string(seq) + ")";
  };
  auto comm_of = [&](int64_t id) -> const ObservedComm* {
    auto it = log.comms.find(id);
    return it == log.comms.end() ? nullptr : &it->second;
  };
  auto make = [&](const std::string& name, const std::string& dtype, uint64_t bytes, int32_t peer, int32_t root,
                  int64_t comm, int64_t seq) -> bool {
    Piece p;
    p.comm_id = comm;
    p.seq = seq;
    p.bytes = bytes;
    const ObservedComm* c = comm_of(comm);
    if (!c) return Fail(where(comm, seq) + ": no \"comm\" line describes communicator " + std::to_string(comm));
    if (name == "send" || name == "recv") {
      p.kind = name == "send" ? NodeKind::kSend : NodeKind::kRecv;
      int nranks = c->nranks > 0 ? c->nranks : static_cast<int>(c->members.size());
      if (peer < 0 && nranks == 2 && c->rank >= 0) peer = 1 - c->rank;  // the one other member
      if (peer < 0)
        return Fail(where(comm, seq) + ": " + name + " without its peer on a communicator of " +
                    std::to_string(nranks) + " ranks (the shim must write \"peer\", or \"ops\" for a fused unit)");
      p.peer = peer;
      int me = c->rank;
      if (me < 0) {
        auto m = std::find(c->members.begin(), c->members.end(), log.rank);
        if (m != c->members.end()) me = static_cast<int>(m - c->members.begin());
      }
      // Why: torch's all_to_all_single with uneven splits (MoE token dispatch) sends to and receives from the rank
      // itself, a local copy with no peer; the graph has no such channel (the validator rejects a self peer). The
      // copy's time stays in its unit's other nodes, or in the compute gap when the unit had nothing else.
      if (peer == me) {
        p.dtype = trace::ParseDType(dtype);  // a class that borrows the rank's operations can make it a node
        local->push_back(p);
        return true;
      }
      if (seq < 0)
        return Fail(where(comm, seq) + ": a " + name + " to peer " + std::to_string(peer) +
                    " without a sequence number (only a send or receive to the rank itself has none)");
    } else {
      if (seq < 0) return Fail(where(comm, seq) + ": " + name + " without a sequence number");
      p.kind = NodeKind::kColl;
      p.op = trace::ParseCollOp(name);
      if (p.op == CollOp::kInvalid)
        return Fail(where(comm, seq) + ": operation '" + name + "' cannot be written in a PrismTrace");
      if (p.op == CollOp::kBroadcast || p.op == CollOp::kReduce) {
        if (root < 0) {
          root = 0;
          if (!warned_root_) Warn("broadcast/reduce without a recorded root (older shim): root 0 assumed");
          warned_root_ = true;
        }
        p.root = root;
      }
    }
    p.dtype = trace::ParseDType(dtype);
    if (p.dtype == DType::kInvalid) return Fail(where(comm, seq) + ": unknown dtype '" + dtype + "'");
    pieces->push_back(p);
    return true;
  };

  if (!op.ops.empty()) {
    for (size_t i = 0; i < op.ops.size(); ++i) {
      const ObservedSubOp& s = op.ops[i];
      int64_t comm = s.comm_id >= 0 ? s.comm_id : op.comm_id;
      if (!make(s.op, s.dtype.empty() ? op.dtype : s.dtype, s.bytes, s.peer, s.root, comm, s.seq)) return false;
    }
    return true;
  }
  if (op.nops <= 1) return make(op.op, op.dtype, op.bytes, op.peer, op.root, op.comm_id, op.seq);
  if (op.seq < 0)
    return Fail(where(op.comm_id, op.seq) + ": a unit of " + std::to_string(op.nops) + " copies to the rank itself "
                "without per-operation detail (\"ops\")");

  // A fused unit without per-operation detail: split what can be split without guessing more than sizes.
  const ObservedComm* c = comm_of(op.comm_id);
  if (!c)
    return Fail(where(op.comm_id, op.seq) + ": no \"comm\" line describes communicator " + std::to_string(op.comm_id));
  const int n = op.nops;
  DType dt = trace::ParseDType(op.dtype);
  const uint64_t unit = std::max(1, trace::DTypeSize(dt));
  auto share = [&](int i, int parts) {
    uint64_t elems = op.bytes / unit, base = elems / static_cast<uint64_t>(parts);
    uint64_t extra = i == 0 ? elems - base * static_cast<uint64_t>(parts) : 0;
    uint64_t b = (base + extra) * unit;
    if (i == 0) b += op.bytes % unit;
    return b;
  };
  int nranks = c->nranks > 0 ? c->nranks : static_cast<int>(c->members.size());
  if (op.op == "group") {
    if (n != 2 || nranks != 2)
      return Fail(where(op.comm_id, op.seq) + ": a fused unit of " + std::to_string(n) + " sends and receives on a "
                  "communicator of " + std::to_string(nranks) + " ranks, without per-operation detail (\"ops\"): "
                  "its peers and sizes are unknown. " +
                  (op.ops_truncated ? std::string("The line's \"ops\" list is incomplete (\"ops_truncated\": the "
                                                  "shim lists at most 16 operations of a unit)")
                                    : std::string("The shim must write \"ops\" for fused units (docs/collect.md)")));
    if (!warned_split_)
      Warn("fused send+recv units without per-operation detail: each side taken as half of the unit's bytes");
    warned_split_ = true;
    return make("send", op.dtype, share(0, 2), op.peer, -1, op.comm_id, op.seq) &&
           make("recv", op.dtype, share(1, 2), op.peer, -1, op.comm_id, op.seq + 1);
  }
  if (!warned_split_)
    Warn("fused units without per-operation detail: their bytes split evenly over their operations");
  warned_split_ = true;
  for (int i = 0; i < n; ++i)
    if (!make(op.op, op.dtype, share(i, n), op.peer, op.root, op.comm_id, op.seq + i)) return false;
  return true;
}

// EP symmetry for the point-to-point operations of one unit on the expert-parallel communicator (torch's grouped
// send/recv all-to-all), for a class at position p there that borrows the source rank at position p0. With R[q] the
// bytes the source sends to q and C[q] those it receives from q (0 when absent; R[p0] = C[p0], its copy to itself),
// the class sends R[q] + C[p] - R[p0] to q and receives R[p] + C[q] - R[p0] from q. Under mirror every ep rank
// routes like the source: in the dispatch the source receives its own split from every peer (C[q] = R[p0]), so the
// class sends R[q] and receives R[p], what the source sends to p; in the combine (the reverse all-to-all) the source
// sends R[p0] to everyone (R[q] = R[p0]), so the class sends C[p] and receives C[q]. Any two ranks then agree on
// what passes between them, the source included. The operations to p itself become local copies; one whose size
// becomes 0 is left out unless the unit already has a zero-size operation there (torch with NCCL >= 2.14 issues
// them, older ones skip them).
bool Builder::BorrowEpP2p(const RankEventLog& log, const ObservedOp& op, int position, std::map<int64_t, int>* ep_comms,
                          std::vector<Piece>* pieces, std::vector<Piece>* local) {
  std::vector<Piece> all = std::move(*pieces);
  const size_t was_pieces = all.size();  // the rest were local copies
  pieces->clear();
  all.insert(all.end(), local->begin(), local->end());
  local->clear();
  auto p0_of = [&](int64_t comm) {  // the source's position on `comm` when it is the ep communicator, else -1
    auto [it, fresh] = ep_comms->try_emplace(comm, -1);
    Family f;
    if (fresh && Resolve(log, log.comms.at(comm), &f) && f.type == Family::kGroup && f.kind == "ep")
      it->second = f.position;
    return it->second;
  };
  std::map<int64_t, std::map<int32_t, uint64_t>> sent, received;  // comm -> peer -> bytes
  std::set<int64_t> zeros;
  for (const Piece& x : all) {
    if (!IsP2p(x.kind) || p0_of(x.comm_id) < 0) continue;
    (x.kind == NodeKind::kSend ? sent : received)[x.comm_id].try_emplace(x.peer, x.bytes);
    if (x.bytes == 0) zeros.insert(x.comm_id);
  }
  for (size_t i = 0; i < all.size(); ++i) {
    Piece x = all[i];
    const int p0 = IsP2p(x.kind) ? p0_of(x.comm_id) : -1;
    if (p0 < 0) {
      (i < was_pieces ? pieces : local)->push_back(x);
      continue;
    }
    auto at = [](const std::map<int32_t, uint64_t>& m, int q) {
      auto it = m.find(q);
      return it == m.end() ? int64_t{0} : static_cast<int64_t>(it->second);
    };
    const auto& r = sent[x.comm_id];
    const auto& c = received[x.comm_id];
    const int64_t self = r.count(p0) ? at(r, p0) : at(c, p0);
    const int64_t bytes =
        x.kind == NodeKind::kSend ? at(r, x.peer) + at(c, position) - self : at(r, position) + at(c, x.peer) - self;
    if (bytes < 0)
      return Fail("rank " + std::to_string(log.rank) + " event file line " + std::to_string(op.line) +
                  ": its sends and receives on the expert-parallel communicator are neither a dispatch nor a combine "
                  "all-to-all under mirrored routing, so the expert-parallel classes without a real rank cannot "
                  "borrow them; run `prism-run collect --real-routing`");
    x.bytes = static_cast<uint64_t>(bytes);
    (x.peer == position || (bytes == 0 && !zeros.count(x.comm_id)) ? local : pieces)->push_back(x);
  }
  return true;
}

// Iteration of each op: the first mark after its arrival.
void Builder::ClassBuild::SortMarks() {
  marks_ = log_.marks;
  std::stable_sort(marks_.begin(), marks_.end(),
                   [](const ObservedMark& a, const ObservedMark& b) { return a.iteration < b.iteration; });
  marks_.erase(std::unique(marks_.begin(), marks_.end(),
                           [](const ObservedMark& a, const ObservedMark& b) { return a.iteration == b.iteration; }),
               marks_.end());
  for (size_t i = 1; i < marks_.size(); ++i) {
    if (marks_[i].t_ns < marks_[i - 1].t_ns) {
      b_.Warn(rank_s_ + ": iteration marks go back in time at iteration " + std::to_string(marks_[i].iteration) +
              ": operations may be assigned to the wrong iteration");
      break;
    }
  }
  for (const ObservedMark& m : marks_) {
    mark_t_[m.iteration] = m.t_ns;
    mark_stream_[m.iteration] = m.stream;
  }
}

int64_t Builder::ClassBuild::IterationOf(int64_t arrival) const {
  if (!b_.use_marks_) return 0;
  auto it = std::upper_bound(marks_.begin(), marks_.end(), arrival,
                             [](int64_t t, const ObservedMark& m) { return t < m.t_ns; });
  return it == marks_.end() ? INT64_MAX : it->iteration;
}

// Units per stream.
bool Builder::ClassBuild::CollectUnits() {
  bool any_recorded = false, any_fallback = false;
  for (const ObservedOp& op : log_.ops) {
    int64_t it = IterationOf(op.arrival_ns);
    if (it < b_.first_ || it > b_.last_) {
      ++b_.out_->dropped_ops;
      continue;
    }
    Unit u;
    u.op = &op;
    u.iter = it;
    if (!b_.Expand(log_, op, &u.pieces, &u.local)) return false;
    if (ci_.ep_position >= 0 && !b_.BorrowEpP2p(log_, op, ci_.ep_position, &ep_comms_, &u.pieces, &u.local))
      return false;
    if (u.pieces.empty() && !u.local.empty()) {  // only copies to itself: no communication, no node
      local_only_.push_back(std::move(u));
      continue;
    }
    StreamKey key;
    if (op.stream >= 0) {
      key = {0, op.stream};
      any_recorded = true;
    } else {
      any_fallback = true;
      if (b_.o_.stream_fallback == StreamFallback::kOne) {
        key = {1, 0};
      } else {
        auto [fu, fresh] = first_use_.try_emplace(op.comm_id, static_cast<int64_t>(first_use_.size()));
        key = {1, fu->second};
      }
    }
    streams_[key].push_back(std::move(u));
  }
  if (any_recorded && any_fallback)
    b_.Warn(rank_s_ + ": some op lines have \"stream\" and some do not: those without are on a stream of their own");
  return true;
}

// Communicators -> slots.
bool Builder::ClassBuild::AssignSlots() {
  for (auto& [key, units] : streams_) {
    for (const Unit& u : units) {
      for (const Piece& p : u.pieces) {
        if (slot_of_comm_.count(p.comm_id)) continue;
        Family f;
        if (!b_.Resolve(log_, log_.comms.at(p.comm_id), &f)) return false;
        // Why unique names: two communicators can resolve alike (torch making two over one group).
        std::string base = f.slot;
        const std::vector<std::string>& slots = cls_->comm_slots;
        for (int k = 2; std::find(slots.begin(), slots.end(), f.slot) != slots.end(); ++k)
          f.slot = base + "#" + std::to_string(k);
        slot_of_comm_[p.comm_id] = static_cast<uint32_t>(cls_->comm_slots.size());
        cls_->comm_slots.push_back(f.slot);
        ci_.families.push_back(std::move(f));
        ci_.p2p_slot.push_back(0);
      }
    }
  }
  return true;
}

// Order within a stream: GPU arrival; a communicator's operations must then be in sequence order.
bool Builder::ClassBuild::OrderStreams() {
  for (auto& [key, units] : streams_) {
    // Why file order on ties: lines are written as units are released, which on one stream is issue order.
    std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
      return a.op->arrival_ns != b.op->arrival_ns ? a.op->arrival_ns < b.op->arrival_ns : a.op->line < b.op->line;
    });
    std::map<int64_t, int64_t> last_seq;
    for (const Unit& u : units) {
      if (u.op->seq < 0) continue;  // only copies to itself (made nodes for a class that borrows them): unnumbered
      auto [it, fresh] = last_seq.try_emplace(u.op->comm_id, u.op->seq);
      if (!fresh && u.op->seq <= it->second)
        return b_.Fail(rank_s_ + ": on one stream, communicator " + std::to_string(u.op->comm_id) +
                       "'s operation seq " + std::to_string(u.op->seq) + " (line " + std::to_string(u.op->line) +
                       ") arrives after seq " + std::to_string(it->second) +
                       ": the GPU timestamps contradict the issue order");
      it->second = u.op->seq;
    }
  }
  return true;
}

// Gaps in a communicator's sequence numbers: operations missing from the file.
void Builder::ClassBuild::CheckSequenceGaps() {
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> by_comm;  // comm -> (seq, count)
  auto add_unit = [&](const Unit& u) {
    std::map<int64_t, int64_t> per, first;  // comm -> numbered operations, the lowest sequence
    for (const auto* v : {&u.pieces, &u.local}) {
      for (const Piece& p : *v) {
        if (p.seq < 0) continue;  // a copy to itself, unnumbered
        per[p.comm_id]++;
        auto [f, fresh] = first.try_emplace(p.comm_id, p.seq);
        if (!fresh) f->second = std::min(f->second, p.seq);
      }
    }
    for (auto& [comm, count] : per) by_comm[comm].push_back({first.at(comm), count});
  };
  for (auto& [key, units] : streams_)
    for (const Unit& u : units) add_unit(u);
  for (const Unit& u : local_only_) add_unit(u);
  for (auto& [comm, v] : by_comm) {
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i) {
      if (v[i].first != v[i - 1].first + v[i - 1].second) {
        b_.Warn(rank_s_ + " communicator " + std::to_string(comm) + ": sequence numbers jump from " +
                std::to_string(v[i - 1].first) + " to " + std::to_string(v[i].first) +
                " (operations missing from the event file, or fused with another communicator's)");
        break;
      }
    }
  }
}

// Why here: a duration comes from two clock stamps of the file, and past the format's bound the graph written
// would be refused by every reader (a stamp missing or cut makes a gap of decades).
bool Builder::ClassBuild::CheckDurations() {
  for (const trace::Stream& st : cls_->streams) {
    for (size_t i = 0; i < st.nodes.size(); ++i) {
      if (st.nodes[i].dur_us <= limits::kMaxDurationUs) continue;
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.6g us, past the format's bound of %.0e us", st.nodes[i].dur_us,
                    limits::kMaxDurationUs);
      return b_.Fail(rank_s_ + "'s events give stream '" + st.name + "' node " + std::to_string(i) +
                     " a duration of " + buf + ": its clock stamps (arrival_ns, release_ns, opened_ns, t_ns) jump");
    }
  }
  return true;
}

bool Builder::BuildClass(ClassInfo& ci, trace::RoleClass* cls) {
  cls->name = ClassName(w_, ci.key);
  ClassBuild b(*this, ci, cls);
  b.SortMarks();
  if (!b.CollectUnits() || !b.AssignSlots() || !b.OrderStreams()) return false;
  b.CheckSequenceGaps();
  b.BuildNodes();
  if (!b.CheckDurations()) return false;
  b.ApplyWaits();
  b.SequenceMultiStreamSlots();
  return true;
}

// Cross-stream dependencies ("wait" lines). The gap before the waiting unit is cut at iteration marks into compute
// nodes. The stream waited somewhere in the gap for the awaited unit's release; the wait is taken to sit at the start
// of the part of the gap where it can be: after the last piece that ends at an iteration mark stamped on this very
// stream (the stream reached that mark, so it was not blocked before it: the end of the backward pass and the
// optimizer step), else at the start of the gap (a side stream, whose gap across another stream's mark is waiting,
// not work). Those pieces keep only what lies after the release; the first of them that ends after it gets the
// awaited unit's nodes in `after` (else the unit itself does), so the edge lands in the iteration the wait ended
// in. Without this the wait would be replayed as compute (docs/fill.md): the medium fill's side streams replayed
// the optimizer step and the other streams' work, 2.65 s per iteration instead of 0.22 s.
void Builder::ApplyWaits(const RankEventLog& log, const std::map<std::pair<int64_t, int64_t>, UnitNodes>& unit_at,
                         trace::RoleClass* cls) {
  if (log.waits.empty()) return;
  std::map<uint32_t, Node*> by_id;
  for (trace::Stream& st : cls->streams)
    for (Node& n : st.nodes) by_id[n.id] = &n;
  std::map<const UnitNodes*, int64_t> awaited;  // waiting unit -> latest awaited release
  size_t used = 0, skipped = 0;
  for (const ObservedWait& w : log.waits) {
    auto s = unit_at.find({w.stream, w.next});
    auto t = unit_at.find({w.on, w.after});
    // Why the time check: an edge must point forward in time, so the graph stays acyclic whatever the file says.
    if (s == unit_at.end() || t == unit_at.end() || t->second.arrival >= s->second.arrival || t->second.ids.empty() ||
        s->second.ids.empty()) {
      ++skipped;
      continue;
    }
    const UnitNodes& u = s->second;
    const int64_t rel = t->second.release;
    uint32_t target = u.ids.front();
    for (size_t i = u.waitable; i < u.gap.size(); ++i) {
      if (u.gap[i].to > rel) {
        target = u.gap[i].id;
        break;
      }
    }
    Node* n = by_id.at(target);
    for (uint32_t id : t->second.ids)
      if (std::find(n->after.begin(), n->after.end(), id) == n->after.end()) n->after.push_back(id);
    int64_t& a = awaited[&u];
    a = std::max(a, rel);
    ++used;
  }
  for (const auto& [unit, rel] : awaited) {
    for (size_t i = unit->waitable; i < unit->gap.size(); ++i) {
      const UnitNodes::GapPiece& g = unit->gap[i];
      by_id.at(g.id)->dur_us = static_cast<double>(std::max<int64_t>(0, g.to - std::max(g.from, rel))) / 1000.0;
    }
  }
  out_->wait_edges += used;
  out_->waits_skipped += skipped;
}

// A communicator whose operations the rank issued on several streams is sequenced by node id in the graph
// (docs/trace-format.md): torch runs a blocking collective on the caller's current stream (Megatron's forward
// tensor-parallel all-reduces on one stream, backward ones on the autograd stream), and its point-to-point operations
// on a stream of their own (a pipeline group's sends and receives beside its all-reduces on the main stream). Node
// ids are handed out stream by stream, so permute the ids of that slot's numbered operations (collectives, sends and
// receives; a copy to itself has no number) into communicator-sequence order and remap `after`.
void Builder::SequenceMultiStreamSlots(const std::map<uint32_t, int64_t>& comm_seq, trace::RoleClass* cls) {
  std::map<uint32_t, std::set<size_t>> streams_of_slot;
  std::map<uint32_t, std::vector<Node*>> nodes_of_slot;
  for (size_t si = 0; si < cls->streams.size(); ++si) {
    for (Node& n : cls->streams[si].nodes) {
      if (n.kind == NodeKind::kCompute || !comm_seq.contains(n.id)) continue;
      streams_of_slot[n.comm_slot].insert(si);
      nodes_of_slot[n.comm_slot].push_back(&n);
    }
  }
  std::map<uint32_t, uint32_t> renamed;  // old id -> new id
  for (auto& [slot, nodes] : nodes_of_slot) {
    if (streams_of_slot[slot].size() < 2) continue;
    std::vector<uint32_t> ids;
    for (Node* n : nodes) ids.push_back(n->id);
    std::sort(ids.begin(), ids.end());
    std::stable_sort(nodes.begin(), nodes.end(), [&](const Node* a, const Node* b) {
      return comm_seq.at(a->id) < comm_seq.at(b->id);
    });
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i]->id != ids[i]) renamed[nodes[i]->id] = ids[i];
    }
  }
  if (renamed.empty()) return;
  for (trace::Stream& st : cls->streams) {
    for (Node& n : st.nodes) {
      auto it = renamed.find(n.id);
      if (it != renamed.end()) n.id = it->second;
      for (uint32_t& a : n.after) {
        auto ia = renamed.find(a);
        if (ia != renamed.end()) a = ia->second;
      }
    }
  }
}

std::vector<int> Builder::Moved(const std::vector<int>& members, int from, int to) const {
  const int dp = w_.layout().dp;
  const int delta = w_.CoordsOf(to).dp - w_.CoordsOf(from).dp;
  std::vector<int> out;
  out.reserve(members.size());
  for (int m : members) {
    world::Coords c = w_.CoordsOf(m);
    out.push_back(w_.RankOf(c.tp, c.cp, ((c.dp + delta) % dp + dp) % dp, c.pp, c.gtp));
  }
  return out;
}

uint32_t Builder::CommId(const std::string& slot, const std::vector<int>& members, const std::string& desc) {
  auto [it, fresh] = comm_ids_.try_emplace({slot, members}, static_cast<uint32_t>(out_->trace.comms.size()));
  if (fresh) {
    trace::Comm c;
    c.id = it->second;
    c.ranks.assign(members.begin(), members.end());
    c.desc = desc;
    out_->trace.comms.push_back(std::move(c));
  }
  return it->second;
}

bool Builder::Bind() {
  trace::Trace& t = out_->trace;
  const int n = w_.size();
  t.ranks.resize(static_cast<size_t>(n));
  std::vector<int> world_members(static_cast<size_t>(n));
  std::iota(world_members.begin(), world_members.end(), 0);
  std::map<std::tuple<std::string, std::string, int>, uint32_t> group_ids;
  for (int r = 0; r < n; ++r) {
    const uint32_t cls = static_cast<uint32_t>(class_of_key_.at(key_of_[r]));
    const ClassInfo& ci = classes_[cls];
    trace::RankBinding& b = t.ranks[r];
    b.cls = cls;
    b.comms.resize(ci.families.size());
    for (size_t s = 0; s < ci.families.size(); ++s) {
      const Family& f = ci.families[s];
      const std::string where = "rank " + std::to_string(r) + " (class " + t.classes[cls].name + ", from rank " +
                                std::to_string(ci.rep) + ") slot '" + f.slot + "'";
      int position = -1;
      switch (f.type) {
        case Family::kWorld:
          b.comms[s] = CommId(f.slot, world_members, f.desc);
          position = r;
          break;
        case Family::kGroup: {
          int gi = groups_.IndexOf(f.kind, r);
          if (gi < 0) return Fail(where + ": the rank is in no " + f.kind + " group of this layout");
          auto [it, fresh] = group_ids.try_emplace({f.slot, f.kind, gi}, 0);
          const std::vector<int>& members = groups_.Group(f.kind, gi);
          if (fresh) it->second = CommId(f.slot, members, groups_.Desc(f.kind, gi));
          b.comms[s] = it->second;
          if (ci.p2p_slot[s])
            position = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
          break;
        }
        case Family::kMoved: {
          std::vector<int> members = r == ci.rep ? f.members : Moved(f.members, ci.rep, r);
          std::vector<int> sorted = members;
          std::sort(sorted.begin(), sorted.end());
          if (std::find(members.begin(), members.end(), -1) != members.end() ||
              std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
              members[static_cast<size_t>(f.position)] != r)
            return Fail(where + ": communicator [" + Join(f.members) + "] of rank " + std::to_string(ci.rep) +
                        " does not move to this rank's data-parallel replica");
          b.comms[s] = CommId(f.slot, members, f.desc);
          position = f.position;
          break;
        }
      }
      // A class that borrows another ep position's operations (ep_position) holds its own peers on that slot.
      const int want = ci.ep_position >= 0 && f.type == Family::kGroup && f.kind == "ep" ? ci.ep_position : f.position;
      if (ci.p2p_slot[s] && position != want)
        return Fail(where + ": point-to-point operations on this communicator, where the rank is communicator rank " +
                    std::to_string(position) + " but rank " + std::to_string(ci.rep) + " (whose operations the class "
                    "holds) is " + std::to_string(want) + ": their peers differ, one class cannot hold both");
    }
  }
  return true;
}

}  // namespace detail

std::optional<ObservedTrace> BuildObservedTrace(const std::vector<RankEventLog>& logs, const world::World& world,
                                                const ObservedTraceOptions& options, std::string* error) {
  ObservedTrace out;
  for (const RankEventLog& log : logs) {
    if (log.malformed > 0)
      out.warnings.push_back("rank " + std::to_string(log.rank) + " events: " + std::to_string(log.malformed) +
                             " malformed line(s) skipped, first at " + log.first_malformed);
  }
  detail::Builder b(logs, world, options, &out);
  if (!b.Run(error)) return std::nullopt;
  if (out.dropped_ops > 0)
    out.warnings.push_back(std::to_string(out.dropped_ops) + " operation(s) outside the kept iterations " +
                           std::to_string(out.first_iteration) + ".." + std::to_string(out.last_iteration) +
                           " left out (warm-up skipped, or after the last iteration every real rank completed)");
  return out;
}

std::optional<ObservedTrace> BuildObservedTrace(const std::string& dir, const world::World& world,
                                                const ObservedTraceOptions& options, std::string* error) {
  std::vector<int> ranks = options.ranks.empty() ? EventFileRanks(dir) : options.ranks;
  if (ranks.empty()) {
    *error = "no rank<R>.events.jsonl in " + dir;
    return std::nullopt;
  }
  std::vector<RankEventLog> logs(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    std::string path = (fs::path(dir) / events::FileName(ranks[i])).string();
    if (!ReadRankEventLog(path, ranks[i], &logs[i], error)) return std::nullopt;
  }
  return BuildObservedTrace(logs, world, options, error);
}

}  // namespace prism::analysis
