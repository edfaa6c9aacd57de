// Runs a plan: starts the coordinator (unless joining one), one process per real rank, collects their output into
// <out>/logs/rank<R>.log (and the terminal), prints one progress line per iteration from the rank event files,
// keeps report.json up to date (atomically) as the run goes, stops every worker cleanly on Ctrl-C (SIGINT, then
// SIGTERM, then SIGKILL to each worker's process group), and returns the job's exit status.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "launcher/coordinator_link.h"
#include "launcher/plan.h"

namespace prism::launcher {

struct LaunchOptions {
  std::vector<std::string> prism_argv;  // how prism-run was called (for command.json)
  bool echo_output = true;              // copy worker output to the terminal, each line prefixed "[rank R] "
  double interrupt_grace_s = 10;        // after Ctrl-C: SIGINT, then SIGTERM after this, SIGKILL after twice this
  double failure_grace_s = 5;           // after a rank failed: SIGTERM the others, SIGKILL after this
  double report_interval_s = 1;         // report.json rewritten at most this often while running
  int log_tail_lines = 20;              // lines of a failed rank's log printed
  int stop_after_iterations = 0;        // > 0: stop the workers once every real rank completed this many iterations
  double iterations_grace_s = 10;       // then: SIGTERM at once, SIGKILL after twice this
  std::function<void(const std::string&)> print;  // progress and status lines (default: stdout)
};

// Exit status of a run that prism stopped after diagnosing a hang (--on-hang stop); docs/cli.md.
inline constexpr int kExitHang = 4;

struct LaunchResult {
  int exit_code = 0;      // the job's: 0, the first failed rank's code, 128 + signal, 130 after Ctrl-C, or kExitHang
  int failed_rank = -1;
  bool interrupted = false;
  std::string error;      // prism's own failure (could not start), if any
  std::string hang_json;  // set when the coordinator diagnosed a hang (its hang.json)
  bool stopped_on_hang = false;  // --on-hang stop: prism stopped the job after the diagnosis
  bool stopped_after_iterations = false;  // --iterations K: prism stopped the job after K iterations
};

// `coordinator` may be null when plan.start_coordinator is false (joining an existing one).
LaunchResult RunPlan(Plan& plan, CoordinatorLink* coordinator, const LaunchOptions& opts);

}  // namespace prism::launcher
