// Reading a rank's event file (include/prism/events.h) into what the graph builder needs (observed_trace.h:
// RankEventLog). Malformed lines are counted, never fatal.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "analysis/observed_trace.h"
#include "common/bounded_read.h"
#include "common/document_shape.h"
#include "prism/events.h"
#include "prism/limits.h"

namespace prism::analysis {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t Int(const json& j, const char* key, int64_t dflt) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return dflt;
  if (it->is_number_float()) {
    // Why the bounds: casting a double past int64 (1e308) is undefined behaviour.
    double d = it->get<double>();
    if (!std::isfinite(d)) return dflt;
    if (d >= 9.2e18) return INT64_MAX;
    if (d <= -9.2e18) return INT64_MIN;
    return static_cast<int64_t>(d);
  }
  if (it->is_number_unsigned()) {
    uint64_t v = it->get<uint64_t>();
    return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v);
  }
  return it->get<int64_t>();
}

uint64_t UInt(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return 0;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  int64_t v = Int(j, key, 0);
  return v > 0 ? static_cast<uint64_t>(v) : 0;
}

// A rank-valued field (peer, root, rank, a stream index): -1 or absent is "none", and anything outside
// -1..kMaxWorldSize-1 is not a value an int32 may silently wrap into. Returns false when out of range.
bool RankField(const json& j, const char* key, int32_t* out) {
  int64_t v = Int(j, key, -1);
  if (v < -1 || v >= limits::kMaxWorldSize) return false;
  *out = static_cast<int32_t>(v);
  return true;
}

// A clock stamp (limits::kMaxTimestampNs says why bounded).
bool Stamp(int64_t ns) { return ns >= 0 && ns <= limits::kMaxTimestampNs; }

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

}  // namespace

void FeedEventLine(RankEventLog* log, std::string_view line, int64_t line_no) {
  size_t a = line.find_first_not_of(" \t\r");
  if (a == std::string_view::npos) return;
  auto malformed = [&](const std::string& why) {
    if (log->malformed++ == 0)
      log->first_malformed = "line " + std::to_string(line_no) + ": " + why + ": " + std::string(line.substr(0, 80));
  };
  std::string shape;
  if (!CheckJsonShape(line, DocumentBounds{}, &shape)) return malformed(shape);
  json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return malformed("not a JSON object");
  std::string type = Str(j, "type");
  if (type == events::kHello) {
    int64_t w = Int(j, "world_size", 0);
    if (w < 0 || w > limits::kMaxWorldSize)
      return malformed("hello world_size " + std::to_string(w) + " is outside 0.." + std::to_string(limits::kMaxWorldSize));
    log->world_size = static_cast<int>(w);
  } else if (type == events::kComm) {
    ObservedComm c;
    c.id = Int(j, "comm_id", -1);
    if (c.id < 0) return malformed("comm line without comm_id");
    c.key = Str(j, "key");
    c.desc = Str(j, "desc");
    c.name = Str(j, "name");
    int64_t nranks = Int(j, "nranks", 0);
    if (nranks < 0 || nranks > limits::kMaxWorldSize || !RankField(j, "rank", &c.rank))
      return malformed("comm line's nranks or rank is outside 0.." + std::to_string(limits::kMaxWorldSize));
    c.nranks = static_cast<int>(nranks);
    auto m = j.find("members");
    if (m != j.end() && m->is_array()) {
      for (const json& x : *m) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= limits::kMaxWorldSize)
          return malformed("comm members must be ranks in 0.." + std::to_string(limits::kMaxWorldSize - 1));
        c.members.push_back(x.get<int>());
      }
    }
    auto it = log->comms.find(c.id);
    if (it != log->comms.end() && c.members.empty()) c.members = it->second.members;
    log->comms[c.id] = std::move(c);
  } else if (type == events::kOp) {
    ObservedOp o;
    o.comm_id = Int(j, "comm_id", -1);
    o.seq = Int(j, "seq", -1);
    o.op = Str(j, "op");
    o.dtype = Str(j, "dtype");
    o.bytes = UInt(j, "bytes");
    if (!RankField(j, "peer", &o.peer) || !RankField(j, "root", &o.root) || !RankField(j, "stream", &o.stream))
      return malformed("op line's peer, root or stream is outside -1.." + std::to_string(limits::kMaxWorldSize - 1));
    o.arrival_ns = Int(j, "arrival_ns", 0);
    o.release_ns = Int(j, "release_ns", 0);
    o.opened_ns = Int(j, "opened_ns", 0);
    if (!Stamp(o.arrival_ns) || !Stamp(o.release_ns) || !Stamp(o.opened_ns))
      return malformed("op line's arrival_ns, release_ns or opened_ns is outside 0..2^62");
    o.sseq = Int(j, "sseq", -1);
    o.passthrough = Int(j, "passthrough", 0) != 0;
    o.nops = static_cast<int32_t>(std::clamp<int64_t>(Int(j, "nops", 1), 1, INT32_MAX));
    o.line = line_no;
    // seq -1: a unit of only sends and receives to the rank itself (libprism numbers no such copy).
    if (o.comm_id < 0 || !j.contains("seq") || o.seq < -1 || o.op.empty())
      return malformed("op line without comm_id, seq or op");
    auto ops = j.find("ops");
    if (ops != j.end() && ops->is_array()) {
      for (const json& x : *ops) {
        if (!x.is_object()) return malformed("\"ops\" entries must be objects");
        ObservedSubOp s;
        s.op = Str(x, "op");
        s.dtype = Str(x, "dtype");
        s.bytes = UInt(x, "bytes");
        if (!RankField(x, "peer", &s.peer) || !RankField(x, "root", &s.root))
          return malformed("\"ops\" entry's peer or root is outside -1.." + std::to_string(limits::kMaxWorldSize - 1));
        s.comm_id = Int(x, "comm_id", -1);
        // Files before per-operation sequences: the unit's numbers in turn (every operation was numbered then).
        s.seq = x.contains("seq") ? Int(x, "seq", -1) : o.seq + static_cast<int64_t>(o.ops.size());
        if (s.op.empty()) return malformed("\"ops\" entry without op");
        o.ops.push_back(std::move(s));
      }
    }
    if (Int(j, "ops_truncated", 0) != 0 || (j.contains("ops_truncated") && j["ops_truncated"].is_boolean() &&
                                              j["ops_truncated"].get<bool>())) {
      o.ops.clear();  // Why: a partial list would drop operations; fall back to the unit's totals
      o.ops_truncated = true;
    }
    log->ops.push_back(std::move(o));
  } else if (type == events::kWait) {
    ObservedWait w;
    if (!RankField(j, "stream", &w.stream) || !RankField(j, "on", &w.on))
      return malformed("wait line's stream or on is outside -1.." + std::to_string(limits::kMaxWorldSize - 1));
    w.next = Int(j, "next", -1);
    w.after = Int(j, "after", -1);
    if (w.stream < 0 || w.next < 0 || w.on < 0 || w.after < 0) return malformed("wait line without stream/next/on/after");
    log->waits.push_back(w);
  } else if (type == events::kIter) {
    ObservedMark m;
    m.iteration = Int(j, "iteration", static_cast<int64_t>(log->marks.size()));
    m.t_ns = Int(j, "t_ns", 0);
    if (!Stamp(m.t_ns)) return malformed("iteration line's t_ns is outside 0..2^62");
    m.stream = 0;
    if (j.contains("stream") && !RankField(j, "stream", &m.stream))
      return malformed("iteration line's stream is outside -1.." + std::to_string(limits::kMaxWorldSize - 1));
    log->marks.push_back(m);
  }
  // Other types (mem, error, bye, newer ones) carry nothing the graph needs.
}

bool ReadRankEventLog(const std::string& path, int rank, RankEventLog* out, std::string* error) {
  std::string text;
  if (!ReadFileBounded(path, limits::kMaxEventFileBytes, "event files", &text, error)) return false;
  *out = RankEventLog{};
  out->rank = rank;
  size_t start = 0;
  int64_t line_no = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) break;  // Why: an unterminated last line is still being written (or was cut)
    ++line_no;
    FeedEventLine(out, std::string_view(text).substr(start, nl - start), line_no);
    start = nl + 1;
  }
  return true;
}

std::vector<int> EventFileRanks(const std::string& dir) {
  std::vector<int> ranks;
  std::error_code ec;
  static const std::regex kName(R"(rank(\d{1,9})\.events\.jsonl)");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (std::regex_match(name, m, kName)) ranks.push_back(std::stoi(m[1].str()));  // Why safe: at most 9 digits
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

}  // namespace prism::analysis
