#include "replay/chakra/chakra_import.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "common/bounded_read.h"
#include "common/document_shape.h"
#include "prism/limits.h"
#include "replay/chakra/chakra_attrs.h"
#include "replay/chakra/chakra_et_io.h"
#include "replay/trace_validate.h"

namespace prism::chakra {

namespace fs = std::filesystem;
using json = nlohmann::json;
using trace::CollOp;
using trace::NodeKind;

namespace {

// ---------------------------------------------------------------------------------------------------------
// Files: <prefix>.<rank>.et[.gz]

struct RankFiles {
  std::vector<std::string> paths;  // index = rank
  std::string dir;
};

bool FindRankFiles(const ImportOptions& opts, RankFiles* out, std::string* error) {
  static const std::regex kName(R"(^(.*)\.([0-9]+)\.et(\.gz)?$)");
  std::string dir, want_prefix = opts.prefix;
  std::error_code ec;
  if (fs::is_directory(opts.input, ec)) {
    dir = opts.input;
  } else {
    // ASTRA-sim style: a path prefix ("traces/gpt" for traces/gpt.0.et ...).
    fs::path p(opts.input);
    dir = p.has_parent_path() ? p.parent_path().string() : ".";
    if (!want_prefix.empty() && want_prefix != p.filename().string()) {
      *error = opts.input + ": is not a directory, and --prefix " + want_prefix + " disagrees with it";
      return false;
    }
    want_prefix = p.filename().string();
    if (!fs::is_directory(dir, ec)) {
      *error = opts.input + ": no such directory (give a directory of <prefix>.<rank>.et files, or a prefix)";
      return false;
    }
  }
  std::map<std::string, std::map<long, std::string>> by_prefix;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, kName)) continue;
    if (m[2].str().size() > 9) continue;
    long rank = std::stol(m[2].str());
    auto& ranks = by_prefix[m[1].str()];
    if (ranks.count(rank)) {
      *error = dir + ": rank " + std::to_string(rank) + " has two files (" + ranks[rank] + " and " +
               e.path().string() + ")";
      return false;
    }
    ranks[rank] = e.path().string();
  }
  if (ec) {
    *error = dir + ": cannot list: " + ec.message();
    return false;
  }
  if (by_prefix.empty()) {
    *error = (want_prefix.empty() ? dir : opts.input) + ": no Chakra ET files (<prefix>.<rank>.et) found";
    return false;
  }
  const std::map<long, std::string>* ranks = nullptr;
  if (!want_prefix.empty()) {
    auto it = by_prefix.find(want_prefix);
    if (it == by_prefix.end()) {
      *error = dir + ": no files " + want_prefix + ".<rank>.et";
      return false;
    }
    ranks = &it->second;
  } else if (by_prefix.size() > 1) {
    std::string names;
    for (const auto& [p, _] : by_prefix) names += (names.empty() ? "" : ", ") + p;
    *error = dir + ": several trace prefixes (" + names + "): choose one with --prefix";
    return false;
  } else {
    ranks = &by_prefix.begin()->second;
  }
  long expect = 0;
  for (const auto& [rank, path] : *ranks) {
    if (rank != expect) {
      *error = dir + ": rank " + std::to_string(expect) + " has no file (" + fs::path(path).filename().string() +
               " is the next one): ranks must be 0.." + std::to_string(ranks->rbegin()->first);
      return false;
    }
    out->paths.push_back(path);
    ++expect;
  }
  out->dir = dir;
  return true;
}

// ---------------------------------------------------------------------------------------------------------
// Communicator groups: ASTRA-sim's JSON {"<id>": [ranks...]}, and PyTorch's process-group table carried by
// METADATA nodes.

struct Group {
  std::vector<int32_t> ranks;  // communicator-rank order
  std::string desc;
  std::string source;  // where it was defined, for messages
};

bool CheckGroupRanks(const json& v, int32_t world, const std::string& where, std::vector<int32_t>* ranks,
                     std::string* error) {
  if (!v.is_array()) {
    *error = where + ": must be an array of ranks";
    return false;
  }
  std::set<int32_t> seen;
  for (const json& r : v) {
    if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() >= world) {
      *error = where + ": " + r.dump() + " is not a rank of this " + std::to_string(world) + "-rank trace";
      return false;
    }
    int32_t x = r.get<int32_t>();
    if (!seen.insert(x).second) {
      *error = where + ": rank " + std::to_string(x) + " appears twice";
      return false;
    }
    ranks->push_back(x);
  }
  if (ranks->empty()) {
    *error = where + ": empty group";
    return false;
  }
  return true;
}

bool ReadCommGroupFile(const std::string& path, int32_t world, std::map<std::string, Group>* groups,
                       std::string* error) {
  std::string text, why;
  if (!ReadFileBounded(path, limits::kMaxReportFileBytes, "comm_group files", &text, error)) return false;
  if (!CheckJsonShape(text, DocumentBounds{}, &why)) {
    *error = path + ": JSON " + why;
    return false;
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *error = path + ": not valid JSON";
    return false;
  }
  if (!j.is_object()) {
    *error = path + ": must be a JSON object {\"<group id>\": [ranks...]} (ASTRA-sim's comm_group file)";
    return false;
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    Group g;
    if (!CheckGroupRanks(it.value(), world, path + ": group \"" + it.key() + "\"", &g.ranks, error)) return false;
    g.source = path;
    (*groups)[it.key()] = std::move(g);
  }
  return true;
}

// PyTorch's ET records the process groups in a METADATA node whose inputs.values is the Python repr of a
// one-element list holding a JSON array: ['[{"pg_name": "0", "pg_desc": "default_pg", "ranks": [...]}, ...]'].
// ASTRA-sim strips two characters at each end and parses the rest; we do the same. An empty "ranks" means
// the world. Returns false (and adds nothing) for any METADATA node that is not such a table.
bool ParsePgTable(const std::string& values, int32_t world, std::map<std::string, Group>* out,
                  const std::string& source) {
  if (values.size() < 4) return false;
  json j = json::parse(values.substr(2, values.size() - 4), nullptr, false);
  if (j.is_discarded() || !j.is_array()) return false;
  std::map<std::string, Group> found;
  for (const json& item : j) {
    if (!item.is_object() || !item.contains("pg_name") || !item.contains("ranks")) return false;
    Group g;
    g.source = source;
    const json& name = item["pg_name"];
    std::string key = name.is_string() ? name.get<std::string>() : name.dump();
    if (item.contains("pg_desc") && item["pg_desc"].is_string()) g.desc = item["pg_desc"].get<std::string>();
    if (item["ranks"].is_array() && item["ranks"].empty()) {
      for (int32_t r = 0; r < world; ++r) g.ranks.push_back(r);
    } else {
      std::string ignored;
      if (!CheckGroupRanks(item["ranks"], world, source, &g.ranks, &ignored)) return false;
    }
    found[key] = std::move(g);
  }
  for (auto& [k, g] : found) out->emplace(k, std::move(g));
  return true;
}

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

std::string NodeRef(const std::string& file, uint64_t id, const std::string& name) {
  std::string s = file + ": node " + std::to_string(id);
  if (!name.empty()) s += " '" + name + "'";
  return s;
}

std::string NodeRef(const std::string& file, const RawNode& n) { return NodeRef(file, n.cid, n.name); }

CollOp MapCommType(int64_t t, bool* representable) {
  *representable = true;
  switch (t) {
    case et::ALL_REDUCE: return CollOp::kAllReduce;
    case et::REDUCE: return CollOp::kReduce;
    case et::ALL_GATHER: return CollOp::kAllGather;
    case et::BROADCAST: return CollOp::kBroadcast;
    case et::ALL_TO_ALL: return CollOp::kAllToAll;
    case et::REDUCE_SCATTER: return CollOp::kReduceScatter;
    case et::REDUCE_SCATTER_BLOCK: return CollOp::kReduceScatter;  // NCCL's reduce-scatter is the block form
    case et::BARRIER: return CollOp::kBarrier;
    case et::GATHER:
    case et::SCATTER:
      *representable = false;
      return CollOp::kInvalid;
    default: return CollOp::kInvalid;
  }
}

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

struct CommInfo {
  std::string key;
  std::vector<int32_t> ranks;
  std::string desc;
  bool pair = false;
  bool world = false;
};

// Structural hash/equality of a role class (names of class aside): what decides folding.
void HashMix(size_t* h, size_t v) { *h ^= v + 0x9e3779b97f4a7c15ULL + (*h << 6) + (*h >> 2); }

size_t HashClass(const trace::RoleClass& c) {
  size_t h = 0;
  std::hash<std::string> hs;
  for (const auto& s : c.comm_slots) HashMix(&h, hs(s));
  for (const auto& st : c.streams) {
    HashMix(&h, hs(st.name));
    for (const auto& n : st.nodes) {
      HashMix(&h, n.id);
      HashMix(&h, static_cast<size_t>(n.kind) * 131 + static_cast<size_t>(n.op));
      HashMix(&h, n.comm_slot);
      HashMix(&h, static_cast<size_t>(n.peer + 7) * 31 + static_cast<size_t>(n.root + 7));
      HashMix(&h, n.bytes);
      HashMix(&h, std::hash<double>()(n.dur_us));
      HashMix(&h, n.iter);
      HashMix(&h, hs(n.name));
      for (uint32_t a : n.after) HashMix(&h, a);
    }
  }
  return h;
}

bool SameNode(const trace::Node& a, const trace::Node& b) {
  return a.id == b.id && a.kind == b.kind && a.op == b.op && a.comm_slot == b.comm_slot && a.peer == b.peer &&
         a.root == b.root && a.bytes == b.bytes && a.dtype == b.dtype && a.dur_us == b.dur_us &&
         a.iter == b.iter && a.after == b.after && a.name == b.name;
}

bool SameClass(const trace::RoleClass& a, const trace::RoleClass& b) {
  if (a.comm_slots != b.comm_slots || a.streams.size() != b.streams.size()) return false;
  for (size_t s = 0; s < a.streams.size(); ++s) {
    const auto& x = a.streams[s];
    const auto& y = b.streams[s];
    if (x.name != y.name || x.nodes.size() != y.nodes.size()) return false;
    for (size_t i = 0; i < x.nodes.size(); ++i) {
      if (!SameNode(x.nodes[i], y.nodes[i])) return false;
    }
  }
  return true;
}

std::string Plural(uint64_t n, const std::string& what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

class Importer {
 public:
  Importer(const ImportOptions& opts, ImportSummary* summary) : opts_(opts), summary_(summary) {}

  bool Run(trace::Trace* out, std::string* error) {
    RankFiles files;
    if (!FindRankFiles(opts_, &files, error)) return false;
    if (files.paths.size() > static_cast<size_t>(limits::kMaxWorldSize)) {
      *error = files.dir + ": " + std::to_string(files.paths.size()) + " rank files is more than the " +
               std::to_string(limits::kMaxWorldSize) + " ranks prism runs";
      return false;
    }
    world_ = static_cast<int32_t>(files.paths.size());
    summary_->world_size = world_;
    summary_->files = files.paths;

    std::string group_file = opts_.comm_group;
    if (group_file.empty()) {
      std::error_code ec;
      fs::path dflt = fs::path(files.dir) / "comm_group.json";
      if (fs::is_regular_file(dflt, ec)) group_file = dflt.string();
    }
    if (!group_file.empty()) {
      if (!ReadCommGroupFile(group_file, world_, &groups_, error)) return false;
      summary_->comm_group_file = group_file;
    }

    std::map<std::string, Group> metadata_groups;
    ranks_.resize(world_);
    for (int32_t r = 0; r < world_; ++r) {
      RankLoader loader(r, world_, opts_, summary_, &metadata_groups);
      if (!loader.Load(files.paths[r], &ranks_[r], error)) return false;
    }
    // The comm-group file wins over METADATA tables (ASTRA-sim reads the file first; we do not let a trace
    // silently redefine what the user passed).
    for (auto& [k, g] : metadata_groups) {
      auto it = groups_.find(k);
      if (it == groups_.end()) {
        groups_.emplace(k, std::move(g));
      } else if (it->second.ranks != g.ranks) {
        summary_->notes.push_back("process group \"" + k + "\": " + it->second.source + " and " + g.source +
                                  " disagree on its members; using " + it->second.source);
      } else if (it->second.desc.empty()) {
        it->second.desc = g.desc;
      }
    }

    if (!ResolveComms(error)) return false;
    if (!ApplyCommSizes(error)) return false;
    if (!CheckP2p(error)) return false;
    if (!CheckCollectives(error)) return false;
    DropUnusedComms();
    Build(out);

    std::vector<std::string> problems = replay::ValidateTrace(*out);
    if (!problems.empty()) {
      *error = "the imported graph does not validate:";
      for (const auto& p : problems) *error += "\n  " + p;
      return false;
    }
    summary_->comms = out->comms.size();
    summary_->classes = out->classes.size();
    if (!summary_->not_represented.empty()) {
      std::string line = "not represented in the Prism graph:";
      bool first = true;
      for (const auto& [k, v] : summary_->not_represented) {
        line += (first ? " " : ", ") + std::to_string(v) + " " + k;
        first = false;
      }
      line += "; dependencies through them are kept";
      if (summary_->not_represented_us > 0) {
        std::ostringstream os;
        os << " (their duration_micros, " << summary_->not_represented_us << " us in all, is not)";
        line += os.str();
      }
      summary_->notes.insert(summary_->notes.begin(), line);
    }
    return true;
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
    *out = trace::Trace{};
    out->world_size = world_;
    out->layout.dp = world_;
    summary_->from_prism = world_ > 0 && ranks_[0].from_prism;
    if (ranks_[0].prism_layout) ParseLayout(*ranks_[0].prism_layout, &out->layout);
    if (ranks_[0].prism_topology) out->topology = *ranks_[0].prism_topology;
    // Why eager for other files: ASTRA-sim completes a send after its transfer, receive or not; a trace valid
    // there (stages that send before they receive) must not deadlock here.
    out->send_completion = opts_.send_completion;
    if (out->send_completion == trace::SendCompletion::kInvalid && !summary_->from_prism) {
      out->send_completion = trace::SendCompletion::kEager;
    }
    if (out->send_completion == trace::SendCompletion::kInvalid && ranks_[0].prism_send_completion) {
      out->send_completion = trace::ParseSendCompletion(*ranks_[0].prism_send_completion);
      if (out->send_completion == trace::SendCompletion::kInvalid) {
        summary_->notes.push_back("ignored prism_send_completion \"" + *ranks_[0].prism_send_completion +
                                  "\": not rendezvous, eager or nccl");
      }
    }
    summary_->send_completion = out->send_completion;
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

  void ParseLayout(const std::string& text, trace::Layout* l) {
    json j = json::parse(text, nullptr, false);
    trace::Layout x;
    bool ok = j.is_object();
    auto get = [&](const char* k, int* v) {
      if (!ok || !j.contains(k)) return;
      if (!j[k].is_number_integer() || j[k].get<int>() <= 0) {
        ok = false;
        return;
      }
      *v = j[k].get<int>();
    };
    get("tp", &x.tp);
    get("pp", &x.pp);
    get("dp", &x.dp);
    get("cp", &x.cp);
    get("ep", &x.ep);
    get("etp", &x.etp);
    if (ok && j.contains("order") && j["order"].is_string()) x.order = j["order"].get<std::string>();
    if (ok && static_cast<int64_t>(x.tp) * x.pp * x.dp * x.cp == world_) {
      *l = x;
    } else {
      summary_->notes.push_back("ignored prism_layout " + text + ": it does not describe " +
                                std::to_string(world_) + " ranks");
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
  Importer imp(opts, summary);
  return imp.Run(out, error);
}

}  // namespace prism::chakra
