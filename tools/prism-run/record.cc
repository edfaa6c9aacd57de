// prism-run record [OPTIONS] torchrun ...: every rank of the job for real, each on its own GPU of this host, every
// communicator on the real NCCL (passthrough, docs/libprism.md), with libprism timing each operation on the GPU
// (stamps before and after the real call) and noting the cross-stream waits; writes the job's timed graph
// (observed.prism: compute from the GPU stamps, communication from the real NCCL's measured times) and the usual
// report. The same launcher path as emulate (emulate_options.h). docs/record.md.
//
// Not built yet (docs/record.md): several hosts, a job larger than this host's GPUs, and the overhead measurement on
// a GPU machine (tests/gpu/record_suite.sh is not written: no multi-GPU machine was lent).
#include <cstdio>
#include <filesystem>

#include "emulate_options.h"
#include "subcommands.h"

namespace prism::cli {
namespace fs = std::filesystem;

namespace {
struct RecordOptions {
  std::string out;
  std::string layout;
  std::string topology;
  int gpus = 0;
  bool quiet = false;
  bool dry_run = false;
  bool json = false;
  double hang_timeout = 60;
};
}  // namespace

void AddRecord(CLI::App& app, int* rc) {
  static RecordOptions o;
  auto* sub = app.add_subcommand(
      "record", "run every rank of the job for real on this host's GPUs, on the real NCCL, and write its timed graph "
                "(observed.prism) from GPU timestamps");
  sub->prefix_command();
  sub->add_option("--out", o.out, "output directory (default ./prism-record[-N])");
  sub->add_option("--layout", o.layout, "as for emulate (default: the job's Megatron arguments)");
  sub->add_option("--topology", o.topology, "target cluster for the graph's cost-model fallbacks: preset or JSON file");
  sub->add_option("--gpus", o.gpus, "GPUs of this host to use (default: all visible); the world must fit")
      ->check(CLI::PositiveNumber);
  sub->add_flag("--quiet", o.quiet, "do not copy the workers' output to the terminal");
  sub->add_flag("--dry-run", o.dry_run, "print the plan and run nothing");
  sub->add_flag("--json", o.json, "with --dry-run: the plan as JSON");
  sub->add_option("--hang-timeout", o.hang_timeout, "as for emulate")->check(CLI::NonNegativeNumber);
  sub->callback([sub, rc] {
    std::vector<std::string> command = sub->remaining();
    if (command.empty()) {
      std::fprintf(stderr, "prism-run record: give the job's command: prism-run record [OPTIONS] torchrun ...\n");
      *rc = kExitBadInput;
      return;
    }
    EmulateOptions e;
    e.out = o.out;
    e.layout = o.layout;
    e.topology = o.topology;
    e.gpus = o.gpus;
    e.quiet = o.quiet;
    e.dry_run = o.dry_run;
    e.json = o.json;
    e.hang_timeout = o.hang_timeout;
    e.all_real = true;
    if (e.out.empty()) {
      std::error_code ec;
      fs::path base = fs::current_path() / "prism-record";
      fs::path p = base;
      for (int i = 2; fs::exists(p, ec); ++i) p = base.string() + "-" + std::to_string(i);
      e.out = p.string();
    }
    *rc = RunEmulate(e, command);
    if (o.dry_run) return;
    std::error_code ec;
    fs::path out = fs::absolute(e.out, ec);
    std::printf("prism record: timed graph %s%s\n", (out / "observed.prism").string().c_str(),
                fs::exists(out / "observed.prism", ec) ? "" : " (NOT written: see the lines above)");
  });
}

}  // namespace prism::cli
