// The streaming importer's own parts (chakra_import.cc's overview says how it works): the records it keeps per
// distinct structure and per rank, the reader of one rank's file (chakra_import_rank_reader.cc) and the importer
// whose passes are split over chakra_import.cc (per rank: structure and binding) and chakra_import_cross_rank.cc
// (communicators, the cross-rank checks, the role classes). Not an API: only those three files include this.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "prism/trace.h"
#include "replay/chakra/chakra_et_reader.h"
#include "replay/chakra/chakra_import.h"
#include "replay/chakra/chakra_import_internal.h"

namespace prism::chakra::streaming {

using internal::CommInfo;
using internal::GraphAttrs;
using internal::Group;
using internal::NodeRef;
using internal::RankFiles;
using trace::CollOp;
using trace::NodeKind;

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
  bool Load(int32_t rank, const std::string& path, RankEffects* effects, std::string* error);

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

  void ReadMetadata(const et::GlobalMetadata& m);

  // The attributes Classify reads; FindAttr's rule: the first of a name counts.
  enum Attr { kType, kSize, kSrc, kDst, kTag, kPg, kCpu, kStream, kSlot, kIter, kDtype, kRoot, kDurUs, kBytes, kAttrs };
  static int AttrIndex(std::string_view n);
  bool Classify(const EtNodeView& c, FileNode* r, std::string* dropped_as, std::string* error);
  bool Order(size_t classify_error_at, const std::string& classify_error, std::string* error);

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

  // The passes, in order.
  bool Run(trace::Trace* out, std::string* error);

 private:
  // ---- Per rank: structure and binding (chakra_import.cc).
  bool LoadRanks(std::map<std::string, Group>* metadata_groups, std::string* error);
  void Commit(int32_t r, const RankReader& rd);

  // ---- Across ranks (chakra_import_cross_rank.cc).
  std::string NodeRefOf(int32_t r, uint32_t k);
  const RankRef& Ref(int32_t r, uint32_t j) const { return refs_[ranks_[r].ref_begin + j]; }
  const RawClass& Raw(int32_t r) const { return *raws_[ranks_[r].raw]; }
  int64_t TagOf(int32_t r, uint32_t k) const;

  // Communicators.
  uint32_t CommFor(const std::string& key, const std::function<CommInfo()>& make);
  uint32_t PairComm(int32_t lo, int32_t hi, const std::string& suffix);
  int32_t PositionIn(const std::vector<int32_t>& members, int32_t rank);
  std::string GroupDesc(const std::string& pg, int32_t r);
  bool ResolveComms(std::string* error);
  uint32_t NodeComm(int32_t r, uint32_t k) const;
  bool CheckCommSizes(std::string* error);
  uint64_t FinalBytes(int32_t r, uint32_t k, uint32_t members) const;

  // p2p pairing.
  struct Msg {
    int32_t rank;
    uint32_t node;
  };
  struct Side {
    int32_t rank = -1;
    std::vector<uint32_t> refs;
  };
  void Messages(const Side& side, NodeKind kind, std::vector<Msg>* out) const;
  bool CheckP2p(std::string* error);

  // Communicator patterns, collective agreement, role classes.
  void ComputeShapes();
  uint32_t CollSeq(const std::string& entries);
  bool CheckCollectives(std::string* error);
  bool ExplainCollectives(uint32_t c, std::string* error);
  void DropUnusedComms();
  trace::RoleClass BuildClass(Shape* sh);
  void Build(trace::Trace* out);

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

}  // namespace prism::chakra::streaming
