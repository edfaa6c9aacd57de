// Builds report.json (include/prism/report.h keys) and trace.json from the per-rank event files the shim writes
// (include/prism/events.h), while the job runs. Reads each rank<R>.events.jsonl incrementally (only complete
// lines; a malformed line becomes one warning, never a crash).
//
// Definitions (docs/cli.md, "report.json"):
//   iteration_time_s (per rank)  median of the rank's iteration durations, excluding its first iteration line
//                                (warm-up: allocator growth, NCCL setup, CUDA module loading; libprism's first mark
//                                has dur_ns 0 anyway) and any line without a duration. With one, that one.
//   iteration_time_s (top level) per iteration, the slowest real rank's duration; the median of those over the
//                                measured iterations (again without the first).
//   wait_s[comm]                 time the rank's operations on that communicator spent waiting for their last
//                                member: sum of (release - arrival - modelled duration), clamped at 0.
//   comm_s[comm]                 time the rank's stream was held by that communicator's operations:
//                                sum of (release - arrival).
//   wait_on_ranks[r]             of wait_s, the part where global rank r arrived last.
//   coordinator_latency_s        time the rank's gates opened after their decided release: sum of
//                                (opened - max(release, arrival)), clamped at 0 (op lines with opened_ns only);
//                                coordinator_latency_per_iteration_s: its median over measured iterations.
//   peak_memory_bytes            the largest device footprint libprism saw (iter/mem/bye lines).
//   torch_max_allocated_bytes    the largest torch.cuda.max_memory_allocated() the Python hook reported.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace prism::analysis {

struct IterationSample {
  int64_t iteration = 0;
  int64_t t_ns = 0;
  int64_t dur_ns = 0;
  int64_t peak_bytes = -1;
  int64_t torch_max_allocated = -1;
};

struct CommTotals {
  double comm_s = 0;
  double wait_s = 0;
  int64_t ops = 0;
};

struct RankEvents {
  int rank = 0;
  bool seen_hello = false;
  bool seen_bye = false;
  int64_t pid = -1;
  std::string host;
  int64_t gpu = -1;
  std::map<int64_t, IterationSample> iterations;  // by iteration number
  int64_t peak_bytes = -1;
  int64_t torch_max_allocated = -1;
  std::map<int64_t, std::string> comm_desc;       // comm_id -> description
  std::map<std::string, CommTotals> comms;        // description -> totals
  std::map<int, double> wait_on_ranks;
  // description -> iteration -> seconds waited by operations that arrived in it (iteration n spans (mark n-1,
  // mark n]). Bounded by iterations, not operations: an operation that arrived after the last mark seen so far
  // waits in pending_waits until the mark that closes its iteration is read (a mark's line can come after the
  // lines of operations that arrived after it).
  std::map<std::string, std::map<int64_t, double>> waits;
  std::vector<std::pair<int64_t, int64_t>> mark_times;  // (t_ns, iteration), increasing t_ns
  struct PendingWait {
    int64_t arrival_ns;
    double seconds;
    std::string desc;
  };
  std::vector<PendingWait> pending_waits;
  // Gates opened after their release (op lines' opened_ns - max(release_ns, arrival_ns), where positive: mostly the
  // coordinator's decision latency under --graph): per iteration as `waits` (pending ones under desc ""), and in
  // all. seen_opened: some op line carried opened_ns (files before the field: none, and the keys are left out).
  std::map<int64_t, double> coordinator_latency;
  std::vector<PendingWait> pending_latency;
  double coordinator_latency_s = 0;
  bool seen_opened = false;
  std::vector<nlohmann::json> ops;                // for trace.json (capped)
  std::vector<std::string> errors;                // "error" lines
  int malformed = 0;
  // Outcome, filled by the launcher.
  std::optional<int> exit_code;
  std::string status = "starting";  // starting | running | exited | failed | killed
};

class RunReport {
 public:
  // `out_dir` holds the event files; `real_ranks` in plan order.
  RunReport(std::string out_dir, int world_size, std::vector<int> real_ranks);

  // Reads what was appended to the event files since the last call. Returns true when something new arrived.
  bool Poll();
  // Feeds one event line (as the file would hold it) for `rank`; public for tests.
  void Feed(int rank, const std::string& line);

  // Names a communicator that the shim reported without a description (e.g. a group whose unique id this
  // rank generated itself) from its global members; "" when unknown. Set before the first Poll().
  void SetCommLabeler(std::function<std::string(const std::vector<int>&)> labeler) { labeler_ = std::move(labeler); }

  RankEvents& rank(int r);
  const std::vector<int>& real_ranks() const { return real_ranks_; }

  // Iterations every rank still expected to report has reported and that were not returned before, in order:
  // the launcher prints one progress line for each. `done(rank)` tells whether a rank can no longer report.
  std::vector<int64_t> NewCompleteIterations(const std::function<bool(int)>& done);
  // "iter 5 | rank 0: 36.2 ms, peak 158.6 MB | rank 1: ..."
  std::string ProgressLine(int64_t iteration) const;

  // The report document. `extra` keys (layout, status, exit_code, ...) are merged in at top level.
  nlohmann::json Build(double wall_s, const std::vector<std::string>& warnings, const nlohmann::json& extra) const;
  // Chrome/Perfetto trace of iterations and communication operations of the real ranks.
  nlohmann::json BuildTrace() const;

 private:
  struct Tail {
    std::string path;
    uint64_t offset = 0;
    std::string partial;
    int64_t line_no = 0;
  };
  std::string out_dir_;
  int world_size_;
  std::vector<int> real_ranks_;
  std::map<int, RankEvents> ranks_;
  std::function<std::string(const std::vector<int>&)> labeler_;
  std::map<int, Tail> tails_;
  int64_t printed_through_ = -1;
  bool printed_any_ = false;
};

// Median of a non-empty list (mean of the two middle values for an even count).
double Median(std::vector<double> v);

// Writes `j` to `path` atomically (path.tmp then rename). False with *error on failure.
bool WriteJsonAtomic(const std::string& path, const nlohmann::json& j, std::string* error);

// "158.6 MB", "1.2 GB" (decimal units).
std::string HumanBytes(int64_t bytes);

}  // namespace prism::analysis
