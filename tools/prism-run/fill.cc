// prism-run fill: fill a bare graph with timing, calibrated across slices
#include "subcommands.h"

namespace prism::cli {

void AddFill(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("fill", "fill a bare graph with timing, calibrated across slices [not built yet]");
  sub->allow_extras();
  sub->callback([rc] { *rc = NotBuilt("fill", "issue 8"); });
}

}  // namespace prism::cli
