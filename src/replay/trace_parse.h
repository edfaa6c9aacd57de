// The PrismTrace element parsers shared by the document reader (trace_io.cc: nlohmann::json DOM) and the
// streaming reader (trace_sax.cc). Both readers run these same functions on the same JSON values, so that they
// fill the same trace::Trace and fail with the same message for the same input. Internal to src/replay.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "prism/limits.h"
#include "prism/trace.h"

namespace prism::replay::trace_parse {

using nlohmann::json;

// Parse failures carry the path to the offending element.
struct ParseError {
  std::string what;
};

// A node's place, composed only when a message needs it (the streaming reader parses 10^5 nodes per graph).
struct NodeWhere {
  const std::string* stream_where;
  size_t index;
};
inline std::string WhereStr(const std::string& w) { return w; }
inline std::string WhereStr(const NodeWhere& w) { return *w.stream_where + " node[" + std::to_string(w.index) + "]"; }

template <typename W>
[[noreturn]] void Fail(const W& where, const std::string& what) {
  throw ParseError{WhereStr(where) + ": " + what};
}

// The fields of one node as the streaming reader collected them (null: absent, as in a document).
struct NodeFields {
  json id, kind, name, dur_us, iter, after, comm, bytes, dtype, op, root, peer;
  void Clear() {
    for (json* f : {&id, &kind, &name, &dur_us, &iter, &after, &comm, &bytes, &dtype, &op, &root, &peer}) *f = nullptr;
  }
  // The member for `key`, or nullptr for a key that nodes do not have.
  json* Slot(std::string_view key) {
    switch (key.size()) {
      case 2: return key == "id" ? &id : key == "op" ? &op : nullptr;
      case 4:
        return key == "kind" ? &kind : key == "name" ? &name : key == "iter" ? &iter : key == "comm" ? &comm
             : key == "root" ? &root : key == "peer" ? &peer : nullptr;
      case 5: return key == "after" ? &after : key == "bytes" ? &bytes : key == "dtype" ? &dtype : nullptr;
      case 6: return key == "dur_us" ? &dur_us : nullptr;
      default: return nullptr;
    }
  }
};

inline const json* Field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}
inline const json* Field(const NodeFields& f, const char* key) {
  const json* v = const_cast<NodeFields&>(f).Slot(key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

template <typename T, typename Obj, typename W>
T Get(const Obj& obj, const char* key, const W& where) {
  const json* v = Field(obj, key);
  if (!v) Fail(where, std::string("missing \"") + key + "\"");
  try {
    return v->get<T>();
  } catch (const json::exception&) {
    Fail(where, std::string("\"") + key + "\" has the wrong type (" + v->type_name() + ")");
  }
}

template <typename T, typename Obj, typename W>
T GetOr(const Obj& obj, const char* key, T dflt, const W& where) {
  return Field(obj, key) ? Get<T>(obj, key, where) : dflt;
}

// An integer field within [lo, hi]. Why not get<T>(): it wraps (-5 bytes read as 2^64-5) and truncates floats.
// The error names the field, its value and the bounds, never a type's 300-digit extreme.
template <typename Obj, typename W>
int64_t GetInt(const Obj& obj, const char* key, int64_t dflt, int64_t lo, int64_t hi, const W& where,
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
    const uint64_t u = v->template get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) out_of_range(std::to_string(u));
    return static_cast<int64_t>(u);
  }
  if (v->is_number_integer()) {
    const int64_t i = v->template get<int64_t>();
    if (i < lo || i > hi) out_of_range(std::to_string(i));
    return i;
  }
  if (v->is_number_float()) {
    const double d = v->template get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || d < static_cast<double>(lo) || d > static_cast<double>(hi)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", d);
      out_of_range(buf);
    }
    return static_cast<int64_t>(d);
  }
  Fail(where, name + " has the wrong type (" + v->type_name() + "): must be an integer");
}

// A duration in microseconds: finite, at most limits::kMaxDurationUs. Absent or negative: dflt.
template <typename Obj, typename W>
double GetDuration(const Obj& obj, const char* key, double dflt, const W& where) {
  const json* v = Field(obj, key);
  if (!v) return dflt;
  if (!v->is_number())
    Fail(where, std::string("\"") + key + "\" has the wrong type (" + v->type_name() + "): must be a number");
  const double d = v->template get<double>();
  // Negative: the format's "no recorded duration" (docs/trace-format.md), as when absent; a compute node then fails.
  if (std::isfinite(d) && d < 0) return dflt;
  if (!(d >= 0 && d <= limits::kMaxDurationUs)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g: must be in 0..%.0e", d, limits::kMaxDurationUs);
    Fail(where, std::string("\"") + key + "\" is " + buf);
  }
  return d;
}

constexpr int64_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr int64_t kMaxRank = limits::kMaxWorldSize - 1;

template <typename E, typename Obj, typename W>
E GetEnum(const Obj& obj, const char* key, E (*parse)(std::string_view), const W& where) {
  std::string s = Get<std::string>(obj, key, where);
  E e = parse(s);
  if (e == E{}) Fail(where, std::string("unknown ") + key + " \"" + s + "\"");
  return e;
}

using SlotIndex = std::unordered_map<std::string, uint32_t>;

template <typename Obj, typename W>
void ParseNode(const Obj& j, const SlotIndex& slots, uint32_t default_id, const W& where, trace::Node* n) {
  if constexpr (std::is_same_v<Obj, json>) {
    if (!j.is_object()) Fail(where, "must be an object");
  }
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
  if (n->kind == trace::NodeKind::kCompute) {
    if (n->dur_us < 0) Fail(where, "compute node needs \"dur_us\" >= 0");
    return;
  }
  std::string slot = Get<std::string>(j, "comm", where);
  auto it = slots.find(slot);
  if (it == slots.end()) Fail(where, "comm slot \"" + slot + "\" is not in the class's comm_slots");
  n->comm_slot = it->second;
  n->bytes = static_cast<uint64_t>(GetInt(j, "bytes", 0, 0, static_cast<int64_t>(limits::kMaxBytes), where));
  n->dtype = Field(j, "dtype") ? GetEnum(j, "dtype", trace::ParseDType, where) : trace::DType::kU8;
  if (n->kind == trace::NodeKind::kColl) {
    n->op = GetEnum(j, "op", trace::ParseCollOp, where);
    n->root = static_cast<int32_t>(GetInt(j, "root", -1, -1, kMaxRank, where));
  } else {
    n->peer = static_cast<int32_t>(GetInt(j, "peer", 0, 0, kMaxRank, where, /*required=*/true));
  }
}

// Each function below is one step of the document reader; the streaming reader calls them on the pieces it
// collected as JSON values (all but the nodes), in the document reader's order.

// magic, schema_version, world_size, layout, topology, send_completion of the top-level object `j`.
void ParseHeader(const json& j, trace::Trace* t);
// classes[index]'s name and comm_slots: sets c->name, c->comm_slots, *slots, *where ("classes[i] 'name'").
void ParseClassHeader(const json& j, size_t index, trace::RoleClass* c, SlotIndex* slots, std::string* where);
// A class's streams[si] as a document; *next_id is the default id of the next node (previous id + 1).
void ParseStream(const json& sj, size_t si, const std::string& class_where, const SlotIndex& slots,
                 uint32_t* next_id, trace::Stream* s);
// A stream's name and the place of its nodes ("classes[i] 'c' stream 'compute'").
void ParseStreamHeader(const json& sj, size_t si, const std::string& class_where, trace::Stream* s,
                       std::string* stream_where);
void ParseClass(const json& j, size_t index, trace::RoleClass* c);
void ParseComm(const json& cj, size_t i, trace::Comm* c);
void ParseRankBinding(const json& e, size_t r, trace::RankBinding* b);

}  // namespace prism::replay::trace_parse
