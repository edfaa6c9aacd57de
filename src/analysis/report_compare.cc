#include "analysis/report_compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "analysis/run_report.h"
#include "common/bounded_read.h"
#include "common/document_shape.h"
#include "prism/limits.h"
#include "prism/report.h"

namespace prism::analysis {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string K(std::string_view k) { return std::string(k); }

std::optional<double> Num(const json& j, std::string_view key) {
  auto it = j.find(K(key));
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::string Seconds(std::optional<double> s) {
  if (!s) return "-";
  char buf[64];
  if (*s >= 1) std::snprintf(buf, sizeof buf, "%.3f s", *s);
  else std::snprintf(buf, sizeof buf, "%.2f ms", *s * 1e3);
  return buf;
}

std::string Bytes(std::optional<double> b) { return b ? HumanBytes(static_cast<int64_t>(*b)) : "-"; }

std::string Pad(const std::string& s, size_t w) { return s.size() >= w ? s + " " : s + std::string(w - s.size(), ' '); }

std::string Percent(double a, double b) {
  if (a == 0) return b == 0 ? "+0.0%" : "+inf%";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%+.1f%%", (b - a) / a * 100);
  return buf;
}

bool Worse(double a, double b, double pct) {
  if (a <= 0) return b > a;
  return (b - a) / a * 100 > pct;
}

std::map<int64_t, const json*> RanksById(const json& rep) {
  std::map<int64_t, const json*> out;
  auto it = rep.find(K(report::kRanks));
  if (it == rep.end() || !it->is_array()) return out;
  for (const json& r : *it)
    if (r.is_object() && r.contains(K(report::kRank)) && r[K(report::kRank)].is_number_integer())
      out[r[K(report::kRank)].get<int64_t>()] = &r;
  return out;
}

// Why by name: report.json's numbers are the keys with a unit suffix and a few counts (include/prism/report.h);
// a string or a 300-digit value there is a damaged or hostile file, not something to print as "-".
bool IsNumericKey(const std::string& k) {
  auto ends = [&](std::string_view suf) {
    return k.size() >= suf.size() && k.compare(k.size() - suf.size(), suf.size(), suf) == 0;
  };
  for (std::string_view suf : {"_s", "_bytes", "_pct", "_ns", "_us", "_ms"})
    if (ends(suf)) return true;
  for (std::string_view name : {report::kWorldSize, report::kIterations, report::kRank, report::kSchema,
                                std::string_view("rounds"), std::string_view("exit_code")})
    if (k == name) return true;
  return false;
}

// Every numeric field (and every value of a numeric-named object such as wait_s) is a number of magnitude at most
// kMaxReportNumber, or null; world_size is within limits::kMaxWorldSize. False with *error naming the field's path.
constexpr double kMaxReportNumber = 1e18;
bool CheckReportNumbers(const json& j, const std::string& path, bool numeric, std::string* error) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string sub = path.empty() ? it.key() : path + "." + it.key();
      if (!CheckReportNumbers(it.value(), sub, IsNumericKey(it.key()) || numeric, error)) return false;
    }
    return true;
  }
  if (j.is_array()) {
    // Why not into objects: an array of records under a numeric-looking name ("iterations": [{...}]) holds fields
    // of their own kinds (a record's "steady" is a flag); their names decide.
    for (size_t i = 0; i < j.size(); ++i)
      if (!CheckReportNumbers(j[i], path + "[" + std::to_string(i) + "]", numeric && !j[i].is_object(), error))
        return false;
    return true;
  }
  if (!numeric || j.is_null()) return true;
  if (!j.is_number()) {
    *error = "\"" + path + "\" is " + j.dump().substr(0, 40) + ": must be a number";
    return false;
  }
  const double v = j.get<double>();
  if (!(std::fabs(v) <= kMaxReportNumber)) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    *error = "\"" + path + "\" is " + buf + ": must be at most 1e18 in magnitude";
    return false;
  }
  if (path == report::kWorldSize && (v < 1 || v > static_cast<double>(limits::kMaxWorldSize) || v != std::floor(v))) {
    *error = "\"world_size\" is " + j.dump() + ": must be an integer in 1.." + std::to_string(limits::kMaxWorldSize);
    return false;
  }
  return true;
}

}  // namespace

std::optional<json> LoadReport(const std::string& path, std::string* error) {
  std::error_code ec;
  fs::path p(path);
  // Why not for a directory named report.json: the user named the file; saying it is a directory is the answer.
  if (fs::is_directory(p, ec) && p.filename() != report::kFileName) p /= std::string(report::kFileName);
  std::string text, why;
  if (!ReadFileBounded(p.string(), limits::kMaxReportFileBytes, "report files", &text, error)) return std::nullopt;
  if (!CheckJsonShape(text, DocumentBounds{}, &why)) {
    *error = p.string() + ": JSON " + why;
    return std::nullopt;
  }
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    *error = p.string() + ": not valid JSON";
    return std::nullopt;
  }
  if (!j.is_object()) {
    *error = p.string() + ": not a JSON object";
    return std::nullopt;
  }
  for (std::string_view key : {report::kWorldSize, report::kMode, report::kRanks}) {
    if (!j.contains(K(key))) {
      *error = p.string() + ": no \"" + K(key) + "\" (not a prism report?)";
      return std::nullopt;
    }
  }
  if (!j[K(report::kRanks)].is_array()) {
    *error = p.string() + ": \"ranks\" is not an array";
    return std::nullopt;
  }
  if (!CheckReportNumbers(j, "", false, &why)) {
    *error = p.string() + ": " + why;
    return std::nullopt;
  }
  return j;
}

std::string PolicyLines(const json& rep) {
  std::ostringstream o;
  auto it = rep.find("policy");
  if (it == rep.end() || !it->is_string()) return "";
  const std::string policy = it->get<std::string>();
  auto text = [&](const json& j, const char* k) -> std::string {
    return j.is_object() && j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string();
  };
  if (policy == "mirror") {
    o << "policy mirror: quick, NOT faithful (a virtual peer arrives when its real counterpart does: no pipeline "
         "bubble, no stragglers); the default policy, graph, collects and fills the job's graph\n";
  } else if (policy == "graph") {
    o << "policy graph: virtual ranks replayed from " << text(rep, "graph") << "\n";
    const json& cache = rep.contains("graph_cache") ? rep["graph_cache"] : json();
    if (cache.is_object())
      o << "graph cache " << (cache.value("hit", false) ? "hit" : "miss (collected and filled in this run)") << ": "
        << text(cache, "dir") << "\n";
    const json& fill = rep.contains("fill") ? rep["fill"] : json();
    if (fill.is_object() && fill.contains("rounds")) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "after %d round(s), last move %.2f %% (tolerance %.2f %%)",
                    fill.value("rounds", 0), fill.value("last_moved_pct", -1.0), fill.value("tolerance_pct", -1.0));
      o << "fill " << (fill.value("converged", false) ? "converged " : "NOT converged ") << buf;
      if (fill.value("compute_spread_pct", 0.0) > 0) {
        std::snprintf(buf, sizeof buf, "; a class's compute moved %.1f %% between its slices",
                      fill.value("compute_spread_pct", 0.0));
        o << buf;
      }
      o << "\n";
    }
    const json& stages = rep.contains("stages") ? rep["stages"] : json();
    if (stages.is_array() && !stages.empty()) {
      o << "stages:";
      for (const json& st : stages) {
        if (!st.is_object()) continue;
        char buf[96];
        std::snprintf(buf, sizeof buf, " %s %.1f s%s", text(st, "name").c_str(), st.value("wall_s", 0.0),
                      st.value("cached", false) ? " (cached)" : "");
        o << buf;
      }
      o << "\n";
    }
  } else {
    o << "policy " << policy << "\n";
  }
  return o.str();
}

std::string ShowReport(const json& rep, size_t max_rows) {
  std::ostringstream o;
  auto str = [&](const char* k) -> std::string {
    auto it = rep.find(k);
    if (it == rep.end()) return "?";
    return it->is_string() ? it->get<std::string>() : it->dump();
  };
  o << PolicyLines(rep);
  o << "mode " << str("mode") << ", world " << str("world_size");
  if (rep.contains("status")) o << ", status " << str("status");
  if (rep.contains("exit_code") && !rep["exit_code"].is_null()) o << " (exit " << str("exit_code") << ")";
  o << "\n";
  o << "iteration time " << Seconds(Num(rep, report::kIterationTime)) << " (median of "
    << (rep.contains("measured_iterations") ? str("measured_iterations") : str("iterations")) << " of "
    << str("iterations") << " iterations)";
  if (auto w = Num(rep, report::kWall)) o << ", prism wall time " << Seconds(*w);
  o << "\n";
  if (rep.contains("layout") && rep["layout"].is_object() && rep["layout"].contains("spec"))
    o << "layout " << rep["layout"]["spec"].get<std::string>() << "\n";

  const json& ranks = rep[K(report::kRanks)];
  o << "\n" << Pad("rank", 8) << Pad("iter time", 13) << Pad("peak memory", 14) << Pad("torch max alloc", 17)
    << Pad("status", 13) << "largest wait\n";
  size_t shown = 0;
  for (const json& r : ranks) {
    if (shown++ >= max_rows) break;
    if (!r.is_object()) continue;
    std::string rank = r.contains("rank") ? r["rank"].dump() : "?";
    std::string wait = "-";
    if (r.contains("wait_s") && r["wait_s"].is_object()) {
      double best = -1;
      for (const auto& [desc, v] : r["wait_s"].items())
        if (v.is_number() && v.get<double>() > best) {
          best = v.get<double>();
          wait = desc + " " + Seconds(best);
          const json* per = r.contains("wait_per_iteration_s") ? &r["wait_per_iteration_s"] : nullptr;
          if (per != nullptr && per->is_object() && per->contains(desc) && (*per)[desc].is_number())
            wait += " (" + Seconds((*per)[desc].get<double>()) + "/iter)";
        }
    }
    std::string status = r.contains("status") && r["status"].is_string() ? r["status"].get<std::string>() : "-";
    if (r.contains("exit_code") && r["exit_code"].is_number()) status += " (" + r["exit_code"].dump() + ")";
    o << Pad(rank, 8) << Pad(Seconds(Num(r, report::kIterationTime)), 13) << Pad(Bytes(Num(r, report::kPeakMemory)), 14)
      << Pad(Bytes(Num(r, "torch_max_allocated_bytes")), 17) << Pad(status, 13) << wait << "\n";
  }
  if (ranks.size() > max_rows) o << "... " << ranks.size() - max_rows << " more ranks\n";
  if (rep.contains("warnings") && rep["warnings"].is_array() && !rep["warnings"].empty()) {
    o << "\nwarnings:\n";
    for (const json& w : rep["warnings"]) o << "  " << (w.is_string() ? w.get<std::string>() : w.dump()) << "\n";
  }
  return o.str();
}

std::optional<DiffResult> DiffReports(const json& a, const json& b, double pct, std::string* error) {
  auto ta = Num(a, report::kIterationTime);
  auto tb = Num(b, report::kIterationTime);
  if (!ta || !tb) {
    *error = std::string(!ta ? "A" : "B") + " has no iteration_time_s (the run measured no iteration)";
    return std::nullopt;
  }
  DiffResult d;
  std::ostringstream o;
  std::vector<std::string> worse;
  o << Pad("", 30) << Pad("A", 14) << Pad("B", 14) << "change\n";
  auto row = [&](const std::string& name, const std::string& va, const std::string& vb, double x, double y) {
    o << Pad(name, 30) << Pad(va, 14) << Pad(vb, 14) << Percent(x, y);
    if (Worse(x, y, pct)) {
      o << "  worse";
      worse.push_back(name + " " + Percent(x, y));
    }
    o << "\n";
  };
  row("iteration_time_s", Seconds(ta), Seconds(tb), *ta, *tb);

  auto ra = RanksById(a), rb = RanksById(b);
  int common_mem = 0;
  for (const auto& [rank, ja] : ra) {
    auto it = rb.find(rank);
    if (it == rb.end()) continue;
    auto ma = Num(*ja, report::kPeakMemory), mb = Num(*it->second, report::kPeakMemory);
    if (ma && mb) {
      ++common_mem;
      row("rank " + std::to_string(rank) + " peak_memory_bytes", Bytes(ma), Bytes(mb), *ma, *mb);
    }
    // Per-rank iteration time: shown for context; the gate is the top-level figure.
    auto ia = Num(*ja, report::kIterationTime), ib = Num(*it->second, report::kIterationTime);
    if (ia && ib) {
      o << Pad("rank " + std::to_string(rank) + " iteration_time_s", 30) << Pad(Seconds(ia), 14) << Pad(Seconds(ib), 14)
        << Percent(*ia, *ib) << "\n";
    }
  }
  if (common_mem == 0) {
    auto max_mem = [](const std::map<int64_t, const json*>& m) -> std::optional<double> {
      std::optional<double> best;
      for (const auto& [r, j] : m)
        if (auto v = Num(*j, report::kPeakMemory)) best = best ? std::max(*best, *v) : *v;
      return best;
    };
    auto ma = max_mem(ra), mb = max_mem(rb);
    if (ma && mb) row("largest peak_memory_bytes", Bytes(ma), Bytes(mb), *ma, *mb);
    else o << "peak memory: not in both reports, not compared\n";
  }
  d.regression = !worse.empty();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g%%", pct);
  if (d.regression) {
    o << "REGRESSION (more than " << buf << " worse):";
    for (const std::string& w : worse) o << " " << w << ";";
    o << "\n";
  } else {
    o << "OK: nothing worse by more than " << buf << "\n";
  }
  d.text = o.str();
  return d;
}

}  // namespace prism::analysis
