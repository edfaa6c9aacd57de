// The default procedure of `prism-run [--ranks R] torchrun ...` (docs/cli.md "What the default does"): the
// paper's three stages on this host, each through library code that the expert subcommands share.
//   1. collect (launcher/collect.h): data-parallel replica 0 for real, --real-routing when ep > 1, context switching
//      when the replica's ranks do not fit (auto: retried with it after a CUDA out-of-memory);
//   2. fill (launcher/fill.h): rounds of slices until simulate's estimate moves by at most the tolerance (default
//      0.5 %, at most 4 rounds; said clearly when it did not converge);
//   3. emulate (launcher/emulate.h): the requested ranks against the filled graph, with the collect's recorded
//      payloads.
// Stages 1-2 are kept in the graph cache (launcher/graph_cache.h): a second run of the same job starts at stage 3.
// Every stage prints a line when it starts and ends (elapsed time, what is left); report.json gets "policy",
// "graph", "graph_cache", "fill" and "stages" (each with its wall time). Ctrl-C keeps what is done: a finished
// collect stays in the cache and the next run starts at the fill.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/emulate.h"
#include "launcher/fill.h"

namespace prism::launcher {

struct StagedOptions {
  EmulateOptions emulate;       // the user's options for the emulation (ranks, out, topology, payload, ...)
  std::string policy;           // --policy graph|mirror ("" = graph, or mirror for a multi-host run; the CLI decides)
  bool payload_given = false;   // the user chose --payload (else the collect's recorded payloads)
  std::string cache_root;       // --graph-cache ("" = GraphCacheRoot's default)
  bool refresh = false;         // --refresh-graph
  double tolerance_pct = kDefaultFillTolerancePct;  // --fill-tolerance
  int max_rounds = kDefaultFillRounds;              // --fill-rounds
  int graph_iterations = 10;    // --graph-iterations: iterations of the collect and each fill slice
  std::string collect_swap = "auto";  // --collect-swap auto|on|off
  std::vector<std::string> environment;  // the user's, NAME=value (the cache key)
};

int RunStaged(const StagedOptions& o, const std::vector<std::string>& command);

}  // namespace prism::launcher
