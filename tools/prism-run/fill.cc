// prism-run fill [OPTIONS] torchrun ...: stages 2 and 3 of the paper's procedure on this host (launcher/fill.h,
// docs/fill.md). Parses and calls launcher::RunFill.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "launcher/fill.h"
#include "subcommands.h"

namespace prism::cli {
namespace fs = std::filesystem;

namespace {
struct FillCliOptions {
  launcher::FillOptions fill;
  std::string graph;  // a collect run's observed.prism (its directory holds the events)
  bool every_class = false;
};
}  // namespace

void AddFill(CLI::App& app, int* rc) {
  static FillCliOptions co;
  launcher::FillOptions& o = co.fill;
  auto* sub = app.add_subcommand("fill", "time the graph of a collect run by running each class alone against the "
                                         "others replayed from the graph; calibrate across slices");
  sub->prefix_command();
  sub->add_option("--graph", co.graph, "a collect run's observed.prism (its directory holds the event files)");
  sub->add_option("--from", o.from, "the collect run's directory (instead of --graph)");
  sub->add_option("--out", o.out, "output directory (default ./prism-fill)");
  sub->add_option("--topology", o.topology, "target cluster for the modelled communication");
  sub->add_option("--tolerance", o.tolerance_pct, "stop when a round moves the estimate by at most this many percent")
      ->capture_default_str();
  sub->add_option("--rounds", o.max_rounds, "at most this many rounds")->capture_default_str()->check(Positive());
  sub->add_option("--gpus", o.gpus,
                  "GPUs of this host: with G > 1 a slice is a tensor-parallel group (up to G ranks, each on its own "
                  "GPU, their communicator on the real NCCL); one slice runs at a time")
      ->check(Positive());
  sub->add_option("--hang-timeout", o.hang_timeout, "per slice, as for emulate")->capture_default_str();
  AddSizeOption(sub, "--payload-max-bytes", &o.payload_max_bytes, "per slice, as for emulate (default 4M)");
  sub->add_option("--lockstep", o.lockstep,
                  "communicator slots (comma-separated, auto, or none) whose virtual members do not hold a slice's "
                  "real rank: its collectives there complete at its own arrival plus the duration; auto: the slots "
                  "whose group spans only tp, cp and dp (replicas and symmetric positions of the rank's own stage "
                  "run in lockstep; docs/fill.md)")
      ->capture_default_str();
  sub->add_flag("--every-class", co.every_class,
                "run a slice for every class; by default a tensor-parallel position whose graph has the same "
                "operations in the same order as its group's first takes that slice's compute (docs/fill.md)");
  sub->add_flag("--resume", o.resume,
                "continue an earlier fill into the same --out that stopped part way: its finished slices are reused");
  sub->add_option("--iterations", o.iterations, "stop each slice's job after K iterations (0: run it out)")
      ->check(NonNegative());
  sub->callback([sub, rc] {
    std::vector<std::string> command = sub->remaining();
    if (command.empty()) {
      std::fprintf(stderr, "prism-run fill: give the job's command: prism-run fill --graph G torchrun ...\n");
      *rc = kExitBadInput;
      return;
    }
    launcher::FillOptions f = co.fill;
    if (f.from.empty() && !co.graph.empty()) f.from = fs::path(co.graph).parent_path().string();
    if (f.from.empty() && !co.graph.empty()) f.from = ".";
    f.share_symmetric_tp = !co.every_class;
    launcher::FillResult r = launcher::RunFill(f, command);
    if (r.exit_code == 0)
      std::printf("prism fill: use: prism-run --graph %s --payload recorded --payload-dir %s --ranks R torchrun ...\n",
                  r.graph.c_str(), f.from.c_str());
    *rc = r.exit_code;
  });
}

}  // namespace prism::cli
