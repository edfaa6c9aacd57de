#include "replay/chakra/chakra_import_internal.h"

#include <filesystem>
#include <functional>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/bounded_read.h"
#include "common/document_shape.h"
#include "prism/limits.h"
#include "replay/chakra/chakra_et_io.h"
#include "replay/trace_validate.h"

namespace prism::chakra::internal {

namespace fs = std::filesystem;
using json = nlohmann::json;
using trace::CollOp;

namespace {

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

// Structural hash/equality of a role class (names of class aside): what decides folding.
void HashMix(size_t* h, size_t v) { *h ^= v + 0x9e3779b97f4a7c15ULL + (*h << 6) + (*h >> 2); }

bool SameNode(const trace::Node& a, const trace::Node& b) {
  return a.id == b.id && a.kind == b.kind && a.op == b.op && a.comm_slot == b.comm_slot && a.peer == b.peer &&
         a.root == b.root && a.bytes == b.bytes && a.dtype == b.dtype && a.dur_us == b.dur_us &&
         a.iter == b.iter && a.after == b.after && a.name == b.name;
}

// The layout prism_layout says, when it describes `world` ranks; otherwise a note and the default.
void ParseLayout(const std::string& text, int32_t world, trace::Layout* l, ImportSummary* summary) {
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
  if (ok && static_cast<int64_t>(x.tp) * x.pp * x.dp * x.cp == world) {
    *l = x;
  } else {
    summary->notes.push_back("ignored prism_layout " + text + ": it does not describe " + std::to_string(world) +
                             " ranks");
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Files: <prefix>.<rank>.et[.gz]

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

bool StartImport(const ImportOptions& opts, ImportSummary* summary, RankFiles* files,
                 std::map<std::string, Group>* groups, std::string* error) {
  if (!FindRankFiles(opts, files, error)) return false;
  if (files->paths.size() > static_cast<size_t>(limits::kMaxWorldSize)) {
    *error = files->dir + ": " + std::to_string(files->paths.size()) + " rank files is more than the " +
             std::to_string(limits::kMaxWorldSize) + " ranks prism runs";
    return false;
  }
  const int32_t world = static_cast<int32_t>(files->paths.size());
  summary->world_size = world;
  summary->files = files->paths;
  std::string group_file = opts.comm_group;
  if (group_file.empty()) {
    std::error_code ec;
    fs::path dflt = fs::path(files->dir) / "comm_group.json";
    if (fs::is_regular_file(dflt, ec)) group_file = dflt.string();
  }
  if (!group_file.empty()) {
    if (!ReadCommGroupFile(group_file, world, groups, error)) return false;
    summary->comm_group_file = group_file;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------------------
// Communicator groups: ASTRA-sim's JSON {"<id>": [ranks...]}, and PyTorch's process-group table carried by
// METADATA nodes.

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

void MergeMetadataGroups(std::map<std::string, Group>&& metadata_groups, std::map<std::string, Group>* groups,
                         ImportSummary* summary) {
  // The comm-group file wins over METADATA tables (ASTRA-sim reads the file first; we do not let a trace
  // silently redefine what the user passed).
  for (auto& [k, g] : metadata_groups) {
    auto it = groups->find(k);
    if (it == groups->end()) {
      groups->emplace(k, std::move(g));
    } else if (it->second.ranks != g.ranks) {
      summary->notes.push_back("process group \"" + k + "\": " + it->second.source + " and " + g.source +
                               " disagree on its members; using " + it->second.source);
    } else if (it->second.desc.empty()) {
      it->second.desc = g.desc;
    }
  }
}

std::string NodeRef(const std::string& file, uint64_t id, const std::string& name) {
  std::string s = file + ": node " + std::to_string(id);
  if (!name.empty()) s += " '" + name + "'";
  return s;
}

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

void StartGraph(const ImportOptions& opts, int32_t world, const GraphAttrs& rank0, trace::Trace* out,
                ImportSummary* summary) {
  *out = trace::Trace{};
  out->world_size = world;
  out->layout.dp = world;
  summary->from_prism = world > 0 && rank0.from_prism;
  if (rank0.layout) ParseLayout(*rank0.layout, world, &out->layout, summary);
  if (rank0.topology) out->topology = *rank0.topology;
  // Why eager for other files: ASTRA-sim completes a send after its transfer, receive or not; a trace valid
  // there (stages that send before they receive) must not deadlock here.
  out->send_completion = opts.send_completion;
  if (out->send_completion == trace::SendCompletion::kInvalid && !summary->from_prism) {
    out->send_completion = trace::SendCompletion::kEager;
  }
  if (out->send_completion == trace::SendCompletion::kInvalid && rank0.send_completion) {
    out->send_completion = trace::ParseSendCompletion(*rank0.send_completion);
    if (out->send_completion == trace::SendCompletion::kInvalid) {
      summary->notes.push_back("ignored prism_send_completion \"" + *rank0.send_completion +
                               "\": not rendezvous, eager or nccl");
    }
  }
  summary->send_completion = out->send_completion;
}

bool FinishImport(const trace::Trace& out, ImportSummary* summary, std::string* error) {
  std::vector<std::string> problems = replay::ValidateTrace(out);
  if (!problems.empty()) {
    *error = "the imported graph does not validate:";
    for (const auto& p : problems) *error += "\n  " + p;
    return false;
  }
  summary->comms = out.comms.size();
  summary->classes = out.classes.size();
  if (!summary->not_represented.empty()) {
    std::string line = "not represented in the Prism graph:";
    bool first = true;
    for (const auto& [k, v] : summary->not_represented) {
      line += (first ? " " : ", ") + std::to_string(v) + " " + k;
      first = false;
    }
    line += "; dependencies through them are kept";
    if (summary->not_represented_us > 0) {
      std::ostringstream os;
      os << " (their duration_micros, " << summary->not_represented_us << " us in all, is not)";
      line += os.str();
    }
    summary->notes.insert(summary->notes.begin(), line);
  }
  return true;
}

}  // namespace prism::chakra::internal
