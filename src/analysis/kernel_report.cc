// `prism-run report kernels A B` (kernel_report.h, The report; docs/kernels.md). The rank's kernels are read by
// kernel_load.cc, their clocks aligned by kernel_clock.cc, their names shortened by kernel_names.cc; trace.json's
// part is kernel_trace.cc.
#include "analysis/kernel_report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/run_report.h"
#include "prism/kernels.h"

namespace prism::analysis {
namespace {

using nlohmann::json;

double MedianD(std::vector<double> v) { return Median(std::move(v)); }

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  if (i + 1 >= v.size()) return v.back();
  return v[i] + (pos - static_cast<double>(i)) * (v[i + 1] - v[i]);
}

// Median absolute deviation from the median.
double Mad(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = MedianD(v);
  std::vector<double> d;
  d.reserve(v.size());
  for (double x : v) d.push_back(std::fabs(x - m));
  return MedianD(d);
}

std::string RecordName(const KernelFile& f, const KernelRecord& r) {
  if (r.kind == KernelKind::kMemcpy) return std::string("[memcpy ") + kernels::CopyKindName(r.copy_kind) + "]";
  if (r.kind == KernelKind::kMemset) return "[memset]";
  if (r.name >= 0 && static_cast<size_t>(r.name) < f.names.size()) return f.names[static_cast<size_t>(r.name)];
  return "?";
}

std::string ClassOf(const std::string& name) {
  if (!name.empty() && name[0] == '[') return "copy";
  if (name.rfind("prism_", 0) == 0) return "prism";
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower.find("nccl") != std::string::npos) return "nccl";
  return "compute";
}

struct Instance {
  std::vector<double> dur_us, off_us;
};

struct NameStats {
  std::vector<int> counts;  // per window
  std::vector<double> durs;
  std::vector<Instance> inst;  // by occurrence within the iteration
  bool graph = false;
};

struct Side {
  int rank = 0;
  std::vector<std::pair<int64_t, int64_t>> windows;
  std::vector<int64_t> window_iteration;
  double iter_us = 0;
  std::map<std::string, NameStats> names;
  int64_t records = 0;
};

std::optional<Side> Analyze(const RankKernels& rk, int skip, std::string* error) {
  Side s;
  s.rank = rk.rank;
  const std::string who = "rank " + std::to_string(rk.rank) + ": ";
  if (rk.iteration_t_ns.size() < 2) {
    *error = who + "needs at least 2 iteration marks in its event file (libprism's Python hook marks every optimizer "
                   "step), has " + std::to_string(rk.iteration_t_ns.size());
    return std::nullopt;
  }
  for (size_t i = 1; i < rk.iteration_t_ns.size(); ++i) {
    if (static_cast<int>(i) <= skip) continue;
    if (rk.iteration_t_ns[i] <= rk.iteration_t_ns[i - 1]) continue;
    s.windows.emplace_back(rk.iteration_t_ns[i - 1], rk.iteration_t_ns[i]);
    s.window_iteration.push_back(rk.iteration_index[i]);
  }
  if (s.windows.empty()) {
    *error = who + "no complete iteration left after skipping " + std::to_string(skip) + " (" +
             std::to_string(rk.iteration_t_ns.size()) + " marks); try --skip 0";
    return std::nullopt;
  }
  std::vector<double> lens;
  for (const auto& [a, b] : s.windows) lens.push_back(static_cast<double>(b - a) / 1000.0);
  s.iter_us = MedianD(lens);
  const auto& recs = rk.file.records;
  const size_t nwin = s.windows.size();
  for (size_t w = 0; w < nwin; ++w) {
    const auto [lo, hi] = s.windows[w];
    auto it = std::upper_bound(recs.begin(), recs.end(), lo,
                               [](int64_t v, const KernelRecord& r) { return v < r.start_ns; });
    std::map<std::string, int> occ;
    for (; it != recs.end() && it->start_ns <= hi; ++it) {
      const std::string name = RecordName(rk.file, *it);
      NameStats& ns = s.names[name];
      if (ns.counts.empty()) ns.counts.assign(nwin, 0);
      ++ns.counts[w];
      const double dur = static_cast<double>(it->end_ns - it->start_ns) / 1000.0;
      ns.durs.push_back(dur);
      if (it->graph != 0) ns.graph = true;
      const int k = occ[name]++;
      if (ns.inst.size() <= static_cast<size_t>(k)) ns.inst.resize(static_cast<size_t>(k) + 1);
      ns.inst[static_cast<size_t>(k)].dur_us.push_back(dur);
      ns.inst[static_cast<size_t>(k)].off_us.push_back(static_cast<double>(it->start_ns - lo) / 1000.0);
      ++s.records;
    }
  }
  if (s.records == 0) {
    *error = who + "no kernel records inside its iterations (were kernels recorded? --kernels)";
    return std::nullopt;
  }
  return s;
}

double Pct(double x) { return std::round(x * 1e5) / 1e3; }  // fraction -> percent, 3 decimals
double R3(double x) { return std::round(x * 1e3) / 1e3; }

// A side's figures for one name.
json SideFigures(const Side& s, const NameStats& ns) {
  std::vector<double> counts(ns.counts.begin(), ns.counts.end());
  std::vector<double> dvar, ovar;
  for (const Instance& in : ns.inst) {
    if (in.dur_us.size() < 2) continue;
    const double md = MedianD(in.dur_us);
    if (md > 0) dvar.push_back(Mad(in.dur_us) / md);
    if (s.iter_us > 0) ovar.push_back(Mad(in.off_us) / s.iter_us);
  }
  double total = 0;
  for (double d : ns.durs) total += d;
  return {{"count", MedianD(counts)},
          {"dur_us", R3(MedianD(ns.durs))},
          {"dur_var_pct", dvar.empty() ? json(nullptr) : json(Pct(MedianD(dvar)))},
          {"off_us", ns.inst.empty() ? json(nullptr) : json(R3(MedianD(ns.inst[0].off_us)))},
          {"off_var_pct", ovar.empty() ? json(nullptr) : json(Pct(MedianD(ovar)))},
          {"time_us", R3(total / static_cast<double>(s.windows.size()))}};
}

json SideSummary(const Side& s, const RankKernels& rk, const std::string& label) {
  double per_iter = static_cast<double>(s.records) / static_cast<double>(s.windows.size());
  json clock = {{"stamps_matched", rk.fit.matched},
                {"stamps", rk.fit.stamps},
                {"stamp_correction_applied", rk.fit.applied},
                {"residual_median_us", R3(rk.fit.residual_median_ns / 1000.0)}};
  return {{"source", label},
          {"rank", s.rank},
          {"iterations", s.windows.size()},
          {"first_iteration", s.window_iteration.front()},
          {"iteration_us", R3(s.iter_us)},
          {"records_per_iteration", R3(per_iter)},
          {"names", s.names.size()},
          {"clock", clock},
          {"warnings", rk.warnings}};
}

json Dist(const std::vector<double>& v) {
  if (v.empty()) return nullptr;
  return {{"median_pct", Pct(MedianD(v))}, {"p90_pct", Pct(Quantile(v, 0.9))}, {"n", v.size()}};
}

}  // namespace

std::optional<json> CompareKernels(const RankKernels& a, const RankKernels& b, const KernelCompareOptions& opts,
                                   std::string* error) {
  auto sa = Analyze(a, opts.skip, error);
  if (!sa) {
    *error = "A " + *error;
    return std::nullopt;
  }
  auto sb = Analyze(b, opts.skip, error);
  if (!sb) {
    *error = "B " + *error;
    return std::nullopt;
  }
  std::set<std::string> all;
  for (const auto& [n, _] : sa->names) all.insert(n);
  for (const auto& [n, _] : sb->names) all.insert(n);
  json rows = json::array();
  // Per instance (name, k-th launch in the iteration) of compute kernels present in both: the summary's samples.
  std::vector<double> dur_dev, dur_var_a, dur_var_b, off_dev, off_var_a, off_var_b;
  std::map<std::string, int> only_a, only_b;
  int both = 0, count_mismatch = 0;
  for (const std::string& name : all) {
    auto ia = sa->names.find(name);
    auto ib = sb->names.find(name);
    const bool in_a = ia != sa->names.end(), in_b = ib != sb->names.end();
    const std::string cls = ClassOf(name);
    json row = {{"name", name}, {"short", name[0] == '[' ? name : ShortKernelName(name)}, {"class", cls},
                {"graph", (in_a && ia->second.graph) || (in_b && ib->second.graph)}};
    row["a"] = in_a ? SideFigures(*sa, ia->second) : json(nullptr);
    row["b"] = in_b ? SideFigures(*sb, ib->second) : json(nullptr);
    row["dur_dev_pct"] = nullptr;
    row["off_dev_pct"] = nullptr;
    if (in_a && in_b) {
      ++both;
      const double da = row["a"]["dur_us"].get<double>(), db = row["b"]["dur_us"].get<double>();
      if (da > 0) row["dur_dev_pct"] = Pct((db - da) / da);
      if (row["a"]["count"].get<double>() != row["b"]["count"].get<double>()) ++count_mismatch;
      std::vector<double> offs;
      const size_t k = std::min(ia->second.inst.size(), ib->second.inst.size());
      for (size_t i = 0; i < k; ++i) {
        const Instance& xa = ia->second.inst[i];
        const Instance& xb = ib->second.inst[i];
        const double ma = MedianD(xa.dur_us), mb = MedianD(xb.dur_us);
        const double od = std::fabs(MedianD(xb.off_us) - MedianD(xa.off_us)) / sa->iter_us;
        offs.push_back(od);
        if (cls != "compute") continue;
        if (ma > 0) dur_dev.push_back(std::fabs(mb - ma) / ma);
        off_dev.push_back(od);
        if (xa.dur_us.size() >= 2 && ma > 0) {
          dur_var_a.push_back(Mad(xa.dur_us) / ma);
          off_var_a.push_back(Mad(xa.off_us) / sa->iter_us);
        }
        if (xb.dur_us.size() >= 2 && mb > 0) {
          dur_var_b.push_back(Mad(xb.dur_us) / mb);
          off_var_b.push_back(Mad(xb.off_us) / sb->iter_us);
        }
      }
      if (!offs.empty()) row["off_dev_pct"] = Pct(MedianD(offs));
    } else if (in_a) {
      ++only_a[cls];
    } else {
      ++only_b[cls];
    }
    rows.push_back(std::move(row));
  }
  // Largest first: time per iteration in A, then in B.
  auto time_of = [](const json& side) { return side.is_null() ? 0.0 : side["time_us"].get<double>(); };
  std::stable_sort(rows.begin(), rows.end(), [&](const json& x, const json& y) {
    const double tx = std::max(time_of(x["a"]), time_of(x["b"])), ty = std::max(time_of(y["a"]), time_of(y["b"]));
    return tx > ty;
  });
  json summary = {{"scope", "compute kernels in both, per instance (a kernel name and its k-th launch in the "
                            "iteration); percentages of the kernel's duration, or of A's iteration time for offsets"},
                  {"instances", dur_dev.size()},
                  {"names_in_both", both},
                  {"names_with_other_count", count_mismatch},
                  {"only_in_a", only_a},
                  {"only_in_b", only_b},
                  {"duration_deviation", Dist(dur_dev)},
                  {"duration_natural_variance_a", Dist(dur_var_a)},
                  {"duration_natural_variance_b", Dist(dur_var_b)},
                  {"offset_deviation", Dist(off_dev)},
                  {"offset_natural_variance_a", Dist(off_var_a)},
                  {"offset_natural_variance_b", Dist(off_var_b)},
                  {"iteration_time_deviation_pct", Pct((sb->iter_us - sa->iter_us) / sa->iter_us)}};
  return json{{"a", SideSummary(*sa, a, "A")}, {"b", SideSummary(*sb, b, "B")}, {"skip", opts.skip},
              {"rows", rows}, {"summary", summary}};
}

namespace {

std::string F(const json& v, int digits, bool sign = false) {
  if (v.is_null()) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, sign ? "%+.*f" : "%.*f", digits, v.get<double>());
  return buf;
}

std::string Cut(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n - 3) + "..."; }

std::string DistText(const json& d) {
  if (d.is_null()) return "-";
  char buf[96];
  std::snprintf(buf, sizeof buf, "median %.2f%%, p90 %.2f%%", d["median_pct"].get<double>(),
                d["p90_pct"].get<double>());
  return buf;
}

}  // namespace

std::string KernelCompareText(const json& c, int rows) {
  std::ostringstream o;
  for (const char* side : {"a", "b"}) {
    const json& s = c[side];
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s  %s rank %d: %d iterations (from %lld, %d skipped), %.3f ms per iteration, %.1f records per "
                  "iteration, %d names\n",
                  side[0] == 'a' ? "A" : "B", s["source"].get<std::string>().c_str(), s["rank"].get<int>(),
                  s["iterations"].get<int>(), static_cast<long long>(s["first_iteration"].get<int64_t>()),
                  c["skip"].get<int>(), s["iteration_us"].get<double>() / 1000.0,
                  s["records_per_iteration"].get<double>(), s["names"].get<int>());
    o << buf;
    const json& cl = s["clock"];
    o << "   clock: " << cl["stamps_matched"].get<int>() << " of " << cl["stamps"].get<int>()
      << " libprism stamps matched to their kernels";
    if (cl["stamp_correction_applied"].get<bool>()) {
      o << ", residual median " << F(cl["residual_median_us"], 2) << " us";
    } else {
      o << " (no correction: times from the sync lines)";
    }
    o << "\n";
    for (const json& w : s["warnings"]) o << "   warning: " << w.get<std::string>() << "\n";
  }
  o << "\n";
  char hdr[512];
  std::snprintf(hdr, sizeof hdr, "%-44s %5s %5s | %9s %9s %8s %6s %6s | %9s %9s %7s %6s %6s\n", "", "count", "",
                "duration", "(us)", "", "var", "var", "launch", "offset", "(ms)", "var", "var");
  o << hdr;
  std::snprintf(hdr, sizeof hdr, "%-44s %5s %5s | %9s %9s %8s %6s %6s | %9s %9s %7s %6s %6s\n", "kernel", "A", "B",
                "A", "B", "dev%", "A%", "B%", "A", "B", "dev%it", "A%it", "B%it");
  o << hdr;
  int shown = 0;
  for (const json& r : c["rows"]) {
    if (shown++ >= rows) break;
    const json& a = r["a"];
    const json& b = r["b"];
    auto side = [](const json& s, const char* k) { return s.is_null() ? json(nullptr) : s[k]; };
    auto ms = [&](const json& s) {
      json v = side(s, "off_us");
      return v.is_null() ? v : json(v.get<double>() / 1000.0);
    };
    std::string name = Cut(r["short"].get<std::string>(), r["graph"].get<bool>() ? 41 : 44);
    if (r["graph"].get<bool>()) name += " [g]";
    char line[512];
    std::snprintf(line, sizeof line, "%-44s %5s %5s | %9s %9s %8s %6s %6s | %9s %9s %7s %6s %6s\n", name.c_str(),
                  F(side(a, "count"), 0).c_str(), F(side(b, "count"), 0).c_str(), F(side(a, "dur_us"), 1).c_str(),
                  F(side(b, "dur_us"), 1).c_str(), F(r["dur_dev_pct"], 1, true).c_str(),
                  F(side(a, "dur_var_pct"), 1).c_str(), F(side(b, "dur_var_pct"), 1).c_str(), F(ms(a), 3).c_str(),
                  F(ms(b), 3).c_str(), F(r["off_dev_pct"], 2).c_str(), F(side(a, "off_var_pct"), 2).c_str(),
                  F(side(b, "off_var_pct"), 2).c_str());
    o << line;
  }
  const int total = static_cast<int>(c["rows"].size());
  if (total > rows) o << "(" << (total - rows) << " more kernels; --rows N or --json for all)\n";
  const json& s = c["summary"];
  o << "\nsummary: " << s["instances"].get<int>() << " instances of " << s["names_in_both"].get<int>()
    << " names in both (compute kernels; an instance is a kernel name and its k-th launch in the iteration)\n";
  o << "  duration deviation |B-A|/A         " << DistText(s["duration_deviation"]) << "\n";
  o << "  natural variance of duration   A  " << DistText(s["duration_natural_variance_a"]) << "\n";
  o << "                                 B  " << DistText(s["duration_natural_variance_b"]) << "\n";
  o << "  launch offset deviation / iter     " << DistText(s["offset_deviation"]) << "\n";
  o << "  natural variance of offset     A  " << DistText(s["offset_natural_variance_a"]) << "\n";
  o << "                                 B  " << DistText(s["offset_natural_variance_b"]) << "\n";
  o << "  iteration time B vs A              " << F(s["iteration_time_deviation_pct"], 2, true) << "%\n";
  auto classes = [](const json& m) {
    std::string t;
    int n = 0;
    for (const auto& [k, v] : m.items()) {
      n += v.get<int>();
      t += (t.empty() ? "" : ", ") + k + " " + std::to_string(v.get<int>());
    }
    return std::to_string(n) + (t.empty() ? "" : " (" + t + ")");
  };
  o << "  names only in A: " << classes(s["only_in_a"]) << "; only in B: " << classes(s["only_in_b"])
    << "; in both with another count per iteration: " << s["names_with_other_count"].get<int>() << "\n";
  o << "columns: count = median launches per iteration; duration = median over launches; dev% = (B-A)/A; var = "
       "natural variance (median absolute deviation across iterations, per instance, median over instances); "
       "launch offset = first launch's median start after the iteration's start; dev%it = median over instances "
       "of |B-A| in % of A's iteration time; [g] = launched from a CUDA graph\n";
  return o.str();
}

}  // namespace prism::analysis
