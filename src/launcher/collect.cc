#include "launcher/collect.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/sizes.h"
#include "coordinator/swap/swap_scheduler.h"
#include "model/world.h"
#include "launcher/emulate.h"
#include "analysis/observed_trace.h"

namespace prism::launcher {
using namespace ::prism::analysis;  // the post-run analysis (src/analysis) this file calls
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json LoadJson(const fs::path& p) {
  std::ifstream in(p);
  return in ? json::parse(in, nullptr, false) : json();
}

// The context-switching figures the coordinator left in status.json ("swap"), printed and copied into report.json.
void SwapSummary(const fs::path& out, const std::string& prefix) {
  json st = LoadJson(out / "status.json");
  if (st.is_discarded() || !st.is_object() || !st.contains("swap") || !st["swap"].is_object()) {
    std::printf("%scontext switching: no figures (status.json has none)\n", prefix.c_str());
    return;
  }
  const json& s = st["swap"];
  auto b = [&](const char* k) { return FormatBytes(s.value(k, uint64_t{0})); };
  const int failures = s.value("failures", 0);
  const std::string failed =
      failures ? "; " + std::to_string(failures) + " swap(s) FAILED (see the lines above)" : std::string();
  // Where the footprints came from (coordinator SwapMeasure): measured per process, or the tracked peak + context.
  std::string from = s.value("footprint_source", std::string());
  const int measured = s.value("footprints_measured", 0), ranks = s.value("ranks", 0);
  if (!from.empty() && measured > 0) {
    from += measured >= ranks ? " for all " + std::to_string(ranks) + " rank(s)"
                              : " for " + std::to_string(measured) + " of " + std::to_string(ranks) +
                                    " rank(s), the others tracked peak + " + b("context_bytes") + " context";
  } else if (from.rfind("measured", 0) == 0) {
    from += ", but no rank's process was in its answer: tracked peak + " + b("context_bytes") + " context";
  }
  if (!from.empty()) from = "; footprints: " + from;
  std::printf("%scontext switching: %d/%d rank(s) finished; %llu swap(s) out (%s, %.1f s) and %llu in "
              "(%s, %.1f s); peak on one GPU %s of its cap %s; peak in host RAM %s of %s%s%s\n",
              prefix.c_str(), s.value("finished", 0), s.value("ranks", 0),
              static_cast<unsigned long long>(s.value("swaps_out", uint64_t{0})), b("bytes_out").c_str(),
              s.value("seconds_out", 0.0), static_cast<unsigned long long>(s.value("swaps_in", uint64_t{0})),
              b("bytes_in").c_str(), s.value("seconds_in", 0.0), b("peak_gpu_bytes").c_str(),
              b("gpu_cap_bytes").c_str(), b("peak_host_bytes").c_str(),
              s.value("host_cap_bytes", uint64_t{0}) ? b("host_cap_bytes").c_str() : "no budget", from.c_str(),
              failed.c_str());
  std::string error;
  if (!MergeIntoReport((out / "report.json").string(), {{"swap", s}}, &error))
    std::printf("%s%s\n", prefix.c_str(), error.c_str());
}

// When some expert-parallel classes had no real rank: the graph repeats another ep coordinate's nodes for them
// (observed_trace.h, mirror_expert_classes). Says so, from the run's report.json (layout) and its event files.
void EpSymmetryNote(const fs::path& out, bool real_routing, const std::string& prefix) {
  json rep = LoadJson(out / "report.json");
  if (rep.is_discarded() || !rep.is_object() || !rep.contains("layout") || !rep["layout"].is_object()) return;
  std::string error;
  auto layout = world::ParseLayout(rep["layout"].value("spec", ""), &error);
  const int world_size = rep.value("world_size", 0);
  if (!layout || layout->ep <= 1 || world_size <= 0 ||
      !world::ResolveLayout(&*layout, world_size, std::to_string(world_size) + " ranks", &error))
    return;
  auto w = world::World::Make(*layout, std::max(1, rep.value("gpus_per_node", 8)), &error);
  if (!w) return;
  const std::vector<int> real = EventFileRanks(out.string());
  size_t mirrored = 0;
  if (CoversEveryClass(*w, real) || !CoversEveryClassOrEpStandIn(*w, real, &mirrored) || mirrored == 0) return;
  std::printf("%snote: expert parallelism (ep %d)%s: %zu expert-parallel class(es) had no real rank; the graph "
              "repeats for them the nodes of the real rank that differs only in ep (EP symmetry assumed: mirrored "
              "MoE routing)%s\n",
              prefix.c_str(), layout->ep, real_routing ? "" : " without --real-routing", mirrored,
              real_routing ? "" : ". Add --real-routing to run them for real");
}

// A rank's log naming CUDA's out-of-memory error: the replica did not fit on the GPUs together.
bool LogsSayOutOfMemory(const fs::path& out) {
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(out / "logs", ec)) {
    std::ifstream in(f.path());
    std::string line;
    while (std::getline(in, line))
      if (line.find("CUDA out of memory") != std::string::npos || line.find("OutOfMemoryError") != std::string::npos ||
          line.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos)
        return true;
  }
  return false;
}

}  // namespace

CollectResult Collect(EmulateOptions e, bool real_routing, bool no_payloads, const std::vector<std::string>& command,
                      const std::string& prefix) {
  CollectResult res;
  e.one_replica = true;
  e.real_routing = real_routing;
  e.record_payloads = !no_payloads;
  if (e.label.empty()) e.label = "collecting";
  if (!e.report_extra.contains("policy")) e.report_extra["policy"] = "collect";
  res.exit_code = Emulate(e, command);
  if (e.dry_run) {
    if (e.swap.enabled && !e.json) {
      std::printf("context switching: on; GPU cap %s, host budget %s, %s per rank beyond its allocations%s; ranks "
                  "start as their GPU has room, ranks blocked in an exchange are swapped out (CUDA checkpoint API "
                  "through %s)\n",
                  e.swap.gpu_cap_bytes ? FormatBytes(e.swap.gpu_cap_bytes).c_str() : "from the driver",
                  e.swap.host_cap_bytes ? FormatBytes(e.swap.host_cap_bytes).c_str() : "80% of MemAvailable",
                  FormatBytes(e.swap.context_bytes).c_str(),
                  e.swap.rank_estimate_bytes
                      ? (", ranks assumed " + FormatBytes(e.swap.rank_estimate_bytes) + " until they report")
                            .c_str()
                      : "",
                  e.swap.driver.c_str());
    }
    return res;
  }
  std::error_code ec;
  fs::path out = fs::absolute(e.out, ec);
  for (const auto& f : fs::directory_iterator(out / "payloads", ec)) {
    res.payload_bytes += f.file_size(ec);
    ++res.payload_files;
  }
  const bool wrote = fs::exists(out / "observed.prism", ec);
  if (wrote) res.graph = (out / "observed.prism").string();
  res.out_of_memory = res.exit_code != 0 && LogsSayOutOfMemory(out);
  std::printf("%sbare graph %s%s\n", prefix.c_str(), (out / "observed.prism").string().c_str(),
              wrote ? "" : " (NOT written: see the lines above)");
  if (wrote) EpSymmetryNote(out, real_routing, prefix);
  if (e.swap.enabled) SwapSummary(out, prefix);
  if (!no_payloads) {
    std::printf("%spayloads of %d rank(s), %.1f MiB, in %s (use: prism-run --payload recorded --payload-dir %s "
                "--ranks R torchrun ...)\n",
                prefix.c_str(), res.payload_files, static_cast<double>(res.payload_bytes) / (1 << 20),
                (out / "payloads").string().c_str(), out.string().c_str());
  }
  return res;
}

}  // namespace prism::launcher
