// prism-run coordinator: run the coordinator alone (store, logical world, event bus)
#include "subcommands.h"

namespace prism::cli {

void AddCoordinator(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("coordinator", "run the coordinator alone (store, logical world, event bus) [not built yet]");
  sub->allow_extras();
  sub->callback([rc] { *rc = NotBuilt("coordinator", "issue 5"); });
}

}  // namespace prism::cli
