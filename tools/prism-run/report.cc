// prism-run report: show a report, or diff two (exit 1 on regression)
#include "subcommands.h"

namespace prism::cli {

void AddReport(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("report", "show a report, or diff two (exit 1 on regression) [not built yet]");
  sub->allow_extras();
  sub->callback([rc] { *rc = NotBuilt("report", "issue 6"); });
}

}  // namespace prism::cli
