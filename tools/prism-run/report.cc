// prism-run report show DIR | diff A B [--max-regression PCT]: read report.json files (any mode).
#include <cstdio>

#include "launcher/report_compare.h"
#include "subcommands.h"

namespace prism::cli {

void AddReport(CLI::App& app, int* rc) {
  auto* sub = app.add_subcommand("report", "show a report, or diff two (exit 1 on regression)");
  sub->require_subcommand(1);

  static std::string show_path;
  static int show_rows = 64;
  auto* show = sub->add_subcommand("show", "print a report as a table");
  show->add_option("DIR", show_path, "output directory of a run (or its report.json)")->required();
  show->add_option("--rows", show_rows, "rank rows to print")->capture_default_str();
  show->callback([rc] {
    std::string error;
    auto rep = launcher::LoadReport(show_path, &error);
    if (!rep) {
      std::fprintf(stderr, "prism-run report show: %s\n", error.c_str());
      *rc = kExitBadInput;
      return;
    }
    std::printf("%s", launcher::ShowReport(*rep, static_cast<size_t>(show_rows)).c_str());
    *rc = kExitOk;
  });

  static std::string a_path, b_path;
  static double max_regression = 5.0;
  auto* diff = sub->add_subcommand("diff", "compare B against A; exit 1 when B is worse by more than PCT");
  diff->add_option("A", a_path, "baseline run directory (or report.json)")->required();
  diff->add_option("B", b_path, "new run directory (or report.json)")->required();
  diff->add_option("--max-regression", max_regression,
                   "percent by which iteration time or a peak memory may grow before it counts as a regression")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  diff->callback([rc] {
    std::string error;
    auto a = launcher::LoadReport(a_path, &error);
    std::optional<nlohmann::json> b;
    if (a) b = launcher::LoadReport(b_path, &error);
    if (!a || !b) {
      std::fprintf(stderr, "prism-run report diff: %s\n", error.c_str());
      *rc = kExitBadInput;
      return;
    }
    auto d = launcher::DiffReports(*a, *b, max_regression, &error);
    if (!d) {
      std::fprintf(stderr, "prism-run report diff: %s\n", error.c_str());
      *rc = kExitBadInput;
      return;
    }
    std::printf("A %s\nB %s\n%s", a_path.c_str(), b_path.c_str(), d->text.c_str());
    *rc = d->regression ? kExitFailure : kExitOk;
  });
}

}  // namespace prism::cli
