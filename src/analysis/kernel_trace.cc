// A rank's kernels in trace.json: one thread per CUDA stream, CUDA graph launches, NVTX ranges, and the summary of
// its kernel file and clock alignment (kernel_report.h, trace.json).
#include "analysis/kernel_report.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "prism/kernels.h"

namespace prism::analysis {

using nlohmann::json;

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

}  // namespace prism::analysis
