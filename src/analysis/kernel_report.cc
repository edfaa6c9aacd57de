#include "analysis/kernel_report.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "prism/kernels.h"
#include "analysis/run_report.h"
#include "common/bounded_read.h"
#include "common/document_shape.h"
#include "prism/events.h"
#include "prism/limits.h"

namespace prism::analysis {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t I(const json& j, const char* key, int64_t dflt = 0) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return dflt;
  if (it->is_number_float()) {
    // Why the bounds: casting a double past int64 (1e308) is undefined behaviour.
    const double d = it->get<double>();
    if (!std::isfinite(d)) return dflt;
    if (d >= 9.2e18) return INT64_MAX;
    if (d <= -9.2e18) return INT64_MIN;
    return static_cast<int64_t>(d);
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return INT64_MAX;
  return it->get<int64_t>();
}

// The lines of a whole file as ReadRankEventLog takes them: an unterminated last line is still being written (or
// was cut by a kill) and is left out.
template <typename F>
void ForEachLine(const std::string& text, F&& f) {
  for (size_t start = 0, nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    f(std::string_view(text).substr(start, nl - start));
  }
}

std::string S(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

// Piecewise-linear interpolation over points sorted by x, clamped at both ends; 0 without points.
int64_t Interp(const std::vector<std::pair<int64_t, int64_t>>& pts, int64_t x) {
  if (pts.empty()) return 0;
  if (x <= pts.front().first) return pts.front().second;
  if (x >= pts.back().first) return pts.back().second;
  auto it = std::upper_bound(pts.begin(), pts.end(), x,
                             [](int64_t v, const std::pair<int64_t, int64_t>& p) { return v < p.first; });
  const auto& [x1, y1] = *it;
  const auto& [x0, y0] = *(it - 1);
  if (x1 == x0) return y1;
  const long double f = static_cast<long double>(x - x0) / static_cast<long double>(x1 - x0);
  return y0 + static_cast<int64_t>(std::llround(f * static_cast<long double>(y1 - y0)));
}

double MedianD(std::vector<double> v) { return Median(std::move(v)); }

int64_t MedianI(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

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

bool IsStampKernel(const std::string& name) { return name == "prism_stamp" || name == "prism_stamp_step"; }

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// The file

void ParseKernelLine(const std::string& line, KernelFile* f) {
  std::string why;
  if (!CheckJsonShape(line, DocumentBounds{}, &why)) {
    ++f->malformed;
    return;
  }
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    ++f->malformed;
    return;
  }
  const std::string type = S(j, "type");
  if (type == "k" || type == "m" || type == "ms") {
    KernelRecord r;
    r.kind = type == "k" ? KernelKind::kKernel : (type == "m" ? KernelKind::kMemcpy : KernelKind::kMemset);
    r.start_ns = I(j, "s");
    r.end_ns = I(j, "e");
    r.device = static_cast<uint32_t>(I(j, "dev"));
    r.context = static_cast<uint32_t>(I(j, "ctx"));
    r.stream = static_cast<uint32_t>(I(j, "st"));
    r.correlation = static_cast<uint32_t>(I(j, "c"));
    r.graph = static_cast<uint32_t>(I(j, "g"));
    r.graph_node = static_cast<uint64_t>(I(j, "gn"));
    if (r.kind == KernelKind::kKernel) {
      r.name = static_cast<int32_t>(I(j, "n", -1));
      for (const char* key : {"grid", "block"}) {
        auto it = j.find(key);
        if (it == j.end() || !it->is_array() || it->size() != 3) continue;
        int32_t* dst = std::string(key) == "grid" ? r.grid : r.block;
        for (int i = 0; i < 3; ++i) dst[i] = (*it)[i].is_number() ? (*it)[i].get<int32_t>() : 0;
      }
    } else {
      r.bytes = static_cast<uint64_t>(I(j, "b"));
      r.copy_kind = static_cast<int>(I(j, "kind"));
    }
    if (r.end_ns < r.start_ns || r.start_ns <= 0) {
      ++f->malformed;
      return;
    }
    f->records.push_back(r);
  } else if (type == "name") {
    const int64_t id = I(j, "id", -1);
    if (id < 0 || id > (1 << 24)) {
      ++f->malformed;
      return;
    }
    if (f->names.size() <= static_cast<size_t>(id)) f->names.resize(static_cast<size_t>(id) + 1);
    f->names[static_cast<size_t>(id)] = S(j, "name");
  } else if (type == "sync") {
    KernelSync s;
    s.host_ns = I(j, "host_ns");
    s.cupti_minus_host_ns = I(j, "cupti_minus_host_ns");
    s.gpu_minus_host_ns = I(j, "gpu_minus_host_ns");
    auto it = j.find("gpu");
    s.gpu_known = it != j.end() && it->is_boolean() && it->get<bool>();
    if (s.host_ns > 0) f->syncs.push_back(s);
  } else if (type == "nvtx") {
    NvtxMarker m;
    m.t_ns = I(j, "t");
    m.id = static_cast<uint32_t>(I(j, "id"));
    m.flags = static_cast<int>(I(j, "f"));
    m.thread = static_cast<uint32_t>(I(j, "tid"));
    m.name = static_cast<int32_t>(I(j, "n", -1));
    m.domain = static_cast<int32_t>(I(j, "dm", -1));
    f->markers.push_back(m);
  } else if (type == "kernels") {
    f->has_header = true;
    f->rank = static_cast<int>(I(j, "rank", -1));
    f->pid = I(j, "pid", -1);
    f->status = S(j, "status");
    f->why = S(j, "why");
    f->cupti = S(j, "cupti");
    f->cupti_version = I(j, "cupti_version");
    f->kinds.clear();
    if (auto it = j.find("kinds"); it != j.end() && it->is_array()) {
      for (const json& k : *it)
        if (k.is_string()) f->kinds.push_back(k.get<std::string>());
    }
  } else if (type == "end") {
    f->ended = true;
    f->dropped = I(j, "dropped");
  }
  // Other types: from a newer libprism, ignored on purpose.
}

std::optional<KernelFile> ReadKernelFile(const std::string& path, std::string* error) {
  std::string text;
  if (!ReadFileBounded(path, limits::kMaxKernelFileBytes, "kernel files", &text, error)) return std::nullopt;
  KernelFile f;
  ForEachLine(text, [&](std::string_view line) {
    if (!line.empty()) ParseKernelLine(std::string(line), &f);
  });
  return f;
}

// ---------------------------------------------------------------------------------------------------------------
// Clocks

KernelClock::KernelClock(std::vector<KernelSync> syncs) {
  for (const KernelSync& s : syncs) {
    cupti_.emplace_back(s.host_ns + s.cupti_minus_host_ns, s.cupti_minus_host_ns);
    if (s.gpu_known) gpu_.emplace_back(s.host_ns, s.gpu_minus_host_ns);
  }
  std::sort(cupti_.begin(), cupti_.end());
  std::sort(gpu_.begin(), gpu_.end());
}

int64_t KernelClock::CuptiToHost(int64_t cupti_ns) const { return cupti_ns - Interp(cupti_, cupti_ns); }

int64_t KernelClock::HostToGpu(int64_t host_ns) const { return host_ns + Interp(gpu_, host_ns); }

int64_t StampFit::Correction(int64_t t) const { return applied ? Interp(knots, t) : 0; }

StampFit FitStamps(const std::vector<int64_t>& starts, std::vector<int64_t> stamps) {
  StampFit fit;
  std::sort(stamps.begin(), stamps.end());
  fit.stamps = static_cast<int>(stamps.size());
  if (starts.empty() || stamps.empty()) return fit;
  // 1. The offset at the start of the run: the most common stamp - start difference (a 4 us window) over the
  // first 3 s of stamps, against every stamp kernel within 2 ms (50 ms if that finds nothing). A stamp's own kernel
  // gives the same difference every time; wrong pairings spread out.
  constexpr int64_t kWindow = 4000, kTrack = 10000;
  auto initial_offset = [&](int64_t search, int64_t* delta) {
    std::vector<int64_t> diffs;
    size_t considered = 0;
    for (size_t i = 0; i < stamps.size() && i < 2000 && stamps[i] - stamps.front() < 3000000000ll; ++i) {
      ++considered;
      const int64_t s = stamps[i];
      auto lo = std::lower_bound(starts.begin(), starts.end(), s - search);
      for (int n = 0; lo != starts.end() && *lo <= s + search && n < 400; ++lo, ++n) diffs.push_back(s - *lo);
    }
    if (diffs.empty()) return false;
    std::sort(diffs.begin(), diffs.end());
    std::vector<size_t> count(diffs.size());
    size_t best_n = 0;
    for (size_t i = 0, j = 0; i < diffs.size(); ++i) {
      while (j < diffs.size() && diffs[j] - diffs[i] <= kWindow) ++j;
      count[i] = j - i;
      best_n = std::max(best_n, count[i]);
    }
    // Why a share of the stamps: each stamp adds exactly one difference to the true offset's window, while chance
    // clusters of wrong pairings hold a few.
    if (best_n < std::min<size_t>(3, considered) || best_n * 10 < considered * 3) return false;
    // Why the tie-break towards 0: a train of evenly spaced stamps matches at every multiple of its period nearly
    // as well; the sync lines are good to far less than a period, so the true offset is the one nearest 0.
    size_t best_i = 0;
    int64_t best_abs = INT64_MAX;
    for (size_t i = 0; i < diffs.size(); ++i) {
      if (count[i] * 5 < best_n * 4) continue;
      const int64_t mid = diffs[i] + kWindow / 2;
      if (std::llabs(mid) < best_abs) {
        best_abs = std::llabs(mid);
        best_i = i;
      }
    }
    *delta = MedianI(std::vector<int64_t>(diffs.begin() + static_cast<std::ptrdiff_t>(best_i),
                                          diffs.begin() + static_cast<std::ptrdiff_t>(best_i + count[best_i])));
    return true;
  };
  // Within 2 ms first (what the sync lines should give); 50 ms when that finds nothing.
  int64_t delta = 0;
  if (!initial_offset(2000000, &delta) && !initial_offset(50000000, &delta)) return fit;
  // 2. Along the run: each stamp's kernel is the stamp kernel starting nearest to stamp - offset (within 10 us);
  // the offset follows the last matches (the clocks drift by a few us per second).
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (stamp, stamp - start)
  std::deque<int64_t> recent;
  for (int64_t s : stamps) {
    const int64_t target = s - delta;
    auto it = std::lower_bound(starts.begin(), starts.end(), target);
    int64_t best = -1, best_d = kTrack + 1;
    for (auto c : {it, it == starts.begin() ? starts.end() : it - 1}) {
      if (c == starts.end()) continue;
      const int64_t d = std::llabs(*c - target);
      if (d < best_d) {
        best_d = d;
        best = *c;
      }
    }
    if (best < 0) continue;
    pairs.emplace_back(s, s - best);
    recent.push_back(s - best);
    if (recent.size() > 9) recent.pop_front();
    delta = MedianI(std::vector<int64_t>(recent.begin(), recent.end()));
  }
  fit.matched = static_cast<int>(pairs.size());
  if (pairs.size() < 3) return fit;
  // 3. One knot per second of run: the median correction there.
  std::vector<int64_t> ts, rs;
  int64_t bucket_start = pairs.front().first;
  auto flush = [&] {
    if (ts.empty()) return;
    fit.knots.emplace_back(MedianI(ts), MedianI(rs));
    ts.clear();
    rs.clear();
  };
  for (const auto& [s, r] : pairs) {
    if (s - bucket_start >= 1000000000ll) {
      flush();
      bucket_start = s;
    }
    ts.push_back(s);
    rs.push_back(r);
  }
  flush();
  fit.applied = true;
  std::vector<double> res;
  for (const auto& [s, r] : pairs) res.push_back(std::fabs(static_cast<double>(r - fit.Correction(s))));
  fit.residual_median_ns = MedianD(res);
  return fit;
}

// ---------------------------------------------------------------------------------------------------------------
// One rank

std::vector<int> KernelRanksIn(const std::string& dir) {
  std::vector<int> out;
  std::error_code ec;
  static const std::regex re("rank([0-9]+)\\.kernels\\.jsonl");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, re)) out.push_back(std::stoi(m[1].str()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<RankKernels> LoadRankKernels(const std::string& dir, int rank, std::string* error) {
  const std::string path = (fs::path(dir) / kernels::FileName(rank)).string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    *error = "no kernel file " + path + " (run prism-run with --kernels)";
    return std::nullopt;
  }
  auto file = ReadKernelFile(path, error);
  if (!file) return std::nullopt;
  // Why an error and not a warning: nothing in it was readable, so whatever follows would be about nothing.
  if (!file->has_header && file->records.empty() && file->malformed > 0) {
    *error = path + ": not a kernel file (no header line, no records, " + std::to_string(file->malformed) +
             " unreadable lines)";
    return std::nullopt;
  }
  RankKernels rk;
  rk.rank = rank;
  rk.file = std::move(*file);
  KernelFile& f = rk.file;
  const std::string who = "rank " + std::to_string(rank) + " kernels: ";
  if (!f.has_header) rk.warnings.push_back(who + "no header line in " + path);
  if (f.status == "off") rk.warnings.push_back(who + "not recorded: " + f.why);
  if (f.status == "on" && !f.ended)
    rk.warnings.push_back(who + "no end line (the rank did not exit cleanly): the last records may be missing");
  if (f.dropped > 0) rk.warnings.push_back(who + std::to_string(f.dropped) + " records dropped by CUPTI");
  if (f.malformed > 0) rk.warnings.push_back(who + std::to_string(f.malformed) + " malformed lines skipped");

  // 1. CUPTI -> GPU clock.
  KernelClock clock(f.syncs);
  if (!f.records.empty() && f.syncs.empty()) rk.warnings.push_back(who + "no sync lines: times taken as they are");
  for (KernelRecord& r : f.records) {
    r.start_ns = clock.CuptiToGpu(r.start_ns);
    r.end_ns = clock.CuptiToGpu(r.end_ns);
  }
  for (NvtxMarker& m : f.markers) m.t_ns = clock.CuptiToGpu(m.t_ns);

  // The event file: iteration marks (the report's iterations) and every stamp libprism's kernels wrote.
  std::vector<int64_t> stamps;
  std::vector<std::pair<int64_t, int64_t>> iters;  // (iteration, t)
  {
    // A run without an event file has no marks and no stamps; one that is there is read within its cap.
    const std::string events_path = (fs::path(dir) / events::FileName(rank)).string();
    std::string text;
    if (fs::exists(events_path, ec) &&
        !ReadFileBounded(events_path, limits::kMaxEventFileBytes, "event files", &text, error)) {
      return std::nullopt;
    }
    ForEachLine(text, [&](std::string_view line) {
      if (line.find("\"iter\"") == std::string::npos && line.find("\"op\"") == std::string::npos) return;
      std::string why;
      if (!CheckJsonShape(line, DocumentBounds{}, &why)) return;
      json j = json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object()) return;
      const std::string type = S(j, "type");
      if (type == events::kIter) {
        int64_t t = I(j, "t_ns");
        if (t <= 0) return;
        if (S(j, "clock") == "host") {
          t = clock.HostToGpu(t);
        } else {
          stamps.push_back(t);
        }
        iters.emplace_back(I(j, "iteration", static_cast<int64_t>(iters.size())), t);
      } else if (type == events::kOp) {
        const int64_t a = I(j, "arrival_ns");
        if (a > 0) stamps.push_back(a);
      }
    });
  }
  std::sort(iters.begin(), iters.end());
  for (const auto& [n, t] : iters) {
    rk.iteration_index.push_back(n);
    rk.iteration_t_ns.push_back(t);
  }

  // 2. Stamp kernels against their stamps.
  std::vector<int64_t> starts;
  for (const KernelRecord& r : f.records) {
    if (r.kind == KernelKind::kKernel && r.name >= 0 && static_cast<size_t>(r.name) < f.names.size() &&
        IsStampKernel(f.names[static_cast<size_t>(r.name)]))
      starts.push_back(r.start_ns);
  }
  std::sort(starts.begin(), starts.end());
  rk.fit = FitStamps(starts, stamps);
  if (rk.fit.applied) {
    for (KernelRecord& r : f.records) {
      const int64_t c = rk.fit.Correction(r.start_ns);
      r.start_ns += c;
      r.end_ns += c;
    }
    for (NvtxMarker& m : f.markers) m.t_ns += rk.fit.Correction(m.t_ns);
  } else if (!starts.empty() && !stamps.empty()) {
    rk.warnings.push_back(who + "libprism's stamps could not be matched to its stamp kernels (" +
                          std::to_string(rk.fit.matched) + " of " + std::to_string(stamps.size()) +
                          "): the kernels rest on the sync lines alone");
  }
  if (!clock.gpu_known() && !rk.fit.applied && !f.records.empty() && !stamps.empty())
    rk.warnings.push_back(who + "the GPU clock offset was never measured: kernels may be offset from the collectives");
  std::stable_sort(f.records.begin(), f.records.end(),
                   [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });

  // NVTX: a start and an end marker with the same id make a range; instantaneous markers stay points.
  std::unordered_map<uint32_t, const NvtxMarker*> open;
  for (const NvtxMarker& m : f.markers) {
    if (m.flags & kernels::kMarkerStart) {
      open[m.id] = &m;
    } else if (m.flags & kernels::kMarkerEnd) {
      auto it = open.find(m.id);
      if (it == open.end()) continue;
      const NvtxMarker& s = *it->second;
      rk.nvtx.push_back(NvtxRange{s.t_ns, std::max(s.t_ns, m.t_ns), s.thread, s.name, s.domain});
      open.erase(it);
    } else if (m.flags & kernels::kMarkerInstant) {
      rk.nvtx.push_back(NvtxRange{m.t_ns, m.t_ns, m.thread, m.name, m.domain});
    }
  }
  return rk;
}

// ---------------------------------------------------------------------------------------------------------------
// Names

namespace {

// Splits off the depth-0 parts: the text with every <...> and (...) group removed.
std::string StripGroups(const std::string& s) {
  std::string out;
  int depth = 0;
  for (char c : s) {
    if (c == '<' || c == '(') {
      ++depth;
    } else if (c == '>' || c == ')') {
      if (depth > 0) --depth;
    } else if (depth == 0) {
      out += c;
    }
  }
  return out;
}

// The last "::" component that is a name (not "{lambda#1}" and the like).
std::string LastComponent(const std::string& s) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (true) {
    size_t j = s.find("::", i);
    parts.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) break;
    i = j + 2;
  }
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    std::string p = *it;
    while (!p.empty() && p.front() == ' ') p.erase(p.begin());
    while (!p.empty() && p.back() == ' ') p.pop_back();
    if (!p.empty() && p.front() != '{') return p;
  }
  return parts.empty() ? s : parts.back();
}

}  // namespace

std::string ShortKernelName(const std::string& demangled) {
  std::string s = demangled;
  for (const char* anon : {"(anonymous namespace)::", "(anonymous namespace)"}) {
    const size_t len = std::char_traits<char>::length(anon);
    for (size_t p; (p = s.find(anon)) != std::string::npos;) s.erase(p, len);
  }
  // Cut the parameter list: the first '(' outside template arguments.
  int depth = 0;
  size_t cut = std::string::npos;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++depth;
    else if (c == '>' && depth > 0) --depth;
    else if (c == '(' && depth == 0) {
      cut = i;
      break;
    }
  }
  if (cut != std::string::npos && cut > 0) s = s.substr(0, cut);
  // The return type: everything before the last space outside template arguments.
  depth = 0;
  size_t name_at = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++depth;
    else if (c == '>' && depth > 0) --depth;
    else if (c == ' ' && depth == 0) name_at = i + 1;
  }
  s = s.substr(name_at);
  // Base name and template arguments.
  const size_t lt = s.find('<');
  std::string base = LastComponent(lt == std::string::npos ? s : s.substr(0, lt));
  std::string arg;
  if (lt != std::string::npos) {
    std::vector<std::string> args;
    depth = 0;
    std::string cur;
    for (size_t i = lt + 1; i < s.size(); ++i) {
      const char c = s[i];
      if (c == '<' || c == '(') ++depth;
      if ((c == '>' || c == ')') && depth > 0) {
        --depth;
      } else if (c == '>' && depth == 0) {
        args.push_back(cur);
        break;
      }
      if (c == ',' && depth == 0) {
        args.push_back(cur);
        cur.clear();
        continue;
      }
      cur += c;
    }
    for (std::string a : args) {
      while (!a.empty() && a.front() == ' ') a.erase(a.begin());
      if (a.empty() || std::isdigit(static_cast<unsigned char>(a[0])) || a[0] == '-' || a[0] == '(' || a == "true" ||
          a == "false")
        continue;
      arg = LastComponent(StripGroups(a));
      // Why also "unsigned int"-like: plain types say little; keep looking for a named argument.
      if (arg.find(' ') != std::string::npos || arg == "float" || arg == "int" || arg == "half" || arg == "double" ||
          arg == "bool" || arg == "char") {
        arg.clear();
        continue;
      }
      break;
    }
  }
  std::string out = arg.empty() ? base : base + "<" + arg + ">";
  if (out.empty()) out = demangled.substr(0, 80);
  if (out.size() > 80) out = out.substr(0, 77) + "...";
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// trace.json

size_t AppendKernelTraceEvents(const RankKernels& rk, int pid, size_t cap, json* events) {
  const KernelFile& f = rk.file;
  std::vector<std::string> shorts(f.names.size());
  for (size_t i = 0; i < f.names.size(); ++i) shorts[i] = ShortKernelName(f.names[i]);
  struct GraphLaunch {
    int64_t start = INT64_MAX, end = 0;
    int kernels = 0;
    std::set<uint32_t> streams;
  };
  std::map<std::pair<uint32_t, uint32_t>, GraphLaunch> graphs;  // (graph, correlation of the launch)
  size_t n = 0, skipped = 0;
  for (const KernelRecord& r : f.records) {
    if (n >= cap) {
      ++skipped;
      continue;
    }
    ++n;
    json e = {{"ph", "X"}, {"pid", pid}, {"tid", "stream " + std::to_string(r.stream)},
              {"ts", static_cast<double>(r.start_ns) / 1000.0},
              {"dur", static_cast<double>(r.end_ns - r.start_ns) / 1000.0}};
    json args = json::object();
    if (r.kind == KernelKind::kKernel) {
      const bool named = r.name >= 0 && static_cast<size_t>(r.name) < f.names.size();
      e["name"] = named ? shorts[static_cast<size_t>(r.name)] : "kernel";
      e["cat"] = "kernel";
      if (named && f.names[static_cast<size_t>(r.name)] != shorts[static_cast<size_t>(r.name)])
        args["name"] = f.names[static_cast<size_t>(r.name)].substr(0, 300);
      args["grid"] = {r.grid[0], r.grid[1], r.grid[2]};
      args["block"] = {r.block[0], r.block[1], r.block[2]};
    } else if (r.kind == KernelKind::kMemcpy) {
      e["name"] = std::string("Memcpy ") + kernels::CopyKindName(r.copy_kind);
      e["cat"] = "memcpy";
      args["bytes"] = r.bytes;
    } else {
      e["name"] = "Memset";
      e["cat"] = "memset";
      args["bytes"] = r.bytes;
    }
    args["correlation"] = r.correlation;
    if (r.graph != 0) {
      args["graph"] = r.graph;
      args["graph_node"] = r.graph_node;
      GraphLaunch& g = graphs[{r.graph, r.correlation}];
      g.start = std::min(g.start, r.start_ns);
      g.end = std::max(g.end, r.end_ns);
      ++g.kernels;
      g.streams.insert(r.stream);
    }
    e["args"] = std::move(args);
    events->push_back(std::move(e));
  }
  for (const auto& [key, g] : graphs) {
    events->push_back({{"name", "graph " + std::to_string(key.first)},
                       {"cat", "graph"},
                       {"ph", "X"},
                       {"pid", pid},
                       {"tid", "graphs"},
                       {"ts", static_cast<double>(g.start) / 1000.0},
                       {"dur", static_cast<double>(g.end - g.start) / 1000.0},
                       {"args", {{"graph", key.first}, {"correlation", key.second}, {"records", g.kernels},
                                 {"streams", std::vector<uint32_t>(g.streams.begin(), g.streams.end())}}}});
  }
  for (const NvtxRange& r : rk.nvtx) {
    const bool named = r.name >= 0 && static_cast<size_t>(r.name) < f.names.size();
    json e = {{"name", named ? f.names[static_cast<size_t>(r.name)] : std::string("nvtx")},
              {"cat", "nvtx"},
              {"pid", pid},
              {"tid", "nvtx " + std::to_string(r.thread)},
              {"ts", static_cast<double>(r.start_ns) / 1000.0}};
    if (r.end_ns > r.start_ns) {
      e["ph"] = "X";
      e["dur"] = static_cast<double>(r.end_ns - r.start_ns) / 1000.0;
    } else {
      e["ph"] = "i";
      e["s"] = "t";
    }
    if (r.domain >= 0 && static_cast<size_t>(r.domain) < f.names.size())
      e["args"] = {{"domain", f.names[static_cast<size_t>(r.domain)]}};
    events->push_back(std::move(e));
  }
  return skipped;
}

json KernelTraceSummary(const RankKernels& rk) {
  const KernelFile& f = rk.file;
  int64_t k = 0, m = 0, ms = 0, graph = 0;
  for (const KernelRecord& r : f.records) {
    if (r.kind == KernelKind::kKernel) ++k;
    else if (r.kind == KernelKind::kMemcpy) ++m;
    else ++ms;
    if (r.graph != 0) ++graph;
  }
  json clock = {{"gpu_offset_measured", KernelClock(f.syncs).gpu_known()},
                {"sync_points", f.syncs.size()},
                {"stamps", rk.fit.stamps},
                {"stamps_matched", rk.fit.matched},
                {"stamp_correction_applied", rk.fit.applied},
                {"residual_median_us", rk.fit.residual_median_ns / 1000.0}};
  if (rk.fit.applied) {
    clock["correction_us"] = {static_cast<double>(rk.fit.knots.front().second) / 1000.0,
                              static_cast<double>(rk.fit.knots.back().second) / 1000.0};
  }
  return {{"rank", rk.rank},       {"status", f.status},  {"why", f.why},         {"cupti", f.cupti},
          {"kinds", f.kinds},      {"kernels", k},        {"memcpy", m},          {"memset", ms},
          {"in_graphs", graph},    {"nvtx", rk.nvtx.size()}, {"dropped", f.dropped}, {"complete", f.ended},
          {"clock", clock},        {"warnings", rk.warnings}};
}

// ---------------------------------------------------------------------------------------------------------------
// The report

namespace {

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
