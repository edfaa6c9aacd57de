// Reading, showing and comparing report.json files (any mode: emulate, simulate, collect, fill), for
// `prism-run report show` and `prism-run report diff` (the overnight CI job's regression gate).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace prism::analysis {

// Loads DIR/report.json, or the file itself when `path` is a file. Checks the keys every report has
// (world_size, mode, ranks); nullopt with *error naming the file and the problem otherwise.
std::optional<nlohmann::json> LoadReport(const std::string& path, std::string* error);

// A table for people: the run's summary, one row per rank (capped at `max_rows`), warnings.
// The report's first lines in words: which policy produced the numbers, the graph, cache hit or miss, the fill's
// convergence and each stage's wall time ("" when report.json has no "policy").
std::string PolicyLines(const nlohmann::json& report);
std::string ShowReport(const nlohmann::json& report, size_t max_rows = 64);

struct DiffResult {
  bool regression = false;
  std::string text;  // a table of A, B and the change of every compared figure, then the verdict
};

// Compares B against A: a regression is an iteration time (top level) or a peak memory (per rank present in
// both; without common ranks, the largest of each report) larger in B by more than max_regression_pct percent.
// nullopt with *error when a report lacks iteration_time_s (nothing to compare).
std::optional<DiffResult> DiffReports(const nlohmann::json& a, const nlohmann::json& b, double max_regression_pct,
                                      std::string* error);

}  // namespace prism::analysis
