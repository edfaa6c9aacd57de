// prism-run report show DIR | diff A B [--max-regression PCT]: read report.json files (any mode).
// prism-run report kernels A [B]: per-kernel comparison of two runs' kernel files (docs/kernels.md).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "analysis/kernel_report.h"
#include "analysis/report_compare.h"
#include "subcommands.h"

namespace prism::cli {

namespace {

// A side of `report kernels`: an output directory, or a kernel file (its directory holds the event file).
struct KernelSource {
  std::string dir;
  int rank = -1;  // from a file name; -1 for a directory
};

bool ResolveKernelSource(const std::string& arg, KernelSource* src, std::string* error) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(arg, ec)) {
    src->dir = arg;
    return true;
  }
  std::smatch m;
  const std::string name = fs::path(arg).filename().string();
  static const std::regex re("rank([0-9]+)\\.kernels\\.jsonl");
  if (fs::is_regular_file(arg, ec) && std::regex_match(name, m, re)) {
    src->dir = fs::path(arg).parent_path().string();
    if (src->dir.empty()) src->dir = ".";
    src->rank = std::stoi(m[1].str());
    return true;
  }
  *error = arg + ": not an output directory or a rank<R>.kernels.jsonl file";
  return false;
}

void AddReportKernels(CLI::App* report, int* rc) {
  static std::string a_path, b_path;
  static int rank = -1, rank_b = -1, rows = 40, skip = 1;
  static bool json_out = false;
  auto* k = report->add_subcommand(
      "kernels", "per kernel: count, duration and launch offset within the iteration in A and B, their deviation and "
                 "each run's natural variance (runs made with --kernels)");
  k->add_option("A", a_path, "output directory (or its rank<R>.kernels.jsonl)")->required();
  k->add_option("B", b_path, "the run to compare with A (default: A itself: its own spread only)");
  k->add_option("--rank", rank, "rank of A (and of B unless --rank-b); default: the lowest rank with kernels in both");
  k->add_option("--rank-b", rank_b, "rank of B when it differs from A's (e.g. a native world-1 run's rank 0)");
  k->add_option("--skip", skip, "leading complete iterations left out (warm-up)")->capture_default_str()
      ->check(NonNegative());
  k->add_option("--rows", rows, "kernel rows to print (largest time per iteration first)")->capture_default_str()
      ->check(NonNegative());
  k->add_flag("--json", json_out, "the comparison as JSON (every kernel)");
  k->callback([rc] {
    std::string error;
    KernelSource a, b;
    if (!ResolveKernelSource(a_path, &a, &error) ||
        !ResolveKernelSource(b_path.empty() ? a_path : b_path, &b, &error)) {
      std::fprintf(stderr, "prism-run report kernels: %s\n", error.c_str());
      *rc = kExitBadInput;
      return;
    }
    int ra = rank >= 0 ? rank : a.rank;
    int rb = rank_b >= 0 ? rank_b : (rank >= 0 ? rank : b.rank);
    if (ra < 0 || rb < 0) {
      const std::vector<int> in_a = analysis::KernelRanksIn(a.dir), in_b = analysis::KernelRanksIn(b.dir);
      auto has = [](const std::vector<int>& v, int r) { return std::find(v.begin(), v.end(), r) != v.end(); };
      if (ra < 0 && rb < 0) {
        for (int r : in_a) {
          if (has(in_b, r)) {
            ra = rb = r;
            break;
          }
        }
      } else if (ra < 0) {
        ra = has(in_a, rb) ? rb : (in_a.empty() ? -1 : in_a.front());
      } else {
        rb = has(in_b, ra) ? ra : (in_b.empty() ? -1 : in_b.front());
      }
      if (ra < 0 || rb < 0) {
        const std::string where = in_a.empty() ? "in " + a.dir
                                  : in_b.empty() ? "in " + b.dir
                                                 : "for a rank common to A and B (use --rank and --rank-b)";
        std::fprintf(stderr, "prism-run report kernels: no rank<R>.kernels.jsonl %s (run prism-run with --kernels)\n",
                     where.c_str());
        *rc = kExitBadInput;
        return;
      }
    }
    auto ka = analysis::LoadRankKernels(a.dir, ra, &error);
    std::optional<analysis::RankKernels> kb;
    if (ka) kb = analysis::LoadRankKernels(b.dir, rb, &error);
    if (!ka || !kb) {
      std::fprintf(stderr, "prism-run report kernels: %s\n", error.c_str());
      *rc = kExitBadInput;
      return;
    }
    analysis::KernelCompareOptions opts;
    opts.skip = skip;
    auto cmp = analysis::CompareKernels(*ka, *kb, opts, &error);
    if (!cmp) {
      std::fprintf(stderr, "prism-run report kernels: %s\n", error.c_str());
      *rc = kExitBadInput;
      return;
    }
    (*cmp)["a"]["source"] = a_path;
    (*cmp)["b"]["source"] = b_path.empty() ? a_path : b_path;
    if (json_out) {
      std::printf("%s\n", cmp->dump(2).c_str());
    } else {
      std::printf("%s", analysis::KernelCompareText(*cmp, rows).c_str());
    }
    *rc = kExitOk;
  });
}

}  // namespace

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
    auto rep = analysis::LoadReport(show_path, &error);
    if (!rep) {
      std::fprintf(stderr, "prism-run report show: %s\n", error.c_str());
      *rc = kExitBadInput;
      return;
    }
    std::printf("%s", analysis::ShowReport(*rep, static_cast<size_t>(show_rows)).c_str());
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
      ->check(NonNegative());
  diff->callback([rc] {
    std::string error;
    auto a = analysis::LoadReport(a_path, &error);
    std::optional<nlohmann::json> b;
    if (a) b = analysis::LoadReport(b_path, &error);
    if (!a || !b) {
      std::fprintf(stderr, "prism-run report diff: %s\n", error.c_str());
      *rc = kExitBadInput;
      return;
    }
    auto d = analysis::DiffReports(*a, *b, max_regression, &error);
    if (!d) {
      std::fprintf(stderr, "prism-run report diff: %s\n", error.c_str());
      *rc = kExitBadInput;
      return;
    }
    std::printf("A %s\nB %s\n%s", a_path.c_str(), b_path.c_str(), d->text.c_str());
    *rc = d->regression ? kExitFailure : kExitOk;
  });

  AddReportKernels(sub, rc);
}

}  // namespace prism::cli
