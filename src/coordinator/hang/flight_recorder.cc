#include "coordinator/hang/flight_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace prism::coord {
namespace {

namespace fs = std::filesystem;
using pickle::Value;
using pickle::ValuePtr;
using json = nlohmann::json;

constexpr uint32_t kSend = 103, kRecv = 104;

// prism::trace::DType order (include/prism/trace.h) -> torch ScalarType name and element size.
struct DtypeInfo {
  const char* name;
  int size;
};
constexpr DtypeInfo kDtypes[] = {{"Byte", 1},     {"Float", 4},         {"Half", 2},        {"BFloat16", 2},
                                 {"Double", 8},   {"Float8_e4m3fn", 1}, {"Float8_e5m2", 1}, {"Char", 1},
                                 {"Byte", 1},     {"Int", 4},           {"UInt32", 4},      {"Long", 8},
                                 {"UInt64", 8}};

int ElemSize(const std::string& torch_name) {
  for (const DtypeInfo& d : kDtypes) {
    if (torch_name == d.name) return d.size;
  }
  static const std::map<std::string, int> kOther = {{"Bool", 1},  {"Short", 2},       {"UInt16", 2},
                                                    {"ComplexFloat", 8}, {"ComplexDouble", 16}, {"ComplexHalf", 4}};
  auto it = kOther.find(torch_name);
  return it == kOther.end() ? 1 : it->second;
}

std::string RanksStr(const std::vector<int>& r) { return fmt::format("[{}]", fmt::join(r, ", ")); }

std::vector<int> ParseRanks(const Value* v) {
  std::vector<int> out;
  if (!v) return out;
  if (v->kind == Value::Kind::kList || v->kind == Value::Kind::kTuple) {
    for (const auto& x : v->items) {
      if (x && x->kind == Value::Kind::kInt) out.push_back(static_cast<int>(x->i));
    }
    return out;
  }
  if (v->kind != Value::Kind::kStr) return out;
  // "[0, 1, 2]"
  std::string num;
  for (char c : v->s + ",") {
    if ((c >= '0' && c <= '9') || c == '-') {
      num.push_back(c);
    } else if (!num.empty()) {
      try {
        out.push_back(std::stoi(num));
      } catch (...) {
      }
      num.clear();
    }
  }
  return out;
}

int64_t IntOf(const Value* v, int64_t def = 0) {
  if (!v) return def;
  if (v->kind == Value::Kind::kInt) return v->i;
  if (v->kind == Value::Kind::kBool) return v->b;
  if (v->kind == Value::Kind::kFloat) return static_cast<int64_t>(v->f);
  if (v->kind == Value::Kind::kStr) {
    try {
      return std::stoll(v->s);
    } catch (...) {
    }
  }
  return def;
}

std::optional<int64_t> OptInt(const Value* v) {
  if (!v || v->kind == Value::Kind::kNone) return std::nullopt;
  int64_t x = IntOf(v, 0);
  if (x == 0) return std::nullopt;  // torch's JSON form writes 0 for "not yet"
  return x;
}

std::string StrOf(const Value* v, std::string def = {}) {
  return v && (v->kind == Value::Kind::kStr || v->kind == Value::Kind::kBytes) ? v->s : def;
}

std::vector<std::vector<int64_t>> Sizes(const Value* v) {
  std::vector<std::vector<int64_t>> out;
  if (!v || (v->kind != Value::Kind::kList && v->kind != Value::Kind::kTuple)) return out;
  for (const auto& t : v->items) {
    std::vector<int64_t> dims;
    if (t && (t->kind == Value::Kind::kList || t->kind == Value::Kind::kTuple)) {
      for (const auto& d : t->items) dims.push_back(IntOf(d.get()));
    }
    out.push_back(std::move(dims));
  }
  return out;
}

std::vector<std::string> Strs(const Value* v) {
  std::vector<std::string> out;
  if (!v || (v->kind != Value::Kind::kList && v->kind != Value::Kind::kTuple)) return out;
  for (const auto& x : v->items) out.push_back(StrOf(x.get()));
  return out;
}

ValuePtr SizesValue(const std::vector<std::vector<int64_t>>& sizes) {
  auto l = Value::List();
  for (const auto& dims : sizes) {
    auto t = Value::List();
    for (int64_t d : dims) t->items.push_back(Value::Int(d));
    l->items.push_back(t);
  }
  return l;
}

ValuePtr StrsValue(const std::vector<std::string>& v) {
  auto l = Value::List();
  for (const auto& x : v) l->items.push_back(Value::Str(x));
  return l;
}

int64_t Numel(const std::vector<std::vector<int64_t>>& sizes) {
  int64_t n = 0;
  for (const auto& dims : sizes) {
    int64_t p = 1;
    for (int64_t d : dims) p *= d;
    n += p;
  }
  return n;
}

// "nccl:send 0->1" -> ("send", "0->1"); the backend prefix is dropped.
std::pair<std::string, std::string> SplitName(const std::string& profiling_name) {
  std::string name = profiling_name;
  size_t colon = name.find(':');
  if (colon != std::string::npos) name = name.substr(colon + 1);
  size_t sp = name.find(' ');
  if (sp == std::string::npos) return {name, ""};
  return {name.substr(0, sp), name.substr(sp + 1)};
}

uint32_t OpCodeOf(const std::string& type) {
  static const std::map<std::string, uint32_t> kOps = {
      {"all_reduce", 1},        {"allreduce_coalesced", 1},
      {"all_reduce_barrier", 1}, {"_allreduce_sparse", 1},
      {"all_gather", 2},        {"_all_gather_base", 2},
      {"all_gather_base", 2},   {"all_gather_into_tensor_coalesced", 2},
      {"all_gather_single", 2}, {"allgather_coalesced", 2},
      {"ALLGATHER_coalesced", 2}, {"all_gather_v", 2},
      {"_allgather_base", 2},   {"reduce_scatter", 3},
      {"_reduce_scatter_base", 3}, {"reduce_scatter_tensor_coalesced", 3},
      {"reduce_scatter_single", 3}, {"REDUCE_SCATTER_coalesced", 3},
      {"reduce_scatter_v", 3},  {"broadcast", 4},
      {"_broadcast_oop", 4},    {"reduce", 5},
      {"_reduce_oop", 5},       {"all_to_all", 6},
      {"all_to_all_single", 6}, {"all_to_all_v_single", 6},
      {"alltoall_base", 6},     {"barrier", 7},
      {"gather", 8},            {"scatter", 9},
      {"send", kSend},          {"recv", kRecv},
      {"coalesced", 0}};
  auto it = kOps.find(type);
  return it == kOps.end() ? 0 : it->second;
}

bool WriteAtomic(const fs::path& path, const std::string& bytes, std::string* error) {
  fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) {
      *error = fmt::format("cannot write {}: {}", tmp.string(), std::strerror(errno));
      return false;
    }
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f.good()) {
      *error = fmt::format("cannot write {}: {}", tmp.string(), std::strerror(errno));
      return false;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    *error = fmt::format("cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message());
    return false;
  }
  return true;
}

}  // namespace

std::string FrDtypeName(int dtype) {
  if (dtype < 1 || dtype >= static_cast<int>(std::size(kDtypes))) return "Byte";
  return kDtypes[dtype].name;
}

int FrDtypeFromName(const std::string& name) {
  for (int i = 1; i < static_cast<int>(std::size(kDtypes)); ++i) {
    if (i != 8 && name == kDtypes[i].name) return i;  // Why skip 8: entry 0 and 8 are both Byte; 8 is u8
  }
  if (name == "Byte") return 8;
  return -1;
}

pickle::ValuePtr FrDumpToPickle(const FrDump& d) {
  auto root = Value::Dict();
  root->Set("version", Value::Str(d.version));
  auto cfg = Value::Dict();
  for (const auto& [name, g] : d.pg_config) {
    auto x = Value::Dict();
    x->Set("name", Value::Str(g.name));
    x->Set("desc", Value::Str(g.desc));
    x->Set("ranks", Value::Str(RanksStr(g.ranks)));
    cfg->Set(name, x);
  }
  root->Set("pg_config", cfg);
  root->Set("comm_lib_version", Value::Str(d.comm_lib_version));
  auto status = Value::Dict();
  for (const auto& [id, s] : d.pg_status) {
    auto x = Value::Dict();
    x->Set("last_enqueued_collective", Value::Int(s[0]));
    x->Set("last_started_collective", Value::Int(s[1]));
    x->Set("last_completed_collective", Value::Int(s[2]));
    status->Set(id, x);
  }
  root->Set("pg_status", status);
  auto entries = Value::List();
  for (const FrEntry& e : d.entries) {
    auto x = Value::Dict();
    x->Set("record_id", Value::Int(e.record_id));
    x->Set("pg_id", Value::Int(e.pg_id));
    x->Set("process_group", Value::Tuple({Value::Str(e.pg_name), Value::Str(e.pg_desc)}));
    x->Set("thread_name", Value::Str("prism"));
    x->Set("thread_id", Value::Str("0"));
    x->Set("collective_seq_id", Value::Int(e.collective_seq_id));
    x->Set("p2p_seq_id", Value::Int(e.p2p_seq_id));
    x->Set("op_id", Value::Int(e.op_id));
    x->Set("profiling_name", Value::Str(e.profiling_name));
    x->Set("time_created_ns", Value::Int(e.time_created_ns));
    if (e.duration_ms) x->Set("duration_ms", Value::Float(*e.duration_ms));
    x->Set("input_sizes", SizesValue(e.input_sizes));
    x->Set("input_dtypes", StrsValue(e.input_dtypes));
    x->Set("output_sizes", SizesValue(e.output_sizes));
    x->Set("output_dtypes", StrsValue(e.output_dtypes));
    x->Set("state", Value::Str(e.state));
    x->Set("time_discovered_started_ns", e.time_started_ns ? Value::Int(*e.time_started_ns) : Value::None());
    x->Set("time_discovered_completed_ns", e.time_completed_ns ? Value::Int(*e.time_completed_ns) : Value::None());
    x->Set("retired", Value::Bool(e.retired));
    x->Set("timeout_ms", Value::Int(e.timeout_ms));
    x->Set("is_p2p", Value::Bool(e.is_p2p));
    entries->items.push_back(x);
  }
  root->Set("entries", entries);
  if (d.from_prism) {
    auto p = Value::Dict();
    p->Set("world_size", Value::Int(d.world_size));
    auto real = Value::List();
    for (int r : d.real_ranks) real->items.push_back(Value::Int(r));
    p->Set("real_ranks", real);
    p->Set("rank", Value::Int(d.rank));
    p->Set("omitted_ops", Value::Int(static_cast<int64_t>(d.omitted)));
    p->Set("virtual", Value::Bool(d.synthesized));
    p->Set("note", Value::Str(d.synthesized
                                  ? "synthesised by prism for a virtual rank: the collectives the real members of its "
                                    "communicators issued, in their order and state (docs/hang.md)"
                                  : "written by prism from its coordinator's view of this real rank"));
    root->Set("prism", p);
  }
  return root;
}

std::optional<FrDump> FrDumpFromPickle(const pickle::Value& v, std::string* error) {
  if (v.kind != Value::Kind::kDict) {
    *error = "not a dict (a Flight Recorder dump is a pickled dict)";
    return std::nullopt;
  }
  const Value* entries = v.Get("entries");
  const Value* cfg = v.Get("pg_config");
  if (!v.Get("version") && !entries && !cfg) {
    *error = "no 'version', 'entries' or 'pg_config': not a Flight Recorder dump";
    return std::nullopt;
  }
  FrDump d;
  d.version = StrOf(v.Get("version"), "?");
  d.comm_lib_version = StrOf(v.Get("comm_lib_version"));
  if (cfg && cfg->kind == Value::Kind::kDict) {
    for (const auto& [k, g] : cfg->dict) {
      if (!g || g->kind != Value::Kind::kDict) continue;
      FrGroup grp;
      grp.name = StrOf(g->Get("name"), StrOf(k.get()));
      grp.desc = StrOf(g->Get("desc"), "undefined");
      grp.ranks = ParseRanks(g->Get("ranks"));
      d.pg_config[StrOf(k.get(), grp.name)] = std::move(grp);
    }
  }
  if (const Value* st = v.Get("pg_status"); st && st->kind == Value::Kind::kDict) {
    for (const auto& [k, s] : st->dict) {
      if (!s || s->kind != Value::Kind::kDict) continue;
      d.pg_status[StrOf(k.get(), std::to_string(IntOf(k.get())))] = {
          IntOf(s->Get("last_enqueued_collective"), -1), IntOf(s->Get("last_started_collective"), -1),
          IntOf(s->Get("last_completed_collective"), -1)};
    }
  }
  if (entries && entries->kind == Value::Kind::kList) {
    for (const auto& ep : entries->items) {
      if (!ep || ep->kind != Value::Kind::kDict) continue;
      const Value& e = *ep;
      FrEntry x;
      x.record_id = IntOf(e.Get("record_id"));
      x.pg_id = IntOf(e.Get("pg_id"));
      if (const Value* pg = e.Get("process_group"); pg && !pg->items.empty()) {
        x.pg_name = StrOf(pg->items[0].get());
        if (pg->items.size() > 1) x.pg_desc = StrOf(pg->items[1].get());
      }
      x.collective_seq_id = IntOf(e.Get("collective_seq_id"));
      x.p2p_seq_id = IntOf(e.Get("p2p_seq_id"));
      x.op_id = IntOf(e.Get("op_id"));
      x.profiling_name = StrOf(e.Get("profiling_name"));
      x.time_created_ns = IntOf(e.Get("time_created_ns"));
      if (const Value* dm = e.Get("duration_ms"); dm && (dm->kind == Value::Kind::kFloat || dm->kind == Value::Kind::kInt)) {
        x.duration_ms = dm->kind == Value::Kind::kFloat ? dm->f : static_cast<double>(dm->i);
      }
      x.input_sizes = Sizes(e.Get("input_sizes"));
      x.output_sizes = Sizes(e.Get("output_sizes"));
      x.input_dtypes = Strs(e.Get("input_dtypes"));
      x.output_dtypes = Strs(e.Get("output_dtypes"));
      x.state = StrOf(e.Get("state"), "scheduled");
      x.time_started_ns = OptInt(e.Get("time_discovered_started_ns"));
      x.time_completed_ns = OptInt(e.Get("time_discovered_completed_ns"));
      x.retired = IntOf(e.Get("retired")) != 0;
      x.timeout_ms = IntOf(e.Get("timeout_ms"), 0);
      x.is_p2p = IntOf(e.Get("is_p2p")) != 0;
      d.entries.push_back(std::move(x));
    }
  }
  if (const Value* p = v.Get("prism"); p && p->kind == Value::Kind::kDict) {
    d.from_prism = true;
    d.world_size = static_cast<int>(IntOf(p->Get("world_size")));
    d.real_ranks = ParseRanks(p->Get("real_ranks"));
    d.omitted = static_cast<uint64_t>(IntOf(p->Get("omitted_ops")));
    d.synthesized = IntOf(p->Get("virtual")) != 0;
  }
  return d;
}

namespace {

// Process groups, by torch name (or prism_comm_<id> when the name never reached the coordinator).
struct Pg {
  FrGroup group;
  int64_t id = -1;
};
struct PgTable {
  std::map<std::string, Pg> pgs;
  std::map<uint32_t, std::string> pg_of;  // comm -> pg key
  const Pg& Of(uint32_t comm) const { return pgs.at(pg_of.at(comm)); }
};

PgTable BuildPgs(const HangDetector& det, int world_size) {
  PgTable t;
  std::vector<int> world(static_cast<size_t>(std::max(world_size, 0)));
  std::iota(world.begin(), world.end(), 0);
  for (const auto& [id, c] : det.comms()) {
    std::string key = !c.pg_name.empty() ? c.pg_name : fmt::format("prism_comm_{}", id);
    t.pg_of[id] = key;
    std::vector<int> ranks = !c.pg_members.empty() ? c.pg_members
                             : c.pg_name == "0"    ? world
                                                   : c.members;
    Pg& pg = t.pgs[key];
    pg.group.name = key;
    if (pg.group.desc.empty() || pg.group.desc == "undefined") pg.group.desc = c.pg_desc.empty() ? "undefined" : c.pg_desc;
    if (ranks.size() > pg.group.ranks.size()) pg.group.ranks = ranks;
  }
  int64_t next_id = 0;
  for (auto& [key, pg] : t.pgs) {
    try {
      size_t used = 0;
      int64_t n = std::stoll(key, &used);
      if (used == key.size() && n >= 0) pg.id = n;
    } catch (...) {
    }
    if (pg.id >= next_id) next_id = pg.id + 1;
  }
  for (auto& [key, pg] : t.pgs) {
    if (pg.id < 0) pg.id = next_id++;
  }
  return t;
}

// The FR entry of one logged operation as `rank` issued it; nullopt for a p2p operation without both ends.
std::optional<FrEntry> EntryOf(const HangLogEntry& le, const HangComm& c, const Pg& pg, int rank) {
  FrEntry e;
  e.record_id = static_cast<int64_t>(le.id);
  e.op_id = static_cast<int64_t>(le.id) + 1;
  e.pg_id = pg.id;
  e.pg_name = pg.group.name;
  e.pg_desc = pg.group.desc;
  e.collective_seq_id = static_cast<int64_t>(le.pg_coll_seq);
  e.p2p_seq_id = static_cast<int64_t>(le.pg_p2p_seq);
  e.time_created_ns = static_cast<int64_t>(le.created_ns);
  e.time_started_ns = static_cast<int64_t>(le.created_ns);
  if (le.completed_ns != 0) {
    e.time_completed_ns = static_cast<int64_t>(le.completed_ns);
    e.state = "completed";
    e.retired = true;
  } else {
    e.state = "started";
  }
  if (le.duration_ns > 0) e.duration_ms = static_cast<double>(le.duration_ns) * 1e-6;
  const HangOp& o = le.op;
  std::string dtype = FrDtypeName(o.dtype);
  int elem = ElemSize(dtype);
  if (o.bytes % static_cast<uint64_t>(elem) != 0) {
    dtype = "Byte";
    elem = 1;
  }
  const int64_t n = static_cast<int64_t>(o.bytes / static_cast<uint64_t>(elem));
  const int64_t members = static_cast<int64_t>(std::max<size_t>(c.members.size(), 1));
  std::vector<std::vector<int64_t>> in = {{n}}, outs = {{n}};
  switch (o.op) {
    case 1: e.profiling_name = "nccl:all_reduce"; break;
    case 2:
      e.profiling_name = "nccl:_all_gather_base";
      in = {{n / members}};
      break;
    case 3:
      e.profiling_name = "nccl:_reduce_scatter_base";
      outs = {{n / members}};
      break;
    case 4: e.profiling_name = "nccl:broadcast"; break;
    case 5: e.profiling_name = "nccl:reduce"; break;
    case 6: e.profiling_name = "nccl:all_to_all"; break;
    case 7: e.profiling_name = "nccl:barrier"; break;
    case kSend:
    case kRecv: {
      int peer = o.peer;
      if (peer < 0 && c.members.size() == 2) peer = c.members[0] == rank ? c.members[1] : c.members[0];
      std::vector<int> sorted = pg.group.ranks;
      std::sort(sorted.begin(), sorted.end());
      auto gi = [&](int g) {
        auto it = std::lower_bound(sorted.begin(), sorted.end(), g);
        return it != sorted.end() && *it == g ? static_cast<int>(it - sorted.begin()) : -1;
      };
      int me = gi(rank), other = peer >= 0 ? gi(peer) : -1;
      if (me < 0 || other < 0) return std::nullopt;  // Why: torch's analyzer cannot parse a send/recv without both ends
      e.profiling_name = o.op == kSend ? fmt::format("nccl:send {}->{}", me, other)
                                       : fmt::format("nccl:recv {}<-{}", me, other);
      e.is_p2p = true;
      break;
    }
    default:
      e.profiling_name = "nccl:coalesced";
      in.clear();
      outs.clear();
      break;
  }
  e.input_sizes = in;
  e.output_sizes = outs;
  e.input_dtypes.assign(in.size(), dtype);
  e.output_dtypes.assign(outs.size(), dtype);
  return e;
}

void AddToStatus(FrDump& d, const FrEntry& e) {
  auto& st = d.pg_status[std::to_string(e.pg_id)];
  st[0] = std::max(st[0], e.collective_seq_id);
  st[1] = std::max(st[1], e.collective_seq_id);
  if (e.state == "completed" && !e.is_p2p) st[2] = std::max(st[2], e.collective_seq_id);
}

bool IsP2pOp(uint32_t op) { return op == kSend || op == kRecv; }

// A dump prism writes for `rank`, before its groups and entries.
FrDump PrismDump(int rank, int world_size, std::vector<int> real_ranks) {
  FrDump d;
  d.rank = rank;
  d.comm_lib_version = "prism (emulated NCCL; see docs/hang.md)";
  d.from_prism = true;
  d.world_size = world_size;
  d.real_ranks = std::move(real_ranks);
  return d;
}

}  // namespace

std::vector<FrDump> FrDumpsFromDetector(const HangDetector& det, int world_size, const std::vector<int>& real_ranks) {
  const PgTable t = BuildPgs(det, world_size);
  std::vector<FrDump> out;
  for (int rank : det.Ranks()) {
    const auto& log = det.Log(rank);
    if (log.empty()) continue;
    FrDump d = PrismDump(rank, world_size, real_ranks);
    for (const auto& [id, c] : det.comms()) {
      if (std::find(c.members.begin(), c.members.end(), rank) == c.members.end()) continue;
      const Pg& pg = t.Of(id);
      d.pg_config[pg.group.name] = pg.group;
    }
    for (const HangLogEntry& le : log) {
      auto c = det.comms().find(le.op.comm_id);
      if (c == det.comms().end()) continue;
      std::optional<FrEntry> e = EntryOf(le, c->second, t.Of(le.op.comm_id), rank);
      if (!e) {
        ++d.omitted;
        continue;
      }
      AddToStatus(d, *e);
      d.entries.push_back(std::move(*e));
    }
    out.push_back(std::move(d));
  }
  return out;
}

FrVirtualOptions FrVirtualOptionsFromEnv(std::string* warning) {
  FrVirtualOptions o;
  if (const char* s = std::getenv("PRISM_FR_VIRTUAL"); s && *s) {
    std::string v = s;
    if (v == "none") {
      o.scope = FrVirtualOptions::Scope::kNone;
    } else if (v == "stuck") {
      o.scope = FrVirtualOptions::Scope::kStuck;
    } else if (v == "groups") {
      o.scope = FrVirtualOptions::Scope::kGroups;
    } else if (warning) {
      *warning += fmt::format("PRISM_FR_VIRTUAL={} is not none, stuck or groups; using groups. ", v);
    }
  }
  if (const char* s = std::getenv("PRISM_FR_VIRTUAL_MAX"); s && *s) {
    char* end = nullptr;
    unsigned long long n = std::strtoull(s, &end, 10);
    if (end && *end == '\0' && s[0] != '-') {
      o.max_dumps = static_cast<size_t>(n);
    } else if (warning) {
      *warning += fmt::format("PRISM_FR_VIRTUAL_MAX={} is not a count; using {}. ", s, o.max_dumps);
    }
  }
  return o;
}

FrVirtualResult FrVirtualDumps(const HangDetector& det, int world_size, const std::vector<int>& real_ranks_in,
                               const FrVirtualOptions& o) {
  FrVirtualResult res;
  const PgTable t = BuildPgs(det, world_size);
  std::set<int> real(real_ranks_in.begin(), real_ranks_in.end());
  if (real.empty()) {
    for (int r : det.Ranks()) real.insert(r);
  }
  // What the real members issued: comm -> seq -> (rank, log entry); collectives only.
  std::map<uint32_t, std::map<uint64_t, std::vector<std::pair<int, const HangLogEntry*>>>> by_seq;
  std::set<std::string> stuck, with_real;
  for (int r : real) {
    for (const HangLogEntry& le : det.Log(r)) {
      if (!det.comms().count(le.op.comm_id)) continue;
      const std::string& key = t.pg_of.at(le.op.comm_id);
      with_real.insert(key);
      if (le.completed_ns == 0) stuck.insert(key);
      if (IsP2pOp(le.op.op)) continue;
      by_seq[le.op.comm_id][le.op.seq].emplace_back(r, &le);
    }
  }
  for (const auto& [key, pg] : t.pgs) {
    for (int m : pg.group.ranks) {
      if (real.count(m)) with_real.insert(key);
    }
  }

  // Groups to cover: stuck ones first, then (kGroups) the others, each set smallest first.
  auto virtual_members = [&](const Pg& pg) {
    std::vector<int> v;
    for (int m : pg.group.ranks) {
      if (!real.count(m)) v.push_back(m);
    }
    return v;
  };
  auto describe = [](const Pg& pg) {
    return fmt::format("{} ({}, {} ranks)", pg.group.name, pg.group.desc, pg.group.ranks.size());
  };
  std::vector<std::string> order;
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<std::string> keys;
    for (const std::string& key : with_real) {
      if ((pass == 0) == (stuck.count(key) > 0)) keys.push_back(key);
    }
    std::stable_sort(keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) {
      return t.pgs.at(a).group.ranks.size() < t.pgs.at(b).group.ranks.size();
    });
    order.insert(order.end(), keys.begin(), keys.end());
  }
  std::set<int> chosen;
  for (const std::string& key : order) {
    const Pg& pg = t.pgs.at(key);
    const bool is_stuck = stuck.count(key) > 0;
    if (o.scope == FrVirtualOptions::Scope::kNone) {
      res.uncovered.push_back(describe(pg) + ": PRISM_FR_VIRTUAL=none");
      continue;
    }
    if (o.scope == FrVirtualOptions::Scope::kStuck && !is_stuck) {
      res.uncovered.push_back(describe(pg) + ": no stuck operation (PRISM_FR_VIRTUAL=stuck)");
      continue;
    }
    size_t add = 0;
    for (int m : virtual_members(pg)) add += chosen.count(m) ? 0 : 1;
    if (chosen.size() + add > o.max_dumps) {
      res.uncovered.push_back(fmt::format("{}: {} more virtual dumps would pass PRISM_FR_VIRTUAL_MAX={}", describe(pg),
                                          add, o.max_dumps));
      continue;
    }
    for (int m : virtual_members(pg)) chosen.insert(m);
    res.covered.push_back(describe(pg));
  }

  // The operation the virtual members issued at one (comm, seq): the one most real members issued there; a tie, the
  // smallest real rank's. The entry of the smallest real rank that issued it is the model.
  std::map<std::pair<uint32_t, uint64_t>, const HangLogEntry*> model;
  for (const auto& [comm, seqs] : by_seq) {
    for (const auto& [seq, issued] : seqs) {
      std::map<std::tuple<uint32_t, uint64_t, int>, std::vector<std::pair<int, const HangLogEntry*>>> kinds;
      for (const auto& x : issued) kinds[{x.second->op.op, x.second->op.bytes, x.second->op.dtype}].push_back(x);
      const std::vector<std::pair<int, const HangLogEntry*>>* best = nullptr;
      int best_min = 0;
      for (auto& [k, v] : kinds) {
        std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        if (!best || v.size() > best->size() || (v.size() == best->size() && v[0].first < best_min)) {
          best = &v;
          best_min = v[0].first;
        }
      }
      model[{comm, seq}] = (*best)[0].second;
    }
  }

  // torch's analyzer (align_trace_from_beginning) drops, in every dump, each entry whose record_id is below the
  // largest first record_id of any dump. A real dump's ids count every operation of its rank (from 0, or from where
  // its log wrapped), so a virtual dump must not raise that bound (its first modelled entry is seldom its model's
  // first operation) nor hold entries that its model's dump loses to it: it holds the modelled entries whose model is
  // at or past the real dumps' bound, numbered from the bound (from 0 when no log wrapped, as torch numbers them).
  int64_t start = 0;
  for (int r : det.Ranks()) {
    for (const HangLogEntry& le : det.Log(r)) {
      auto c = det.comms().find(le.op.comm_id);
      // Why the first one with an entry: FrDumpsFromDetector leaves out the others.
      if (c == det.comms().end() || !EntryOf(le, c->second, t.Of(le.op.comm_id), r)) continue;
      start = std::max(start, static_cast<int64_t>(le.id));
      break;
    }
  }

  for (int v : chosen) {
    FrDump d = PrismDump(v, world_size, std::vector<int>(real.begin(), real.end()));
    d.synthesized = true;
    for (const auto& [key, pg] : t.pgs) {
      if (std::find(pg.group.ranks.begin(), pg.group.ranks.end(), v) != pg.group.ranks.end())
        d.pg_config[pg.group.name] = pg.group;
    }
    std::vector<const HangLogEntry*> mine;
    for (const auto& [id, c] : det.comms()) {
      if (std::find(c.members.begin(), c.members.end(), v) == c.members.end()) continue;
      auto it = by_seq.find(id);
      if (it == by_seq.end()) continue;
      for (const auto& [seq, issued] : it->second) mine.push_back(model.at({id, seq}));
    }
    std::stable_sort(mine.begin(), mine.end(), [](const HangLogEntry* a, const HangLogEntry* b) {
      return std::tie(a->created_ns, a->op.comm_id, a->op.seq) < std::tie(b->created_ns, b->op.comm_id, b->op.seq);
    });
    int64_t next = start;
    for (const HangLogEntry* le : mine) {
      const Pg& pg = t.Of(le->op.comm_id);
      std::optional<FrEntry> e = EntryOf(*le, det.comms().at(le->op.comm_id), pg, v);
      if (!e || e->record_id < start) continue;  // the model's id: torch's alignment drops it from the model's dump
      d.pg_config[pg.group.name] = pg.group;  // Why: torch's analyzer looks every entry's group up in this config
      e->record_id = next++;
      e->op_id = e->record_id + 1;
      AddToStatus(d, *e);
      d.entries.push_back(std::move(*e));
    }
    res.dumps.push_back(std::move(d));
  }
  return res;
}

bool WriteFrDumps(const std::vector<FrDump>& dumps, const std::string& dir, std::string* error) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    *error = fmt::format("cannot create {}: {}", dir, ec.message());
    return false;
  }
  for (const FrDump& d : dumps) {
    if (!WriteAtomic(fs::path(dir) / (kFrPrefix + std::to_string(d.rank)), pickle::Dumps(*FrDumpToPickle(d)), error))
      return false;
  }
  return true;
}

FrReadResult ReadFrDir(const std::string& dir) {
  FrReadResult res;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    res.problems.push_back(fmt::format("{} is not a directory", dir));
    return res;
  }
  std::vector<fs::path> files;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    std::string name = f.filename().string();
    size_t digits = name.size();
    while (digits > 0 && name[digits - 1] >= '0' && name[digits - 1] <= '9') --digits;
    if (digits == name.size()) continue;  // torch's analyzer also takes only <prefix><rank>
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string err;
    pickle::ValuePtr v = pickle::Loads(ss.str(), &err);
    if (!v) {
      res.problems.push_back(fmt::format("{}: not a pickle this reader takes ({})", f.string(), err));
      continue;
    }
    std::optional<FrDump> d = FrDumpFromPickle(*v, &err);
    if (!d) {
      res.problems.push_back(fmt::format("{}: {}", f.string(), err));
      continue;
    }
    try {
      d->rank = std::stoi(name.substr(digits));
    } catch (...) {
      res.problems.push_back(fmt::format("{}: rank number out of range", f.string()));
      continue;
    }
    d->file = f.string();
    res.dumps.push_back(std::move(*d));
  }
  std::sort(res.dumps.begin(), res.dumps.end(), [](const FrDump& a, const FrDump& b) { return a.rank < b.rank; });
  return res;
}

FrAnalysis AnalyzeFr(const std::vector<FrDump>& dumps) {
  FrAnalysis a;
  // Groups: by name and members (torch's split_group can reuse a name for other members).
  std::map<std::pair<std::string, std::vector<int>>, uint32_t> group_id;
  std::map<uint32_t, FrGroup> groups;
  std::set<int> with_dump;
  std::set<int> real;
  bool any_prism = false;
  int max_rank = -1;
  for (const FrDump& d : dumps) {
    with_dump.insert(d.rank);
    max_rank = std::max(max_rank, d.rank);
    if (d.from_prism) {
      any_prism = true;
      a.world_size = std::max(a.world_size, d.world_size);
      real.insert(d.real_ranks.begin(), d.real_ranks.end());
    }
    for (const auto& [name, g] : d.pg_config) {
      for (int r : g.ranks) max_rank = std::max(max_rank, r);
      auto key = std::make_pair(g.name.empty() ? name : g.name, g.ranks);
      if (!group_id.count(key)) {
        uint32_t id = static_cast<uint32_t>(group_id.size() + 1);
        group_id[key] = id;
        groups[id] = g;
      }
    }
  }
  if (a.world_size == 0) a.world_size = max_rank + 1;
  auto is_real = [&](int r) { return !any_prism || real.count(r) > 0; };
  a.ranks.assign(with_dump.begin(), with_dump.end());
  a.groups = groups.size();

  HangDetector det(0);
  for (const auto& [id, g] : groups) {
    HangComm c;
    c.pg_name = g.name;
    c.pg_desc = g.desc;
    c.name = !g.desc.empty() && g.desc != "undefined" ? g.desc : "pg " + g.name;
    c.members = g.ranks;
    for (int m : g.ranks) c.real.push_back(is_real(m));
    c.pg_members = g.ranks;
    det.AddComm(id, std::move(c));
  }
  std::set<int> missing;
  for (const auto& [id, g] : groups) {
    for (int m : g.ranks) {
      if (!with_dump.count(m) && is_real(m)) missing.insert(m);
    }
  }
  for (int m : missing) det.SetState(m, "no dump");
  a.missing_dumps.assign(missing.begin(), missing.end());

  // Pair communicators for p2p, made on first use: (group, low, high) -> id.
  std::map<std::tuple<uint32_t, int, int>, uint32_t> pairs;
  uint32_t next_comm = static_cast<uint32_t>(groups.size() + 1);
  uint64_t now = 0;
  for (const FrDump& d : dumps) {
    for (const FrEntry& e : d.entries) {
      now = std::max<uint64_t>(now, static_cast<uint64_t>(std::max<int64_t>(e.time_created_ns, 0)));
      if (e.time_completed_ns) now = std::max<uint64_t>(now, static_cast<uint64_t>(*e.time_completed_ns));
    }
  }
  for (const FrDump& d : dumps) {
    // Why skip prism's virtual dumps: they are modelled on the real ones (FrVirtualDumps) and add nothing to the
    // diagnosis, which holds only real ranks up; they count as dumps (not missing).
    if (d.synthesized) continue;
    std::vector<const FrEntry*> order;
    for (const FrEntry& e : d.entries) order.push_back(&e);
    std::stable_sort(order.begin(), order.end(),
                     [](const FrEntry* x, const FrEntry* y) { return x->record_id < y->record_id; });
    bool pending_set = false;
    std::map<uint32_t, uint64_t> pair_seq;  // per pair comm: this rank's count of p2p ops
    for (const FrEntry* e : order) {
      ++a.entries;
      // The entry's group in this dump.
      auto cfg = d.pg_config.find(e->pg_name);
      std::vector<int> ranks = cfg != d.pg_config.end() ? cfg->second.ranks : std::vector<int>{};
      auto gid = group_id.find({cfg != d.pg_config.end() && !cfg->second.name.empty() ? cfg->second.name : e->pg_name,
                                ranks});
      if (gid == group_id.end()) continue;  // an entry of a group its dump does not describe
      auto [type, meta] = SplitName(e->profiling_name);
      HangOp o;
      o.op = OpCodeOf(type);
      std::string dt = !e->input_dtypes.empty() ? e->input_dtypes[0]
                       : !e->output_dtypes.empty() ? e->output_dtypes[0]
                                                   : std::string();
      o.dtype = dt.empty() ? -1 : FrDtypeFromName(dt);
      int64_t numel = std::max(Numel(e->input_sizes), Numel(e->output_sizes));
      o.bytes = static_cast<uint64_t>(std::max<int64_t>(numel, 0)) * static_cast<uint64_t>(ElemSize(dt));
      if (o.op == kSend || o.op == kRecv) {
        size_t arrow = meta.find(o.op == kSend ? "->" : "<-");
        std::vector<int> sorted = ranks;
        std::sort(sorted.begin(), sorted.end());
        int peer_g = -1;
        if (arrow != std::string::npos) {
          try {
            peer_g = std::stoi(meta.substr(arrow + 2));
          } catch (...) {
          }
        }
        if (peer_g < 0 || peer_g >= static_cast<int>(sorted.size())) continue;
        o.peer = sorted[static_cast<size_t>(peer_g)];
        int lo = std::min(d.rank, o.peer), hi = std::max(d.rank, o.peer);
        auto key = std::make_tuple(gid->second, lo, hi);
        auto pit = pairs.find(key);
        if (pit == pairs.end()) {
          pit = pairs.emplace(key, next_comm++).first;
          HangComm c;
          c.pg_name = groups[gid->second].name;
          c.pg_desc = groups[gid->second].desc;
          c.name = fmt::format("{} p2p {}:{}", det.comms().at(gid->second).name, lo, hi);
          c.members = {lo, hi};
          c.real = {is_real(lo), is_real(hi)};
          c.pg_members = ranks;
          det.AddComm(pit->second, std::move(c));
        }
        o.comm_id = pit->second;
        o.seq = pair_seq[pit->second]++;
      } else {
        o.comm_id = gid->second;
        o.seq = static_cast<uint64_t>(std::max<int64_t>(e->collective_seq_id, 0));
      }
      const uint64_t created = static_cast<uint64_t>(std::max<int64_t>(e->time_created_ns, 0));
      if (e->state == "completed" || e->time_completed_ns) {
        uint64_t done = e->time_completed_ns ? static_cast<uint64_t>(*e->time_completed_ns) : created;
        det.RecordOp(d.rank, o, created, done, done);
      } else if (!pending_set) {
        // Why the first: the watchdog completes a rank's work in order; the oldest incomplete one is where it is.
        det.ArriveOp(d.rank, o, created, created);
        pending_set = true;
      } else {
        det.Issue(d.rank, o, created);
      }
    }
  }
  a.diagnosis = det.Diagnose(now + 1);
  a.diagnosis.header = fmt::format(
      "prism: from Flight Recorder dumps of {} rank(s): {} rank(s) stopped at an operation that did not complete",
      a.ranks.size(), a.diagnosis.waits.size());
  a.reproduce = ReproduceRanks(a.diagnosis);
  return a;
}

std::string FrAnalysis::Text() const {
  std::string s = fmt::format("{} dump(s): ranks {}; world of at least {} ranks; {} process group(s), {} entries\n",
                              ranks.size(), RankListText(ranks), world_size, groups, entries);
  if (!missing_dumps.empty()) {
    s += fmt::format("no dump from {} member(s) of those groups: {}\n", missing_dumps.size(),
                     RankListText(missing_dumps));
  }
  if (diagnosis.waits.empty()) {
    s += "no rank is stopped at an incomplete operation: every entry completed\n";
    return s;
  }
  s += diagnosis.ToText(8);
  if (!reproduce.empty()) {
    std::vector<int> r;
    for (const auto& [rank, why] : reproduce) r.push_back(rank);
    s += fmt::format("to reproduce under prism, run these ranks for real: --ranks {}\n", fmt::join(r, ","));
    for (const auto& [rank, why] : reproduce) s += fmt::format("  rank {}: {}\n", rank, why);
  }
  return s;
}

std::string FrAnalysis::Json() const {
  json j;
  j["ranks"] = ranks;
  j["world_size"] = world_size;
  j["missing_dumps"] = missing_dumps;
  j["groups"] = groups;
  j["entries"] = entries;
  j["diagnosis"] = json::parse(diagnosis.ToJson());
  json rep = json::array();
  std::vector<int> r;
  for (const auto& [rank, why] : reproduce) {
    rep.push_back({{"rank", rank}, {"why", why}});
    r.push_back(rank);
  }
  j["reproduce_with"] = rep;
  j["ranks_flag"] = fmt::format("--ranks {}", fmt::join(r, ","));
  return j.dump(2) + "\n";
}

}  // namespace prism::coord
