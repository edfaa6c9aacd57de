// The graph builder's classes (observed_trace.cc), shared with observed_trace_streams.cc, which builds the nodes of
// one stream: private to src/analysis, not an interface.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "analysis/class_key.h"
#include "model/megatron_membership.h"
#include "analysis/observed_trace.h"

namespace prism::analysis::detail {

using trace::CollOp;
using trace::DType;
using trace::Node;
using trace::NodeKind;

// Megatron group descriptions compare without case and without a trailing "_GROUP".
inline std::string NormDesc(std::string_view d) {
  std::string s(d);
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  constexpr std::string_view kSuffix = "_GROUP";
  if (s.size() > kSuffix.size() && s.compare(s.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0)
    s.resize(s.size() - kSuffix.size());
  return s;
}

// How a communicator of the class representative generalises to every rank of its class.
struct Family {
  enum Type { kWorld, kGroup, kMoved } type = kMoved;
  std::string kind;          // kGroup: world::Group::kind
  std::string desc;          // trace::Comm::desc
  std::vector<int> members;  // the representative's (global ranks, communicator order)
  int position = -1;         // the representative's communicator rank
  std::string slot;          // slot name in the class
};

// One trace node to be, from (part of) an op line.
struct Piece {
  NodeKind kind = NodeKind::kInvalid;
  CollOp op = CollOp::kInvalid;
  int64_t comm_id = -1;
  int64_t seq = -1;
  uint64_t bytes = 0;
  DType dtype = DType::kInvalid;
  int32_t peer = -1;
  int32_t root = -1;
};

// Where a unit ends on its stream: its release, or when its gate opened if that was later (the release time came
// late: the coordinator's decision under --graph), never before its arrival. That lateness is the communication
// node's, not the next compute node's.
inline int64_t UnitEnd(const ObservedOp& op) {
  return std::max({op.release_ns, op.arrival_ns, op.opened_ns});
}

struct Unit {
  const ObservedOp* op = nullptr;
  int64_t iter = 0;
  std::vector<Piece> pieces;
  // Sends and receives to the rank itself: no nodes. Their seq is -1 (libprism does not number them); in files
  // written before that they have one, and count in the sequence check.
  std::vector<Piece> local;
};

// A built unit, for the event file's "wait" lines: its nodes and the compute nodes of the gap that ends where it
// arrives (one, or several when the gap crosses iteration marks; none when it followed the previous unit at once).
struct UnitNodes {
  struct GapPiece {
    uint32_t id = 0;
    int64_t from = 0, to = 0;
    bool own_mark = false;  // ends at an iteration mark stamped on this stream: the stream did this work in order
  };
  std::vector<uint32_t> ids;
  int64_t arrival = 0, release = 0;
  std::vector<GapPiece> gap;
  size_t waitable = 0;  // first piece a wait can sit in: after the last one that ends at this stream's own mark
};

// Lookup tables over world::World's groups: kind -> (rank -> group index).
class GroupIndex {
 public:
  explicit GroupIndex(const world::World& w) : w_(w) {
    for (const world::Group& g : w.MegatronGroups()) {
      if (g.backend != "nccl") continue;
      std::string n = NormDesc(g.desc);
      if (!by_desc_.count(n)) by_desc_[n] = g.kind;
    }
  }
  // Index of the `kind` group containing `rank` in Groups(kind), -1 when none.
  int IndexOf(const std::string& kind, int rank) {
    const Table& t = TableOf(kind);
    return rank >= 0 && rank < static_cast<int>(t.of_rank.size()) ? t.of_rank[rank] : -1;
  }
  const std::vector<int>& Group(const std::string& kind, int index) { return TableOf(kind).groups[index]->members; }
  const std::string& Desc(const std::string& kind, int index) { return TableOf(kind).groups[index]->desc; }
  // Kind of a Megatron description ("" when none).
  std::string KindOfDesc(std::string_view desc) const {
    // Why split on '|': run_report's labeler joins the names of groups with equal members that way.
    std::string d(desc);
    size_t start = 0;
    while (start <= d.size()) {
      size_t bar = d.find('|', start);
      std::string part = d.substr(start, bar == std::string::npos ? std::string::npos : bar - start);
      auto it = by_desc_.find(NormDesc(part));
      if (!part.empty() && it != by_desc_.end()) return it->second;
      if (bar == std::string::npos) break;
      start = bar + 1;
    }
    return "";
  }
  std::vector<std::string> Kinds() const {
    std::vector<std::string> out;
    for (const world::Group& g : w_.MegatronGroups())
      if (g.backend == "nccl" && std::find(out.begin(), out.end(), g.kind) == out.end()) out.push_back(g.kind);
    return out;
  }

 private:
  struct Table {
    std::vector<const world::Group*> groups;
    std::vector<int> of_rank;
  };
  const Table& TableOf(const std::string& kind) {
    auto [it, fresh] = tables_.try_emplace(kind);
    if (fresh) {
      Table& t = it->second;
      t.of_rank.assign(static_cast<size_t>(w_.size()), -1);
      for (const world::Group& g : w_.MegatronGroups()) {
        if (g.kind != kind || g.backend != "nccl") continue;
        int idx = static_cast<int>(t.groups.size());
        t.groups.push_back(&g);
        for (int m : g.members)
          if (m >= 0 && m < w_.size() && t.of_rank[m] < 0) t.of_rank[m] = idx;
      }
    }
    return it->second;
  }
  const world::World& w_;
  std::map<std::string, Table> tables_;
  std::map<std::string, std::string> by_desc_;
};

inline bool IsP2p(NodeKind k) { return k == NodeKind::kSend || k == NodeKind::kRecv; }

class Builder {
 public:
  Builder(const std::vector<RankEventLog>& logs, const world::World& w, const ObservedTraceOptions& o,
          ObservedTrace* out)
      : logs_(logs), w_(w), o_(o), out_(out), groups_(w), membership_(w, 1) {}

  bool Run(std::string* error);

 private:
  struct ClassInfo {
    ClassKey key;
    int rep = -1;                 // rank whose nodes the class holds
    int mirror_of = -1;           // class whose nodes it repeats (an expert-parallel class without events), or -1
    // A mirrored class with point-to-point operations on the expert-parallel communicator (a grouped send/recv
    // all-to-all): its position there, its nodes built from the source rank's by BorrowEpP2p; else -1.
    int ep_position = -1;
    const RankEventLog* log = nullptr;
    std::vector<Family> families;  // per slot
    std::vector<uint8_t> p2p_slot;
  };

  bool Fail(std::string msg) {
    error_ = std::move(msg);
    return false;
  }
  void Warn(std::string msg) { out_->warnings.push_back(std::move(msg)); }

  bool PickRepresentatives();
  bool IterationRange();
  class ClassBuild;  // BuildClass's steps
  bool BuildClass(ClassInfo& ci, trace::RoleClass* cls);
  void SequenceMultiStreamSlots(const std::map<uint32_t, int64_t>& comm_seq, trace::RoleClass* cls);
  void ApplyWaits(const RankEventLog& log, const std::map<std::pair<int64_t, int64_t>, UnitNodes>& unit_at,
                  trace::RoleClass* cls);
  bool Expand(const RankEventLog& log, const ObservedOp& op, std::vector<Piece>* pieces, std::vector<Piece>* local);
  bool BorrowEpP2p(const RankEventLog& log, const ObservedOp& op, int position, std::map<int64_t, int>* ep_comms,
                   std::vector<Piece>* pieces, std::vector<Piece>* local);
  bool Resolve(const RankEventLog& log, const ObservedComm& c, Family* f);
  bool Bind();
  std::vector<int> Moved(const std::vector<int>& members, int from, int to) const;
  uint32_t CommId(const std::string& slot, const std::vector<int>& members, const std::string& desc);

  const std::vector<RankEventLog>& logs_;
  const world::World& w_;
  const ObservedTraceOptions& o_;
  ObservedTrace* out_;
  GroupIndex groups_;
  world::MegatronMembership membership_;
  std::string error_;

  // Passthrough operations (the real NCCL, every member logged): (communicator key, seq) -> (latest arrival, earliest
  // release, members seen). An operation's duration is the time from its last member's arrival to its first
  // release, which leaves the waiting for late members out.
  std::map<std::tuple<std::string, std::vector<int>, int64_t>, std::tuple<int64_t, int64_t, int>> real_ops_;
  static std::vector<int> SortedMembers(const ObservedComm& c) {
    std::vector<int> m = c.members;
    std::sort(m.begin(), m.end());
    return m;
  }
  void IndexRealOps();
  std::vector<ClassKey> key_of_;               // per rank
  std::map<ClassKey, int> class_of_key_;
  std::vector<ClassInfo> classes_;
  bool use_marks_ = false;
  int64_t first_ = 0, last_ = 0;
  std::map<std::pair<std::string, std::vector<int>>, uint32_t> comm_ids_;
  bool warned_root_ = false, warned_split_ = false;
};

// BuildClass's state and steps for one class, in its order. A step that returns false has failed the build
// (Builder::Fail, or Expand/Resolve's own).
class Builder::ClassBuild {
 public:
  ClassBuild(Builder& b, ClassInfo& ci, trace::RoleClass* cls)
      : b_(b), ci_(ci), cls_(cls), log_(*ci.log), rank_s_("rank " + std::to_string(log_.rank)) {}

  void SortMarks();
  bool CollectUnits();
  bool AssignSlots();
  bool OrderStreams();
  void CheckSequenceGaps();
  void BuildNodes();
  bool CheckDurations();
  void ApplyWaits() { b_.ApplyWaits(log_, unit_at_, cls_); }
  void SequenceMultiStreamSlots() { b_.SequenceMultiStreamSlots(comm_seq_, cls_); }

 private:
  class StreamBuild;
  using StreamKey = std::pair<int, int64_t>;  // (0 recorded index | 1 fallback, id)

  int64_t IterationOf(int64_t arrival) const;

  Builder& b_;
  ClassInfo& ci_;
  trace::RoleClass* cls_;
  const RankEventLog& log_;
  const std::string rank_s_;
  std::vector<ObservedMark> marks_;  // by iteration, one per iteration
  std::map<int64_t, int64_t> mark_t_;
  std::map<int64_t, int32_t> mark_stream_;
  std::map<StreamKey, std::vector<Unit>> streams_;
  std::map<int64_t, int64_t> first_use_;  // comm id -> order of first use (per-comm fallback)
  std::vector<Unit> local_only_;          // units of sends and receives to the rank itself only
  std::map<int64_t, int> ep_comms_;       // BorrowEpP2p's: comm id -> the source's ep position, -1 when not ep
  std::map<int64_t, uint32_t> slot_of_comm_;
  uint32_t next_id_ = 0;
  std::map<uint32_t, int64_t> comm_seq_;  // communication node id -> its communicator sequence on the rank
  std::vector<trace::Stream> helpers_;
  std::map<std::pair<int64_t, int64_t>, UnitNodes> unit_at_;  // (recorded stream, sseq) -> its nodes
};

}  // namespace prism::analysis::detail
