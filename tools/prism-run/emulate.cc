// prism-run [OPTIONS] torchrun ...: emulate (the default mode).
#include "subcommands.h"

namespace prism::cli {

struct EmulateOptions {
  std::string ranks = "0";
  std::string layout;
  std::string topology;
  std::string graph;
  std::string payload = "mirror";
  std::string out;
  bool dry_run = false;
  bool json = false;
};

EmulateOptions* AddEmulateOptions(CLI::App& app) {
  static EmulateOptions opts;
  app.add_option("--ranks", opts.ranks, "logical ranks to run for real: \"0\", \"0,517\", \"0-7\"")
      ->capture_default_str();
  app.add_option("--layout", opts.layout, "\"tp=8,pp=4,dp=32[,cp=..,ep=..][,order=tp-cp-ep-dp-pp]\"");
  app.add_option("--topology", opts.topology, "target cluster: preset name or JSON file");
  app.add_option("--graph", opts.graph, "replay virtual ranks from this PrismTrace (otherwise mirror)");
  app.add_option("--payload", opts.payload, "data of virtual members: mirror|recorded|random|zeros")
      ->capture_default_str();
  app.add_option("--out", opts.out, "report directory (default ./prism-out/<timestamp>)");
  app.add_flag("--dry-run", opts.dry_run, "print the plan and run nothing");
  app.add_flag("--json", opts.json, "with --dry-run: the plan as JSON");
  return &opts;
}

int RunEmulate(const EmulateOptions& opts, const std::vector<std::string>& command) {
  return NotBuilt("emulate", "issue 6");
}

}  // namespace prism::cli
