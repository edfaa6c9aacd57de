// import-chakra, streaming: each rank's file is read one node at a time (EtReader), mapped, put in topological
// order, and reduced to two parts before the next file is opened:
//   - its structure, everything of its mapped nodes that the graph keeps (kind, op, sizes, durations, names,
//     dependencies, Prism's stream and slot names) with each communication node naming a "ref" (a communicator
//     reference numbered in order of first use) instead of a process group or a peer; ranks with the same
//     structure share one RawClass, stored once;
//   - its binding, what differs between such ranks: per ref the process group, the peer's global rank and the
//     message tag, and the rank's GlobalMetadata.
// After the last file the cross-rank passes of the reference importer (chakra_import_document.cc) run on these:
// communicators per ref, the all-gather size check, p2p pairing, collective agreement, and the role classes,
// built once per distinct (structure, communicator pattern) and folded exactly as the reference folds them.
// Memory is the distinct structures plus a few hundred bytes per rank; the reference keeps every node of every
// rank. Files are read by a few threads and committed in rank order, so nothing depends on the threads. A late
// error names its node by reading that rank's file again (errors end the import).
#include "replay/chakra/chakra_import.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "prism/limits.h"
#include "replay/chakra/chakra_attrs.h"
#include "replay/chakra/chakra_et_reader.h"
#include "replay/chakra/chakra_import_internal.h"

namespace prism::chakra {

namespace fs = std::filesystem;
using json = nlohmann::json;
using trace::CollOp;
using trace::NodeKind;
using namespace internal;

namespace {

constexpr uint32_t kNone = trace::kNoIndex;

// ---------------------------------------------------------------------------------------------------------
// Strings that recur across ranks (process-group names, class names), stored once.

class Interner {
 public:
  uint32_t Id(std::string_view s) {
    auto it = index_.find(s);
    if (it != index_.end()) return it->second;
    strings_.emplace_back(s);
    const uint32_t id = static_cast<uint32_t>(strings_.size() - 1);
    index_.emplace(strings_.back(), id);
    return id;
  }
  const std::string& operator[](uint32_t id) const { return strings_[id]; }

 private:
  std::deque<std::string> strings_;  // Why a deque: the index's keys point into these
  std::unordered_map<std::string_view, uint32_t> index_;
};

// Chakra id -> index in the file, reused from file to file (open addressing; a generation stamp empties it).
class IdIndex {
 public:
  void Clear() {
    if (++gen_ == 0) {
      std::fill(stamp_.begin(), stamp_.end(), 0);
      gen_ = 1;
    }
    size_ = 0;
  }
  // Inserts id -> v unless id is there; returns the value stored for id and whether it was inserted.
  std::pair<uint32_t, bool> Insert(uint64_t id, uint32_t v) {
    if (2 * (size_ + 1) > stamp_.size()) Grow();
    size_t s = Slot(id);
    for (; stamp_[s] == gen_; s = (s + 1) & mask_) {
      if (keys_[s] == id) return {vals_[s], false};
    }
    stamp_[s] = gen_;
    keys_[s] = id;
    vals_[s] = v;
    ++size_;
    return {v, true};
  }
  uint32_t Find(uint64_t id) const {
    if (stamp_.empty()) return kNone;
    for (size_t s = Slot(id); stamp_[s] == gen_; s = (s + 1) & mask_) {
      if (keys_[s] == id) return vals_[s];
    }
    return kNone;
  }

 private:
  size_t Slot(uint64_t id) const { return static_cast<size_t>((id * 0x9e3779b97f4a7c15ULL) >> 20) & mask_; }
  void Grow() {
    std::vector<uint64_t> keys = std::move(keys_);
    std::vector<uint32_t> vals = std::move(vals_), stamp = std::move(stamp_);
    const size_t cap = std::max<size_t>(1024, 2 * stamp.size());
    keys_.assign(cap, 0);
    vals_.assign(cap, 0);
    stamp_.assign(cap, 0);
    mask_ = cap - 1;
    const uint32_t old_gen = gen_;
    gen_ = 1;
    size_ = 0;
    for (size_t i = 0; i < stamp.size(); ++i) {
      if (stamp[i] == old_gen) Insert(keys[i], vals[i]);
    }
  }
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> vals_, stamp_;
  size_t mask_ = 0, size_ = 0;
  uint32_t gen_ = 1;
};

// ---------------------------------------------------------------------------------------------------------
// One rank's structure, shared by every rank that has the same.

struct RawNode {
  uint64_t cid = 0;  // the Chakra id; part of the structure only for files Prism wrote (their ids are kept)
  NodeKind kind = NodeKind::kInvalid;
  CollOp op = CollOp::kInvalid;
  bool cpu = false;
  trace::DType dtype = trace::DType::kU8;
  int32_t root = -1;
  uint32_t iter = 0;
  uint32_t ref = kNone;  // communication nodes
  uint64_t bytes = 0;    // comm_size
  std::optional<uint64_t> exact_bytes;
  double dur_us = -1.0;
  std::string name;
  std::optional<std::string> stream_attr, slot_attr;
  std::vector<uint32_t> deps;  // mapped indices
};

struct RawClass {
  std::string key;  // the encoded structure (what decides sharing)
  bool from_prism = false;
  std::vector<RawNode> nodes;
  // Per ref.
  std::vector<char> ref_p2p;
  std::vector<uint32_t> ref_first;              // its first node
  std::vector<std::vector<uint32_t>> ref_nodes;  // its nodes, in order
  std::vector<char> ref_sends, ref_recvs;
  std::vector<uint64_t> ref_max_allgather;  // largest comm_size of its all-gathers without prism_bytes (0: none)
};

// What differs between ranks of one RawClass.
struct RankRef {
  bool p2p = false;
  bool has_pg = false;
  uint32_t pg = kNone;  // interned name
  int32_t peer = -1;    // p2p: global rank of the other side
  int64_t tag = 0;      // p2p: the tag of its messages, when they all have one (tag_varies false)
  bool tag_varies = false;
};

struct RankRec {
  uint32_t raw = kNone;
  uint32_t ref_begin = 0, refs = 0;  // into StreamImporter::refs_
  bool from_prism = false;
  uint32_t prism_class = kNone;  // interned
  uint32_t prism_comms = kNone;  // interned JSON text, parsed when the rank first names a group communicator
};

// Side effects of loading one rank that the reference applies as it reads: applied in rank order.
struct RankEffects {
  std::map<std::string, uint64_t> not_represented;
  std::vector<double> dropped_us;  // duration_micros of each node not represented, nonzero ones, in file order
  std::map<std::string, Group> pg_tables;
  void Clear() {
    not_represented.clear();
    dropped_us.clear();
    pg_tables.clear();
  }
};

// A mapped node's fixed-size part of its structure's key; its name, stream and slot names and dependencies follow.
struct NodeKeyHead {
  uint64_t cid, bytes, exact;
  double dur_us;
  int32_t root;
  uint32_t iter, ref, name_len, stream_len, slot_len, deps;
  uint8_t kind, op, dtype, flags;
};

// Appends the bytes of plain values to a key.
class KeyWriter {
 public:
  explicit KeyWriter(std::string* out) : out_(out) {}
  template <typename T>
  void Put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_->append(reinterpret_cast<const char*>(&v), sizeof v);
  }

 private:
  std::string* out_;
};

// ---------------------------------------------------------------------------------------------------------
// Reading one rank: the reference's RankLoader::Load and Classify on a stream of node views.

class RankReader {
 public:
  struct Span {
    uint32_t off = 0, len = 0;
  };
  // A node of the file, in file order.
  struct FileNode {
    uint64_t cid = 0, start = 0;
    Span name;
    bool kept = false;
    NodeKind kind = NodeKind::kInvalid;
    CollOp op = CollOp::kInvalid;
    bool cpu = false;
    bool has_pg = false;
    bool has_exact = false;
    bool has_stream = false, has_slot = false;
    trace::DType dtype = trace::DType::kU8;
    int32_t root = -1;
    int32_t peer = -1;
    uint32_t iter = 0;
    int64_t tag = 0;
    uint64_t bytes = 0, exact = 0;
    double dur_us = -1.0;
    Span pg, stream, slot;
    uint32_t dep_begin = 0, data_deps = 0, ctrl_deps = 0;  // Chakra ids in dep_cids_
    uint32_t eff_begin = 0, eff_count = 0;                 // resolved dependencies (file indices) in deps_
  };

  RankReader(int32_t world, const ImportOptions& opts) : world_(world), opts_(opts) {}

  // Reads and maps rank `rank`'s file. The mapped nodes are then mapped_ (file indices in topological order)
  // with mapped_deps(i).
  bool Load(int32_t rank, const std::string& path, RankEffects* effects, std::string* error) {
    rank_ = rank;
    path_ = &path;
    effects_ = effects;
    nodes_.clear();
    text_.clear();
    dep_cids_.clear();
    index_.Clear();
    if (!reader_.Open(path, error)) return false;
    ReadMetadata(reader_.metadata());

    std::string dup_error, classify_error;
    size_t classify_error_at = std::numeric_limits<size_t>::max();
    for (;;) {
      const int rc = reader_.Next(&view_, error);
      if (rc < 0) return false;
      if (rc == 0) break;
      const uint32_t i = static_cast<uint32_t>(nodes_.size());
      FileNode& n = nodes_.emplace_back();
      n.cid = view_.id;
      n.start = view_.start_time_micros;
      n.name = Keep(view_.name);
      n.dep_begin = static_cast<uint32_t>(dep_cids_.size());
      dep_cids_.insert(dep_cids_.end(), view_.data_deps.begin(), view_.data_deps.end());
      n.data_deps = static_cast<uint32_t>(view_.data_deps.size());
      if (opts_.ctrl_deps) {
        dep_cids_.insert(dep_cids_.end(), view_.ctrl_deps.begin(), view_.ctrl_deps.end());
        n.ctrl_deps = static_cast<uint32_t>(view_.ctrl_deps.size());
      }
      auto [first, fresh] = index_.Insert(view_.id, i);
      if (!fresh && dup_error.empty()) {
        dup_error = NodeRef(path, view_.id, std::string(view_.name)) + ": id used twice (nodes #" +
                    std::to_string(first) + " and #" + std::to_string(i) + " of the file)";
      }
      // Why keep reading after an error: the reference reads the whole file first (a broken message later in
      // the file is the error it reports), then checks ids, then classifies node by node.
      if (dup_error.empty() && classify_error.empty()) {
        std::string dropped_as;
        if (!Classify(view_, &n, &dropped_as, &classify_error)) {
          classify_error_at = i;
        } else {
          n.kept = dropped_as.empty();
          if (!n.kept) {
            effects_->not_represented[dropped_as]++;
            if (view_.duration_micros != 0) effects_->dropped_us.push_back(static_cast<double>(view_.duration_micros));
          }
        }
      }
    }
    if (!dup_error.empty()) {
      *error = dup_error;
      return false;
    }
    return Order(classify_error_at, classify_error, error);
  }

  const std::vector<uint32_t>& mapped() const { return mapped_; }
  const FileNode& node(uint32_t file_index) const { return nodes_[file_index]; }
  std::string_view text(Span s) const { return std::string_view(text_).substr(s.off, s.len); }
  // Mapped dependencies (mapped indices) of mapped node k.
  const uint32_t* mapped_deps(uint32_t k, uint32_t* count) const {
    *count = mapped_dep_count_[k];
    return mapped_deps_.data() + mapped_dep_begin_[k];
  }
  // "file: node <id> '<name>'" of mapped node k.
  std::string Ref(uint32_t k) const {
    const FileNode& n = nodes_[mapped_[k]];
    return NodeRef(*path_, n.cid, std::string(text(n.name)));
  }

  bool from_prism = false;
  std::optional<std::string> prism_class, prism_layout, prism_topology, prism_send_completion, prism_comms;

 private:
  Span Keep(std::string_view s) {
    Span sp{static_cast<uint32_t>(text_.size()), static_cast<uint32_t>(s.size())};
    text_.append(s);
    return sp;
  }

  void ReadMetadata(const et::GlobalMetadata& m) {
    auto get = [&](const char* name, std::optional<std::string>* v) {
      *v = std::nullopt;
      for (const auto& a : m.attr()) {
        if (a.name() == name) {
          *v = AttrString(a);
          return true;
        }
      }
      return false;
    };
    from_prism = get(kAttrClass, &prism_class);
    get(kAttrLayout, &prism_layout);
    get(kAttrTopology, &prism_topology);
    get(kAttrSendCompletion, &prism_send_completion);
    get(kAttrComms, &prism_comms);
  }

  // The attributes Classify reads; FindAttr's rule: the first of a name counts.
  enum Attr { kType, kSize, kSrc, kDst, kTag, kPg, kCpu, kStream, kSlot, kIter, kDtype, kRoot, kDurUs, kBytes, kAttrs };
  // Why by length and one letter: every attribute of every node is looked up; one comparison decides.
  static int AttrIndex(std::string_view n) {
    auto is = [&n](std::string_view lit) { return std::memcmp(n.data(), lit.data(), lit.size()) == 0; };
    switch (n.size()) {
      case 7: return is(kAttrPgName) ? kPg : -1;
      case 8:
        switch (n[5]) {
          case 's': return is(kAttrCommSrc) ? kSrc : -1;
          case 'd': return is(kAttrCommDst) ? kDst : -1;
          case 't': return is(kAttrCommTag) ? kTag : -1;
          default: return -1;
        }
      case 9:
        switch (n[5]) {
          case 't': return is(kAttrCommType) ? kType : -1;
          case 's': return is(kAttrCommSize) ? kSize : -1;
          case 'u': return is(kAttrIsCpuOp) ? kCpu : -1;
          default: return -1;
        }
      case 10:
        switch (n[6]) {
          case 's': return is(kAttrSlot) ? kSlot : -1;
          case 'i': return is(kAttrIter) ? kIter : -1;
          case 'r': return is(kAttrRoot) ? kRoot : -1;
          default: return -1;
        }
      case 11:
        switch (n[6]) {
          case 'd': return is(kAttrDtype) ? kDtype : -1;
          case 'b': return is(kAttrBytes) ? kBytes : -1;
          default: return -1;
        }
      case 12:
        switch (n[6]) {
          case 's': return is(kAttrStream) ? kStream : -1;
          case 'd': return is(kAttrDurUs) ? kDurUs : -1;
          default: return -1;
        }
      default: return -1;
    }
  }

  // The reference's Classify, on a view: fills *r for a node Prism represents, or sets *dropped_as.
  bool Classify(const EtNodeView& c, FileNode* r, std::string* dropped_as, std::string* error) {
    const EtAttrView* at[kAttrs] = {};
    for (const EtAttrView& a : c.attrs) {
      const int k = AttrIndex(a.name);
      if (k >= 0 && !at[k]) at[k] = &a;
    }
    auto fail = [&](const std::string& what) {
      *error = NodeRef(*path_, c.id, std::string(c.name)) + " (" + NodeTypeName(c.type) + "): " + what;
      return false;
    };
    auto int_attr = [&](Attr k, const char* name, std::optional<int64_t>* v) {
      *v = std::nullopt;
      const EtAttrView* a = at[k];
      if (!a) return true;
      *v = AttrInt(*a);
      if (!*v) return fail(std::string("attribute ") + name + " holds " + std::string(AttrValueKind(*a)) +
                           ", not an integer");
      return true;
    };
    auto rank_attr = [&](Attr k, const char* name, std::optional<int64_t>* v) {
      if (!int_attr(k, name, v)) return false;
      if (*v && (**v < 0 || **v >= world_)) {
        return fail(std::string(name) + " = " + std::to_string(**v) + " is not a rank of this " +
                    std::to_string(world_) + "-rank trace");
      }
      return true;
    };
    auto string_attr = [&](Attr k, Span* s, bool* has) {
      *has = false;
      if (!at[k]) return;
      const int vc = at[k]->value_case;
      if (vc == et::AttributeProto::kStringVal || vc == et::AttributeProto::kBytesVal) {
        *s = Keep(at[k]->s);
        *has = true;
      }
    };

    string_attr(kStream, &r->stream, &r->has_stream);
    string_attr(kSlot, &r->slot, &r->has_slot);
    if (const EtAttrView* a = at[kIter]) {
      auto v = AttrInt(*a);
      if (!v || *v < 0 || *v > std::numeric_limits<uint32_t>::max()) return fail("bad prism_iter");
      r->iter = static_cast<uint32_t>(*v);
    }
    if (const EtAttrView* a = at[kCpu]) r->cpu = AttrInt(*a).value_or(0) != 0;
    std::optional<double> exact_dur;
    if (const EtAttrView* a = at[kDurUs]) exact_dur = AttrDouble(*a);
    auto bad_duration = [&](double d) { return !(d >= 0 && d <= limits::kMaxDurationUs); };
    auto duration_error = [&](double d) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "duration %.6g us is outside 0..%.0e", d, limits::kMaxDurationUs);
      return fail(buf);
    };

    switch (c.type) {
      case et::COMP_NODE:
        r->kind = NodeKind::kCompute;
        r->dur_us = exact_dur ? *exact_dur : static_cast<double>(c.duration_micros);
        if (bad_duration(r->dur_us)) return duration_error(r->dur_us);
        return true;
      case et::COMM_COLL_NODE:
      case et::COMM_SEND_NODE:
      case et::COMM_RECV_NODE:
        break;
      default: {
        *dropped_as = NodeTypeName(c.type);
        std::map<std::string, Group> found;
        if (c.type == et::METADATA_NODE &&
            ParsePgTable(std::string(c.inputs_values), world_, &found, NodeRef(*path_, c.id, std::string(c.name)))) {
          *dropped_as = "METADATA_NODE (process-group table, used for communicators)";
          for (auto& [k, g] : found) effects_->pg_tables.emplace(k, std::move(g));
        }
        return true;
      }
    }

    // Communication.
    if (const EtAttrView* a = at[kPg]) {
      const int vc = a->value_case;
      if (vc == et::AttributeProto::kStringVal || vc == et::AttributeProto::kBytesVal) {
        r->pg = Keep(a->s);
      } else if (auto i = AttrInt(*a)) {
        r->pg = Keep(std::to_string(*i));
      } else {
        return fail("attribute pg_name holds " + std::string(AttrValueKind(*a)) + ", not a string");
      }
      r->has_pg = r->pg.len > 0;
    }
    if (const EtAttrView* a = at[kDtype]) {
      const int vc = a->value_case;
      const bool text = vc == et::AttributeProto::kStringVal || vc == et::AttributeProto::kBytesVal;
      r->dtype = text ? trace::ParseDType(a->s) : trace::DType::kInvalid;
      if (r->dtype == trace::DType::kInvalid) return fail("unknown prism_dtype");
    }
    r->dur_us = exact_dur ? *exact_dur : c.duration_micros > 0 ? static_cast<double>(c.duration_micros) : -1.0;
    if (r->dur_us != -1.0 && bad_duration(r->dur_us)) return duration_error(r->dur_us);
    std::optional<int64_t> size, type, src, dst, tag, root, exact_bytes;
    if (!int_attr(kSize, kAttrCommSize, &size) || !int_attr(kType, kAttrCommType, &type) ||
        !rank_attr(kSrc, kAttrCommSrc, &src) || !rank_attr(kDst, kAttrCommDst, &dst) ||
        !int_attr(kTag, kAttrCommTag, &tag) || !int_attr(kRoot, kAttrRoot, &root) ||
        !int_attr(kBytes, kAttrBytes, &exact_bytes)) {
      return false;
    }
    if (size && (*size < 0 || static_cast<uint64_t>(*size) > limits::kMaxBytes))
      return fail("comm_size " + std::to_string(*size) + " is outside 0.." + std::to_string(limits::kMaxBytes));
    if (exact_bytes && (*exact_bytes < 0 || static_cast<uint64_t>(*exact_bytes) > limits::kMaxBytes))
      return fail("prism_bytes " + std::to_string(*exact_bytes) + " is outside 0.." + std::to_string(limits::kMaxBytes));
    if (exact_bytes) {
      r->has_exact = true;
      r->exact = static_cast<uint64_t>(*exact_bytes);
    }
    r->bytes = size ? static_cast<uint64_t>(*size) : 0;
    r->tag = tag.value_or(0);

    if (c.type == et::COMM_COLL_NODE) {
      if (!type) return fail("no comm_type attribute (which collective is it?)");
      bool representable = true;
      r->op = MapCommType(*type, &representable);
      if (!representable) {
        *dropped_as = "COMM_COLL_NODE " + CommTypeName(*type);
        return true;
      }
      if (r->op == CollOp::kInvalid) return fail("comm_type " + std::to_string(*type) + " is not a CollectiveCommType");
      if (!size && r->op != CollOp::kBarrier) return fail("no comm_size attribute");
      r->kind = NodeKind::kColl;
      if (r->op == CollOp::kBroadcast || r->op == CollOp::kReduce) {
        r->root = static_cast<int32_t>(root.value_or(0));  // Chakra has no root: 0 unless we wrote one
      }
      return true;
    }
    const bool send = c.type == et::COMM_SEND_NODE;
    if (send ? !dst : !src) {
      *dropped_as = NodeTypeName(c.type) + (send ? " without comm_dst" : " without comm_src");
      return true;
    }
    if (!size) return fail("no comm_size attribute");
    if (send && src && *src != rank_) {
      return fail("comm_src " + std::to_string(*src) + " is not this file's rank " + std::to_string(rank_));
    }
    if (!send && dst && *dst != rank_) {
      return fail("comm_dst " + std::to_string(*dst) + " is not this file's rank " + std::to_string(rank_));
    }
    r->peer = static_cast<int32_t>(send ? *dst : *src);
    if (r->peer == rank_) return fail("sends to itself");
    r->kind = send ? NodeKind::kSend : NodeKind::kRecv;
    return true;
  }

  // Dependencies, the topological order and dependencies through dropped nodes: the reference's, in the same
  // order (its errors included).
  bool Order(size_t classify_error_at, const std::string& classify_error, std::string* error) {
    const size_t n = nodes_.size();
    deps_.clear();
    for (size_t i = 0; i < n; ++i) {
      if (i == classify_error_at) {
        *error = classify_error;
        return false;
      }
      FileNode& c = nodes_[i];
      c.eff_begin = static_cast<uint32_t>(deps_.size());
      for (uint32_t k = 0; k < c.data_deps + c.ctrl_deps; ++k) {
        const uint64_t d = dep_cids_[c.dep_begin + k];
        const char* what = k < c.data_deps ? "data_dep" : "ctrl_dep";
        const uint32_t at = index_.Find(d);
        if (at == kNone) {
          *error = NodeRef(*path_, c.cid, std::string(text(c.name))) + ": " + what + " " + std::to_string(d) +
                   " names no node in the file";
          return false;
        }
        if (at == i) {
          *error = NodeRef(*path_, c.cid, std::string(text(c.name))) + ": depends on itself (" + what + ")";
          return false;
        }
        const uint32_t* b = deps_.data() + c.eff_begin;
        const uint32_t* e = deps_.data() + deps_.size();
        if (std::find(b, e, at) == e) deps_.push_back(at);
      }
      c.eff_count = static_cast<uint32_t>(deps_.size() - c.eff_begin);
    }

    // Topological order; among nodes free to go the earlier (start time, id) first, as the reference.
    pending_.assign(n, 0);
    child_begin_.assign(n + 1, 0);
    for (size_t i = 0; i < n; ++i) {
      pending_[i] = nodes_[i].eff_count;
      for (uint32_t k = 0; k < nodes_[i].eff_count; ++k) child_begin_[deps_[nodes_[i].eff_begin + k] + 1]++;
    }
    for (size_t i = 0; i < n; ++i) child_begin_[i + 1] += child_begin_[i];
    children_.resize(deps_.size());
    fill_.assign(child_begin_.begin(), child_begin_.end() - 1);
    for (size_t i = 0; i < n; ++i) {
      for (uint32_t k = 0; k < nodes_[i].eff_count; ++k) {
        children_[fill_[deps_[nodes_[i].eff_begin + k]]++] = static_cast<uint32_t>(i);
      }
    }
    heap_.clear();
    auto later = [](const Key& a, const Key& b) { return a > b; };
    auto push = [&](uint32_t i) {
      heap_.push_back(Key{nodes_[i].start, nodes_[i].cid, i});
      std::push_heap(heap_.begin(), heap_.end(), later);
    };
    for (size_t i = 0; i < n; ++i) {
      if (pending_[i] == 0) push(static_cast<uint32_t>(i));
    }
    order_.clear();
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), later);
      const uint32_t i = std::get<2>(heap_.back());
      heap_.pop_back();
      order_.push_back(i);
      for (uint32_t k = child_begin_[i]; k < child_begin_[i + 1]; ++k) {
        if (--pending_[children_[k]] == 0) push(children_[k]);
      }
    }
    if (order_.size() != n) {
      for (size_t i = 0; i < n; ++i) {
        if (pending_[i] != 0) {
          *error = NodeRef(*path_, nodes_[i].cid, std::string(text(nodes_[i].name))) + ": dependency cycle (" +
                   std::to_string(n - order_.size()) + " nodes never become ready)";
          return false;
        }
      }
    }

    // A kept node waits for the nearest kept ancestors along every path, in the file's order of its
    // dependencies, each once.
    through_begin_.assign(n, 0);
    through_count_.assign(n, 0);
    through_.clear();
    new_index_.assign(n, kNone);
    seen_.assign(n, kNone);
    mapped_.clear();
    mapped_deps_.clear();
    mapped_dep_begin_.clear();
    mapped_dep_count_.clear();
    eff_.clear();
    for (uint32_t i : order_) {
      eff_.clear();
      auto add = [&](uint32_t d) {
        if (seen_[d] != i) {
          seen_[d] = i;
          eff_.push_back(d);
        }
      };
      const FileNode& c = nodes_[i];
      for (uint32_t k = 0; k < c.eff_count; ++k) {
        const uint32_t d = deps_[c.eff_begin + k];
        if (nodes_[d].kept) {
          add(d);
        } else {
          for (uint32_t x = 0; x < through_count_[d]; ++x) add(through_[through_begin_[d] + x]);
        }
      }
      if (!c.kept) {
        through_begin_[i] = static_cast<uint32_t>(through_.size());
        through_count_[i] = static_cast<uint32_t>(eff_.size());
        through_.insert(through_.end(), eff_.begin(), eff_.end());
        continue;
      }
      mapped_dep_begin_.push_back(static_cast<uint32_t>(mapped_deps_.size()));
      mapped_dep_count_.push_back(static_cast<uint32_t>(eff_.size()));
      for (uint32_t d : eff_) mapped_deps_.push_back(new_index_[d]);
      new_index_[i] = static_cast<uint32_t>(mapped_.size());
      mapped_.push_back(i);
    }
    return true;
  }

  using Key = std::tuple<uint64_t, uint64_t, uint32_t>;

  const int32_t world_;
  const ImportOptions& opts_;
  int32_t rank_ = 0;
  const std::string* path_ = nullptr;
  RankEffects* effects_ = nullptr;
  EtReader reader_;
  EtNodeView view_;
  std::vector<FileNode> nodes_;
  std::string text_;
  std::vector<uint64_t> dep_cids_;
  IdIndex index_;
  std::vector<uint32_t> deps_, pending_, child_begin_, children_, fill_, order_;
  std::vector<Key> heap_;
  std::vector<uint32_t> through_begin_, through_count_, through_, new_index_, seen_, eff_;
  std::vector<uint32_t> mapped_, mapped_deps_, mapped_dep_begin_, mapped_dep_count_;
};

// ---------------------------------------------------------------------------------------------------------
// A rank's communicator pattern: which of its refs share a communicator, the peer's position, each
// communicator's kind and size. With its RawClass it decides the rank's role class.

struct LocalComm {
  uint8_t kind = 0;  // 0 group, 1 pair, 2 world
  uint32_t members = 0;
};

struct Shape {
  uint32_t raw = kNone;
  std::vector<uint32_t> ref_local;   // per ref: index of its communicator in the rank's binding
  std::vector<uint32_t> node_local;  // per node, when p2p splitting gave nodes of one ref other communicators
  std::vector<int32_t> ref_peer;     // per ref: the peer's position in the communicator (p2p), else -1
  std::vector<LocalComm> local;
  // Filled later.
  std::vector<uint32_t> coll_seq;  // per local communicator: its collectives' sequence (0: none)
  uint32_t cls = kNone;
  std::vector<std::pair<std::string, uint64_t>> imported;
  uint64_t after_edges = 0;

  uint32_t LocalOf(const RawClass& raw, uint32_t k) const {
    return node_local.empty() ? ref_local[raw.nodes[k].ref] : node_local[k];
  }
};

class StreamImporter {
 public:
  StreamImporter(const ImportOptions& opts, ImportSummary* summary) : opts_(opts), summary_(summary) {}

  bool Run(trace::Trace* out, std::string* error) {
    if (!StartImport(opts_, summary_, &files_, &groups_, error)) return false;
    world_ = static_cast<int32_t>(files_.paths.size());
    std::map<std::string, Group> metadata_groups;
    ranks_.resize(world_);
    if (!LoadRanks(&metadata_groups, error)) return false;
    MergeMetadataGroups(std::move(metadata_groups), &groups_, summary_);

    if (!ResolveComms(error)) return false;
    if (!CheckCommSizes(error)) return false;
    if (!CheckP2p(error)) return false;
    ComputeShapes();
    if (!CheckCollectives(error)) return false;
    DropUnusedComms();
    Build(out);
    return FinishImport(*out, summary_, error);
  }

 private:
  // ---- Per rank: structure and binding.

  // Files are read by up to opts.threads threads (0: one per core, at most 4), rank r by thread r mod T; each
  // rank is then committed in rank order, so the result and the first error (in rank order) do not depend on
  // the threads.
  bool LoadRanks(std::map<std::string, Group>* metadata_groups, std::string* error) {
    int threads = opts_.threads > 0 ? opts_.threads : static_cast<int>(std::thread::hardware_concurrency());
    threads = std::clamp(threads, 1, opts_.threads > 0 ? 64 : 4);
    threads = std::min<int>(threads, world_);
    std::mutex mu;
    std::condition_variable cv;
    int32_t turn = 0;
    bool stop = false;
    auto work = [&](int t) {
      RankReader reader(world_, opts_);
      RankEffects effects;
      std::string err;
      for (int32_t r = t; r < world_; r += threads) {
        effects.Clear();
        const bool ok = reader.Load(r, files_.paths[r], &effects, &err);
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return turn == r || stop; });
        if (stop) return;
        if (!ok) {
          *error = err;
          stop = true;
          cv.notify_all();
          return;
        }
        for (const auto& [k, v] : effects.not_represented) summary_->not_represented[k] += v;
        for (double us : effects.dropped_us) summary_->not_represented_us += us;
        for (auto& [k, g] : effects.pg_tables) metadata_groups->emplace(k, std::move(g));
        Commit(r, reader);
        ++turn;
        cv.notify_all();
      }
    };
    if (threads == 1) {
      work(0);
    } else {
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t) pool.emplace_back(work, t);
      for (std::thread& th : pool) th.join();
    }
    return !stop;
  }

  void Commit(int32_t r, const RankReader& rd) {
    RankRec& rec = ranks_[r];
    rec.from_prism = rd.from_prism;
    if (rd.prism_class) rec.prism_class = strings_.Id(*rd.prism_class);
    if (rd.prism_comms) rec.prism_comms = strings_.Id(*rd.prism_comms);
    if (r == 0) {
      rank0_.from_prism = rd.from_prism;
      rank0_.layout = rd.prism_layout;
      rank0_.topology = rd.prism_topology;
      rank0_.send_completion = rd.prism_send_completion;
    }

    // Refs in order of first use: (p2p, has_pg, pg, peer).
    const auto& mapped = rd.mapped();
    const uint32_t n = static_cast<uint32_t>(mapped.size());
    ref_of_.assign(n, kNone);
    ref_index_.clear();
    rec.ref_begin = static_cast<uint32_t>(refs_.size());
    uint32_t refs = 0;
    bool varies = false;
    for (uint32_t k = 0; k < n; ++k) {
      const RankReader::FileNode& fn = rd.node(mapped[k]);
      if (fn.kind == NodeKind::kCompute) continue;
      const bool p2p = fn.kind != NodeKind::kColl;
      RefKey key{p2p, fn.has_pg, rd.text(fn.pg), p2p ? fn.peer : -1};
      auto [it, fresh] = ref_index_.emplace(key, refs);
      if (fresh) {
        RankRef ref;
        ref.p2p = p2p;
        ref.has_pg = fn.has_pg;
        ref.pg = strings_.Id(key.pg);
        ref.peer = key.peer;
        ref.tag = fn.tag;
        refs_.push_back(ref);
        ++refs;
      } else if (p2p && refs_[rec.ref_begin + it->second].tag != fn.tag) {
        refs_[rec.ref_begin + it->second].tag_varies = true;
        varies = true;
      }
      ref_of_[k] = it->second;
    }
    rec.refs = refs;
    if (varies) {
      std::vector<int64_t>& tags = varied_tags_[r];
      tags.assign(n, 0);
      for (uint32_t k = 0; k < n; ++k) tags[k] = rd.node(mapped[k]).tag;
    }

    // The structure's key.
    key_.clear();
    KeyWriter w(&key_);
    w.Put(rd.from_prism);
    w.Put(n);
    for (uint32_t k = 0; k < n; ++k) {
      const RankReader::FileNode& fn = rd.node(mapped[k]);
      uint32_t nd = 0;
      const uint32_t* d = rd.mapped_deps(k, &nd);
      NodeKeyHead h;
      std::memset(&h, 0, sizeof h);  // Why: the padding is part of the key's bytes
      h.cid = rd.from_prism ? fn.cid : 0;
      h.bytes = fn.bytes;
      h.exact = fn.exact;
      h.dur_us = fn.dur_us;
      h.root = fn.root;
      h.iter = fn.iter;
      h.ref = ref_of_[k];
      h.name_len = fn.name.len;
      h.stream_len = fn.has_stream ? fn.stream.len : 0;
      h.slot_len = fn.has_slot ? fn.slot.len : 0;
      h.deps = nd;
      h.kind = static_cast<uint8_t>(fn.kind);
      h.op = static_cast<uint8_t>(fn.op);
      h.dtype = static_cast<uint8_t>(fn.dtype);
      h.flags = static_cast<uint8_t>(fn.cpu | fn.has_exact << 1 | fn.has_stream << 2 | fn.has_slot << 3);
      w.Put(h);
      key_.append(rd.text(fn.name));
      if (fn.has_stream) key_.append(rd.text(fn.stream));
      if (fn.has_slot) key_.append(rd.text(fn.slot));
      key_.append(reinterpret_cast<const char*>(d), nd * sizeof(uint32_t));
    }
    auto it = raw_index_.find(key_);
    if (it != raw_index_.end()) {
      rec.raw = it->second;
      return;
    }
    auto raw = std::make_unique<RawClass>();
    raw->key = key_;
    raw->from_prism = rd.from_prism;
    raw->nodes.resize(n);
    raw->ref_p2p.assign(refs, 0);
    raw->ref_first.assign(refs, kNone);
    raw->ref_nodes.assign(refs, {});
    raw->ref_sends.assign(refs, 0);
    raw->ref_recvs.assign(refs, 0);
    raw->ref_max_allgather.assign(refs, 0);
    for (uint32_t k = 0; k < n; ++k) {
      const RankReader::FileNode& fn = rd.node(mapped[k]);
      RawNode& x = raw->nodes[k];
      x.cid = fn.cid;
      x.kind = fn.kind;
      x.op = fn.op;
      x.cpu = fn.cpu;
      x.dtype = fn.dtype;
      x.root = fn.root;
      x.iter = fn.iter;
      x.ref = ref_of_[k];
      x.bytes = fn.bytes;
      if (fn.has_exact) x.exact_bytes = fn.exact;
      x.dur_us = fn.dur_us;
      x.name = std::string(rd.text(fn.name));
      if (fn.has_stream) x.stream_attr = std::string(rd.text(fn.stream));
      if (fn.has_slot) x.slot_attr = std::string(rd.text(fn.slot));
      uint32_t nd = 0;
      const uint32_t* d = rd.mapped_deps(k, &nd);
      x.deps.assign(d, d + nd);
      if (x.ref == kNone) continue;
      const uint32_t j = x.ref;
      raw->ref_p2p[j] = x.kind != NodeKind::kColl;
      if (raw->ref_first[j] == kNone) raw->ref_first[j] = k;
      raw->ref_nodes[j].push_back(k);
      if (x.kind == NodeKind::kSend) raw->ref_sends[j] = 1;
      if (x.kind == NodeKind::kRecv) raw->ref_recvs[j] = 1;
      if (x.kind == NodeKind::kColl && x.op == CollOp::kAllGather && !x.exact_bytes) {
        // Why +1: 0 means "none", and a comm_size of 0 is never over the bound.
        raw->ref_max_allgather[j] = std::max(raw->ref_max_allgather[j], x.bytes + 1);
      }
    }
    rec.raw = static_cast<uint32_t>(raws_.size());
    raws_.push_back(std::move(raw));
    raw_index_.emplace(raws_.back()->key, rec.raw);
  }

  // ---- Late errors name their node: that rank's file is read again (the reader is deterministic).

  std::string NodeRefOf(int32_t r, uint32_t k) {
    RankReader again(world_, opts_);
    RankEffects ignored;
    std::string err;
    if (!again.Load(r, files_.paths[r], &ignored, &err) || k >= again.mapped().size()) {
      return files_.paths[r] + ": node #" + std::to_string(k) + " (the file changed while it was imported)";
    }
    return again.Ref(k);
  }

  const RankRef& Ref(int32_t r, uint32_t j) const { return refs_[ranks_[r].ref_begin + j]; }
  const RawClass& Raw(int32_t r) const { return *raws_[ranks_[r].raw]; }

  int64_t TagOf(int32_t r, uint32_t k) const {
    const RankRef& ref = Ref(r, Raw(r).nodes[k].ref);
    if (!ref.tag_varies) return ref.tag;
    return varied_tags_.at(r)[k];
  }

  // ---- Communicators (the reference's ResolveComms, per ref).

  uint32_t CommFor(const std::string& key, const std::function<CommInfo()>& make) {
    auto it = comm_index_.find(key);
    if (it != comm_index_.end()) return it->second;
    CommInfo c = make();
    c.key = key;
    comms_.push_back(std::move(c));
    uint32_t id = static_cast<uint32_t>(comms_.size() - 1);
    comm_index_[key] = id;
    return id;
  }

  uint32_t PairComm(int32_t lo, int32_t hi, const std::string& suffix) {
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
  int32_t PositionIn(const std::vector<int32_t>& members, int32_t rank) {
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

  std::string GroupDesc(const std::string& pg, int32_t r) {
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

  bool ResolveComms(std::string* error) {
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

  uint32_t NodeComm(int32_t r, uint32_t k) const {
    auto it = node_comm_.find(r);
    if (it != node_comm_.end() && it->second[k] != kNone) return it->second[k];
    return ref_comm_[ranks_[r].ref_begin + Raw(r).nodes[k].ref];
  }

  // The reference's ApplyCommSizes check: an all-gather's comm_size x ranks must stay within kMaxBytes.
  bool CheckCommSizes(std::string* error) {
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
  uint64_t FinalBytes(int32_t r, uint32_t k, uint32_t members) const {
    const RawNode& n = Raw(r).nodes[k];
    if (n.kind != NodeKind::kColl || n.op != CollOp::kAllGather) return n.bytes;
    if (n.exact_bytes) return *n.exact_bytes;
    if (opts_.allgather_comm_size == AllGatherCommSize::kOutput) return n.bytes;
    return n.bytes * members;
  }

  // ---- p2p pairing: the reference's CheckP2p, with each flow's messages taken from the sides' refs.

  struct Msg {
    int32_t rank;
    uint32_t node;
  };
  struct Side {
    int32_t rank = -1;
    std::vector<uint32_t> refs;
  };

  void Messages(const Side& side, NodeKind kind, std::vector<Msg>* out) const {
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

  bool CheckP2p(std::string* error) {
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

  void ComputeShapes() {
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

  uint32_t CollSeq(const std::string& entries) {
    auto [it, fresh] = seq_index_.emplace(entries, static_cast<uint32_t>(seq_index_.size() + 1));
    return it->second;
  }

  bool CheckCollectives(std::string* error) {
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
  bool ExplainCollectives(uint32_t c, std::string* error) {
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
  void DropUnusedComms() {
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

  trace::RoleClass BuildClass(Shape* sh) {
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

  void Build(trace::Trace* out) {
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

  struct RefKey {
    bool p2p, has_pg;
    std::string_view pg;
    int32_t peer;
    bool operator==(const RefKey& o) const {
      return p2p == o.p2p && has_pg == o.has_pg && peer == o.peer && pg == o.pg;
    }
  };
  struct RefKeyHash {
    size_t operator()(const RefKey& k) const {
      return std::hash<std::string_view>()(k.pg) ^ (static_cast<size_t>(k.peer) * 0x9e3779b97f4a7c15ULL) ^
             (k.p2p ? 0x51 : 0) ^ (k.has_pg ? 0xa2 : 0);
    }
  };

  const ImportOptions& opts_;
  ImportSummary* summary_;
  RankFiles files_;
  int32_t world_ = 0;
  std::map<std::string, Group> groups_;
  Interner strings_;
  GraphAttrs rank0_;
  std::vector<RankRec> ranks_;
  std::vector<RankRef> refs_;
  std::unordered_map<int32_t, std::vector<int64_t>> varied_tags_;  // rank -> tag per node, where a ref's vary
  std::vector<std::unique_ptr<RawClass>> raws_;
  std::unordered_map<std::string_view, uint32_t> raw_index_;  // keys point into raws_[i]->key
  // Commit's scratch.
  std::string key_;
  std::vector<uint32_t> ref_of_;
  std::unordered_map<RefKey, uint32_t, RefKeyHash> ref_index_;
  // Communicators.
  std::vector<CommInfo> comms_;
  std::unordered_map<std::string, uint32_t> comm_index_;
  std::vector<uint32_t> ref_comm_;                                   // per refs_ entry
  std::unordered_map<int32_t, std::vector<uint32_t>> node_comm_;     // rank -> per node, after p2p splitting
  std::unordered_map<const int32_t*, std::unordered_map<int32_t, int32_t>> positions_;
  // Patterns.
  std::vector<Shape> shapes_;
  std::unordered_map<std::string, uint32_t> shape_index_;
  std::vector<uint32_t> shape_of_;
  std::vector<uint32_t> bindings_, binding_begin_;  // per rank: its communicators in slot order
  std::unordered_map<std::string, uint32_t> seq_index_;
};

}  // namespace

std::string ImportSummary::Format() const {
  std::ostringstream os;
  os << "ranks: " << world_size << " (" << (files.empty() ? "" : fs::path(files[0]).filename().string())
     << (files.size() > 1 ? " .. " + fs::path(files.back()).filename().string() : "") << ")\n";
  if (!comm_group_file.empty()) os << "comm groups: " << comm_group_file << "\n";
  os << "role classes: " << classes << "\n";
  os << "communicators: " << comms << "\n";
  uint64_t total = 0;
  for (const auto& [k, v] : imported) total += v;
  os << "nodes imported: " << total;
  for (const auto& [k, v] : imported) os << ", " << k << " " << v;
  os << "\nafter edges: " << after_edges << "\n";
  if (send_completion != trace::SendCompletion::kInvalid) {
    os << "send completion: " << trace::ToString(send_completion) << "\n";
  }
  uint64_t dropped = 0;
  for (const auto& [k, v] : not_represented) dropped += v;
  os << "not represented: " << dropped;
  for (const auto& [k, v] : not_represented) os << ", " << k << " " << v;
  if (not_represented_us > 0) os << " (" << not_represented_us << " us of duration_micros)";
  os << "\n";
  return os.str();
}

bool ImportChakra(const ImportOptions& opts, trace::Trace* out, ImportSummary* summary, std::string* error) {
  ImportSummary local;
  if (!summary) summary = &local;
  *summary = ImportSummary{};
  StreamImporter imp(opts, summary);
  return imp.Run(out, error);
}

}  // namespace prism::chakra
