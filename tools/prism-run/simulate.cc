// prism-run simulate: replay every rank of a graph, no GPU needed (src/replay/simulate.h does the work).
#include <cstdlib>
#include <iostream>

#include "replay/simulate.h"
#include "subcommands.h"

namespace prism::cli {

void AddSimulate(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("simulate", "replay every rank of a graph, no GPU needed");
  auto opts = std::make_shared<replay::SimulateOptions>();
  auto nccl_algo = std::make_shared<std::string>();
  auto nccl_proto = std::make_shared<std::string>();
  sub->add_option("graph", opts->graph, "PrismTrace to replay (.prism or .prism.json)")->required();
  sub->add_option("--topology", opts->topology,
                  "target cluster: preset name (examples/topologies/) or JSON file; default: the graph's, else "
                  "h100-8x400g");
  sub->add_option("--model", opts->model, "cost model: nccl or alpha-beta (default: the topology's)");
  sub->add_option("--what-if", opts->what_ifs,
                  "straggler=RANK:FACTOR | bw-scale=F | topology=FILE (',' combines; repeat for more scenarios)");
  sub->add_option("--out", opts->out_dir, "output directory (default ./prism-out/<timestamp>)");
  sub->add_option("--trace-ranks", opts->trace_ranks, "ranks in trace.json, e.g. 0,8-15 (\"none\": no trace)")
      ->capture_default_str();
  sub->add_flag("--use-recorded,!--no-use-recorded", opts->use_recorded,
                "use recorded comm durations from the graph when present (default on)");
  sub->add_option("--send-completion", opts->send_completion,
                  "when a send completes: rendezvous (with its receive), eager (after its transfer, without the "
                  "receiver: ASTRA-sim), nccl (eager up to NCCL's p2p buffer, rendezvous above); default: the "
                  "graph's send_completion, else rendezvous")
      ->check(CLI::IsMember({"rendezvous", "eager", "nccl"}));
  sub->add_flag("!--no-validate", opts->validate, "skip the graph validator (the engine still refuses what it cannot run)");
  sub->add_flag("!--no-symmetric,!--full", opts->symmetric,
                "replay every rank even when all data-parallel replicas are identical (default: replay one replica "
                "and copy it, which gives the same result)");
  sub->add_option("--nccl-algo", *nccl_algo, "NCCL_ALGO for the model (default: $NCCL_ALGO)");
  sub->add_option("--nccl-proto", *nccl_proto, "NCCL_PROTO for the model (default: $NCCL_PROTO)");
  sub->add_flag("--quiet", opts->quiet, "no summary on stdout");
  sub->callback([rc, opts, nccl_algo, nccl_proto] {
    // Precedence: command line > environment.
    const char* env_algo = std::getenv("NCCL_ALGO");
    const char* env_proto = std::getenv("NCCL_PROTO");
    opts->nccl_algo = !nccl_algo->empty() ? *nccl_algo : env_algo ? env_algo : "";
    opts->nccl_proto = !nccl_proto->empty() ? *nccl_proto : env_proto ? env_proto : "";
    *rc = replay::RunSimulate(*opts, std::cout, std::cerr);
  });
}

}  // namespace prism::cli
