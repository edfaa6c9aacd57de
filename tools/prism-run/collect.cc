// prism-run collect: bare graph of every rank by context switching
#include "subcommands.h"

namespace prism::cli {

void AddCollect(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("collect", "bare graph of every rank by context switching [not built yet]");
  sub->allow_extras();
  sub->callback([rc] { *rc = NotBuilt("collect", "issue 7"); });
}

}  // namespace prism::cli
