// Reads the kernel files libprism writes under PRISM_KERNELS (rank<R>.kernels.jsonl, src/interpose/core/
// prism/kernels.h), puts their records on the clock of the rank's op and iteration events, and builds
//   - the kernel part of trace.json (one thread per CUDA stream next to the rank's collectives and gates, CUDA
//     graph launches, NVTX ranges), and
//   - `prism-run report kernels A B`: per kernel, count per iteration, median duration and launch offset within the
//     iteration in A and B, their deviation, and the natural variance (each run's own spread across iterations).
// docs/kernels.md documents the file, the clock alignment and the report's columns.
//
// Clock alignment (LoadRankKernels):
//   1. CUPTI time -> host time -> GPU time with the file's sync lines (cupti_minus_host, gpu_minus_host, both
//      interpolated between points).
//   2. Anchors: libprism's own stamp kernels (prism_stamp, prism_stamp_step) write the %globaltimer values that
//      become the event file's iteration t_ns and op arrival_ns, and CUPTI records those same kernels. Each stamp
//      is matched to its kernel (the offset found first as the mode of stamp - start differences, then tracked
//      along the run), and the residual stamp - kernel start, smoothed per second, corrects every record.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace prism::analysis {

struct KernelSync {
  int64_t host_ns = 0;
  int64_t cupti_minus_host_ns = 0;
  int64_t gpu_minus_host_ns = 0;
  bool gpu_known = false;
};

enum class KernelKind : uint8_t { kKernel = 0, kMemcpy, kMemset };

struct KernelRecord {
  KernelKind kind = KernelKind::kKernel;
  int64_t start_ns = 0;  // CUPTI clock as read; GPU clock after LoadRankKernels
  int64_t end_ns = 0;
  uint32_t device = 0, context = 0, stream = 0;
  int32_t name = -1;  // index into KernelFile::names (kernels)
  uint32_t correlation = 0;
  uint32_t graph = 0;  // CUDA graph id (0: not in a graph launch)
  uint64_t graph_node = 0;
  int32_t grid[3] = {0, 0, 0};
  int32_t block[3] = {0, 0, 0};
  uint64_t bytes = 0;
  int copy_kind = 0;
};

struct NvtxMarker {
  int64_t t_ns = 0;
  uint32_t id = 0;
  int flags = 0;
  uint32_t thread = 0;
  int32_t name = -1, domain = -1;
};

struct NvtxRange {
  int64_t start_ns = 0, end_ns = 0;
  uint32_t thread = 0;
  int32_t name = -1, domain = -1;
};

struct KernelFile {
  bool has_header = false;
  int rank = -1;
  int64_t pid = -1;
  std::string status;  // "on" | "off"
  std::string why;
  std::string cupti;
  int64_t cupti_version = 0;
  std::vector<std::string> kinds;
  std::vector<KernelSync> syncs;
  std::vector<std::string> names;
  std::vector<KernelRecord> records;
  std::vector<NvtxMarker> markers;
  bool ended = false;  // the end line (a clean flush at exit)
  int64_t dropped = 0;
  int malformed = 0;
};

// One line of a kernel file into *f (malformed lines are counted; unknown types ignored).
void ParseKernelLine(const std::string& line, KernelFile* f);
// The whole file; nullopt with *error when it cannot be read. A partial last line (a live or killed run) is skipped.
std::optional<KernelFile> ReadKernelFile(const std::string& path, std::string* error);

// CUPTI time -> GPU clock of libprism's events, from the sync points.
class KernelClock {
 public:
  explicit KernelClock(std::vector<KernelSync> syncs);
  int64_t CuptiToHost(int64_t cupti_ns) const;
  int64_t HostToGpu(int64_t host_ns) const;
  int64_t CuptiToGpu(int64_t cupti_ns) const { return HostToGpu(CuptiToHost(cupti_ns)); }
  bool gpu_known() const { return !gpu_.empty(); }

 private:
  std::vector<std::pair<int64_t, int64_t>> cupti_;  // (cupti time, cupti - host)
  std::vector<std::pair<int64_t, int64_t>> gpu_;    // (host time, gpu - host), measured points only
};

// The stamp correction (step 2 above).
struct StampFit {
  int stamps = 0;            // anchors available (iteration marks on the GPU clock and op arrivals)
  int matched = 0;           // of those, matched to a stamp kernel
  bool applied = false;      // at least 3 matched
  std::vector<std::pair<int64_t, int64_t>> knots;  // (time, correction ns), interpolated, clamped at the ends
  double residual_median_ns = 0;  // median |stamp - corrected kernel start| over the matches
  int64_t Correction(int64_t t) const;
};

// `starts`: start times of the stamp kernels (GPU clock, sorted); `stamps`: their values from the event file.
StampFit FitStamps(const std::vector<int64_t>& starts, std::vector<int64_t> stamps);

struct RankKernels {
  int rank = 0;
  KernelFile file;                        // times on the GPU clock, records sorted by start
  std::vector<NvtxRange> nvtx;
  std::vector<int64_t> iteration_t_ns;    // libprism's iteration marks (GPU clock), in iteration order
  std::vector<int64_t> iteration_index;
  StampFit fit;
  std::vector<std::string> warnings;
};

// The ranks with a kernel file in `dir` (sorted).
std::vector<int> KernelRanksIn(const std::string& dir);
// Reads dir/rank<R>.kernels.jsonl and dir/rank<R>.events.jsonl and aligns the clocks. nullopt with *error when
// there is no kernel file.
std::optional<RankKernels> LoadRankKernels(const std::string& dir, int rank, std::string* error);

// "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>(int, ...)" ->
// "vectorized_elementwise_kernel<FillFunctor>": the last name component and the first non-numeric template
// argument's, at most 80 characters.
std::string ShortKernelName(const std::string& demangled);

// Appends the rank's kernels, memcpys, memsets (thread "stream S"), CUDA graph launches (thread "graphs") and NVTX
// ranges (thread "nvtx T") to trace.json's events, process `pid`; at most `cap` records. Returns how many were
// left out.
size_t AppendKernelTraceEvents(const RankKernels& rk, int pid, size_t cap, nlohmann::json* events);
// A summary of the rank's kernel file and clock alignment (trace.json's "kernels" key).
nlohmann::json KernelTraceSummary(const RankKernels& rk);

struct KernelCompareOptions {
  int skip = 1;    // leading complete iterations left out (warm-up)
};

// `prism-run report kernels A B`: the comparison document (docs/kernels.md, "The report"). nullopt with *error when
// a side has no iterations with kernels.
std::optional<nlohmann::json> CompareKernels(const RankKernels& a, const RankKernels& b,
                                             const KernelCompareOptions& opts, std::string* error);
// The same for people: header, one row per kernel (the `rows` largest by time in A, then B), summary.
std::string KernelCompareText(const nlohmann::json& cmp, int rows);

}  // namespace prism::analysis
