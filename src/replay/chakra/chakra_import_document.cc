// The reference importer: reads each rank's file into protobuf messages (ReadEtFile), keeps every rank's mapped
// node list until the cross-rank checks and the class folding at the end. Its memory grows with the whole trace;
// chakra_import.cc streams instead and must give the same graph, summary and messages. Kept for
// bench/chakra_import_bench (the baseline it measures against) and tests/unit/chakra_stream_test (the reference).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "prism/limits.h"
#include "replay/chakra/chakra_attrs.h"
#include "replay/chakra/chakra_et_io.h"
#include "replay/chakra/chakra_import.h"
#include "replay/chakra/chakra_import_internal.h"

namespace prism::chakra {

using json = nlohmann::json;
using trace::CollOp;
using trace::NodeKind;
using namespace internal;

namespace {

// ---------------------------------------------------------------------------------------------------------
// One rank's nodes after mapping: only what Prism represents, in a topological order.

struct RawNode {
  uint64_t cid = 0;  // Chakra node id
  std::string name;
  int chakra_type = 0;
  NodeKind kind = NodeKind::kInvalid;
  CollOp op = CollOp::kInvalid;
  bool has_pg = false;
  std::string pg;
  int32_t peer_global = -1;  // send: comm_dst, recv: comm_src
  int64_t tag = 0;
  uint64_t bytes = 0;                  // comm_size until ApplyCommSizes, then Prism's bytes (S)
  std::optional<uint64_t> exact_bytes;  // prism_bytes
  double dur_us = -1.0;
  uint32_t iter = 0;
  bool cpu = false;
  std::optional<std::string> stream_attr, slot_attr;
  trace::DType dtype = trace::DType::kU8;
  int32_t root = -1;
  std::vector<uint32_t> deps;  // indices into RankGraph::nodes
  // Filled by the cross-rank pass.
  uint32_t comm = trace::kNoIndex;  // index into Importer::comms_
};

struct RankGraph {
  std::string file;
  std::vector<RawNode> nodes;
  std::optional<std::string> prism_class, prism_layout, prism_topology, prism_send_completion;
  std::map<std::string, std::string> prism_comm_desc;  // pg -> desc
  bool from_prism = false;
};

using internal::NodeRef;
std::string NodeRef(const std::string& file, const RawNode& n) { return NodeRef(file, n.cid, n.name); }

class RankLoader {
 public:
  RankLoader(int32_t rank, int32_t world, const ImportOptions& opts, ImportSummary* summary,
             std::map<std::string, Group>* metadata_groups)
      : rank_(rank), world_(world), opts_(opts), summary_(summary), metadata_groups_(metadata_groups) {}

  bool Load(const std::string& path, RankGraph* out, std::string* error) {
    out->file = path;
    EtFile f;
    if (!ReadEtFile(path, &f, error)) return false;
    ReadMetadata(f.metadata, out);

    const size_t n = f.nodes.size();
    std::unordered_map<uint64_t, uint32_t> index;
    index.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      auto [it, fresh] = index.emplace(f.nodes[i].id(), static_cast<uint32_t>(i));
      if (!fresh) {
        *error = NodeRef(path, f.nodes[i].id(), f.nodes[i].name()) + ": id used twice (nodes #" +
                 std::to_string(it->second) + " and #" + std::to_string(i) + " of the file)";
        return false;
      }
    }
    // Classify every node; kept[i] says whether Prism represents it.
    std::vector<RawNode> raw(n);
    std::vector<char> kept(n, 0);
    std::vector<std::vector<uint32_t>> deps(n);
    for (size_t i = 0; i < n; ++i) {
      const et::Node& c = f.nodes[i];
      std::string dropped_as;
      if (!Classify(path, c, &raw[i], &dropped_as, error)) return false;
      kept[i] = dropped_as.empty();
      if (!kept[i]) {
        summary_->not_represented[dropped_as]++;
        summary_->not_represented_us += static_cast<double>(c.duration_micros());
      }
      auto add = [&](uint64_t d, const char* what) {
        auto it = index.find(d);
        if (it == index.end()) {
          *error = NodeRef(path, c.id(), c.name()) + ": " + what + " " + std::to_string(d) +
                   " names no node in the file";
          return false;
        }
        if (it->second == i) {
          *error = NodeRef(path, c.id(), c.name()) + ": depends on itself (" + what + ")";
          return false;
        }
        if (std::find(deps[i].begin(), deps[i].end(), it->second) == deps[i].end()) deps[i].push_back(it->second);
        return true;
      };
      for (uint64_t d : c.data_deps()) {
        if (!add(d, "data_dep")) return false;
      }
      if (opts_.ctrl_deps) {
        for (uint64_t d : c.ctrl_deps()) {
          if (!add(d, "ctrl_dep")) return false;
        }
      }
    }

    // Topological order. Why the (start time, id) priority: among nodes free to go, a recorded trace's start
    // times say what ran first; generated traces (all zero) fall back to ids, like Chakra's feeder.
    std::vector<uint32_t> pending(n, 0);
    std::vector<std::vector<uint32_t>> children(n);
    for (size_t i = 0; i < n; ++i) {
      pending[i] = static_cast<uint32_t>(deps[i].size());
      for (uint32_t d : deps[i]) children[d].push_back(static_cast<uint32_t>(i));
    }
    using Key = std::tuple<uint64_t, uint64_t, uint32_t>;
    std::priority_queue<Key, std::vector<Key>, std::greater<Key>> ready;
    for (size_t i = 0; i < n; ++i) {
      if (pending[i] == 0) ready.emplace(f.nodes[i].start_time_micros(), f.nodes[i].id(), static_cast<uint32_t>(i));
    }
    std::vector<uint32_t> order;
    order.reserve(n);
    while (!ready.empty()) {
      uint32_t i = std::get<2>(ready.top());
      ready.pop();
      order.push_back(i);
      for (uint32_t ch : children[i]) {
        if (--pending[ch] == 0) ready.emplace(f.nodes[ch].start_time_micros(), f.nodes[ch].id(), ch);
      }
    }
    if (order.size() != n) {
      for (size_t i = 0; i < n; ++i) {
        if (pending[i] != 0) {
          *error = NodeRef(path, f.nodes[i].id(), f.nodes[i].name()) + ": dependency cycle (" +
                   std::to_string(n - order.size()) + " nodes never become ready)";
          return false;
        }
      }
    }

    // Dependencies through nodes Prism does not represent are kept transitively: a kept node waits for the
    // nearest kept ancestors along every path.
    std::vector<std::vector<uint32_t>> through(n);  // for dropped nodes: their nearest kept ancestors
    std::vector<uint32_t> new_index(n, trace::kNoIndex);
    for (uint32_t i : order) {
      // In the file's order (data_deps first), each ancestor once.
      std::vector<uint32_t> eff;
      std::unordered_set<uint32_t> seen;
      auto push = [&](uint32_t d) {
        if (seen.insert(d).second) eff.push_back(d);
      };
      for (uint32_t d : deps[i]) {
        if (kept[d]) {
          push(d);
        } else {
          for (uint32_t x : through[d]) push(x);
        }
      }
      if (!kept[i]) {
        through[i] = std::move(eff);
        continue;
      }
      RawNode& r = raw[i];
      r.deps.clear();
      for (uint32_t d : eff) r.deps.push_back(new_index[d]);
      new_index[i] = static_cast<uint32_t>(out->nodes.size());
      out->nodes.push_back(std::move(r));
    }
    return true;
  }

 private:
  void ReadMetadata(const et::GlobalMetadata& m, RankGraph* out) {
    if (const auto* a = FindAttr(m.attr(), kAttrClass)) out->prism_class = AttrString(*a);
    if (const auto* a = FindAttr(m.attr(), kAttrLayout)) out->prism_layout = AttrString(*a);
    if (const auto* a = FindAttr(m.attr(), kAttrTopology)) out->prism_topology = AttrString(*a);
    if (const auto* a = FindAttr(m.attr(), kAttrSendCompletion)) out->prism_send_completion = AttrString(*a);
    if (const auto* a = FindAttr(m.attr(), kAttrComms)) {
      if (auto s = AttrString(*a)) {
        json j = json::parse(*s, nullptr, false);
        if (j.is_object()) {
          for (auto it = j.begin(); it != j.end(); ++it) {
            if (it.value().is_string()) out->prism_comm_desc[it.key()] = it.value().get<std::string>();
          }
        }
      }
    }
    out->from_prism = FindAttr(m.attr(), kAttrClass) != nullptr;
  }

  // Fills *r for a node Prism represents, or sets *dropped_as to the kind it is counted under otherwise.
  bool Classify(const std::string& path, const et::Node& c, RawNode* r, std::string* dropped_as,
                std::string* error) {
    r->cid = c.id();
    r->name = c.name();
    r->chakra_type = c.type();
    const auto& attrs = c.attr();
    auto fail = [&](const std::string& what) {
      *error = NodeRef(path, c.id(), c.name()) + " (" + NodeTypeName(c.type()) + "): " + what;
      return false;
    };
    // Integer attribute, with a message naming it when it holds a non-integer.
    auto int_attr = [&](const char* name, std::optional<int64_t>* v) {
      *v = std::nullopt;
      const et::AttributeProto* a = FindAttr(attrs, name);
      if (!a) return true;
      *v = AttrInt(*a);
      if (!*v) return fail(std::string("attribute ") + name + " holds " + std::string(AttrValueKind(*a)) +
                           ", not an integer");
      return true;
    };
    auto rank_attr = [&](const char* name, std::optional<int64_t>* v) {
      if (!int_attr(name, v)) return false;
      if (*v && (**v < 0 || **v >= world_)) {
        return fail(std::string(name) + " = " + std::to_string(**v) + " is not a rank of this " +
                    std::to_string(world_) + "-rank trace");
      }
      return true;
    };

    if (const auto* a = FindAttr(attrs, kAttrStream)) r->stream_attr = AttrString(*a);
    if (const auto* a = FindAttr(attrs, kAttrSlot)) r->slot_attr = AttrString(*a);
    if (const auto* a = FindAttr(attrs, kAttrIter)) {
      auto v = AttrInt(*a);
      if (!v || *v < 0 || *v > std::numeric_limits<uint32_t>::max()) return fail("bad prism_iter");
      r->iter = static_cast<uint32_t>(*v);
    }
    if (const auto* a = FindAttr(attrs, kAttrIsCpuOp)) r->cpu = AttrInt(*a).value_or(0) != 0;
    std::optional<double> exact_dur;
    if (const auto* a = FindAttr(attrs, kAttrDurUs)) exact_dur = AttrDouble(*a);
    // Why bounded: a duration becomes the replay's clock; 1e308 us or NaN would print as a 63-digit time.
    auto bad_duration = [&](double d) {
      return !(d >= 0 && d <= limits::kMaxDurationUs);
    };
    auto duration_error = [&](double d) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "duration %.6g us is outside 0..%.0e", d, limits::kMaxDurationUs);
      return fail(buf);
    };

    switch (c.type()) {
      case et::COMP_NODE:
        r->kind = NodeKind::kCompute;
        r->dur_us = exact_dur ? *exact_dur : static_cast<double>(c.duration_micros());
        if (bad_duration(r->dur_us)) return duration_error(r->dur_us);
        return true;
      case et::COMM_COLL_NODE:
      case et::COMM_SEND_NODE:
      case et::COMM_RECV_NODE:
        break;
      default:
        *dropped_as = NodeTypeName(c.type());
        if (c.type() == et::METADATA_NODE &&
            ParsePgTable(c.inputs().values(), world_, metadata_groups_, NodeRef(path, c.id(), c.name()))) {
          *dropped_as = "METADATA_NODE (process-group table, used for communicators)";
        }
        return true;
    }

    // Communication.
    if (const auto* a = FindAttr(attrs, kAttrPgName)) {
      auto s = AttrString(*a);
      if (!s) {
        if (auto i = AttrInt(*a)) s = std::to_string(*i);
      }
      if (!s) return fail("attribute pg_name holds " + std::string(AttrValueKind(*a)) + ", not a string");
      r->has_pg = !s->empty();
      r->pg = *s;
    }
    if (const auto* a = FindAttr(attrs, kAttrDtype)) {
      auto s = AttrString(*a);
      r->dtype = s ? trace::ParseDType(*s) : trace::DType::kInvalid;
      if (r->dtype == trace::DType::kInvalid) return fail("unknown prism_dtype");
    }
    r->dur_us = exact_dur ? *exact_dur : c.duration_micros() > 0 ? static_cast<double>(c.duration_micros()) : -1.0;
    if (r->dur_us != -1.0 && bad_duration(r->dur_us)) return duration_error(r->dur_us);
    std::optional<int64_t> size, type, src, dst, tag, root, exact_bytes;
    if (!int_attr(kAttrCommSize, &size) || !int_attr(kAttrCommType, &type) || !rank_attr(kAttrCommSrc, &src) ||
        !rank_attr(kAttrCommDst, &dst) || !int_attr(kAttrCommTag, &tag) || !int_attr(kAttrRoot, &root) ||
        !int_attr(kAttrBytes, &exact_bytes)) {
      return false;
    }
    if (size && (*size < 0 || static_cast<uint64_t>(*size) > limits::kMaxBytes))
      return fail("comm_size " + std::to_string(*size) + " is outside 0.." + std::to_string(limits::kMaxBytes));
    if (exact_bytes && (*exact_bytes < 0 || static_cast<uint64_t>(*exact_bytes) > limits::kMaxBytes))
      return fail("prism_bytes " + std::to_string(*exact_bytes) + " is outside 0.." + std::to_string(limits::kMaxBytes));
    if (exact_bytes) r->exact_bytes = static_cast<uint64_t>(*exact_bytes);
    r->bytes = size ? static_cast<uint64_t>(*size) : 0;
    r->tag = tag.value_or(0);

    if (c.type() == et::COMM_COLL_NODE) {
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
    const bool send = c.type() == et::COMM_SEND_NODE;
    if (send ? !dst : !src) {
      // PyTorch-converted traces carry only comm_size and pg_name on p2p nodes: the peer is unknown.
      *dropped_as = NodeTypeName(c.type()) + (send ? " without comm_dst" : " without comm_src");
      return true;
    }
    if (!size) return fail("no comm_size attribute");
    if (send && src && *src != rank_) {
      return fail("comm_src " + std::to_string(*src) + " is not this file's rank " + std::to_string(rank_));
    }
    if (!send && dst && *dst != rank_) {
      return fail("comm_dst " + std::to_string(*dst) + " is not this file's rank " + std::to_string(rank_));
    }
    r->peer_global = static_cast<int32_t>(send ? *dst : *src);
    if (r->peer_global == rank_) return fail("sends to itself");
    r->kind = send ? NodeKind::kSend : NodeKind::kRecv;
    return true;
  }

  int32_t rank_, world_;
  const ImportOptions& opts_;
  ImportSummary* summary_;
  std::map<std::string, Group>* metadata_groups_;
};

// ---------------------------------------------------------------------------------------------------------
// Communicators, cross-rank checks, role classes.

class DocumentImporter {
 public:
  DocumentImporter(const ImportOptions& opts, ImportSummary* summary) : opts_(opts), summary_(summary) {}

  bool Run(trace::Trace* out, std::string* error) {
    RankFiles files;
    if (!StartImport(opts_, summary_, &files, &groups_, error)) return false;
    world_ = static_cast<int32_t>(files.paths.size());

    std::map<std::string, Group> metadata_groups;
    ranks_.resize(world_);
    for (int32_t r = 0; r < world_; ++r) {
      RankLoader loader(r, world_, opts_, summary_, &metadata_groups);
      if (!loader.Load(files.paths[r], &ranks_[r], error)) return false;
    }
    MergeMetadataGroups(std::move(metadata_groups), &groups_, summary_);

    if (!ResolveComms(error)) return false;
    if (!ApplyCommSizes(error)) return false;
    if (!CheckP2p(error)) return false;
    if (!CheckCollectives(error)) return false;
    DropUnusedComms();
    Build(out);

    return FinishImport(*out, summary_, error);
  }

 private:
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

  std::string GroupDesc(const std::string& pg, const RankGraph& g) const {
    auto d = g.prism_comm_desc.find(pg);
    if (d != g.prism_comm_desc.end()) return d->second;
    auto it = groups_.find(pg);
    if (it != groups_.end() && !it->second.desc.empty()) return it->second.desc;
    return "pg " + pg;
  }

  // Assigns every communication node its communicator (collectives: the process group, the world for an
  // empty or "0" pg_name as in ASTRA-sim; p2p: its process group when defined, else the pair of ranks).
  bool ResolveComms(std::string* error) {
    for (int32_t r = 0; r < world_; ++r) {
      RankGraph& g = ranks_[r];
      for (RawNode& n : g.nodes) {
        if (n.kind == NodeKind::kCompute) continue;
        const bool p2p = n.kind != NodeKind::kColl;
        auto group = n.has_pg ? groups_.find(n.pg) : groups_.end();
        if (group != groups_.end()) {
          const Group& gr = group->second;
          auto member = [&](int32_t x) { return std::find(gr.ranks.begin(), gr.ranks.end(), x) != gr.ranks.end(); };
          if (!member(r)) {
            *error = NodeRef(g.file, n) + ": rank " + std::to_string(r) + " is not a member of process group \"" +
                     n.pg + "\" (" + gr.source + ")";
            return false;
          }
          if (p2p && !member(n.peer_global)) {
            *error = NodeRef(g.file, n) + ": peer rank " + std::to_string(n.peer_global) +
                     " is not a member of process group \"" + n.pg + "\" (" + gr.source + ")";
            return false;
          }
          n.comm = CommFor("g:" + n.pg, [&] {
            CommInfo c;
            c.ranks = gr.ranks;
            c.desc = GroupDesc(n.pg, g);
            return c;
          });
          continue;
        }
        if (!p2p) {
          if (n.has_pg && n.pg != "0") {
            *error = NodeRef(g.file, n) + ": process group \"" + n.pg + "\" is not defined (" +
                     (summary_->comm_group_file.empty() ? std::string("no comm-group file; pass --comm-group FILE")
                                                        : "not in " + summary_->comm_group_file) +
                     ")";
            return false;
          }
          n.comm = CommFor("world", [&] {
            CommInfo c;
            for (int32_t x = 0; x < world_; ++x) c.ranks.push_back(x);
            c.desc = "world";
            c.world = true;
            return c;
          });
          continue;
        }
        // Why a pair communicator: data-parallel replicas then bind the same slot/peer and fold into one class
        // (with the world, peers would be global ranks that differ per replica). ASTRA-sim ignores pg_name on
        // p2p nodes, so nothing is lost.
        const int32_t lo = std::min(r, n.peer_global), hi = std::max(r, n.peer_global);
        n.comm = PairComm(lo, hi, "");
      }
    }
    return true;
  }

  // comm_size -> Prism's bytes (nccl-tests' S). Only all-gather reads differently: ASTRA-sim takes its comm_size
  // as each rank's input, so S = comm_size x ranks of the communicator (docs/chakra.md, "comm_size"), unless
  // the option says the writer put S there. prism_bytes, when present, is S itself.
  bool ApplyCommSizes(std::string* error) {
    for (int32_t r = 0; r < world_; ++r) {
      for (RawNode& n : ranks_[r].nodes) {
        if (n.kind != NodeKind::kColl || n.op != CollOp::kAllGather) continue;
        if (n.exact_bytes) {
          n.bytes = *n.exact_bytes;
          continue;
        }
        if (opts_.allgather_comm_size == AllGatherCommSize::kOutput) continue;
        const uint64_t members = comms_[n.comm].ranks.size();
        if (n.bytes > limits::kMaxBytes / members) {
          *error = NodeRef(ranks_[r].file, n) + ": comm_size " + std::to_string(n.bytes) + " x " +
                   std::to_string(members) + " ranks (the all-gather's output) is over " +
                   std::to_string(limits::kMaxBytes) + " bytes";
          return false;
        }
        n.bytes *= members;
      }
    }
    return true;
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

  struct Msg {
    int32_t rank;
    uint32_t node;
  };

  // Prism matches the k-th send from a to b on a communicator with the k-th receive; ASTRA-sim matches by
  // (src, dst, tag, size) in order. When the two orders agree (the usual case) one communicator serves;
  // otherwise each (tag, size) gets its own communicator so that Prism pairs the same messages ASTRA-sim does.
  bool CheckP2p(std::string* error) {
    std::map<std::tuple<uint32_t, int32_t, int32_t>, std::pair<std::vector<Msg>, std::vector<Msg>>> flows;
    for (int32_t r = 0; r < world_; ++r) {
      auto& nodes = ranks_[r].nodes;
      for (uint32_t i = 0; i < nodes.size(); ++i) {
        const RawNode& n = nodes[i];
        if (n.kind == NodeKind::kSend) flows[{n.comm, r, n.peer_global}].first.push_back({r, i});
        if (n.kind == NodeKind::kRecv) flows[{n.comm, n.peer_global, r}].second.push_back({r, i});
      }
    }
    for (auto& [key, flow] : flows) {
      auto& [sends, recvs] = flow;
      auto tag_size = [&](const Msg& m) {
        const RawNode& n = ranks_[m.rank].nodes[m.node];
        return std::make_pair(n.tag, n.bytes);
      };
      bool same = sends.size() == recvs.size();
      for (size_t k = 0; same && k < sends.size(); ++k) same = tag_size(sends[k]) == tag_size(recvs[k]);
      if (same) continue;
      // Split by (tag, size) and match within each.
      std::map<std::pair<int64_t, uint64_t>, std::pair<size_t, size_t>> counts;
      std::map<std::pair<int64_t, uint64_t>, Msg> first_send, first_recv;
      const CommInfo base = comms_[std::get<0>(key)];
      for (auto* side : {&sends, &recvs}) {
        for (const Msg& m : *side) {
          RawNode& n = ranks_[m.rank].nodes[m.node];
          auto ts = tag_size(m);
          (side == &sends ? counts[ts].first : counts[ts].second)++;
          (side == &sends ? first_send : first_recv).emplace(ts, m);
          const std::string suffix = " tag " + std::to_string(n.tag) + " bytes " + std::to_string(n.bytes);
          if (base.pair) {
            n.comm = PairComm(base.ranks[0], base.ranks[1], suffix);
          } else {
            n.comm = CommFor(base.key + suffix, [&] {
              CommInfo c = base;
              c.desc = base.desc + suffix;
              return c;
            });
          }
        }
      }
      for (const auto& [ts, c] : counts) {
        if (c.first == c.second) continue;
        const auto [src, dst] = std::make_pair(std::get<1>(key), std::get<2>(key));
        const bool more_sends = c.first > c.second;
        const Msg& m = more_sends ? first_send.at(ts) : first_recv.at(ts);
        *error = NodeRef(ranks_[m.rank].file, ranks_[m.rank].nodes[m.node]) + ": rank " + std::to_string(src) +
                 " sends " + Plural(c.first, "message") + " of " + std::to_string(ts.second) + " bytes with tag " +
                 std::to_string(ts.first) + " to rank " + std::to_string(dst) + ", which receives " +
                 std::to_string(c.second) + " (" + ranks_[more_sends ? dst : src].file + ")";
        return false;
      }
    }
    return true;
  }

  // Every member of a communicator must issue the same collectives in the same order.
  bool CheckCollectives(std::string* error) {
    std::vector<std::vector<std::vector<uint32_t>>> seq(comms_.size());  // comm -> member position -> nodes
    for (size_t c = 0; c < comms_.size(); ++c) seq[c].resize(comms_[c].ranks.size());
    for (int32_t r = 0; r < world_; ++r) {
      const auto& nodes = ranks_[r].nodes;
      for (uint32_t i = 0; i < nodes.size(); ++i) {
        if (nodes[i].kind != NodeKind::kColl) continue;
        const auto& members = comms_[nodes[i].comm].ranks;
        size_t pos = std::find(members.begin(), members.end(), r) - members.begin();
        seq[nodes[i].comm][pos].push_back(i);
      }
    }
    auto describe = [&](int32_t r, uint32_t i) {
      const RawNode& n = ranks_[r].nodes[i];
      std::string s = NodeRef(ranks_[r].file, n) + " " + std::string(trace::ToString(n.op)) + " " +
                      std::to_string(n.bytes) + " bytes";
      if (n.root >= 0) s += " root " + std::to_string(n.root);
      if (n.dtype != trace::DType::kU8) s += " " + std::string(trace::ToString(n.dtype));
      return s;
    };
    for (size_t c = 0; c < comms_.size(); ++c) {
      const CommInfo& comm = comms_[c];
      const auto& members = comm.ranks;
      size_t longest = 0;
      for (size_t p = 0; p < members.size(); ++p) longest = std::max(longest, seq[c][p].size());
      if (longest == 0) continue;
      const std::string where = "communicator '" + comm.desc + "' (" + std::to_string(members.size()) + " ranks)";
      for (size_t p = 0; p < members.size(); ++p) {
        if (seq[c][p].size() != longest) {
          size_t q = 0;
          while (seq[c][q].size() != longest) ++q;
          const uint32_t missing = seq[c][q][seq[c][p].size()];
          *error = where + ": rank " + std::to_string(members[p]) + " (" + ranks_[members[p]].file + ") issues " +
                   Plural(seq[c][p].size(), "collective") + ", rank " + std::to_string(members[q]) + " issues " +
                   std::to_string(longest) + "; the first without a partner: " + describe(members[q], missing);
          return false;
        }
      }
      for (size_t k = 0; k < longest; ++k) {
        const RawNode& a = ranks_[members[0]].nodes[seq[c][0][k]];
        for (size_t p = 1; p < members.size(); ++p) {
          const RawNode& b = ranks_[members[p]].nodes[seq[c][p][k]];
          const bool bytes_ok = a.bytes == b.bytes || (a.op == CollOp::kAllToAll && b.op == CollOp::kAllToAll);
          if (a.op != b.op || !bytes_ok || a.root != b.root || a.dtype != b.dtype) {
            *error = where + ": members disagree at collective #" + std::to_string(k) + ": " +
                     describe(members[0], seq[c][0][k]) + " vs " + describe(members[p], seq[c][p][k]);
            return false;
          }
        }
      }
    }
    return true;
  }

  // A communicator left without nodes (the base of one split by tag) is not written; ids stay dense.
  void DropUnusedComms() {
    std::vector<uint32_t> remap(comms_.size(), trace::kNoIndex);
    for (const RankGraph& g : ranks_) {
      for (const RawNode& n : g.nodes) {
        if (n.comm != trace::kNoIndex) remap[n.comm] = 0;
      }
    }
    std::vector<CommInfo> kept;
    for (size_t c = 0; c < comms_.size(); ++c) {
      if (remap[c] == trace::kNoIndex) continue;
      remap[c] = static_cast<uint32_t>(kept.size());
      kept.push_back(std::move(comms_[c]));
    }
    for (RankGraph& g : ranks_) {
      for (RawNode& n : g.nodes) {
        if (n.comm != trace::kNoIndex) n.comm = remap[n.comm];
      }
    }
    comms_ = std::move(kept);
    comm_index_.clear();
  }

  // One rank's role class: slots in order of first use, streams in order of first node.
  trace::RoleClass BuildClass(int32_t r, std::vector<uint32_t>* binding) {
    const RankGraph& g = ranks_[r];
    trace::RoleClass cls;
    bool streams_given = !g.nodes.empty();
    bool ids_given = g.from_prism;
    for (const RawNode& n : g.nodes) {
      streams_given = streams_given && n.stream_attr.has_value() && !n.stream_attr->empty();
      ids_given = ids_given && n.cid < trace::kNoIndex;
    }
    // Slot names: Prism's own (prism_slot) when they name the communicators one to one, else generated.
    std::map<uint32_t, std::string> given;
    bool slots_given = g.from_prism;
    {
      std::map<std::string, uint32_t> back;
      for (const RawNode& n : g.nodes) {
        if (n.kind == NodeKind::kCompute || !slots_given) continue;
        if (!n.slot_attr || n.slot_attr->empty()) {
          slots_given = false;
          break;
        }
        auto [a, fa] = given.emplace(n.comm, *n.slot_attr);
        auto [b, fb] = back.emplace(*n.slot_attr, n.comm);
        if (a->second != *n.slot_attr || b->second != n.comm) slots_given = false;
      }
    }
    std::unordered_map<uint32_t, uint32_t> slot_of;  // comm -> slot
    int groups = 0, pairs = 0;
    auto slot = [&](uint32_t comm) {
      auto it = slot_of.find(comm);
      if (it != slot_of.end()) return it->second;
      std::string name;
      if (slots_given) {
        name = given[comm];
      } else if (comms_[comm].world) {
        name = "world";
      } else if (comms_[comm].pair) {
        name = "p" + std::to_string(pairs++);
      } else {
        name = "g" + std::to_string(groups++);
      }
      uint32_t s = static_cast<uint32_t>(cls.comm_slots.size());
      cls.comm_slots.push_back(name);
      binding->push_back(comm);
      slot_of[comm] = s;
      return s;
    };
    std::unordered_map<std::string, uint32_t> stream_of;
    std::vector<std::pair<uint32_t, uint32_t>> where(g.nodes.size());  // node -> (stream, position)
    std::vector<uint32_t> ids(g.nodes.size());
    for (uint32_t i = 0; i < g.nodes.size(); ++i) {
      const RawNode& rn = g.nodes[i];
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
        const auto& members = comms_[rn.comm].ranks;
        n.comm_slot = slot(rn.comm);
        n.op = rn.op;
        n.bytes = rn.bytes;
        n.dtype = rn.dtype;
        n.root = rn.root;
        const std::string& sname = cls.comm_slots[n.comm_slot];
        if (rn.kind == NodeKind::kColl) {
          stream = "comm." + sname;
        } else {
          n.peer = static_cast<int32_t>(std::find(members.begin(), members.end(), rn.peer_global) - members.begin());
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
      summary_->after_edges += n.after.size();
      summary_->imported[rn.kind == NodeKind::kColl ? "coll " + std::string(trace::ToString(rn.op))
                                                    : std::string(trace::ToString(rn.kind))]++;
      st.nodes.push_back(std::move(n));
    }
    return cls;
  }

  void Build(trace::Trace* out) {
    GraphAttrs rank0;
    if (world_ > 0) {
      rank0.from_prism = ranks_[0].from_prism;
      rank0.layout = ranks_[0].prism_layout;
      rank0.topology = ranks_[0].prism_topology;
      rank0.send_completion = ranks_[0].prism_send_completion;
    }
    StartGraph(opts_, world_, rank0, out, summary_);
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
      std::vector<uint32_t> binding;
      trace::RoleClass cls = BuildClass(r, &binding);
      const size_t h = HashClass(cls);
      uint32_t found = trace::kNoIndex;
      for (uint32_t k : by_hash[h]) {
        if (SameClass(out->classes[k], cls)) {
          found = k;
          break;
        }
      }
      if (found == trace::kNoIndex) {
        found = static_cast<uint32_t>(out->classes.size());
        cls.name = ranks_[r].prism_class ? *ranks_[r].prism_class : "rank" + std::to_string(r);
        out->classes.push_back(std::move(cls));
        by_hash[h].push_back(found);
      }
      out->ranks[r].cls = found;
      out->ranks[r].comms = std::move(binding);
      ranks_[r].nodes.clear();  // Why: keep peak memory near one copy of the graph for large imports
      ranks_[r].nodes.shrink_to_fit();
    }
  }

  const ImportOptions& opts_;
  ImportSummary* summary_;
  int32_t world_ = 0;
  std::map<std::string, Group> groups_;
  std::vector<RankGraph> ranks_;
  std::vector<CommInfo> comms_;
  std::unordered_map<std::string, uint32_t> comm_index_;
};

}  // namespace

bool ImportChakraDocument(const ImportOptions& opts, trace::Trace* out, ImportSummary* summary, std::string* error) {
  ImportSummary local;
  if (!summary) summary = &local;
  *summary = ImportSummary{};
  DocumentImporter imp(opts, summary);
  return imp.Run(out, error);
}

}  // namespace prism::chakra
