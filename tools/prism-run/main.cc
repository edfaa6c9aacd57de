// prism-run: the CLI. Parses, dispatches to one subcommand, returns its exit code.
#include <cstdio>
#include <functional>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "subcommands.h"

namespace {
std::string CommandLine(int argc, char** argv) {
  std::string s = "prism-run";
  for (int i = 1; i < argc; ++i) s += std::string(" ") + argv[i];
  return s.size() > 400 ? s.substr(0, 400) + " ..." : s;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace prism::cli;
  CLI::App app{
      "Prism: run the ranks you care about of a large distributed training job on a few GPUs.\n"
      "  prism-run [OPTIONS] torchrun [TORCHRUN ARGS] SCRIPT [ARGS]   emulate (default)",
      "prism-run"};
  app.set_version_flag("--version", PRISM_VERSION);
  app.prefix_command();  // Why: everything from the first unknown word (torchrun ...) on is the job's command.
  app.require_subcommand(0, 1);

  int rc = kExitOk;
  EmulateOptions* emulate = AddEmulateOptions(app);
  AddSimulate(app, &rc);
  AddSynth(app, &rc);
  AddCollect(app, &rc);
  AddRecord(app, &rc);
  AddFill(app, &rc);
  AddReport(app, &rc);
  AddStatus(app, &rc);
  AddCoordinator(app, &rc);
  AddImportChakra(app, &rc);
  AddExportChakra(app, &rc);
  AddGraph(app, &rc);
  AddCalibrate(app, &rc);
  // Why: subcommands inherit the top level's prefix_command, which passes unknown options through silently; only
  // the subcommands that take the job's command keep it (they set it themselves).
  std::function<void(CLI::App*)> strict = [&](CLI::App* a) {
    for (CLI::App* sub : a->get_subcommands([](CLI::App*) { return true; })) {
      const std::string n = sub->get_name();
      if (a == &app && (n == "collect" || n == "fill" || n == "record")) continue;
      sub->prefix_command(false);
      sub->allow_extras(false);
      strict(sub);
    }
  };
  strict(&app);

  // Why one handler here: a file or argument no reader foresaw (a directory given as a graph, a CBOR array claiming
  // 2^62 elements) must end as a clear error and exit 2, never as an abort that loses the user's output.
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      int code = app.exit(e);
      return code == 0 ? 0 : kExitBadInput;
    }
    if (!app.get_subcommands().empty()) return rc;
    std::vector<std::string> command = app.remaining();
    if (command.empty()) {
      std::fprintf(stderr, "%s", app.help().c_str());
      return kExitBadInput;
    }
    return RunEmulate(*emulate, command);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "prism-run: out of memory on the input of: %s\n", CommandLine(argc, argv).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "prism-run: cannot use the input of: %s: %s\n", CommandLine(argc, argv).c_str(), e.what());
  }
  return kExitBadInput;
}
