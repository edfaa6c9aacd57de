// prism-run collect [OPTIONS] torchrun ...: stage 1 (docs/collect.md). Runs data-parallel replica 0 of the job
// (every rank with dp == 0: tp x pp x cp ranks) for real, with real data between them (exchange), records what
// each received from real data (payloads/rank<R>.bin, for `--payload recorded`), and writes the bare graph of all
// ranks (observed.prism) from their event files. The same launcher path as emulate (emulate_options.h).
//
// Not built yet (docs/collect.md says so): context switching with the CUDA checkpoint API when the replica does
// not fit on this host's GPUs at once, --real-routing (expert-parallel ranks), and stopping after K iterations
// (the job's own --train-iters decides).
#include <cstdio>
#include <filesystem>

#include "emulate_options.h"
#include "subcommands.h"

namespace prism::cli {
namespace fs = std::filesystem;

namespace {
struct CollectOptions : LaunchSubcommandOptions {
  bool no_payloads = false;
};
}  // namespace

void AddCollect(CLI::App& app, int* rc) {
  static CollectOptions o;
  auto* sub = app.add_subcommand(
      "collect", "run data-parallel replica 0 for real (real data between its ranks); write the bare graph of all "
                 "ranks and the payloads each rank received");
  sub->prefix_command();
  AddLaunchSubcommandOptions(sub, &o, "prism-collect", "GPUs of this host to use (default: all visible)");
  sub->add_flag("--no-payloads", o.no_payloads, "do not record payloads (no `--payload recorded` later)");
  sub->callback([sub, rc] {
    std::vector<std::string> command = sub->remaining();
    if (command.empty()) {
      std::fprintf(stderr, "prism-run collect: give the job's command: prism-run collect [OPTIONS] torchrun ...\n");
      *rc = kExitBadInput;
      return;
    }
    EmulateOptions e = ToEmulateOptions(o, "prism-collect");
    e.one_replica = true;
    e.record_payloads = !o.no_payloads;
    *rc = RunEmulate(e, command);
    if (o.dry_run) return;
    std::error_code ec;
    fs::path out = fs::absolute(e.out, ec);
    uint64_t bytes = 0;
    int files = 0;
    for (const auto& f : fs::directory_iterator(out / "payloads", ec)) {
      bytes += f.file_size(ec);
      ++files;
    }
    std::printf("prism collect: bare graph %s%s\n", (out / "observed.prism").string().c_str(),
                fs::exists(out / "observed.prism", ec) ? "" : " (NOT written: see the lines above)");
    if (!o.no_payloads) {
      std::printf("prism collect: payloads of %d rank(s), %.1f MiB, in %s (use: prism-run --payload recorded "
                  "--payload-dir %s --ranks R torchrun ...)\n",
                  files, static_cast<double>(bytes) / (1 << 20), (out / "payloads").string().c_str(),
                  out.string().c_str());
    }
  });
}

}  // namespace prism::cli
