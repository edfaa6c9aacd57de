#include "replay/trace_io.h"

#include <fstream>
#include <iterator>
#include <sstream>
#include <unordered_map>

#include "common/bounded_read.h"
#include "common/document_shape.h"
#include "prism/limits.h"
#include "replay/trace_parse.h"
#include "replay/trace_validate.h"

namespace prism::replay {

namespace trace_parse {

void ParseHeader(const json& j, trace::Trace* t) {
  const json* magic = Field(j, "magic");
  if (!magic || !magic->is_string() || magic->get<std::string>() != trace::kMagic) {
    Fail(std::string("trace"),
         std::string("wrong magic (expected \"") + std::string(trace::kMagic) + "\"): not a PrismTrace");
  }
  const std::string top = "trace";
  int version = static_cast<int>(GetInt(j, "schema_version", 0, 0, 1 << 30, top, /*required=*/true));
  if (version != trace::kSchemaVersion) {
    Fail(top, "schema_version " + std::to_string(version) + " is not supported (this build reads " +
                  std::to_string(trace::kSchemaVersion) + ")");
  }
  t->world_size = static_cast<int32_t>(GetInt(j, "world_size", 0, 1, limits::kMaxWorldSize, top, true));
  if (const json* lj = Field(j, "layout")) {
    const std::string where = "layout";
    if (!lj->is_object()) Fail(where, "must be an object");
    trace::Layout* l = &t->layout;
    for (auto [key, field] : {std::pair{"tp", &l->tp}, {"pp", &l->pp}, {"dp", &l->dp}, {"cp", &l->cp},
                              {"ep", &l->ep}, {"etp", &l->etp}}) {
      *field = static_cast<int>(GetInt(*lj, key, 1, 1, limits::kMaxWorldSize, where));
    }
    l->order = GetOr<std::string>(*lj, "order", l->order, where);
  } else {
    t->layout.dp = t->world_size;  // Why: no layout means every rank is a data-parallel replica.
  }
  if (const json* topo = Field(j, "topology")) t->topology = topo->is_string() ? topo->get<std::string>() : topo->dump();
  const std::string send_key(trace::kSendCompletionKey);
  if (Field(j, send_key.c_str())) {
    t->send_completion = GetEnum(j, send_key.c_str(), trace::ParseSendCompletion, top);
  }
}

void ParseClassHeader(const json& j, size_t index, trace::RoleClass* c, SlotIndex* slots, std::string* where) {
  *where = "classes[" + std::to_string(index) + "]";
  if (!j.is_object()) Fail(*where, "must be an object");
  c->name = GetOr<std::string>(j, "name", "class" + std::to_string(index), *where);
  *where += " '" + c->name + "'";
  if (const json* s = Field(j, "comm_slots")) {
    c->comm_slots = s->get<std::vector<std::string>>();
    for (uint32_t i = 0; i < c->comm_slots.size(); ++i) {
      if (!slots->emplace(c->comm_slots[i], i).second) {
        Fail(*where, "duplicate comm slot \"" + c->comm_slots[i] + "\"");
      }
    }
  }
}

void ParseStreamHeader(const json& sj, size_t si, const std::string& class_where, trace::Stream* s,
                       std::string* stream_where) {
  *stream_where = class_where + " stream " + std::to_string(si);
  if (!sj.is_object()) Fail(*stream_where, "must be an object");
  s->name = GetOr<std::string>(sj, "name", "stream" + std::to_string(si), *stream_where);
  *stream_where = class_where + " stream '" + s->name + "'";
}

void ParseStream(const json& sj, size_t si, const std::string& class_where, const SlotIndex& slots,
                 uint32_t* next_id, trace::Stream* s) {
  std::string swhere;
  ParseStreamHeader(sj, si, class_where, s, &swhere);
  const json* nodes = Field(sj, "nodes");
  if (!nodes || !nodes->is_array()) Fail(swhere, "missing \"nodes\" array");
  s->nodes.resize(nodes->size());
  for (size_t ni = 0; ni < nodes->size(); ++ni) {
    ParseNode((*nodes)[ni], slots, *next_id, NodeWhere{&swhere, ni}, &s->nodes[ni]);
    *next_id = s->nodes[ni].id + 1;
  }
}

void ParseClass(const json& j, size_t index, trace::RoleClass* c) {
  std::string where;
  SlotIndex slots;
  ParseClassHeader(j, index, c, &slots, &where);
  const json* streams = Field(j, "streams");
  if (!streams || !streams->is_array()) Fail(where, "missing \"streams\" array");
  uint32_t next_id = 0;
  c->streams.resize(streams->size());
  for (size_t si = 0; si < streams->size(); ++si) ParseStream((*streams)[si], si, where, slots, &next_id, &c->streams[si]);
}

void ParseComm(const json& cj, size_t i, trace::Comm* c) {
  std::string where = "comms[" + std::to_string(i) + "]";
  if (!cj.is_object()) Fail(where, "must be an object");
  c->id = static_cast<uint32_t>(GetInt(cj, "id", static_cast<int64_t>(i), 0, kU32Max, where));
  const json* ranks = Field(cj, "ranks");
  if (!ranks || !ranks->is_array()) Fail(where, "missing \"ranks\" array");
  for (size_t k = 0; k < ranks->size(); ++k) {
    const json& x = (*ranks)[k];
    const bool ok = x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= kMaxRank &&
                    !(x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(kMaxRank));
    if (!ok) Fail(where, "\"ranks\"[" + std::to_string(k) + "] is " + x.dump() + ": must be a rank in 0.." +
                         std::to_string(kMaxRank));
    c->ranks.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  c->desc = GetOr<std::string>(cj, "desc", "", where);
}

void ParseRankBinding(const json& e, size_t r, trace::RankBinding* b) {
  std::string where = "rank_class[" + std::to_string(r) + "]";
  if (e.is_number_integer()) {
    const json wrap = {{"class", e}};
    b->cls = static_cast<uint32_t>(GetInt(wrap, "class", 0, 0, kU32Max, where, true));
  } else if (e.is_object()) {
    b->cls = static_cast<uint32_t>(GetInt(e, "class", 0, 0, kU32Max, where, true));
    if (const json* comms = Field(e, "comms")) {
      if (!comms->is_array()) Fail(where, "\"comms\" must be an array of comm ids");
      for (const json& x : *comms) {
        const json wrap = {{"comms", x}};
        b->comms.push_back(static_cast<uint32_t>(GetInt(wrap, "comms", 0, 0, kU32Max, where)));
      }
    }
  } else {
    Fail(where, "must be a class index or {\"class\": i, \"comms\": [...]}");
  }
}

}  // namespace trace_parse

namespace {

using nlohmann::json;
using trace::Node;
using trace::NodeKind;
using namespace trace_parse;

void FromJson(const json& j, trace::Trace* t) {
  if (!j.is_object()) Fail(std::string("trace"), "top level must be an object");
  ParseHeader(j, t);
  const json* comms = Field(j, "comms");
  if (comms && !comms->is_array()) Fail(std::string("comms"), "must be an array");
  if (comms) {
    t->comms.resize(comms->size());
    for (size_t i = 0; i < comms->size(); ++i) ParseComm((*comms)[i], i, &t->comms[i]);
  }
  const json* classes = Field(j, "classes");
  if (!classes || !classes->is_array()) Fail(std::string("trace"), "missing \"classes\" array");
  t->classes.resize(classes->size());
  for (size_t i = 0; i < classes->size(); ++i) ParseClass((*classes)[i], i, &t->classes[i]);
  const json* rc = Field(j, "rank_class");
  if (!rc || !rc->is_array()) Fail(std::string("trace"), "missing \"rank_class\" array");
  t->ranks.resize(rc->size());
  for (size_t r = 0; r < rc->size(); ++r) ParseRankBinding((*rc)[r], r, &t->ranks[r]);
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

// The shape (depth, element counts against the bytes left) checked before any reader builds from the bytes
// (docs/trace-format.md "Limits").
bool CheckShape(const std::string& data, std::string* why) {
  if (data.empty()) {
    *why = "empty file (truncated?)";
    return false;
  }
  const size_t first = data.find_first_not_of(" \t\r\n");
  const bool is_json = first != std::string::npos && data[first] == '{';
  std::string shape;
  if (is_json ? !CheckJsonShape(data, DocumentBounds{}, &shape) : !CheckCborShape(data, DocumentBounds{}, &shape)) {
    *why = std::string(is_json ? "JSON " : "CBOR ") + shape + " (docs/trace-format.md \"Limits\")";
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

namespace {

// Why sniff: a JSON document starts with '{' (after whitespace); a CBOR map never starts with one.
bool LooksLikeJson(const std::string& data) {
  size_t first = data.find_first_not_of(" \t\r\n");
  return first != std::string::npos && data[first] == '{';
}

// The document reader on bytes whose shape was checked: the whole file as one nlohmann::json, then TraceFromJson.
bool DomFromCheckedBytes(const std::string& data, trace::Trace* out, std::string* error) {
  const bool is_json = LooksLikeJson(data);
  json j = is_json ? json::parse(data, nullptr, /*allow_exceptions=*/false)
                   : json::from_cbor(data, /*strict=*/true, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *error = is_json ? "not valid JSON (truncated or malformed)" : "not valid CBOR (truncated or not a PrismTrace)";
    return false;
  }
  return TraceFromJson(j, out, error);
}

// The file, refused above its cap before a byte is read (*error names it).
bool ReadBytes(const std::string& path, std::string* data, std::string* error) {
  return ReadFileBounded(path, limits::kMaxGraphFileBytes, "graph files", data, error);
}

}  // namespace

bool TraceFromBytesDom(const std::string& data, trace::Trace* out, std::string* error) {
  return CheckShape(data, error) && DomFromCheckedBytes(data, out, error);
}

bool TraceFromBytes(const std::string& data, trace::Trace* out, std::string* error) {
  if (!CheckShape(data, error)) return false;
  SaxResult r = TraceFromBytesSax(data, LooksLikeJson(data), out, error);
  // Why a second pass: keys in an order the streaming reader does not follow (a node list before its class's
  // comm_slots were known, and the like) are left to the document reader, which takes any order.
  if (r == SaxResult::kIrregular) r = DomFromCheckedBytes(data, out, error) ? SaxResult::kOk : SaxResult::kError;
  return r == SaxResult::kOk;
}

bool ReadTraceUncheckedDom(const std::string& path, trace::Trace* out, std::string* error) {
  std::string data, why;
  if (!ReadBytes(path, &data, error)) return false;
  if (TraceFromBytesDom(data, out, &why)) return true;
  *error = path + ": " + why;
  return false;
}

bool ReadTraceUnchecked(const std::string& path, trace::Trace* out, std::string* error) {
  std::string data, why;
  if (!ReadBytes(path, &data, error)) return false;
  if (TraceFromBytes(data, out, &why)) return true;
  *error = path + ": " + why;
  return false;
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
