// The nodes of one stream of a class (Builder::ClassBuild::BuildNodes, observed_trace_builder.h): what
// observed_trace.h describes per real rank and per CUDA stream.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "analysis/observed_trace_builder.h"

namespace prism::analysis::detail {

// One stream's nodes: its units' communication nodes, the compute nodes of the gaps between them (cut at iteration
// marks), and helper streams for point-to-point channels.
class Builder::ClassBuild::StreamBuild {
 public:
  StreamBuild(ClassBuild& c, const StreamKey& key) : c_(c), b_(c.b_), key_(key), cur_(c.b_.first_) {}

  void NameStream(const std::vector<Unit>& units);
  void AddHelperStreams(const std::vector<Unit>& units);
  void StartClock();
  void AddUnit(const Unit& u);
  void Close();
  trace::Stream TakeMain() { return std::move(main_); }

 private:
  uint32_t Add(trace::Stream& s, Node node, std::vector<uint32_t> after);
  uint32_t AddMain(Node node);
  void Compute(int64_t from, int64_t to, int64_t iter, bool own_mark);
  bool MarksHere(int64_t it) const;
  void CloseThrough(int64_t iter);
  void AddPiece(const Unit& u, const Piece& p, const std::vector<uint32_t>& fork, std::vector<uint32_t>* joined);

  ClassBuild& c_;
  Builder& b_;
  const StreamKey& key_;
  trace::Stream main_;
  std::map<std::tuple<uint32_t, int32_t, int>, size_t> helper_of_;  // (slot, peer, send) -> index in helpers_
  std::vector<uint32_t> pending_;         // helper nodes the next node of the main stream waits for
  std::vector<UnitNodes::GapPiece> gap_;  // compute nodes since the last unit
  bool have_t_ = false;
  int64_t t_ = 0;
  int64_t cur_;
  bool trailing_ = false;  // after the stream's last unit
};

void Builder::ClassBuild::StreamBuild::NameStream(const std::vector<Unit>& units) {
  if (key_.first == 0) {
    main_.name = "stream" + std::to_string(key_.second);
  } else if (b_.o_.stream_fallback == StreamFallback::kPerComm && !units.empty()) {
    main_.name = c_.cls_->comm_slots[c_.slot_of_comm_.at(units.front().op->comm_id)];
  } else {
    main_.name = "stream";
  }
}

// Point-to-point channels (slot, peer, direction) that appear in a unit with another p2p operation get a helper
// stream each, for all their operations, so that each channel stays in order on one stream.
void Builder::ClassBuild::StreamBuild::AddHelperStreams(const std::vector<Unit>& units) {
  for (const Unit& u : units) {
    int p2p = 0;
    for (const Piece& p : u.pieces) p2p += IsP2p(p.kind) ? 1 : 0;
    if (p2p < 2) continue;
    for (const Piece& p : u.pieces) {
      if (!IsP2p(p.kind)) continue;
      uint32_t slot = c_.slot_of_comm_.at(p.comm_id);
      auto k = std::make_tuple(slot, p.peer, p.kind == NodeKind::kSend ? 1 : 0);
      if (helper_of_.count(k)) continue;
      helper_of_[k] = c_.helpers_.size();
      c_.helpers_.push_back(trace::Stream{main_.name + "." + c_.cls_->comm_slots[slot] +
                                              (p.kind == NodeKind::kSend ? ".send" : ".recv") + std::to_string(p.peer),
                                          {}});
    }
  }
}

// The stream's clock starts at the mark of the iteration before the first one built, when there is one.
void Builder::ClassBuild::StreamBuild::StartClock() {
  if (b_.use_marks_) {
    auto prev = c_.mark_t_.find(b_.first_ - 1);
    if (prev != c_.mark_t_.end()) {
      t_ = prev->second;
      have_t_ = true;
    }
  }
}

uint32_t Builder::ClassBuild::StreamBuild::Add(trace::Stream& s, Node node, std::vector<uint32_t> after) {
  node.id = c_.next_id_++;
  node.after = std::move(after);
  s.nodes.push_back(std::move(node));
  return s.nodes.back().id;
}

uint32_t Builder::ClassBuild::StreamBuild::AddMain(Node node) {
  uint32_t id = Add(main_, std::move(node), std::move(pending_));
  pending_.clear();
  return id;
}

void Builder::ClassBuild::StreamBuild::Compute(int64_t from, int64_t to, int64_t iter, bool own_mark) {
  if (to <= from) return;
  Node node;
  node.kind = NodeKind::kCompute;
  node.dur_us = static_cast<double>(to - from) / 1000.0;
  node.iter = static_cast<uint32_t>(iter);
  gap_.push_back({AddMain(std::move(node)), from, to, own_mark});
}

// Whether iteration `it`'s mark was stamped on this stream (streams without a recorded index: one per
// communicator or one for all, never with wait lines, so either answer is harmless).
bool Builder::ClassBuild::StreamBuild::MarksHere(int64_t it) const {
  auto ms = c_.mark_stream_.find(it);
  return key_.first != 0 || (ms != c_.mark_stream_.end() && ms->second == key_.second);
}

// Compute up to the end of iterations cur..iter-1.
void Builder::ClassBuild::StreamBuild::CloseThrough(int64_t iter) {
  while (b_.use_marks_ && cur_ < iter) {
    auto m = c_.mark_t_.find(cur_);
    if (m != c_.mark_t_.end()) {
      // Why not after the last unit on another stream than the mark's: no wait line can follow to take the
      // waiting out, and a side stream has no work of its own there (the last iteration replayed the slice's
      // whole wait: 2.6 s against 0.21 s for the others, GraphCli.RealFillEvents...).
      const bool own = MarksHere(cur_);
      if (have_t_ && (!trailing_ || own)) Compute(t_, m->second, cur_, own);
      t_ = have_t_ ? std::max(t_, m->second) : m->second;
      have_t_ = true;
    }
    ++cur_;
  }
}

void Builder::ClassBuild::StreamBuild::AddUnit(const Unit& u) {
  CloseThrough(u.iter);
  UnitNodes un;
  un.arrival = u.op->arrival_ns;
  un.release = UnitEnd(*u.op);
  if (have_t_) Compute(t_, u.op->arrival_ns, u.iter, false);
  if (u.op->opened_ns > 0) {
    const int64_t late = u.op->opened_ns - std::max(u.op->release_ns, u.op->arrival_ns);
    b_.out_->coordinator_latency_ns[c_.log_.rank][u.iter] += std::max<int64_t>(0, late);
  }
  un.gap = std::move(gap_);
  gap_.clear();
  for (size_t i = 0; i < un.gap.size(); ++i)
    if (un.gap[i].own_mark) un.waitable = i + 1;
  const uint32_t first_id = c_.next_id_;
  // Fork: helper nodes start when the main stream reaches the unit; join: the next main node waits for them.
  std::vector<uint32_t> fork = pending_;
  if (!main_.nodes.empty()) fork.push_back(main_.nodes.back().id);
  std::vector<uint32_t> joined;
  for (const Piece& p : u.pieces) AddPiece(u, p, fork, &joined);
  if (!joined.empty()) pending_ = std::move(joined);  // includes the old pending through the fork
  t_ = UnitEnd(*u.op);
  have_t_ = true;
  if (key_.first == 0 && u.op->sseq >= 0) {
    for (uint32_t id = first_id; id < c_.next_id_; ++id) un.ids.push_back(id);
    c_.unit_at_[{key_.second, u.op->sseq}] = std::move(un);
  }
}

// A communication node, on the main stream or its channel's helper stream.
void Builder::ClassBuild::StreamBuild::AddPiece(const Unit& u, const Piece& p, const std::vector<uint32_t>& fork,
                                                std::vector<uint32_t>* joined) {
  if (p.seq >= 0) c_.comm_seq_[c_.next_id_] = p.seq;  // the id `Add` gives it (a copy to itself has none)
  Node node;
  node.kind = p.kind;
  node.op = p.op;
  node.comm_slot = c_.slot_of_comm_.at(p.comm_id);
  node.peer = p.peer;
  node.root = p.root;
  node.bytes = p.bytes;
  node.dtype = p.dtype;
  node.iter = static_cast<uint32_t>(u.iter);
  node.name = p.seq >= 0 ? "seq " + std::to_string(p.seq) : "copy to itself, borrowed";
  if (u.op->passthrough && u.op->nops == 1) {
    // Measured on the real NCCL (prism-run record): from the last member's arrival to the first release.
    auto c = c_.log_.comms.find(u.op->comm_id);
    auto r = c == c_.log_.comms.end() ? b_.real_ops_.end()
                                      : b_.real_ops_.find({c->second.key, SortedMembers(c->second), u.op->seq});
    if (r != b_.real_ops_.end()) {
      const auto& [arrival, release, members] = r->second;
      node.dur_us = static_cast<double>(std::max<int64_t>(0, release - arrival)) / 1000.0;
      ++b_.out_->recorded_comm;
    }
  }
  if (IsP2p(p.kind)) c_.ci_.p2p_slot[node.comm_slot] = 1;
  auto h = helper_of_.end();
  if (IsP2p(p.kind))
    h = helper_of_.find(std::make_tuple(node.comm_slot, p.peer, p.kind == NodeKind::kSend ? 1 : 0));
  if (h != helper_of_.end()) {
    joined->push_back(Add(c_.helpers_[h->second], std::move(node), fork));
  } else {
    AddMain(std::move(node));
  }
}

// After the stream's last unit: compute through the end of the last iteration.
void Builder::ClassBuild::StreamBuild::Close() {
  trailing_ = true;
  CloseThrough(b_.last_ + 1);
}

// Nodes.
void Builder::ClassBuild::BuildNodes() {
  for (auto& [key, units] : streams_) {
    StreamBuild s(*this, key);
    s.NameStream(units);
    s.AddHelperStreams(units);
    s.StartClock();
    for (const Unit& u : units) s.AddUnit(u);
    s.Close();
    cls_->streams.push_back(s.TakeMain());
  }
  for (trace::Stream& h : helpers_) cls_->streams.push_back(std::move(h));
}

}  // namespace prism::analysis::detail
