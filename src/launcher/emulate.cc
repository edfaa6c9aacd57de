#include "launcher/emulate.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "common/atomic_file.h"
#include "common/text.h"
#include "coordinator/coordinator.h"
#include "coordinator/store/store_client.h"
#include "launcher/coordinator_link.h"
#include "analysis/graph_compare.h"
#include "launcher/launch.h"
#include "launcher/plan.h"
#include "analysis/report_compare.h"
#include "prism/report.h"
#include "replay/simulate.h"
#include "replay/topology.h"
#include "replay/trace_io.h"

namespace prism::launcher {
using namespace ::prism::analysis;  // the post-run analysis (src/analysis) this file calls

namespace fs = std::filesystem;

std::string DefaultOutDir() {
  fs::path base = fs::current_path() / "prism-out" / TimeNow("%Y%m%d-%H%M%S");
  fs::path p = base;
  for (int i = 2; fs::exists(p); ++i) p = base.string() + "-" + std::to_string(i);
  return p.string();
}

namespace {

std::vector<std::string> SelfArgv() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> out;
  std::string arg;
  while (std::getline(in, arg, '\0')) out.push_back(arg);
  return out;
}

// "host:port" that is not a file or directory: the port, else 0.
int StorePort(const std::string& s, std::string* host) {
  std::error_code ec;
  if (fs::exists(s, ec)) return 0;
  size_t c = s.rfind(':');
  if (c == std::string::npos || c == 0 || c + 1 == s.size()) return 0;
  for (size_t i = c + 1; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return 0;
  }
  int port = std::atoi(s.c_str() + c + 1);
  if (port <= 0 || port > 65535) return 0;
  *host = s.substr(0, c);
  return port;
}

std::string SelfExe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("prism-run") : p.string();
}

// After an emulation with a graph: simulate the graph for the same topology and what-ifs, compare every real rank's
// measured iterations with it (analysis/graph_compare.h), print one line per rank and add "graph_comparison" to
// report.json. A failure is reported and leaves the report as it was.
void CompareRunWithGraph(const std::string& graph, const std::string& topology,
                         const std::vector<std::pair<int32_t, double>>& stragglers, const std::string& rep_path) {
  std::string error;
  auto rep = LoadReport(rep_path, &error);
  if (!rep) return;
  trace::Trace g;
  if (!replay::ReadTrace(graph, &g, &error)) {
    std::printf("prism: no graph comparison: %s\n", error.c_str());
    return;
  }
  auto sim = SimulateGraph(g, graph, topology, stragglers, &error);
  if (!sim) {
    std::printf("prism: no graph comparison: %s\n", error.c_str());
    return;
  }
  std::vector<RankGraphComparison> cs = CompareReports(*rep, *sim, &error);
  if (cs.empty()) {
    std::printf("prism: no graph comparison: %s\n", error.c_str());
    return;
  }
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& c : cs) {
    std::printf("prism: %s\n", Describe(c).c_str());
    arr.push_back(ToJson(c));
  }
  // At the real ranks' own speed (graph_compare.h): each real rank's compute scaled to what it measured in this run,
  // so that a model whose speed moved since the fill does not pass for a replay error.
  std::ifstream tf((fs::path(rep_path).parent_path() / "trace.json").string());
  const nlohmann::json trace = nlohmann::json::parse(tf, nullptr, false);
  std::vector<std::pair<int32_t, double>> own = stragglers;
  std::map<int, nlohmann::json> speed;
  const nlohmann::json no_ranks = nlohmann::json::array();
  const nlohmann::json& ranks = rep->contains("ranks") && (*rep)["ranks"].is_array() ? (*rep)["ranks"] : no_ranks;
  for (const auto& c : cs) {
    double latency = 0;
    for (const auto& r : ranks) {
      if (!r.is_object() || !r.contains("rank") || !r["rank"].is_number_integer() || r["rank"].get<int>() != c.rank)
        continue;
      auto l = r.find(std::string(report::kCoordinatorLatencyPerIteration));
      if (l != r.end() && l->is_number()) latency = l->get<double>();
    }
    const std::optional<double> run = RunComputePerIteration(trace, c.rank, latency);
    const std::optional<double> in_graph = GraphComputePerIteration(g, c.rank, &error);
    if (!in_graph) std::printf("prism: no own-speed comparison for rank %d: %s\n", c.rank, error.c_str());
    if (!run) std::printf("prism: no own-speed comparison for rank %d: its trace.json has no timed iterations\n", c.rank);
    if (!run || !in_graph || *in_graph <= 0 || *run <= 0) continue;
    own.emplace_back(c.rank, *run / *in_graph);
    speed[c.rank] = {{"run_compute_per_iteration_s", *run},
                     {"graph_compute_per_iteration_s", *in_graph},
                     {"compute_scale", *run / *in_graph}};
  }
  if (!speed.empty()) {
    std::optional<nlohmann::json> sim_own = SimulateGraph(g, graph, topology, own, &error);
    std::vector<RankGraphComparison> cs_own;
    if (sim_own) cs_own = CompareReports(*rep, *sim_own, &error);
    if (cs_own.empty()) std::printf("prism: no own-speed comparison: %s\n", error.c_str());
    for (const auto& c : cs_own) {
      auto sp = speed.find(c.rank);
      if (sp == speed.end()) continue;
      std::printf("prism: at rank %d's own speed (compute %.1f ms per iteration in this run, %.1f ms in the graph: "
                  "x%.3f): %s\n",
                  c.rank, sp->second["run_compute_per_iteration_s"].get<double>() * 1e3,
                  sp->second["graph_compute_per_iteration_s"].get<double>() * 1e3,
                  sp->second["compute_scale"].get<double>(), Describe(c).c_str());
      nlohmann::json j = ToJson(c);
      j.erase("iterations");
      j.erase("rank");
      sp->second.update(j);
      for (auto& a : arr)
        if (a.value("rank", -1) == c.rank) a["own_speed"] = sp->second;
    }
  }
  nlohmann::json extra = {{"graph_comparison",
                           {{"graph", graph},
                            {"simulated_iteration_time_s", (*sim).value("iteration_time_s", 0.0)},
                            {"ranks", std::move(arr)}}}};
  if (!MergeIntoReport(rep_path, extra, &error)) std::printf("prism: %s\n", error.c_str());
}

// The plan request of `opts`; exit code != 0 with the message printed when an option is refused.
int MakeRequest(const EmulateOptions& opts, const std::vector<std::string>& command, PlanRequest* req,
                std::vector<std::pair<int32_t, double>>* stragglers, std::string* what_if_spec) {
  req->command = command;
  req->ranks = opts.ranks;
  req->layout = opts.layout;
  req->gpus = opts.gpus;
  req->node_rank = opts.node_rank;
  req->coordinator = opts.coordinator;
  req->payload = opts.payload;
  req->one_replica = opts.one_replica;
  req->real_routing = opts.real_routing;
  req->record_payloads = opts.record_payloads;
  req->all_real = opts.all_real;
  req->preload = !opts.no_preload;
  req->hang_timeout_s = opts.hang_timeout;
  req->on_hang = opts.on_hang;
  req->passthrough = !opts.no_passthrough;
  req->kernels = opts.kernels_nvtx ? 2 : (opts.kernels ? 1 : 0);
  req->listen = opts.listen;
  req->remote_ranks = opts.remote_ranks;
  req->swap = opts.swap;
  if (!opts.coordinator.empty() && !opts.dry_run) {
    // Why before the plan: the coordinator's document (event bus port, real ranks) lives in its store.
    std::string host;
    if (int port = StorePort(opts.coordinator, &host)) {
      store::StoreClient c;
      if (!c.Connect(host, static_cast<uint16_t>(port), 10000)) {
        std::fprintf(stderr, "prism-run: --coordinator %s: cannot reach its store: %s\n", opts.coordinator.c_str(),
                     c.error().c_str());
        return kExitFailure;
      }
      c.Get(coord::kInfoKey, &req->coordinator_doc);
    }
  }
  std::error_code ec;
  req->out_dir = opts.out.empty() ? DefaultOutDir() : fs::absolute(opts.out, ec).string();
  if (!opts.graph.empty()) {
    if (!fs::is_regular_file(opts.graph, ec)) {
      std::fprintf(stderr, "prism-run: --graph %s: no such file\n", opts.graph.c_str());
      return kExitBadInput;
    }
    req->graph = fs::absolute(opts.graph, ec).string();
  }
  if (!opts.what_if.empty()) {
    if (opts.graph.empty()) {
      std::fprintf(stderr, "prism-run: --what-if needs a graph (without one virtual ranks have no compute to slow): "
                           "leave out --policy mirror, or give --graph\n");
      return kExitBadInput;
    }
    for (const std::string& w : opts.what_if) *what_if_spec += (what_if_spec->empty() ? "" : ",") + w;
    replay::WhatIf wi;
    std::string e;
    if (!replay::ParseWhatIf(*what_if_spec, &wi, &e)) {
      std::fprintf(stderr, "prism-run: --what-if: %s\n", e.c_str());
      return kExitBadInput;
    }
    if (wi.bw_scale != 1.0 || !wi.topology.empty()) {
      std::fprintf(stderr, "prism-run: --what-if %s: only straggler= applies to an emulation (bw-scale= and topology= "
                           "change the cost model: use --topology)\n", what_if_spec->c_str());
      return kExitBadInput;
    }
    *stragglers = wi.stragglers;
  }
  req->payload_max_bytes = opts.payload_max_bytes;
  if (!opts.payload_dir.empty()) {
    if (opts.payload != "recorded") {
      std::fprintf(stderr, "prism-run: --payload-dir only applies to --payload recorded\n");
      return kExitBadInput;
    }
    req->payload_dir = fs::absolute(opts.payload_dir, ec).string();
  } else if (opts.payload == "recorded") {
    std::fprintf(stderr, "prism-run: --payload recorded needs --payload-dir (the output of prism-run collect)\n");
    return kExitBadInput;
  }
  if (!opts.topology.empty()) {
    // A file is passed by absolute path (the workers may run elsewhere); otherwise it names a preset. Either must load
    // here, so that a typo is an error now and not in every worker.
    req->topology = fs::is_regular_file(opts.topology, ec) ? fs::absolute(opts.topology, ec).string() : opts.topology;
    replay::Topology topo;
    std::string terr;
    if (!replay::LoadTopology(req->topology, &topo, &terr)) {
      std::fprintf(stderr, "prism-run: --topology %s: %s\n", opts.topology.c_str(), terr.c_str());
      return kExitBadInput;
    }
  }
  req->run_id = "prism-" + fs::path(req->out_dir).filename().string();
  return kExitOk;
}

std::optional<Plan> MakePlan(const EmulateOptions& opts, const PlanRequest& req, std::string* error) {
  HostInfo host = DetectHost(SelfExe());
  // Why preload is not required for a dry run: the plan is worth seeing on a machine without the shim built.
  if (opts.dry_run && host.libprism.empty() && req.preload) {
    host.libprism = "<libprism.so not built>";
    host.python_hook_dir = "<libprism.so not built>/python";
  }
  return BuildPlan(req, host, error);
}

}  // namespace

bool MergeIntoReport(const std::string& path, const nlohmann::json& extra, std::string* error) {
  auto rep = LoadReport(path, error);
  if (!rep) return false;
  for (const auto& [k, v] : extra.items()) (*rep)[k] = v;
  return WriteFileAtomic(path, rep->dump(2) + "\n", error);
}

bool SummarizePlan(const EmulateOptions& opts, const std::vector<std::string>& command, PlanSummary* out,
                   std::string* error) {
  EmulateOptions o = opts;
  o.dry_run = true;  // no store contact, no libprism needed
  PlanRequest req;
  std::vector<std::pair<int32_t, double>> stragglers;
  std::string spec;
  // MakeRequest prints its own refusal; the message here says where to look.
  if (MakeRequest(o, command, &req, &stragglers, &spec) != kExitOk) {
    *error = "the options above were refused";
    return false;
  }
  auto plan = MakePlan(o, req, error);
  if (!plan) return false;
  out->world_size = plan->world_size;
  out->gpus_per_node = plan->nproc_per_node;
  out->gpus = plan->gpus;
  out->layout_spec = plan->layout.ToSpec();
  out->tp = plan->layout.tp;
  out->pp = plan->layout.pp;
  out->dp = plan->layout.dp;
  out->cp = plan->layout.cp;
  out->ep = plan->layout.ep;
  out->real_ranks.clear();
  for (const RealRank& r : plan->real) out->real_ranks.push_back(r.rank);
  const TorchrunArgs& t = plan->torchrun;
  out->job_argv = t.launcher;
  out->job_argv.insert(out->job_argv.end(), t.options.begin(), t.options.end());
  out->job_argv.push_back(t.script);
  out->job_argv.insert(out->job_argv.end(), t.script_args.begin(), t.script_args.end());
  std::error_code ec;
  out->cwd = fs::current_path(ec).string();
  out->script_path.clear();
  if (!t.module) {
    fs::path s = fs::absolute(t.script, ec);
    if (fs::is_regular_file(s, ec)) out->script_path = s.lexically_normal().string();
  }
  // The parts of the job line that determine the program (torchrun's rendezvous, ports, log and restart options
  // do not): how the script is run, the script, its arguments and the interpreter.
  out->script_key.clear();
  out->script_key.push_back(std::string("module=") + (t.module ? "1" : "0"));
  out->script_key.push_back(std::string("no_python=") + (t.no_python ? "1" : "0"));
  out->script_key.push_back(std::string("run_path=") + (t.run_path ? "1" : "0"));
  out->script_key.push_back("python=" + plan->python);
  out->script_key.push_back("script=" + (out->script_path.empty() ? t.script : out->script_path));
  // Why split "--opt=v": argparse (and Megatron's parser) reads it as "--opt v", so both spellings are one job; a
  // flag that takes no value cannot be written "--flag=v" without the parser refusing it.
  for (const std::string& a : t.script_args) {
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos && eq > 2) {
      out->script_key.push_back(a.substr(0, eq));
      out->script_key.push_back(a.substr(eq + 1));
    } else {
      out->script_key.push_back(a);
    }
  }
  return true;
}

int Emulate(const EmulateOptions& opts, const std::vector<std::string>& command) {
  PlanRequest req;
  std::vector<std::pair<int32_t, double>> stragglers;
  std::string what_if_spec;
  if (int rc = MakeRequest(opts, command, &req, &stragglers, &what_if_spec); rc != kExitOk) return rc;
  std::string error;
  auto plan = MakePlan(opts, req, &error);
  if (!plan) {
    std::fprintf(stderr, "prism-run: %s\n", error.c_str());
    return kExitBadInput;
  }
  // Why in the workers' environment too: the coordinator link reads the plan's variables (as PRISM_GRAPH), and a
  // rank's log then says which what-if it ran under.
  if (!what_if_spec.empty()) plan->env.emplace_back("PRISM_WHAT_IF", what_if_spec);
  if (!opts.lockstep_slots.empty() && !opts.graph.empty())
    plan->env.emplace_back("PRISM_LOCKSTEP_SLOTS", opts.lockstep_slots);
  for (auto [rank, f] : stragglers) {
    const bool real = std::any_of(plan->real.begin(), plan->real.end(), [&](const auto& r) { return r.rank == rank; });
    if (real || rank >= plan->world_size) {
      std::fprintf(stderr, "prism-run: --what-if straggler=%d:%g: %s\n", rank, f,
                   real ? "that rank runs for real: its compute is measured on the GPU, not replayed; name a virtual rank"
                        : "outside the world");
      return kExitBadInput;
    }
  }
  if (opts.dry_run) {
    if (opts.json) {
      nlohmann::ordered_json j = PlanToJson(*plan);
      for (const auto& [k, v] : opts.plan_extra.items()) j[k] = v;
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      if (opts.plan_extra.contains("policy") && opts.plan_extra["policy"].is_string() &&
          !opts.plan_extra.contains("graph_cache"))
        std::printf("policy %s\n", opts.plan_extra["policy"].get<std::string>().c_str());
      std::printf("%s(dry run: nothing was started)\n", PlanToText(*plan).c_str());
    }
    return kExitOk;
  }
  if (opts.json) std::fprintf(stderr, "prism-run: --json only applies to --dry-run; running\n");
  for (const std::string& w : plan->warnings) std::fprintf(stderr, "prism-run: warning: %s\n", w.c_str());

  if (opts.record_payloads) {
    std::error_code mk;
    fs::create_directories(fs::path(plan->out_dir) / "payloads", mk);
    if (mk) {
      std::fprintf(stderr, "prism-run: cannot create %s/payloads: %s\n", plan->out_dir.c_str(), mk.message().c_str());
      return kExitBadInput;
    }
  }
  std::unique_ptr<CoordinatorLink> coord;
  if (plan->start_coordinator) {
    coord = MakeLocalCoordinator();
  } else {
    coord = MakeRemoteCoordinator(*plan);
  }
  LaunchOptions lo;
  lo.prism_argv = SelfArgv();
  lo.echo_output = !opts.quiet;
  lo.stop_after_iterations = opts.iterations;
  if (opts.label.empty() && req.graph.empty() && !opts.one_replica && !opts.all_real)
    std::printf("prism: policy mirror (quick, not faithful: a virtual peer arrives when its real counterpart does, so "
                "no pipeline bubble and no stragglers show; leave out --policy mirror for the faithful default)\n");
  std::printf("prism: %s %d ranks (%d nodes x %d), layout %s; %zu real rank(s); output %s\n",
              opts.label.empty() ? "emulating" : opts.label.c_str(), plan->world_size, plan->nnodes,
              plan->nproc_per_node, plan->layout.ToSpec().c_str(), plan->real.size(), plan->out_dir.c_str());
  std::fflush(stdout);
  LaunchResult res = RunPlan(*plan, coord.get(), lo);
  if (!res.error.empty()) std::fprintf(stderr, "prism-run: %s\n", res.error.c_str());
  std::string rep_path = (fs::path(plan->out_dir) / std::string(report::kFileName)).string();
  if (!req.graph.empty()) {
    // Why catch: the job has ended and its exit code must survive whatever the comparison meets in the files.
    try {
      CompareRunWithGraph(req.graph, req.topology, stragglers, rep_path);
    } catch (const std::exception& e) {
      std::printf("prism: no graph comparison: %s\n", e.what());
    }
  }
  nlohmann::json extra = opts.report_extra;
  if (!extra.contains("policy")) extra["policy"] = req.graph.empty() ? "mirror" : "graph";
  if (!req.graph.empty() && !extra.contains("graph")) extra["graph"] = req.graph;
  if (fs::exists(rep_path) && !MergeIntoReport(rep_path, extra, &error))
    std::printf("prism: report.json: %s\n", error.c_str());
  if (opts.print_report) {
    if (auto rep = LoadReport(rep_path, &error)) std::printf("\n%s", ShowReport(*rep, 16).c_str());
  }
  if (res.stopped_on_hang) {
    std::printf("prism: stopped after a hang diagnosis: %s (exit %d)\n", res.hang_json.c_str(), kExitHang);
  } else if (!res.hang_json.empty()) {
    std::printf("prism: a hang was diagnosed during the run: %s\n", res.hang_json.c_str());
  }
  if (opts.print_report) std::printf("prism: report %s (exit %d)\n", rep_path.c_str(), res.exit_code);
  return res.exit_code;
}

}  // namespace prism::launcher
