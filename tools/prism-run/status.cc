// prism-run status: live state of every logical rank of a running emulation
#include "subcommands.h"

namespace prism::cli {

void AddStatus(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("status", "live state of every logical rank of a running emulation [not built yet]");
  sub->allow_extras();
  sub->callback([rc] { *rc = NotBuilt("status", "issue 9"); });
}

}  // namespace prism::cli
