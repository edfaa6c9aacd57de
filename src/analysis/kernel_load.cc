// A rank's kernel file read and put on the clock of its events (kernel_report.h: the file, one rank): parsing,
// the rank's iteration marks and libprism's stamps from its event file, then KernelClock and FitStamps
// (kernel_clock.cc) applied to every record and NVTX marker.
#include "analysis/kernel_report.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <regex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/bounded_read.h"
#include "common/document_shape.h"
#include "prism/events.h"
#include "prism/kernels.h"
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

}  // namespace prism::analysis
