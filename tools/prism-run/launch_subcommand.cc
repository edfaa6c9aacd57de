// The options and output directory `collect` and `record` share (emulate_options.h).
#include <filesystem>

#include <CLI/CLI.hpp>

#include "checks.h"
#include "emulate_options.h"

namespace prism::cli {
namespace fs = std::filesystem;

void AddLaunchSubcommandOptions(CLI::App* sub, LaunchSubcommandOptions* o, const std::string& default_out,
                                const std::string& gpus_help) {
  sub->add_option("--out", o->out, "output directory (default ./" + default_out + ", then " + default_out +
                                        "-2, ... while taken)");
  sub->add_option("--layout", o->layout, "as for emulate (default: the job's Megatron arguments)");
  sub->add_option("--topology", o->topology, "target cluster for the modelled durations: preset or JSON file");
  sub->add_option("--gpus", o->gpus, gpus_help)->check(Positive());
  sub->add_flag("--quiet", o->quiet, "do not copy the workers' output to the terminal");
  sub->add_flag("--dry-run", o->dry_run, "print the plan (which ranks run) and run nothing");
  sub->add_flag("--json", o->json, "with --dry-run: the plan as JSON");
  sub->add_option("--hang-timeout", o->hang_timeout, "as for emulate")->check(NonNegative());
  AddSizeOption(sub, "--payload-max-bytes", &o->payload_max_bytes,
                  "record only payloads up to this size, e.g. 4M (default 4M; 0: all); larger ones replay as mirror");
  sub->add_option("--iterations", o->iterations, "as for emulate: stop the job after K iterations of every real rank")
      ->check(NonNegative());
}

EmulateOptions ToEmulateOptions(const LaunchSubcommandOptions& o, const std::string& default_out) {
  EmulateOptions e;
  e.out = o.out;
  e.layout = o.layout;
  e.topology = o.topology;
  e.gpus = o.gpus;
  e.quiet = o.quiet;
  e.dry_run = o.dry_run;
  e.json = o.json;
  e.hang_timeout = o.hang_timeout;
  e.iterations = o.iterations;
  e.payload_max_bytes = o.payload_max_bytes;
  if (e.out.empty()) {
    std::error_code ec;
    fs::path base = fs::current_path() / default_out;
    fs::path p = base;
    for (int i = 2; fs::exists(p, ec); ++i) p = base.string() + "-" + std::to_string(i);
    e.out = p.string();
  }
  return e;
}

}  // namespace prism::cli
