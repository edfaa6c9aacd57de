// prism-run [OPTIONS] torchrun ...: emulate (the default mode). Parses, builds the plan (launcher/plan.h), prints
// it (--dry-run) or runs it (launcher/launch.h).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "coordinator/coordinator.h"
#include "coordinator/store_client.h"
#include "launcher/coordinator_link.h"
#include "launcher/graph_compare.h"
#include "launcher/launch.h"
#include "launcher/plan.h"
#include "launcher/report_compare.h"
#include "prism/report.h"
#include "replay/simulate.h"
#include "replay/trace_io.h"
#include "emulate_options.h"
#include "subcommands.h"

namespace prism::cli {

namespace fs = std::filesystem;


EmulateOptions* AddEmulateOptions(CLI::App& app) {
  static EmulateOptions opts;
  app.add_option("--ranks", opts.ranks, "logical ranks to run for real: \"0\", \"0,517\", \"0-7\" (default 0)");
  app.add_option("--layout", opts.layout,
                 "\"tp=8,pp=4,dp=32[,cp=..,ep=..,etp=..][,order=tp-cp-ep-dp-pp]\" (default: the job's Megatron "
                 "arguments)");
  app.add_option("--topology", opts.topology, "target cluster: preset name or JSON file");
  app.add_option("--graph", opts.graph, "replay virtual ranks from this PrismTrace (otherwise mirror)");
  app.add_option("--what-if", opts.what_if,
                 "with --graph: straggler=RANK:FACTOR slows that virtual rank's compute in the replay (',' joins "
                 "several); the graph comparison after the run uses the same");
  app.add_option("--payload", opts.payload, "data of virtual members: mirror|recorded|random|zeros")
      ->capture_default_str()
      ->check(CLI::IsMember({"mirror", "recorded", "random", "zeros"}));
  app.add_option("--payload-dir", opts.payload_dir,
                 "with --payload recorded: the output directory of `prism-run collect` whose payloads/rank<R>.bin "
                 "the real ranks replay (each rank the file of its class)");
  app.add_option("--out", opts.out, "report directory (default ./prism-out/<timestamp>)");
  app.add_flag("--dry-run", opts.dry_run, "print the plan and run nothing");
  app.add_flag("--json", opts.json, "with --dry-run: the plan as JSON");
  app.add_option("--gpus", opts.gpus, "GPUs of this host to use (default: CUDA_VISIBLE_DEVICES, else nvidia-smi -L)")
      ->check(CLI::PositiveNumber);
  app.add_option("--coordinator", opts.coordinator,
                 "HOST:PORT of a running coordinator's store to join (multi-host), or its coordinator.json; "
                 "default: start one here");
  app.add_option("--node-rank", opts.node_rank,
                 "run every rank of this virtual node for real (instead of --ranks); with --ranks and "
                 "--coordinator: this host's number among the hosts")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--listen", opts.listen,
                 "the coordinator started here serves other hosts: its store and a TCP event bus bind this address "
                 "(0.0.0.0, or this host's address)");
  app.add_option("--remote-ranks", opts.remote_ranks,
                 "real ranks that prism-runs on other hosts will run against the coordinator started here "
                 "(they join with --coordinator HOST:PORT)");
  app.add_flag("--no-preload", opts.no_preload,
               "do not LD_PRELOAD libprism.so (tests the launch only: the job's NCCL calls are not emulated)");
  app.add_flag("--no-passthrough", opts.no_passthrough,
               "never run a communicator on the real NCCL; by default one whose members are all real, each on its "
               "own GPU, does (real NCCL kernels, links and timing among them)");
  app.add_flag("--kernels", opts.kernels,
               "record every kernel, memcpy and memset of the real ranks with CUPTI (<out>/rank<R>.kernels.jsonl), "
               "merged into trace.json; `prism-run report kernels` compares runs (docs/kernels.md)");
  app.add_flag("--kernels-nvtx", opts.kernels_nvtx, "--kernels, and the NVTX ranges the job emits");
  app.add_flag("--quiet", opts.quiet, "do not copy the workers' output to the terminal (it is still in <out>/logs)");
  app.add_option("--hang-timeout", opts.hang_timeout,
                 "seconds without progress of any real rank, while some wait, before the hang diagnosis "
                 "(<out>/hang.json, printed); 0 turns it off")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->envname("PRISM_HANG_TIMEOUT");
  app.add_option("--payload-max-bytes", opts.payload_max_bytes,
                 "with --payload recorded: replay only recorded payloads up to this size, e.g. 4M (default 4M; 0: "
                 "all); larger ones (activations, gradient buckets) follow mirror, so no collective copies megabytes "
                 "from the file (docs/payload.md)");
  app.add_option("--iterations", opts.iterations,
                 "stop the job once every real rank has completed K iterations (its iteration marks), as if it "
                 "had ended there: the report, trace and graph hold at least those K (0: run the job to its end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--on-hang", opts.on_hang,
                 "after a hang diagnosis: stop the job (report written, exit 4) or wait (keep running)")
      ->capture_default_str()
      ->check(CLI::IsMember({"wait", "stop"}));
  return &opts;
}

namespace {

std::string DefaultOutDir() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  fs::path base = fs::current_path() / "prism-out" / buf;
  fs::path p = base;
  for (int i = 2; fs::exists(p); ++i) p = base.string() + "-" + std::to_string(i);
  return p.string();
}

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

}  // namespace

namespace {

// After an emulation with --graph (issue 8): simulate the graph for the same topology and what-ifs, compare every real
// rank's measured iterations with it (launcher/graph_compare.h), print one line per rank and add
// "graph_comparison" to report.json. A failure is reported and leaves the report as it was.
void CompareRunWithGraph(const std::string& graph, const std::string& topology,
                         const std::vector<std::pair<int32_t, double>>& stragglers, const std::string& rep_path) {
  std::string error;
  auto rep = launcher::LoadReport(rep_path, &error);
  if (!rep) return;
  trace::Trace g;
  if (!replay::ReadTrace(graph, &g, &error)) {
    std::printf("prism: no graph comparison: %s\n", error.c_str());
    return;
  }
  auto sim = launcher::SimulateGraph(g, graph, topology, stragglers, &error);
  if (!sim) {
    std::printf("prism: no graph comparison: %s\n", error.c_str());
    return;
  }
  std::vector<launcher::RankGraphComparison> cs = launcher::CompareReports(*rep, *sim, &error);
  if (cs.empty()) {
    std::printf("prism: no graph comparison: %s\n", error.c_str());
    return;
  }
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& c : cs) {
    std::printf("prism: %s\n", launcher::Describe(c).c_str());
    arr.push_back(launcher::ToJson(c));
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
    const std::optional<double> run = launcher::RunComputePerIteration(trace, c.rank, latency);
    const std::optional<double> in_graph = launcher::GraphComputePerIteration(g, c.rank, &error);
    if (!in_graph) std::printf("prism: no own-speed comparison for rank %d: %s\n", c.rank, error.c_str());
    if (!run) std::printf("prism: no own-speed comparison for rank %d: its trace.json has no timed iterations\n", c.rank);
    if (!run || !in_graph || *in_graph <= 0 || *run <= 0) continue;
    own.emplace_back(c.rank, *run / *in_graph);
    speed[c.rank] = {{"run_compute_per_iteration_s", *run},
                     {"graph_compute_per_iteration_s", *in_graph},
                     {"compute_scale", *run / *in_graph}};
  }
  if (!speed.empty()) {
    std::optional<nlohmann::json> sim_own = launcher::SimulateGraph(g, graph, topology, own, &error);
    std::vector<launcher::RankGraphComparison> cs_own;
    if (sim_own) cs_own = launcher::CompareReports(*rep, *sim_own, &error);
    if (cs_own.empty()) std::printf("prism: no own-speed comparison: %s\n", error.c_str());
    for (const auto& c : cs_own) {
      auto sp = speed.find(c.rank);
      if (sp == speed.end()) continue;
      std::printf("prism: at rank %d's own speed (compute %.1f ms per iteration in this run, %.1f ms in the graph: "
                  "x%.3f): %s\n",
                  c.rank, sp->second["run_compute_per_iteration_s"].get<double>() * 1e3,
                  sp->second["graph_compute_per_iteration_s"].get<double>() * 1e3,
                  sp->second["compute_scale"].get<double>(), launcher::Describe(c).c_str());
      nlohmann::json j = launcher::ToJson(c);
      j.erase("iterations");
      j.erase("rank");
      sp->second.update(j);
      for (auto& a : arr)
        if (a.value("rank", -1) == c.rank) a["own_speed"] = sp->second;
    }
  }
  (*rep)["graph_comparison"] = {{"graph", graph},
                                {"simulated_iteration_time_s", (*sim).value("iteration_time_s", 0.0)},
                                {"ranks", std::move(arr)}};
  // Why a rename: report.json is read by `prism-run status` and CI while it changes.
  const std::string tmp = rep_path + ".tmp";
  {
    std::ofstream f(tmp);
    f << rep->dump(2) << "\n";
    if (!f) {
      std::printf("prism: cannot write %s\n", tmp.c_str());
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, rep_path, ec);
  if (ec) std::printf("prism: cannot update %s: %s\n", rep_path.c_str(), ec.message().c_str());
}

}  // namespace

int RunEmulate(const EmulateOptions& opts, const std::vector<std::string>& command) {
  launcher::PlanRequest req;
  req.command = command;
  req.ranks = opts.ranks;
  req.layout = opts.layout;
  req.gpus = opts.gpus;
  req.node_rank = opts.node_rank;
  req.coordinator = opts.coordinator;
  req.payload = opts.payload;
  req.one_replica = opts.one_replica;
  req.real_routing = opts.real_routing;
  req.record_payloads = opts.record_payloads;
  req.all_real = opts.all_real;
  req.preload = !opts.no_preload;
  req.hang_timeout_s = opts.hang_timeout;
  req.on_hang = opts.on_hang;
  req.passthrough = !opts.no_passthrough;
  req.kernels = opts.kernels_nvtx ? 2 : (opts.kernels ? 1 : 0);
  req.listen = opts.listen;
  req.remote_ranks = opts.remote_ranks;
  req.swap = opts.swap;
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
      c.Get(coord::kInfoKey, &req.coordinator_doc);
    }
  }
  std::error_code ec;
  req.out_dir = opts.out.empty() ? DefaultOutDir() : fs::absolute(opts.out, ec).string();
  if (!opts.graph.empty()) {
    if (!fs::is_regular_file(opts.graph, ec)) {
      std::fprintf(stderr, "prism-run: --graph %s: no such file\n", opts.graph.c_str());
      return kExitBadInput;
    }
    req.graph = fs::absolute(opts.graph, ec).string();
  }
  std::vector<std::pair<int32_t, double>> stragglers;
  std::string what_if_spec;
  if (!opts.what_if.empty()) {
    if (opts.graph.empty()) {
      std::fprintf(stderr, "prism-run: --what-if needs --graph (without a graph virtual ranks have no compute to slow)\n");
      return kExitBadInput;
    }
    for (const std::string& w : opts.what_if) what_if_spec += (what_if_spec.empty() ? "" : ",") + w;
    replay::WhatIf wi;
    std::string e;
    if (!replay::ParseWhatIf(what_if_spec, &wi, &e)) {
      std::fprintf(stderr, "prism-run: --what-if: %s\n", e.c_str());
      return kExitBadInput;
    }
    if (wi.bw_scale != 1.0 || !wi.topology.empty()) {
      std::fprintf(stderr, "prism-run: --what-if %s: only straggler= applies to an emulation (bw-scale= and topology= "
                           "change the cost model: use --topology)\n", what_if_spec.c_str());
      return kExitBadInput;
    }
    stragglers = wi.stragglers;
  }
  if (!opts.payload_max_bytes.empty()) {
    uint64_t n = 0;
    if (!coord::ParseBytes(opts.payload_max_bytes, &n)) {
      std::fprintf(stderr, "prism-run: --payload-max-bytes %s: expected bytes such as 4M, 65536 or 0\n",
                   opts.payload_max_bytes.c_str());
      return kExitBadInput;
    }
    req.payload_max_bytes = std::to_string(n);
  }
  if (!opts.payload_dir.empty()) {
    if (opts.payload != "recorded") {
      std::fprintf(stderr, "prism-run: --payload-dir only applies to --payload recorded\n");
      return kExitBadInput;
    }
    req.payload_dir = fs::absolute(opts.payload_dir, ec).string();
  } else if (opts.payload == "recorded") {
    std::fprintf(stderr, "prism-run: --payload recorded needs --payload-dir (the output of prism-run collect)\n");
    return kExitBadInput;
  }
  if (!opts.topology.empty()) {
    // A file is passed by absolute path (the workers may run elsewhere); otherwise it names a preset.
    req.topology = fs::is_regular_file(opts.topology, ec) ? fs::absolute(opts.topology, ec).string() : opts.topology;
  }
  req.run_id = "prism-" + fs::path(req.out_dir).filename().string();

  launcher::HostInfo host = launcher::DetectHost(SelfExe());
  std::string error;
  // Why preload is not required for a dry run: the plan is worth seeing on a machine without the shim built.
  if (opts.dry_run && host.libprism.empty() && req.preload) {
    host.libprism = "<libprism.so not built>";
    host.python_hook_dir = "<libprism.so not built>/python";
  }
  auto plan = launcher::BuildPlan(req, host, &error);
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
      std::printf("%s\n", launcher::PlanToJson(*plan).dump(2).c_str());
    } else {
      std::printf("%s(dry run: nothing was started)\n", launcher::PlanToText(*plan).c_str());
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
  std::unique_ptr<launcher::CoordinatorLink> coord;
  if (plan->start_coordinator) {
    coord = launcher::MakeLocalCoordinator();
  } else {
    coord = launcher::MakeRemoteCoordinator(*plan);
  }
  launcher::LaunchOptions lo;
  lo.prism_argv = SelfArgv();
  lo.echo_output = !opts.quiet;
  lo.stop_after_iterations = opts.iterations;
  std::printf("prism: emulating %d ranks (%d nodes x %d), layout %s; %zu real rank(s); output %s\n",
              plan->world_size, plan->nnodes, plan->nproc_per_node, plan->layout.ToSpec().c_str(), plan->real.size(),
              plan->out_dir.c_str());
  std::fflush(stdout);
  launcher::LaunchResult res = launcher::RunPlan(*plan, coord.get(), lo);
  if (!res.error.empty()) std::fprintf(stderr, "prism-run: %s\n", res.error.c_str());
  std::string rep_path = (fs::path(plan->out_dir) / "report.json").string();
  if (!req.graph.empty()) {
    // Why catch: the job has ended and its exit code must survive whatever the comparison meets in the files.
    try {
      CompareRunWithGraph(req.graph, req.topology, stragglers, rep_path);
    } catch (const std::exception& e) {
      std::printf("prism: no graph comparison: %s\n", e.what());
    }
  }
  if (auto rep = launcher::LoadReport(rep_path, &error)) {
    std::printf("\n%s", launcher::ShowReport(*rep, 16).c_str());
  }
  if (res.stopped_on_hang) {
    std::printf("prism: stopped after a hang diagnosis: %s (exit %d)\n", res.hang_json.c_str(), kExitHang);
  } else if (!res.hang_json.empty()) {
    std::printf("prism: a hang was diagnosed during the run: %s\n", res.hang_json.c_str());
  }
  std::printf("prism: report %s (exit %d)\n", rep_path.c_str(), res.exit_code);
  return res.exit_code;
}

}  // namespace prism::cli
