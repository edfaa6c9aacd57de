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


void AddRecord(CLI::App& app, int* rc) {
  static LaunchSubcommandOptions o;
  auto* sub = app.add_subcommand(
      "record", "run every rank of the job for real on this host's GPUs, on the real NCCL, and write its timed graph "
                "(observed.prism) from GPU timestamps");
  sub->prefix_command();
  AddLaunchSubcommandOptions(sub, &o, "prism-record",
                             "GPUs of this host to use (default: all visible); the world must fit");
  sub->callback([sub, rc] {
    std::vector<std::string> command = sub->remaining();
    if (command.empty()) {
      std::fprintf(stderr, "prism-run record: give the job's command: prism-run record [OPTIONS] torchrun ...\n");
      *rc = kExitBadInput;
      return;
    }
    EmulateOptions e = ToEmulateOptions(o, "prism-record");
    e.all_real = true;
    *rc = launcher::Emulate(e, command);
    if (o.dry_run) return;
    std::error_code ec;
    fs::path out = fs::absolute(e.out, ec);
    std::printf("prism record: timed graph %s%s\n", (out / "observed.prism").string().c_str(),
                fs::exists(out / "observed.prism", ec) ? "" : " (NOT written: see the lines above)");
  });
}

}  // namespace prism::cli
