// prism-run graph build DIR: the observed PrismTrace of a run from its event files (src/analysis/observed_trace.h).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>

#include "analysis/observed_trace.h"
#include "common/bounded_read.h"
#include "common/document_shape.h"
#include "common/rank_list.h"
#include "launcher/plan.h"
#include "prism/events.h"
#include "prism/limits.h"
#include "prism/report.h"
#include "replay/trace_io.h"
#include "subcommands.h"

namespace prism::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct GraphBuildArgs {
  std::string dir;
  std::string out;
  std::string layout;
  int world_size = 0;
  int gpus_per_node = 0;
  std::string ranks;
  int64_t skip_iterations = 0;
  int64_t iterations = 0;
  std::string stream_fallback = "one";
  std::string topology;
  bool validate = true;
  bool quiet = false;
};

// A JSON file read within its cap (include/prism/limits.h): null when there is none; false with *error naming it
// when it is there but too large, not a regular file, nested too deep or not JSON.
bool LoadJson(const fs::path& p, uint64_t cap, const std::string& what, json* out, std::string* error) {
  *out = json();
  std::error_code ec;
  if (!fs::exists(p, ec)) return true;
  std::string text, why;
  if (!ReadFileBounded(p.string(), cap, what, &text, error)) return false;
  if (!CheckJsonShape(text, DocumentBounds{}, &why)) {
    *error = p.string() + ": JSON " + why;
    return false;
  }
  *out = json::parse(text, nullptr, false);
  if (out->is_discarded()) {
    *error = p.string() + ": not valid JSON";
    return false;
  }
  return true;
}

// An integer field in 1..max, else 0 (as if absent). Why not json::value<int>: it casts a 1e12 or 2^40 silently.
int PositiveField(const json& j, const std::string& key, int64_t max) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return 0;
  const int64_t v = it->get<int64_t>();
  return v >= 1 && v <= max ? static_cast<int>(v) : 0;
}

// World size from the first hello line of any event file in `dir` (0 when none says). Why only the head of each
// file: the hello line is the first one a rank writes, and the files may be gigabytes.
int WorldSizeFromEvents(const std::string& dir) {
  for (int r : analysis::EventFileRanks(dir)) {
    std::ifstream in(fs::path(dir) / events::FileName(r), std::ios::binary);
    std::string head(64 << 10, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
    for (size_t start = 0, nl; (nl = head.find('\n', start)) != std::string::npos; start = nl + 1) {
      const std::string_view line(head.data() + start, nl - start);
      std::string why;
      if (!CheckJsonShape(line, DocumentBounds{}, &why)) continue;
      json j = json::parse(line, nullptr, false);
      if (!j.is_object() || j.value("type", "") != events::kHello) continue;
      auto w = j.find("world_size");
      if (w != j.end() && w->is_number_integer() && w->get<int64_t>() > 0 && w->get<int64_t>() <= limits::kMaxWorldSize)
        return static_cast<int>(w->get<int64_t>());
    }
  }
  return 0;
}

int RunGraphBuild(const GraphBuildArgs& a) {
  auto fail = [](const std::string& m, int code) {
    std::fprintf(stderr, "prism-run graph build: %s\n", m.c_str());
    return code;
  };
  std::error_code ec;
  if (!fs::is_directory(a.dir, ec)) return fail(a.dir + " is not a directory", kExitBadInput);

  // The world: command line > the run's report.json > the event files (world size) and pure data parallel.
  json rep;
  std::string read_error;
  if (!LoadJson(fs::path(a.dir) / std::string(report::kFileName), limits::kMaxReportFileBytes, "report files", &rep,
                &read_error)) {
    return fail(read_error, kExitBadInput);
  }
  std::string spec = a.layout;
  std::string layout_from = "--layout";
  if (spec.empty() && rep.is_object() && rep.contains("layout") && rep["layout"].is_object() &&
      rep["layout"].value("spec", "") != "") {
    spec = rep["layout"]["spec"].get<std::string>();
    layout_from = "report.json";
  }
  int world_size = a.world_size;
  if (world_size <= 0 && rep.is_object()) {
    world_size = PositiveField(rep, std::string(report::kWorldSize), limits::kMaxWorldSize);
  }
  if (world_size <= 0) world_size = WorldSizeFromEvents(a.dir);
  if (world_size <= 0) return fail("the world size is unknown: give --world-size", kExitBadInput);
  int gpus = a.gpus_per_node;
  if (gpus <= 0 && rep.is_object()) gpus = PositiveField(rep, "gpus_per_node", limits::kMaxWorldSize);
  if (gpus <= 0) gpus = 8;
  std::string error;
  world::Layout layout;
  if (!spec.empty()) {
    auto l = world::ParseLayout(spec, &error);
    if (!l) return fail("layout '" + spec + "': " + error, kExitBadInput);
    layout = *l;
  } else {
    layout_from = "none given: pure data parallel";
  }
  if (!world::ResolveLayout(&layout, world_size, std::to_string(world_size) + " ranks", &error))
    return fail(error, kExitBadInput);
  auto world = world::World::Make(layout, gpus, &error);
  if (!world) return fail(error, kExitBadInput);

  analysis::ObservedTraceOptions o;
  if (!a.ranks.empty()) {
    auto r = prism::ParseRankList(a.ranks, world_size, "--ranks", &error);
    if (!r) return fail(error, kExitBadInput);
    o.ranks = *r;
  }
  o.skip_iterations = a.skip_iterations;
  o.max_iterations = a.iterations;
  if (a.stream_fallback == "one") {
    o.stream_fallback = analysis::StreamFallback::kOne;
  } else if (a.stream_fallback == "per-comm") {
    o.stream_fallback = analysis::StreamFallback::kPerComm;
  } else {
    return fail("--stream-fallback must be one or per-comm, not '" + a.stream_fallback + "'", kExitBadInput);
  }
  o.topology = a.topology;
  if (!a.topology.empty() && fs::exists(a.topology, ec) && !fs::is_directory(a.topology, ec)) {
    json topo;
    if (!LoadJson(a.topology, limits::kMaxTopologyFileBytes, "topology files", &topo, &error))
      return fail("--topology " + error, kExitBadInput);
    if (!topo.is_object()) return fail("--topology " + a.topology + ": not a JSON object", kExitBadInput);
    o.topology = topo.dump();  // Why inline: the graph must not depend on a file next to it
  }
  o.validate = a.validate;

  auto g = analysis::BuildObservedTrace(a.dir, *world, o, &error);
  if (!g) return fail(error, error.find("does not validate") != std::string::npos ? kExitFailure : kExitBadInput);

  std::string out = a.out.empty() ? (fs::path(a.dir) / "observed.prism").string() : a.out;
  if (!replay::WriteTrace(g->trace, out, &error)) return fail(error, kExitFailure);

  for (const std::string& w : g->warnings) std::fprintf(stderr, "prism-run graph build: warning: %s\n", w.c_str());
  if (!a.quiet) {
    const trace::Trace& t = g->trace;
    std::printf("prism-run graph build: %s\n", a.dir.c_str());
    std::printf("  world %d ranks, layout %s (%s)\n", t.world_size, world->layout().ToSpec().c_str(),
                layout_from.c_str());
    std::string iters = g->first_iteration < 0 ? std::string("no marks: one iteration")
                                               : std::to_string(g->first_iteration) + ".." +
                                                     std::to_string(g->last_iteration);
    std::printf("  iterations %s, %zu nodes, %zu communicators\n", iters.c_str(), g->nodes, t.comms.size());
    std::printf("  cross-stream waits %zu (from the event files' \"wait\" lines; %zu outside the kept iterations)\n",
                g->wait_edges, g->waits_skipped);
    if (!g->coordinator_latency_ns.empty()) {
      // Why say it: the gates of these ranks opened after their decided release (the coordinator's decision came
      // late); the graph keeps that time in the communication nodes, where it was spent, not in the compute.
      std::string per;
      for (const auto& [rank, iters] : g->coordinator_latency_ns) {
        int64_t sum = 0;
        for (const auto& [it, ns] : iters) sum += ns;
        char b[96];
        std::snprintf(b, sizeof b, "%srank %d %.3f ms", per.empty() ? "" : ", ", rank,
                      static_cast<double>(sum) / 1e6 / static_cast<double>(std::max<size_t>(1, iters.size())));
        per += b;
      }
      std::printf("  coordinator latency, mean per iteration (gates opened after their release; in the communication "
                  "nodes, not the compute): %s\n", per.c_str());
    }
    for (size_t c = 0; c < t.classes.size(); ++c) {
      const trace::RoleClass& cls = t.classes[c];
      size_t nodes = 0;
      for (const trace::Stream& s : cls.streams) nodes += s.nodes.size();
      std::string slots;
      for (const std::string& s : cls.comm_slots) slots += (slots.empty() ? "" : ",") + s;
      std::printf("  class %-16s from rank %-6d %zu streams, %zu nodes, slots %s\n", cls.name.c_str(),
                  g->class_ranks[c], cls.streams.size(), nodes, slots.empty() ? "-" : slots.c_str());
    }
    if (g->recorded_comm > 0) {
      std::printf("  wrote %s (compute durations measured; %zu communication nodes measured on the real NCCL, the "
                  "rest left to the cost model)\n",
                  out.c_str(), g->recorded_comm);
    } else {
      std::printf("  wrote %s (compute durations measured; communication left to the cost model)\n", out.c_str());
    }
  }
  return kExitOk;
}

}  // namespace

void AddGraph(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("graph", "build a PrismTrace from a run's event files");
  sub->require_subcommand(1);
  auto a = std::make_shared<GraphBuildArgs>();
  auto* build = sub->add_subcommand("build", "the observed graph of the real ranks of an output directory "
                                             "(docs/collect.md)");
  build->add_option("DIR", a->dir, "output directory holding rank<R>.events.jsonl")->required();
  build->add_option("--out,-o", a->out, "graph to write (.prism: CBOR, else JSON); default DIR/observed.prism");
  build->add_option("--layout", a->layout, "parallel layout, e.g. tp=2,pp=2 (default: DIR/report.json's)");
  build->add_option("--world-size", a->world_size, "ranks in the job (default: report.json's, else the events')");
  build->add_option("--gpus-per-node", a->gpus_per_node,
                    "GPUs per node of the target (default: report.json's, else 8)");
  build->add_option("--ranks", a->ranks, "event files to read, e.g. 0-3 (default: all in DIR)");
  build->add_option("--skip-iterations", a->skip_iterations, "leave out the first K complete iterations (warm-up)")
      ->capture_default_str()
      ->check(NonNegative());
  build->add_option("--iterations", a->iterations, "keep at most K iterations (0: all complete ones)")
      ->capture_default_str()
      ->check(NonNegative());
  build->add_option("--stream-fallback", a->stream_fallback,
                    "for op lines without \"stream\": one (one stream) or per-comm (one per communicator)")
      ->capture_default_str();
  build->add_option("--topology", a->topology, "topology preset or file name written into the graph");
  build->add_flag("!--no-validate", a->validate, "write the graph even when it fails validation");
  build->add_flag("--quiet", a->quiet, "no summary on stdout");
  build->callback([rc, a] { *rc = RunGraphBuild(*a); });
}

}  // namespace prism::cli
