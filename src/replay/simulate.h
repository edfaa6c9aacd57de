// `prism-run simulate`: load a graph, replay every rank, answer what-ifs, write report.json (+ trace.json) and a
// short summary. The CLI (tools/prism-run/simulate.cc) only parses flags into SimulateOptions and calls
// RunSimulate. docs/simulate.md documents the options and the report.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "prism/trace.h"
#include "replay/engine.h"
#include "replay/topology.h"

namespace prism::replay {

// One what-if scenario: "straggler=RANK:FACTOR", "bw-scale=F", "topology=FILE|PRESET", or several joined by
// ',' (applied together).
struct WhatIf {
  std::string spec;
  std::vector<std::pair<int32_t, double>> stragglers;
  double bw_scale = 1.0;
  std::string topology;  // empty: unchanged
};
bool ParseWhatIf(const std::string& spec, WhatIf* out, std::string* error);

struct SimulateOptions {
  std::string graph;                // .prism or .prism.json
  std::string topology;             // NAME|FILE|JSON; empty: the graph's own, else h100-8x400g
  std::string model;                // "", "nccl" or "alpha-beta": overrides the topology's model
  std::string nccl_algo, nccl_proto;  // NCCL_ALGO / NCCL_PROTO (the CLI fills them from the environment)
  std::vector<std::string> what_ifs;
  std::string out_dir;              // empty: ./prism-out/<timestamp>
  std::string trace_ranks = "0";    // ranks in trace.json; "" or "none": no trace
  bool use_recorded = true;
  // When sends complete: "rendezvous", "eager" or "nccl" (trace::SendCompletion); empty: the graph's
  // send_completion, else rendezvous.
  std::string send_completion;
  bool validate = true;
  bool symmetric = true;            // symmetric fast path when the graph allows it (--no-symmetric: full replay)
  bool quiet = false;               // no summary on stdout
  // Read the graph through one JSON document (ReadTraceUncheckedDom) instead of the streaming reader. Same
  // result; for bench/replay_load_bench.cc, which times both in one run.
  bool document_reader = false;
};

// Runs the whole command. Returns the exit code: 0 ok, 1 the graph cannot finish (deadlock, mismatched
// collectives), 2 bad input (unreadable or invalid graph, topology, option). Messages name the file and place.
int RunSimulate(const SimulateOptions& opts, std::ostream& out, std::ostream& err);

// The report for one finished simulation (the keys of include/prism/report.h plus the simulate extras).
nlohmann::ordered_json SimReportJson(const trace::Trace& trace, const SimResult& res);

// Which replay ran (report.json "replay": path, replicas, ranks_replayed, simulated_events, reason) and why, in
// one line: the symmetric fast path with its replica count, or the full replay with the fast path's refusal.
nlohmann::ordered_json ReplayPathJson(const trace::Trace& trace, const SimResult& res);
std::string ReplayPathReason(const trace::Trace& trace, const SimResult& res);

}  // namespace prism::replay
