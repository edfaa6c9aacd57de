#include "replay/trace_io.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "common/bounded_read.h"
#include "common/document_shape.h"
#include "prism/limits.h"
#include "replay/trace_validate.h"

namespace prism::replay {
namespace {

using nlohmann::json;
using trace::Node;
using trace::NodeKind;

// Parse failures carry the path to the offending element.
struct ParseError {
  std::string what;
};

[[noreturn]] void Fail(const std::string& where, const std::string& what) { throw ParseError{where + ": " + what}; }

const json* Field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

template <typename T>
T Get(const json& obj, const char* key, const std::string& where) {
  const json* v = Field(obj, key);
  if (!v) Fail(where, std::string("missing \"") + key + "\"");
  try {
    return v->get<T>();
  } catch (const json::exception&) {
    Fail(where, std::string("\"") + key + "\" has the wrong type (" + v->type_name() + ")");
  }
}

template <typename T>
T GetOr(const json& obj, const char* key, T dflt, const std::string& where) {
  return Field(obj, key) ? Get<T>(obj, key, where) : dflt;
}

// An integer field within [lo, hi]. Why not get<T>(): it wraps (-5 bytes read as 2^64-5) and truncates floats.
// The error names the field, its value and the bounds, never a type's 300-digit extreme.
int64_t GetInt(const json& obj, const char* key, int64_t dflt, int64_t lo, int64_t hi, const std::string& where,
               bool required = false) {
  const json* v = Field(obj, key);
  if (!v) {
    if (required) Fail(where, std::string("missing \"") + key + "\"");
    return dflt;
  }
  const std::string name = std::string("\"") + key + "\"";
  auto out_of_range = [&](const std::string& shown) {
    Fail(where, name + " is " + shown + ": must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
  };
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) out_of_range(std::to_string(u));
    return static_cast<int64_t>(u);
  }
  if (v->is_number_integer()) {
    int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) out_of_range(std::to_string(i));
    return i;
  }
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || d < static_cast<double>(lo) || d > static_cast<double>(hi)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", d);
      out_of_range(buf);
    }
    return static_cast<int64_t>(d);
  }
  Fail(where, name + " has the wrong type (" + v->type_name() + "): must be an integer");
}

// A duration in microseconds: finite, 0 <= v <= limits::kMaxDurationUs. Absent: dflt.
double GetDuration(const json& obj, const char* key, double dflt, const std::string& where) {
  const json* v = Field(obj, key);
  if (!v) return dflt;
  if (!v->is_number())
    Fail(where, std::string("\"") + key + "\" has the wrong type (" + v->type_name() + "): must be a number");
  double d = v->get<double>();
  if (!(d >= 0 && d <= limits::kMaxDurationUs)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g: must be in 0..%.0e", d, limits::kMaxDurationUs);
    Fail(where, std::string("\"") + key + "\" is " + buf);
  }
  return d;
}

constexpr int64_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr int64_t kMaxRank = limits::kMaxWorldSize - 1;

template <typename E>
E GetEnum(const json& obj, const char* key, E (*parse)(std::string_view), const std::string& where) {
  std::string s = Get<std::string>(obj, key, where);
  E e = parse(s);
  if (e == E{}) Fail(where, std::string("unknown ") + key + " \"" + s + "\"");
  return e;
}

void ParseLayout(const json& j, trace::Layout* l) {
  const std::string where = "layout";
  if (!j.is_object()) Fail(where, "must be an object");
  for (auto [key, field] : {std::pair{"tp", &l->tp}, {"pp", &l->pp}, {"dp", &l->dp}, {"cp", &l->cp},
                            {"ep", &l->ep}, {"etp", &l->etp}}) {
    *field = static_cast<int>(GetInt(j, key, 1, 1, limits::kMaxWorldSize, where));
  }
  l->order = GetOr<std::string>(j, "order", l->order, where);
}

void ParseNode(const json& j, const std::unordered_map<std::string, uint32_t>& slots, uint32_t default_id,
               const std::string& where, Node* n) {
  if (!j.is_object()) Fail(where, "must be an object");
  n->id = static_cast<uint32_t>(GetInt(j, "id", default_id, 0, kU32Max, where));
  n->kind = GetEnum(j, "kind", trace::ParseNodeKind, where);
  n->dur_us = GetDuration(j, "dur_us", -1.0, where);
  n->iter = static_cast<uint32_t>(GetInt(j, "iter", 0, 0, kU32Max, where));
  n->name = GetOr<std::string>(j, "name", "", where);
  if (const json* a = Field(j, "after")) {
    if (!a->is_array()) Fail(where, "\"after\" must be an array of node ids");
    n->after.reserve(a->size());
    for (const json& x : *a) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || (x.is_number_unsigned() && x.get<uint64_t>() > kU32Max))
        Fail(where, "\"after\" must hold node ids in 0.." + std::to_string(kU32Max));
      n->after.push_back(x.get<uint32_t>());
    }
  }
  if (n->kind == NodeKind::kCompute) {
    if (n->dur_us < 0) Fail(where, "compute node needs \"dur_us\" >= 0");
    return;
  }
  std::string slot = Get<std::string>(j, "comm", where);
  auto it = slots.find(slot);
  if (it == slots.end()) Fail(where, "comm slot \"" + slot + "\" is not in the class's comm_slots");
  n->comm_slot = it->second;
  n->bytes = static_cast<uint64_t>(GetInt(j, "bytes", 0, 0, static_cast<int64_t>(limits::kMaxBytes), where));
  n->dtype = Field(j, "dtype") ? GetEnum(j, "dtype", trace::ParseDType, where) : trace::DType::kU8;
  if (n->kind == NodeKind::kColl) {
    n->op = GetEnum(j, "op", trace::ParseCollOp, where);
    n->root = static_cast<int32_t>(GetInt(j, "root", -1, -1, kMaxRank, where));
  } else {
    n->peer = static_cast<int32_t>(GetInt(j, "peer", 0, 0, kMaxRank, where, /*required=*/true));
  }
}

void ParseClass(const json& j, size_t index, trace::RoleClass* c) {
  std::string where = "classes[" + std::to_string(index) + "]";
  if (!j.is_object()) Fail(where, "must be an object");
  c->name = GetOr<std::string>(j, "name", "class" + std::to_string(index), where);
  where += " '" + c->name + "'";
  std::unordered_map<std::string, uint32_t> slots;
  if (const json* s = Field(j, "comm_slots")) {
    c->comm_slots = s->get<std::vector<std::string>>();
    for (uint32_t i = 0; i < c->comm_slots.size(); ++i) {
      if (!slots.emplace(c->comm_slots[i], i).second) Fail(where, "duplicate comm slot \"" + c->comm_slots[i] + "\"");
    }
  }
  const json* streams = Field(j, "streams");
  if (!streams || !streams->is_array()) Fail(where, "missing \"streams\" array");
  uint32_t next_id = 0;
  c->streams.resize(streams->size());
  for (size_t si = 0; si < streams->size(); ++si) {
    const json& sj = (*streams)[si];
    trace::Stream& s = c->streams[si];
    std::string swhere = where + " stream " + std::to_string(si);
    if (!sj.is_object()) Fail(swhere, "must be an object");
    s.name = GetOr<std::string>(sj, "name", "stream" + std::to_string(si), swhere);
    swhere = where + " stream '" + s.name + "'";
    const json* nodes = Field(sj, "nodes");
    if (!nodes || !nodes->is_array()) Fail(swhere, "missing \"nodes\" array");
    s.nodes.resize(nodes->size());
    for (size_t ni = 0; ni < nodes->size(); ++ni) {
      ParseNode((*nodes)[ni], slots, next_id, swhere + " node[" + std::to_string(ni) + "]", &s.nodes[ni]);
      next_id = s.nodes[ni].id + 1;
    }
  }
}

void FromJson(const json& j, trace::Trace* t) {
  if (!j.is_object()) Fail("trace", "top level must be an object");
  const json* magic = Field(j, "magic");
  if (!magic || !magic->is_string() || magic->get<std::string>() != trace::kMagic) {
    Fail("trace", std::string("wrong magic (expected \"") + std::string(trace::kMagic) + "\"): not a PrismTrace");
  }
  int version = static_cast<int>(GetInt(j, "schema_version", 0, 0, 1 << 30, "trace", /*required=*/true));
  if (version != trace::kSchemaVersion) {
    Fail("trace", "schema_version " + std::to_string(version) + " is not supported (this build reads " +
                      std::to_string(trace::kSchemaVersion) + ")");
  }
  t->world_size = static_cast<int32_t>(GetInt(j, "world_size", 0, 1, limits::kMaxWorldSize, "trace", true));
  if (const json* l = Field(j, "layout")) {
    ParseLayout(*l, &t->layout);
  } else {
    t->layout.dp = t->world_size;  // Why: no layout means every rank is a data-parallel replica.
  }
  if (const json* topo = Field(j, "topology")) t->topology = topo->is_string() ? topo->get<std::string>() : topo->dump();

  const json* comms = Field(j, "comms");
  if (comms && !comms->is_array()) Fail("comms", "must be an array");
  if (comms) {
    t->comms.resize(comms->size());
    for (size_t i = 0; i < comms->size(); ++i) {
      std::string where = "comms[" + std::to_string(i) + "]";
      const json& cj = (*comms)[i];
      if (!cj.is_object()) Fail(where, "must be an object");
      t->comms[i].id = static_cast<uint32_t>(GetInt(cj, "id", static_cast<int64_t>(i), 0, kU32Max, where));
      const json* ranks = Field(cj, "ranks");
      if (!ranks || !ranks->is_array()) Fail(where, "missing \"ranks\" array");
      for (size_t k = 0; k < ranks->size(); ++k) {
        const json& x = (*ranks)[k];
        bool ok = x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= kMaxRank &&
                  !(x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(kMaxRank));
        if (!ok) Fail(where, "\"ranks\"[" + std::to_string(k) + "] is " + x.dump() + ": must be a rank in 0.." +
                             std::to_string(kMaxRank));
        t->comms[i].ranks.push_back(static_cast<int32_t>(x.get<int64_t>()));
      }
      t->comms[i].desc = GetOr<std::string>(cj, "desc", "", where);
    }
  }

  const json* classes = Field(j, "classes");
  if (!classes || !classes->is_array()) Fail("trace", "missing \"classes\" array");
  t->classes.resize(classes->size());
  for (size_t i = 0; i < classes->size(); ++i) ParseClass((*classes)[i], i, &t->classes[i]);

  const json* rc = Field(j, "rank_class");
  if (!rc || !rc->is_array()) Fail("trace", "missing \"rank_class\" array");
  t->ranks.resize(rc->size());
  for (size_t r = 0; r < rc->size(); ++r) {
    const json& e = (*rc)[r];
    std::string where = "rank_class[" + std::to_string(r) + "]";
    if (e.is_number_integer()) {
      json wrap = {{"class", e}};
      t->ranks[r].cls = static_cast<uint32_t>(GetInt(wrap, "class", 0, 0, kU32Max, where, true));
    } else if (e.is_object()) {
      t->ranks[r].cls = static_cast<uint32_t>(GetInt(e, "class", 0, 0, kU32Max, where, true));
      if (const json* comms = Field(e, "comms")) {
        if (!comms->is_array()) Fail(where, "\"comms\" must be an array of comm ids");
        for (const json& x : *comms) {
          json wrap = {{"comms", x}};
          t->ranks[r].comms.push_back(static_cast<uint32_t>(GetInt(wrap, "comms", 0, 0, kU32Max, where)));
        }
      }
    } else {
      Fail(where, "must be a class index or {\"class\": i, \"comms\": [...]}");
    }
  }
}

json NodeToJson(const Node& n, const trace::RoleClass& c) {
  json j = json::object();
  j["id"] = n.id;
  j["kind"] = trace::ToString(n.kind);
  if (!n.name.empty()) j["name"] = n.name;
  if (n.kind != NodeKind::kCompute) {
    j["comm"] = n.comm_slot < c.comm_slots.size() ? c.comm_slots[n.comm_slot] : std::string("?");
    if (n.kind == NodeKind::kColl) {
      j["op"] = trace::ToString(n.op);
      if (n.root >= 0) j["root"] = n.root;
    } else {
      j["peer"] = n.peer;
    }
    j["bytes"] = n.bytes;
    j["dtype"] = trace::ToString(n.dtype);
  }
  if (n.dur_us >= 0 || n.kind == NodeKind::kCompute) j["dur_us"] = n.dur_us;
  if (n.iter != 0) j["iter"] = n.iter;
  if (!n.after.empty()) j["after"] = n.after;
  return j;
}


}  // namespace

bool TraceFromJson(const json& j, trace::Trace* out, std::string* error) {
  try {
    *out = trace::Trace{};
    FromJson(j, out);
    return true;
  } catch (const ParseError& e) {
    *error = e.what;
  } catch (const json::exception& e) {
    *error = std::string("malformed trace: ") + e.what();
  }
  return false;
}

json TraceToJson(const trace::Trace& t) {
  json j = json::object();
  j["magic"] = trace::kMagic;
  j["schema_version"] = trace::kSchemaVersion;
  j["world_size"] = t.world_size;
  j["layout"] = {{"tp", t.layout.tp}, {"pp", t.layout.pp}, {"dp", t.layout.dp}, {"cp", t.layout.cp},
                 {"ep", t.layout.ep}, {"etp", t.layout.etp}, {"order", t.layout.order}};
  if (!t.topology.empty()) {
    json topo = json::parse(t.topology, nullptr, false);
    j["topology"] = topo.is_discarded() ? json(t.topology) : topo;
  }
  json comms = json::array();
  for (const trace::Comm& c : t.comms) {
    json cj = {{"id", c.id}, {"ranks", c.ranks}};
    if (!c.desc.empty()) cj["desc"] = c.desc;
    comms.push_back(std::move(cj));
  }
  j["comms"] = std::move(comms);
  json classes = json::array();
  for (const trace::RoleClass& c : t.classes) {
    json streams = json::array();
    for (const trace::Stream& s : c.streams) {
      json nodes = json::array();
      for (const Node& n : s.nodes) nodes.push_back(NodeToJson(n, c));
      streams.push_back({{"name", s.name}, {"nodes", std::move(nodes)}});
    }
    classes.push_back({{"name", c.name}, {"comm_slots", c.comm_slots}, {"streams", std::move(streams)}});
  }
  j["classes"] = std::move(classes);
  json rc = json::array();
  for (const trace::RankBinding& b : t.ranks) {
    if (b.comms.empty()) {
      rc.push_back(b.cls);
    } else {
      rc.push_back({{"class", b.cls}, {"comms", b.comms}});
    }
  }
  j["rank_class"] = std::move(rc);
  return j;
}

bool ReadTraceUnchecked(const std::string& path, trace::Trace* out, std::string* error) {
  std::string data;
  if (!ReadFileBounded(path, limits::kMaxGraphFileBytes, "graph files", &data, error)) return false;
  if (data.empty()) {
    *error = path + ": empty file (truncated?)";
    return false;
  }
  json j;
  // Why sniff: a JSON document starts with '{' (after whitespace); a CBOR map never starts with one.
  size_t first = data.find_first_not_of(" \t\r\n");
  bool is_json = first != std::string::npos && data[first] == '{';
  std::string why;
  if (is_json ? !CheckJsonShape(data, DocumentBounds{}, &why) : !CheckCborShape(data, DocumentBounds{}, &why)) {
    *error = path + ": " + (is_json ? "JSON " : "CBOR ") + why + " (docs/trace-format.md \"Limits\")";
    return false;
  }
  if (is_json) {
    j = json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      *error = path + ": not valid JSON (truncated or malformed)";
      return false;
    }
  } else {
    j = json::from_cbor(data, /*strict=*/true, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      *error = path + ": not valid CBOR (truncated or not a PrismTrace)";
      return false;
    }
  }
  if (!TraceFromJson(j, out, &why)) {
    *error = path + ": " + why;
    return false;
  }
  return true;
}

bool ReadTrace(const std::string& path, trace::Trace* out, std::string* error) {
  if (!ReadTraceUnchecked(path, out, error)) return false;
  std::vector<std::string> errors = ValidateTrace(*out);
  if (errors.empty()) return true;
  std::ostringstream os;
  os << path << ": invalid trace (" << errors.size() << (errors.size() >= ValidationOptions{}.max_errors ? "+" : "")
     << " error" << (errors.size() == 1 ? "" : "s") << ")";
  for (const std::string& e : errors) os << "\n  " << e;
  *error = os.str();
  return false;
}

bool WriteTrace(const trace::Trace& t, const std::string& path, std::string* error) {
  json j = TraceToJson(t);
  bool cbor = path.size() >= 6 && path.compare(path.size() - 6, 6, ".prism") == 0;
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      *error = path + ": cannot write";
      return false;
    }
    if (cbor) {
      std::vector<uint8_t> bytes = json::to_cbor(j);
      out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    } else {
      out << j.dump(1) << "\n";
    }
    if (!out) {
      *error = path + ": write failed";
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    *error = path + ": cannot rename " + tmp;
    return false;
  }
  return true;
}

}  // namespace prism::replay
