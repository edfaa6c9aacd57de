#include "replay/trace_io.h"

#include <fstream>
#include <iterator>
#include <sstream>
#include <unordered_map>

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
  l->tp = GetOr<int>(j, "tp", 1, where);
  l->pp = GetOr<int>(j, "pp", 1, where);
  l->dp = GetOr<int>(j, "dp", 1, where);
  l->cp = GetOr<int>(j, "cp", 1, where);
  l->ep = GetOr<int>(j, "ep", 1, where);
  l->etp = GetOr<int>(j, "etp", 1, where);
  l->order = GetOr<std::string>(j, "order", l->order, where);
}

void ParseNode(const json& j, const std::unordered_map<std::string, uint32_t>& slots, uint32_t default_id,
               const std::string& where, Node* n) {
  if (!j.is_object()) Fail(where, "must be an object");
  n->id = GetOr<uint32_t>(j, "id", default_id, where);
  n->kind = GetEnum(j, "kind", trace::ParseNodeKind, where);
  n->dur_us = GetOr<double>(j, "dur_us", -1.0, where);
  n->iter = GetOr<uint32_t>(j, "iter", 0, where);
  n->name = GetOr<std::string>(j, "name", "", where);
  if (const json* a = Field(j, "after")) {
    if (!a->is_array()) Fail(where, "\"after\" must be an array of node ids");
    n->after.reserve(a->size());
    for (const json& x : *a) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) Fail(where, "\"after\" must hold non-negative node ids");
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
  n->bytes = GetOr<uint64_t>(j, "bytes", 0, where);
  n->dtype = Field(j, "dtype") ? GetEnum(j, "dtype", trace::ParseDType, where) : trace::DType::kU8;
  if (n->kind == NodeKind::kColl) {
    n->op = GetEnum(j, "op", trace::ParseCollOp, where);
    n->root = GetOr<int32_t>(j, "root", -1, where);
  } else {
    n->peer = Get<int32_t>(j, "peer", where);
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
  int version = Get<int>(j, "schema_version", "trace");
  if (version != trace::kSchemaVersion) {
    Fail("trace", "schema_version " + std::to_string(version) + " is not supported (this build reads " +
                      std::to_string(trace::kSchemaVersion) + ")");
  }
  t->world_size = Get<int32_t>(j, "world_size", "trace");
  if (const json* l = Field(j, "layout")) {
    ParseLayout(*l, &t->layout);
  } else {
    t->layout.dp = t->world_size;  // Why: no layout means every rank is a data-parallel replica.
  }
  if (const json* topo = Field(j, "topology")) t->topology = topo->is_string() ? topo->get<std::string>() : topo->dump();
  const std::string send_key(trace::kSendCompletionKey);
  if (Field(j, send_key.c_str())) {
    t->send_completion = GetEnum(j, send_key.c_str(), trace::ParseSendCompletion, "trace");
  }

  const json* comms = Field(j, "comms");
  if (comms && !comms->is_array()) Fail("comms", "must be an array");
  if (comms) {
    t->comms.resize(comms->size());
    for (size_t i = 0; i < comms->size(); ++i) {
      std::string where = "comms[" + std::to_string(i) + "]";
      const json& cj = (*comms)[i];
      if (!cj.is_object()) Fail(where, "must be an object");
      t->comms[i].id = GetOr<uint32_t>(cj, "id", static_cast<uint32_t>(i), where);
      t->comms[i].ranks = Get<std::vector<int32_t>>(cj, "ranks", where);
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
      t->ranks[r].cls = e.get<uint32_t>();
    } else if (e.is_object()) {
      t->ranks[r].cls = Get<uint32_t>(e, "class", where);
      t->ranks[r].comms = GetOr<std::vector<uint32_t>>(e, "comms", {}, where);
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

bool ReadFile(const std::string& path, std::string* data, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = path + ": cannot open";
    return false;
  }
  data->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (data->empty()) {
    *error = path + ": empty file (truncated?)";
    return false;
  }
  return true;
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
  if (t.send_completion != trace::SendCompletion::kInvalid) {
    j[std::string(trace::kSendCompletionKey)] = trace::ToString(t.send_completion);
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
  if (!ReadFile(path, &data, error)) return false;
  json j;
  // Why sniff: a JSON document starts with '{' (after whitespace); a CBOR map never starts with one.
  size_t first = data.find_first_not_of(" \t\r\n");
  bool is_json = first != std::string::npos && data[first] == '{';
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
  std::string why;
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
