// prism-run: the CLI. Parses, dispatches to one subcommand, returns its exit code.
#include <cstdio>
#include <string>
#include <vector>

#include "subcommands.h"

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
}
