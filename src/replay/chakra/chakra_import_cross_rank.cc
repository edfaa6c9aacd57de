// import-chakra, streaming (chakra_import.cc says how): the passes across ranks, after every rank's structure
// and binding are in: communicators per ref, the all-gather size check, p2p pairing, communicator patterns,
// collective agreement, and the role classes, built once per (structure, pattern) and folded as the reference
// (chakra_import_document.cc) folds them.
#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "prism/limits.h"
#include "replay/chakra/chakra_import_internal.h"
#include "replay/chakra/chakra_import_stream.h"

namespace prism::chakra::streaming {

using json = nlohmann::json;
using namespace internal;

// ---- Late errors name their node: that rank's file is read again (the reader is deterministic).

std::string StreamImporter::NodeRefOf(int32_t r, uint32_t k) {
  RankReader again(world_, opts_);
  RankEffects ignored;
  std::string err;
  if (!again.Load(r, files_.paths[r], &ignored, &err) || k >= again.mapped().size()) {
    return files_.paths[r] + ": node #" + std::to_string(k) + " (the file changed while it was imported)";
  }
  return again.Ref(k);
}

int64_t StreamImporter::TagOf(int32_t r, uint32_t k) const {
  const RankRef& ref = Ref(r, Raw(r).nodes[k].ref);
  if (!ref.tag_varies) return ref.tag;
  return varied_tags_.at(r)[k];
}

// ---- Communicators (the reference's ResolveComms, per ref).

uint32_t StreamImporter::CommFor(const std::string& key, const std::function<CommInfo()>& make) {
  auto it = comm_index_.find(key);
  if (it != comm_index_.end()) return it->second;
  CommInfo c = make();
  c.key = key;
  comms_.push_back(std::move(c));
  uint32_t id = static_cast<uint32_t>(comms_.size() - 1);
  comm_index_[key] = id;
  return id;
}

uint32_t StreamImporter::PairComm(int32_t lo, int32_t hi, const std::string& suffix) {
  return CommFor("p:" + std::to_string(lo) + ":" + std::to_string(hi) + suffix, [&] {
    CommInfo c;
    c.ranks = {lo, hi};
    c.desc = "p2p " + std::to_string(lo) + "-" + std::to_string(hi) + suffix;
    c.pair = true;
    return c;
  });
}

// Position of `rank` in `members` (-1 when absent). Why an index for large lists: every rank asks about the
// world and its data-parallel group. Keyed by the list's storage, which lives as long as its group or
// communicator (positions_ is cleared when communicators are dropped).
int32_t StreamImporter::PositionIn(const std::vector<int32_t>& members, int32_t rank) {
  if (members.size() <= 32) {
    auto it = std::find(members.begin(), members.end(), rank);
    return it == members.end() ? -1 : static_cast<int32_t>(it - members.begin());
  }
  auto [it, fresh] = positions_.try_emplace(members.data());
  if (fresh) {
    it->second.reserve(members.size());
    for (size_t p = 0; p < members.size(); ++p) it->second.emplace(members[p], static_cast<int32_t>(p));
  }
  auto pos = it->second.find(rank);
  return pos == it->second.end() ? -1 : pos->second;
}

std::string StreamImporter::GroupDesc(const std::string& pg, int32_t r) {
  const RankRec& rec = ranks_[r];
  if (rec.prism_comms != kNone) {
    json j = json::parse(strings_[rec.prism_comms], nullptr, false);
    if (j.is_object()) {
      auto d = j.find(pg);
      if (d != j.end() && d->is_string()) return d->get<std::string>();
    }
  }
  auto it = groups_.find(pg);
  if (it != groups_.end() && !it->second.desc.empty()) return it->second.desc;
  return "pg " + pg;
}

bool StreamImporter::ResolveComms(std::string* error) {
  ref_comm_.assign(refs_.size(), kNone);
  for (int32_t r = 0; r < world_; ++r) {
    const RankRec& rec = ranks_[r];
    const RawClass& raw = Raw(r);
    for (uint32_t j = 0; j < rec.refs; ++j) {
      const RankRef& ref = Ref(r, j);
      const std::string& pg = strings_[ref.pg];
      auto group = ref.has_pg ? groups_.find(pg) : groups_.end();
      uint32_t comm = kNone;
      if (group != groups_.end()) {
        const Group& gr = group->second;
        if (PositionIn(gr.ranks, r) < 0) {
          *error = NodeRefOf(r, raw.ref_first[j]) + ": rank " + std::to_string(r) +
                   " is not a member of process group \"" + pg + "\" (" + gr.source + ")";
          return false;
        }
        if (ref.p2p && PositionIn(gr.ranks, ref.peer) < 0) {
          *error = NodeRefOf(r, raw.ref_first[j]) + ": peer rank " + std::to_string(ref.peer) +
                   " is not a member of process group \"" + pg + "\" (" + gr.source + ")";
          return false;
        }
        comm = CommFor("g:" + pg, [&] {
          CommInfo c;
          c.ranks = gr.ranks;
          c.desc = GroupDesc(pg, r);
          return c;
        });
      } else if (!ref.p2p) {
        if (ref.has_pg && pg != "0") {
          *error = NodeRefOf(r, raw.ref_first[j]) + ": process group \"" + pg + "\" is not defined (" +
                   (summary_->comm_group_file.empty() ? std::string("no comm-group file; pass --comm-group FILE")
                                                      : "not in " + summary_->comm_group_file) +
                   ")";
          return false;
        }
        comm = CommFor("world", [&] {
          CommInfo c;
          for (int32_t x = 0; x < world_; ++x) c.ranks.push_back(x);
          c.desc = "world";
          c.world = true;
          return c;
        });
      } else {
        // Why a pair communicator: see the reference (replicas then fold into one class).
        comm = PairComm(std::min(r, ref.peer), std::max(r, ref.peer), "");
      }
      ref_comm_[rec.ref_begin + j] = comm;
    }
  }
  return true;
}

uint32_t StreamImporter::NodeComm(int32_t r, uint32_t k) const {
  auto it = node_comm_.find(r);
  if (it != node_comm_.end() && it->second[k] != kNone) return it->second[k];
  return ref_comm_[ranks_[r].ref_begin + Raw(r).nodes[k].ref];
}

// The reference's ApplyCommSizes check: an all-gather's comm_size x ranks must stay within kMaxBytes.
bool StreamImporter::CheckCommSizes(std::string* error) {
  if (opts_.allgather_comm_size == AllGatherCommSize::kOutput) return true;
  for (int32_t r = 0; r < world_; ++r) {
    const RankRec& rec = ranks_[r];
    const RawClass& raw = Raw(r);
    bool over = false;
    for (uint32_t j = 0; j < rec.refs && !over; ++j) {
      if (raw.ref_max_allgather[j] == 0) continue;
      const uint64_t members = comms_[ref_comm_[rec.ref_begin + j]].ranks.size();
      over = raw.ref_max_allgather[j] - 1 > limits::kMaxBytes / members;
    }
    if (!over) continue;
    for (uint32_t k = 0; k < raw.nodes.size(); ++k) {
      const RawNode& n = raw.nodes[k];
      if (n.kind != NodeKind::kColl || n.op != CollOp::kAllGather || n.exact_bytes) continue;
      const uint64_t members = comms_[NodeComm(r, k)].ranks.size();
      if (n.bytes > limits::kMaxBytes / members) {
        *error = NodeRefOf(r, k) + ": comm_size " + std::to_string(n.bytes) + " x " + std::to_string(members) +
                 " ranks (the all-gather's output) is over " + std::to_string(limits::kMaxBytes) + " bytes";
        return false;
      }
    }
  }
  return true;
}

// Prism's bytes (S) of node k of rank r: the reference's ApplyCommSizes.
uint64_t StreamImporter::FinalBytes(int32_t r, uint32_t k, uint32_t members) const {
  const RawNode& n = Raw(r).nodes[k];
  if (n.kind != NodeKind::kColl || n.op != CollOp::kAllGather) return n.bytes;
  if (n.exact_bytes) return *n.exact_bytes;
  if (opts_.allgather_comm_size == AllGatherCommSize::kOutput) return n.bytes;
  return n.bytes * members;
}

// ---- p2p pairing: the reference's CheckP2p, with each flow's messages taken from the sides' refs.

void StreamImporter::Messages(const Side& side, NodeKind kind, std::vector<Msg>* out) const {
  out->clear();
  if (side.rank < 0) return;
  const RawClass& raw = Raw(side.rank);
  for (uint32_t j : side.refs) {
    for (uint32_t k : raw.ref_nodes[j]) {
      if (raw.nodes[k].kind == kind) out->push_back({side.rank, k});
    }
  }
  if (side.refs.size() > 1) {
    std::sort(out->begin(), out->end(), [](const Msg& a, const Msg& b) { return a.node < b.node; });
  }
}

bool StreamImporter::CheckP2p(std::string* error) {
  std::map<std::tuple<uint32_t, int32_t, int32_t>, std::pair<Side, Side>> flows;
  for (int32_t r = 0; r < world_; ++r) {
    const RankRec& rec = ranks_[r];
    const RawClass& raw = Raw(r);
    for (uint32_t j = 0; j < rec.refs; ++j) {
      const RankRef& ref = Ref(r, j);
      if (!ref.p2p) continue;
      const uint32_t c = ref_comm_[rec.ref_begin + j];
      if (raw.ref_sends[j]) {
        Side& s = flows[{c, r, ref.peer}].first;
        s.rank = r;
        s.refs.push_back(j);
      }
      if (raw.ref_recvs[j]) {
        Side& s = flows[{c, ref.peer, r}].second;
        s.rank = r;
        s.refs.push_back(j);
      }
    }
  }
  std::vector<Msg> sends, recvs;
  for (auto& [key, flow] : flows) {
    Messages(flow.first, NodeKind::kSend, &sends);
    Messages(flow.second, NodeKind::kRecv, &recvs);
    auto tag_size = [&](const Msg& m) { return std::make_pair(TagOf(m.rank, m.node), Raw(m.rank).nodes[m.node].bytes); };
    bool same = sends.size() == recvs.size();
    for (size_t k = 0; same && k < sends.size(); ++k) same = tag_size(sends[k]) == tag_size(recvs[k]);
    if (same) continue;
    // Split by (tag, size) and match within each.
    std::map<std::pair<int64_t, uint64_t>, std::pair<size_t, size_t>> counts;
    std::map<std::pair<int64_t, uint64_t>, Msg> first_send, first_recv;
    const CommInfo base = comms_[std::get<0>(key)];
    for (auto* side : {&sends, &recvs}) {
      for (const Msg& m : *side) {
        auto ts = tag_size(m);
        (side == &sends ? counts[ts].first : counts[ts].second)++;
        (side == &sends ? first_send : first_recv).emplace(ts, m);
        const std::string suffix = " tag " + std::to_string(ts.first) + " bytes " + std::to_string(ts.second);
        uint32_t split = kNone;
        if (base.pair) {
          split = PairComm(base.ranks[0], base.ranks[1], suffix);
        } else {
          split = CommFor(base.key + suffix, [&] {
            CommInfo c = base;
            c.desc = base.desc + suffix;
            return c;
          });
        }
        std::vector<uint32_t>& over = node_comm_[m.rank];
        if (over.empty()) over.assign(Raw(m.rank).nodes.size(), kNone);
        over[m.node] = split;
      }
    }
    for (const auto& [ts, c] : counts) {
      if (c.first == c.second) continue;
      const auto [src, dst] = std::make_pair(std::get<1>(key), std::get<2>(key));
      const bool more_sends = c.first > c.second;
      const Msg& m = more_sends ? first_send.at(ts) : first_recv.at(ts);
      *error = NodeRefOf(m.rank, m.node) + ": rank " + std::to_string(src) + " sends " +
               Plural(c.first, "message") + " of " + std::to_string(ts.second) + " bytes with tag " +
               std::to_string(ts.first) + " to rank " + std::to_string(dst) + ", which receives " +
               std::to_string(c.second) + " (" + files_.paths[more_sends ? dst : src] + ")";
      return false;
    }
  }
  return true;
}

// ---- Communicator patterns.

void StreamImporter::ComputeShapes() {
  shape_of_.assign(world_, kNone);
  binding_begin_.assign(world_ + 1, 0);
  bindings_.clear();
  std::unordered_map<uint32_t, uint32_t> local_of;
  std::string key;
  for (int32_t r = 0; r < world_; ++r) {
    const RankRec& rec = ranks_[r];
    const RawClass& raw = Raw(r);
    Shape s;
    s.raw = rec.raw;
    local_of.clear();
    const size_t begin = bindings_.size();
    auto local = [&](uint32_t comm) {
      auto [it, fresh] = local_of.emplace(comm, static_cast<uint32_t>(bindings_.size() - begin));
      if (fresh) {
        bindings_.push_back(comm);
        const CommInfo& c = comms_[comm];
        s.local.push_back(LocalComm{static_cast<uint8_t>(c.world ? 2 : c.pair ? 1 : 0),
                                    static_cast<uint32_t>(c.ranks.size())});
      }
      return it->second;
    };
    if (node_comm_.count(r)) {
      s.node_local.assign(raw.nodes.size(), kNone);
      for (uint32_t k = 0; k < raw.nodes.size(); ++k) {
        if (raw.nodes[k].ref != kNone) s.node_local[k] = local(NodeComm(r, k));
      }
    } else {
      s.ref_local.resize(rec.refs);
      for (uint32_t j = 0; j < rec.refs; ++j) s.ref_local[j] = local(ref_comm_[rec.ref_begin + j]);
    }
    s.ref_peer.assign(rec.refs, -1);
    for (uint32_t j = 0; j < rec.refs; ++j) {
      const RankRef& ref = Ref(r, j);
      if (ref.p2p) s.ref_peer[j] = PositionIn(comms_[ref_comm_[rec.ref_begin + j]].ranks, ref.peer);
    }
    binding_begin_[r + 1] = static_cast<uint32_t>(bindings_.size());

    key.clear();
    KeyWriter w(&key);
    w.Put(s.raw);
    w.Put(static_cast<uint32_t>(s.node_local.size()));
    for (uint32_t v : s.node_local) w.Put(v);
    for (uint32_t v : s.ref_local) w.Put(v);
    for (int32_t v : s.ref_peer) w.Put(v);
    for (const LocalComm& l : s.local) {
      w.Put(l.kind);
      w.Put(l.members);
    }
    auto [it, fresh] = shape_index_.emplace(key, static_cast<uint32_t>(shapes_.size()));
    if (fresh) shapes_.push_back(std::move(s));
    shape_of_[r] = it->second;
  }
}

// ---- Collective agreement: the reference's CheckCollectives. Each (pattern, communicator) gets its
// sequence of collectives once; members agree when their sequences are the same. Where they are not, the
// reference's own comparison runs on that communicator for its message.

uint32_t StreamImporter::CollSeq(const std::string& entries) {
  auto [it, fresh] = seq_index_.emplace(entries, static_cast<uint32_t>(seq_index_.size() + 1));
  return it->second;
}

bool StreamImporter::CheckCollectives(std::string* error) {
  for (Shape& s : shapes_) {
    const RawClass& raw = *raws_[s.raw];
    std::vector<std::string> seqs(s.local.size());
    for (uint32_t k = 0; k < raw.nodes.size(); ++k) {
      const RawNode& n = raw.nodes[k];
      if (n.kind != NodeKind::kColl) continue;
      const uint32_t l = s.LocalOf(raw, k);
      uint64_t bytes = n.bytes;
      if (n.op == CollOp::kAllGather) {
        bytes = n.exact_bytes                                                ? *n.exact_bytes
                : opts_.allgather_comm_size == AllGatherCommSize::kOutput ? n.bytes
                                                                           : n.bytes * s.local[l].members;
      }
      if (n.op == CollOp::kAllToAll) bytes = 0;  // Why: members may differ in an all-to-all's size
      KeyWriter w(&seqs[l]);
      w.Put(static_cast<uint8_t>(n.op));
      w.Put(bytes);
      w.Put(n.root);
      w.Put(static_cast<uint8_t>(n.dtype));
    }
    s.coll_seq.assign(s.local.size(), 0);
    for (size_t l = 0; l < s.local.size(); ++l) {
      if (!seqs[l].empty()) s.coll_seq[l] = CollSeq(seqs[l]);
    }
  }
  std::vector<uint32_t> first(comms_.size(), 0), count(comms_.size(), 0);
  std::vector<char> differ(comms_.size(), 0);
  for (int32_t r = 0; r < world_; ++r) {
    const Shape& s = shapes_[shape_of_[r]];
    for (uint32_t l = 0; l < s.local.size(); ++l) {
      const uint32_t seq = s.coll_seq[l];
      if (seq == 0) continue;
      const uint32_t c = bindings_[binding_begin_[r] + l];
      ++count[c];
      if (first[c] == 0) first[c] = seq;
      if (first[c] != seq) differ[c] = 1;
    }
  }
  for (size_t c = 0; c < comms_.size(); ++c) {
    if (count[c] == 0) continue;
    if (!differ[c] && count[c] == comms_[c].ranks.size()) continue;
    if (!ExplainCollectives(static_cast<uint32_t>(c), error)) return false;
  }
  return true;
}

// The reference's comparison on one communicator.
bool StreamImporter::ExplainCollectives(uint32_t c, std::string* error) {
  const CommInfo& comm = comms_[c];
  const auto& members = comm.ranks;
  const uint32_t m = static_cast<uint32_t>(members.size());
  std::vector<std::vector<uint32_t>> seq(members.size());
  for (size_t p = 0; p < members.size(); ++p) {
    const int32_t r = members[p];
    const RawClass& raw = Raw(r);
    for (uint32_t k = 0; k < raw.nodes.size(); ++k) {
      if (raw.nodes[k].kind == NodeKind::kColl && NodeComm(r, k) == c) seq[p].push_back(k);
    }
  }
  auto describe = [&](int32_t r, uint32_t k) {
    const RawNode& n = Raw(r).nodes[k];
    std::string s = NodeRefOf(r, k) + " " + std::string(trace::ToString(n.op)) + " " +
                    std::to_string(FinalBytes(r, k, m)) + " bytes";
    if (n.root >= 0) s += " root " + std::to_string(n.root);
    if (n.dtype != trace::DType::kU8) s += " " + std::string(trace::ToString(n.dtype));
    return s;
  };
  size_t longest = 0;
  for (size_t p = 0; p < members.size(); ++p) longest = std::max(longest, seq[p].size());
  if (longest == 0) return true;
  const std::string where = "communicator '" + comm.desc + "' (" + std::to_string(members.size()) + " ranks)";
  for (size_t p = 0; p < members.size(); ++p) {
    if (seq[p].size() != longest) {
      size_t q = 0;
      while (seq[q].size() != longest) ++q;
      const uint32_t missing = seq[q][seq[p].size()];
      *error = where + ": rank " + std::to_string(members[p]) + " (" + files_.paths[members[p]] + ") issues " +
               Plural(seq[p].size(), "collective") + ", rank " + std::to_string(members[q]) + " issues " +
               std::to_string(longest) + "; the first without a partner: " + describe(members[q], missing);
      return false;
    }
  }
  for (size_t k = 0; k < longest; ++k) {
    const RawNode& a = Raw(members[0]).nodes[seq[0][k]];
    const uint64_t a_bytes = FinalBytes(members[0], seq[0][k], m);
    for (size_t p = 1; p < members.size(); ++p) {
      const RawNode& b = Raw(members[p]).nodes[seq[p][k]];
      const uint64_t b_bytes = FinalBytes(members[p], seq[p][k], m);
      const bool bytes_ok = a_bytes == b_bytes || (a.op == CollOp::kAllToAll && b.op == CollOp::kAllToAll);
      if (a.op != b.op || !bytes_ok || a.root != b.root || a.dtype != b.dtype) {
        *error = where + ": members disagree at collective #" + std::to_string(k) + ": " +
                 describe(members[0], seq[0][k]) + " vs " + describe(members[p], seq[p][k]);
        return false;
      }
    }
  }
  return true;
}

// A communicator left without nodes (the base of one split by tag) is not written; ids stay dense.
void StreamImporter::DropUnusedComms() {
  std::vector<uint32_t> remap(comms_.size(), kNone);
  for (uint32_t c : bindings_) remap[c] = 0;
  std::vector<CommInfo> kept;
  for (size_t c = 0; c < comms_.size(); ++c) {
    if (remap[c] == kNone) continue;
    remap[c] = static_cast<uint32_t>(kept.size());
    kept.push_back(std::move(comms_[c]));
  }
  for (uint32_t& c : bindings_) c = remap[c];
  comms_ = std::move(kept);
  comm_index_.clear();
  positions_.clear();
}

// ---- Role classes: the reference's BuildClass from a structure and a pattern.

trace::RoleClass StreamImporter::BuildClass(Shape* sh) {
  const RawClass& raw = *raws_[sh->raw];
  trace::RoleClass cls;
  bool streams_given = !raw.nodes.empty();
  bool ids_given = raw.from_prism;
  for (const RawNode& n : raw.nodes) {
    streams_given = streams_given && n.stream_attr.has_value() && !n.stream_attr->empty();
    ids_given = ids_given && n.cid < trace::kNoIndex;
  }
  std::map<uint32_t, std::string> given;
  bool slots_given = raw.from_prism;
  {
    std::map<std::string, uint32_t> back;
    for (uint32_t k = 0; k < raw.nodes.size(); ++k) {
      const RawNode& n = raw.nodes[k];
      if (n.kind == NodeKind::kCompute || !slots_given) continue;
      if (!n.slot_attr || n.slot_attr->empty()) {
        slots_given = false;
        break;
      }
      const uint32_t l = sh->LocalOf(raw, k);
      auto [a, fa] = given.emplace(l, *n.slot_attr);
      auto [b, fb] = back.emplace(*n.slot_attr, l);
      if (a->second != *n.slot_attr || b->second != l) slots_given = false;
    }
  }
  std::unordered_map<uint32_t, uint32_t> slot_of;  // local communicator -> slot
  int groups = 0, pairs = 0;
  auto slot = [&](uint32_t l) {
    auto it = slot_of.find(l);
    if (it != slot_of.end()) return it->second;
    std::string name;
    if (slots_given) {
      name = given[l];
    } else if (sh->local[l].kind == 2) {
      name = "world";
    } else if (sh->local[l].kind == 1) {
      name = "p" + std::to_string(pairs++);
    } else {
      name = "g" + std::to_string(groups++);
    }
    uint32_t s = static_cast<uint32_t>(cls.comm_slots.size());
    cls.comm_slots.push_back(name);
    slot_of[l] = s;
    return s;
  };
  std::map<std::string, uint64_t> imported;
  uint64_t after_edges = 0;
  std::unordered_map<std::string, uint32_t> stream_of;
  std::vector<std::pair<uint32_t, uint32_t>> where(raw.nodes.size());  // node -> (stream, position)
  std::vector<uint32_t> ids(raw.nodes.size());
  for (uint32_t i = 0; i < raw.nodes.size(); ++i) {
    const RawNode& rn = raw.nodes[i];
    trace::Node n;
    n.id = ids_given ? static_cast<uint32_t>(rn.cid) : i;
    ids[i] = n.id;
    n.kind = rn.kind;
    n.name = rn.name;
    n.dur_us = rn.dur_us;
    n.iter = rn.iter;
    std::string stream;
    if (rn.kind == NodeKind::kCompute) {
      stream = rn.cpu ? "cpu" : "compute";
    } else {
      const uint32_t l = sh->LocalOf(raw, i);
      n.comm_slot = slot(l);
      n.op = rn.op;
      n.bytes = rn.bytes;
      if (rn.kind == NodeKind::kColl && rn.op == CollOp::kAllGather) {
        n.bytes = rn.exact_bytes                                                ? *rn.exact_bytes
                  : opts_.allgather_comm_size == AllGatherCommSize::kOutput ? rn.bytes
                                                                             : rn.bytes * sh->local[l].members;
      }
      n.dtype = rn.dtype;
      n.root = rn.root;
      const std::string& sname = cls.comm_slots[n.comm_slot];
      if (rn.kind == NodeKind::kColl) {
        stream = "comm." + sname;
      } else {
        n.peer = sh->ref_peer[rn.ref];
        stream = std::string(rn.kind == NodeKind::kSend ? "send." : "recv.") + sname + "." + std::to_string(n.peer);
      }
    }
    if (streams_given) stream = *rn.stream_attr;
    auto [it, fresh] = stream_of.emplace(stream, static_cast<uint32_t>(cls.streams.size()));
    if (fresh) cls.streams.push_back(trace::Stream{stream, {}});
    trace::Stream& st = cls.streams[it->second];
    // Why: a dependency on an earlier node of the same stream is already implied by stream order; with
    // Prism's own streams only the immediate predecessor is dropped, so a Prism graph comes back as it was.
    const bool has_prev = !st.nodes.empty();
    const uint32_t prev = has_prev ? st.nodes.back().id : 0;
    for (uint32_t d : rn.deps) {
      const bool same_stream = where[d].first == it->second;
      if (same_stream && (!streams_given || (has_prev && ids[d] == prev))) continue;
      n.after.push_back(ids[d]);
    }
    where[i] = {it->second, static_cast<uint32_t>(st.nodes.size())};
    after_edges += n.after.size();
    imported[rn.kind == NodeKind::kColl ? "coll " + std::string(trace::ToString(rn.op))
                                        : std::string(trace::ToString(rn.kind))]++;
    st.nodes.push_back(std::move(n));
  }
  sh->imported.assign(imported.begin(), imported.end());
  sh->after_edges = after_edges;
  return cls;
}

void StreamImporter::Build(trace::Trace* out) {
  StartGraph(opts_, world_, rank0_, out, summary_);
  for (size_t c = 0; c < comms_.size(); ++c) {
    trace::Comm comm;
    comm.id = static_cast<uint32_t>(c);
    comm.ranks = comms_[c].ranks;
    comm.desc = comms_[c].desc;
    out->comms.push_back(std::move(comm));
  }
  std::unordered_map<size_t, std::vector<uint32_t>> by_hash;
  out->ranks.resize(world_);
  for (int32_t r = 0; r < world_; ++r) {
    Shape& sh = shapes_[shape_of_[r]];
    if (sh.cls == kNone) {
      trace::RoleClass cls = BuildClass(&sh);
      const size_t h = HashClass(cls);
      uint32_t found = kNone;
      for (uint32_t k : by_hash[h]) {
        if (SameClass(out->classes[k], cls)) {
          found = k;
          break;
        }
      }
      if (found == kNone) {
        found = static_cast<uint32_t>(out->classes.size());
        const RankRec& rec = ranks_[r];
        cls.name = rec.prism_class != kNone ? strings_[rec.prism_class] : "rank" + std::to_string(r);
        out->classes.push_back(std::move(cls));
        by_hash[h].push_back(found);
      }
      sh.cls = found;
    }
    out->ranks[r].cls = sh.cls;
    out->ranks[r].comms.assign(bindings_.begin() + binding_begin_[r], bindings_.begin() + binding_begin_[r + 1]);
    for (const auto& [k, v] : sh.imported) summary_->imported[k] += v;
    summary_->after_edges += sh.after_edges;
  }
}

}  // namespace prism::chakra::streaming
