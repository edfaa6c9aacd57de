// prism-run simulate: replay every rank of a graph, no GPU needed
#include "subcommands.h"

namespace prism::cli {

void AddSimulate(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("simulate", "replay every rank of a graph, no GPU needed [not built yet]");
  sub->allow_extras();
  sub->callback([rc] { *rc = NotBuilt("simulate", "issue 3"); });
}

}  // namespace prism::cli
