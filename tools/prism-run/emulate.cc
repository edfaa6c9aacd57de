// prism-run [OPTIONS] torchrun ...: emulate (the default mode). Registers the options, picks the policy and calls
// the library: the faithful procedure (launcher/stages.h: collect -> fill -> emulate, with the graph cache) unless
// --policy mirror, --graph FILE or a multi-host option says otherwise (launcher/emulate.h).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "launcher/emulate.h"
#include "launcher/stages.h"
#include "emulate_options.h"
#include "subcommands.h"

extern char** environ;

namespace prism::cli {

namespace {
struct DefaultMode {
  launcher::StagedOptions staged;
  std::string policy;  // "" = graph (the faithful default)
  CLI::Option* payload = nullptr;
  CLI::Option* ranks = nullptr;
};
DefaultMode& Mode() {
  static DefaultMode m;
  return m;
}
}  // namespace

EmulateOptions* AddEmulateOptions(CLI::App& app) {
  DefaultMode& m = Mode();
  EmulateOptions& opts = m.staged.emulate;
  m.ranks = app.add_option("--ranks", opts.ranks, "logical ranks to run for real: \"0\", \"0,517\", \"0-7\" (default 0)");
  app.add_option("--layout", opts.layout,
                 "\"tp=8,pp=4,dp=32[,cp=..,ep=..,etp=..][,order=tp-cp-ep-dp-pp]\" (default: the job's Megatron "
                 "arguments)");
  app.add_option("--topology", opts.topology, "target cluster: preset name or JSON file");
  app.add_option("--policy", m.policy,
                 "how virtual ranks answer: graph (default: collect, fill and emulate against the filled graph, kept "
                 "in the graph cache; docs/cli.md \"What the default does\") or mirror (quick, not faithful: a "
                 "virtual peer arrives when its real counterpart does; no pipeline bubble, no stragglers)")
      ->check(CLI::IsMember({"graph", "mirror"}));
  app.add_option("--graph", opts.graph, "replay virtual ranks from this PrismTrace (skips collect and fill)");
  app.add_option("--graph-cache", m.staged.cache_root,
                 "where the default procedure keeps collect and fill results (default $PRISM_GRAPH_CACHE, else "
                 "~/.cache/prism/graphs)");
  app.add_flag("--refresh-graph", m.staged.refresh, "collect and fill again even when the graph cache has this job");
  app.add_option("--fill-tolerance", m.staged.tolerance_pct,
                 "the fill stops when a round moves the estimate by at most this many percent")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--fill-rounds", m.staged.max_rounds, "at most this many fill rounds")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--graph-iterations", m.staged.graph_iterations,
                 "iterations of the job the collect and each fill slice run (--iterations, when given, wins)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--collect-swap", m.staged.collect_swap,
                 "context switching in the collect stage: auto (again with it after a CUDA out-of-memory), on, off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  app.add_option("--what-if", opts.what_if,
                 "with a graph (the default policy, or --graph): straggler=RANK:FACTOR slows that virtual rank's compute in the replay (',' joins "
                 "several); the graph comparison after the run uses the same");
  m.payload = app.add_option("--payload", opts.payload,
                             "data of virtual members: mirror|recorded|random|zeros (default policy: the collect's "
                             "recorded payloads; --policy mirror or --graph: mirror)")
      ->capture_default_str()
      ->check(CLI::IsMember({"mirror", "recorded", "random", "zeros"}));
  app.add_option("--payload-dir", opts.payload_dir,
                 "with --payload recorded: the output directory of `prism-run collect` whose payloads/rank<R>.bin "
                 "the real ranks replay (each rank the file of its class)");
  app.add_option("--out", opts.out, "report directory (default ./prism-out/<timestamp>)");
  app.add_flag("--dry-run", opts.dry_run, "print the plan and run nothing");
  app.add_flag("--json", opts.json, "with --dry-run: the plan as JSON");
  app.add_option("--gpus", opts.gpus, "GPUs of this host to use (default: CUDA_VISIBLE_DEVICES, else nvidia-smi -L)")
      ->check(Positive());
  app.add_option("--coordinator", opts.coordinator,
                 "HOST:PORT of a running coordinator's store to join (multi-host), or its coordinator.json; "
                 "default: start one here");
  app.add_option("--node-rank", opts.node_rank,
                 "run every rank of this virtual node for real (instead of --ranks); with --ranks and "
                 "--coordinator: this host's number among the hosts")
      ->check(NonNegative());
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
      ->check(NonNegative())
      ->envname("PRISM_HANG_TIMEOUT");
  app.add_option("--payload-max-bytes", opts.payload_max_bytes,
                 "with --payload recorded: replay only recorded payloads up to this size, e.g. 4M (default 4M; 0: "
                 "all); larger ones (activations, gradient buckets) follow mirror, so no collective copies megabytes "
                 "from the file (docs/payload.md)");
  app.add_option("--iterations", opts.iterations,
                 "stop the job once every real rank has completed K iterations (its iteration marks), as if it "
                 "had ended there: the report, trace and graph hold at least those K (0: run the job to its end)")
      ->check(NonNegative());
  app.add_option("--on-hang", opts.on_hang,
                 "after a hang diagnosis: stop the job (report written, exit 4) or wait (keep running)")
      ->capture_default_str()
      ->check(CLI::IsMember({"wait", "stop"}));
  return &opts;
}


int RunEmulate(const EmulateOptions& /*opts*/, const std::vector<std::string>& command) {
  DefaultMode& m = Mode();
  EmulateOptions& e = m.staged.emulate;
  m.staged.payload_given = m.payload != nullptr && m.payload->count() > 0;
  if (m.ranks != nullptr && m.ranks->count() > 0 && e.ranks.find_first_not_of(" \t") == std::string::npos) {
    std::fprintf(stderr, "prism-run: --ranks \"%s\": no rank given (e.g. 0, 0,517 or 0-7)\n", e.ranks.c_str());
    return kExitBadInput;
  }
  // Multi-host runs (a coordinator here serving others, or joining one) and a given graph run one emulation; the
  // procedure's stages run on one host.
  const bool multi_host = !e.coordinator.empty() || !e.listen.empty() || !e.remote_ranks.empty();
  std::string policy = m.policy;
  // PRISM_POLICY: the policy when --policy is not given (a given --graph still wins over it).
  const char* env_policy = std::getenv("PRISM_POLICY");
  if (policy.empty() && env_policy != nullptr && *env_policy != 0 && e.graph.empty()) {
    policy = env_policy;
    if (policy != "graph" && policy != "mirror") {
      std::fprintf(stderr, "prism-run: PRISM_POLICY=%s: expected graph or mirror\n", env_policy);
      return kExitBadInput;
    }
  }
  if (policy.empty()) policy = !e.graph.empty() ? "given graph" : multi_host ? "mirror" : "graph";
  if (policy == "mirror" && !e.graph.empty()) {
    std::fprintf(stderr, "prism-run: --policy mirror and --graph contradict each other: choose one\n");
    return kExitBadInput;
  }
  if (policy == "graph" && multi_host) {
    std::fprintf(stderr, "prism-run: --policy graph runs its stages on one host; with --coordinator, --listen or "
                         "--remote-ranks give the graph (--graph FILE, made by a one-host run) or --policy mirror\n");
    return kExitBadInput;
  }
  if (policy != "graph") {
    if (m.policy.empty() && multi_host)
      std::fprintf(stderr, "prism-run: note: multi-host run: virtual ranks follow the mirror policy (give --graph "
                           "for a graph)\n");
    const std::string name = policy == "given graph" ? "graph" : policy;
    e.plan_extra = {{"policy", name}, {"stages", {{{"name", "emulate"}}}}};
    if (!e.graph.empty()) e.plan_extra["graph"] = e.graph;
    return launcher::Emulate(e, command);
  }
  for (char** v = environ; v != nullptr && *v != nullptr; ++v) m.staged.environment.emplace_back(*v);
  return launcher::RunStaged(m.staged, command);
}

}  // namespace prism::cli
