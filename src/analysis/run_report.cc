#include "analysis/run_report.h"

#include "common/atomic_file.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "analysis/kernel_report.h"
#include "prism/events.h"
#include "prism/report.h"

namespace prism::analysis {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr size_t kMaxTraceOpsPerRank = 200000;  // Why: trace.json of a long run must stay loadable in Perfetto
constexpr size_t kMaxTraceKernelsPerRank = 300000;  // the same for kernel records (prism-run --kernels)

int64_t GetInt(const json& j, const char* key, int64_t dflt = -1) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return dflt;
  return it->get<int64_t>();
}

std::string GetStr(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

namespace {

// The rank's measured iterations: those with a duration, less the first mark's.
std::vector<int64_t> MeasuredIterations(const RankEvents& e) {
  std::vector<int64_t> measured;
  bool first = true;
  for (const auto& [n, s] : e.iterations) {
    // Why the first entry never counts: Build leaves it out of iteration_time_s (warm-up, or no start mark).
    if (!first && s.dur_ns > 0) measured.push_back(n);
    first = false;
  }
  return measured;
}

// The median over `measured` of `by_iter` (iterations missing from it count 0).
double MedianOver(const std::vector<int64_t>& measured, const std::map<int64_t, double>& by_iter) {
  std::vector<double> per;
  for (int64_t n : measured) {
    auto it = by_iter.find(n);
    per.push_back(it == by_iter.end() ? 0.0 : it->second);
  }
  return Median(per);
}

// Per communicator description, the median over the rank's measured iterations (those with a duration after the
// first mark, as for iteration_time_s) of the seconds waited in each (RankEvents::waits: an operation belongs to
// the iteration in which it arrived).
json WaitPerIteration(const RankEvents& e) {
  json out = json::object();
  const std::vector<int64_t> measured = MeasuredIterations(e);
  if (measured.empty()) return out;
  for (const auto& [desc, by_iter] : e.waits) out[desc] = MedianOver(measured, by_iter);
  return out;
}

}  // namespace

std::string HumanBytes(int64_t bytes) {
  if (bytes < 0) return "?";
  double b = static_cast<double>(bytes);
  if (b >= 1e9) return Fixed(b / 1e9, 2) + " GB";
  if (b >= 1e6) return Fixed(b / 1e6, 1) + " MB";
  if (b >= 1e3) return Fixed(b / 1e3, 1) + " kB";
  return std::to_string(bytes) + " B";
}

bool WriteJsonAtomic(const std::string& path, const json& j, std::string* error) {
  return WriteFileAtomic(path, j.dump(2) + "\n", error);
}

RunReport::RunReport(std::string out_dir, int world_size, std::vector<int> real_ranks)
    : out_dir_(std::move(out_dir)), world_size_(world_size), real_ranks_(std::move(real_ranks)) {
  for (int r : real_ranks_) {
    ranks_[r].rank = r;
    tails_[r].path = (fs::path(out_dir_) / events::FileName(r)).string();
  }
}

RankEvents& RunReport::rank(int r) {
  RankEvents& e = ranks_[r];
  e.rank = r;
  return e;
}

bool RunReport::Poll() {
  bool any = false;
  for (auto& [r, t] : tails_) {
    std::ifstream in(t.path, std::ios::binary);
    if (!in) continue;
    in.seekg(0, std::ios::end);
    auto size = static_cast<uint64_t>(in.tellg());
    if (size < t.offset) {  // truncated or replaced: start over
      t.offset = 0;
      t.partial.clear();
    }
    if (size == t.offset) continue;
    in.seekg(static_cast<std::streamoff>(t.offset));
    std::string chunk(size - t.offset, '\0');
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    chunk.resize(static_cast<size_t>(in.gcount()));
    t.offset += chunk.size();
    t.partial += chunk;
    size_t start = 0;
    while (true) {
      size_t nl = t.partial.find('\n', start);
      if (nl == std::string::npos) break;
      std::string line = t.partial.substr(start, nl - start);
      start = nl + 1;
      ++t.line_no;
      if (!line.empty()) {
        Feed(r, line);
        any = true;
      }
    }
    t.partial.erase(0, start);
  }
  return any;
}

void RunReport::Feed(int r, const std::string& line) {
  RankEvents& e = rank(r);
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    if (e.malformed++ == 0)
      e.errors.push_back("rank " + std::to_string(r) + " events: a line is not a JSON object: " + line.substr(0, 80));
    return;
  }
  std::string type = GetStr(j, "type");
  if (e.status == "starting") e.status = "running";
  if (type == events::kHello) {
    e.seen_hello = true;
    e.pid = GetInt(j, "pid");
    e.host = GetStr(j, "host");
    e.gpu = GetInt(j, "gpu");
  } else if (type == events::kIter) {
    IterationSample s;
    s.iteration = GetInt(j, "iteration", static_cast<int64_t>(e.iterations.size()));
    s.t_ns = GetInt(j, "t_ns", 0);
    s.dur_ns = GetInt(j, "dur_ns", 0);
    s.peak_bytes = GetInt(j, "peak_bytes");
    s.torch_max_allocated = GetInt(j, "torch_max_allocated");
    if (s.torch_max_allocated == 0) s.torch_max_allocated = -1;  // libprism writes 0 when the hook reported nothing
    e.peak_bytes = std::max(e.peak_bytes, s.peak_bytes);
    e.torch_max_allocated = std::max(e.torch_max_allocated, s.torch_max_allocated);
    e.iterations[s.iteration] = s;
    if (e.mark_times.empty() || s.t_ns > e.mark_times.back().first) {
      e.mark_times.emplace_back(s.t_ns, s.iteration);
      // Pending waits arrived after the previous mark: those at or before this one are in this iteration.
      auto keep = std::partition(e.pending_waits.begin(), e.pending_waits.end(),
                                 [&](const RankEvents::PendingWait& p) { return p.arrival_ns > s.t_ns; });
      for (auto it = keep; it != e.pending_waits.end(); ++it) e.waits[it->desc][s.iteration] += it->seconds;
      e.pending_waits.erase(keep, e.pending_waits.end());
      auto late = std::partition(e.pending_latency.begin(), e.pending_latency.end(),
                                 [&](const RankEvents::PendingWait& p) { return p.arrival_ns > s.t_ns; });
      for (auto it = late; it != e.pending_latency.end(); ++it) e.coordinator_latency[s.iteration] += it->seconds;
      e.pending_latency.erase(late, e.pending_latency.end());
    }
  } else if (type == events::kMem || type == events::kBye) {
    e.peak_bytes = std::max(e.peak_bytes, GetInt(j, "peak_bytes"));
    if (type == events::kBye) e.seen_bye = true;
  } else if (type == events::kComm) {
    std::string desc = GetStr(j, "desc");
    int64_t id = GetInt(j, "comm_id");
    if (desc.empty() && labeler_ && j.contains("members") && j["members"].is_array()) {
      std::vector<int> members;
      for (const json& m : j["members"]) {
        if (m.is_number_integer()) members.push_back(m.get<int>());
      }
      desc = labeler_(members);
    }
    if (desc.empty()) desc = GetStr(j, "name");
    if (desc.empty()) desc = GetStr(j, "key");
    if (desc.empty()) desc = "comm" + std::to_string(id);
    e.comm_desc[id] = desc;
  } else if (type == events::kOp) {
    int64_t id = GetInt(j, "comm_id");
    auto it = e.comm_desc.find(id);
    std::string desc = it != e.comm_desc.end() ? it->second : "comm" + std::to_string(id);
    int64_t arrival = GetInt(j, "arrival_ns", 0);
    int64_t release = GetInt(j, "release_ns", 0);
    int64_t model = std::max<int64_t>(0, GetInt(j, "model_dur_ns", 0));
    double held = release > arrival ? (release - arrival) * 1e-9 : 0;
    double wait = std::max(0.0, held - model * 1e-9);
    CommTotals& c = e.comms[desc];
    c.comm_s += held;
    c.wait_s += wait;
    ++c.ops;
    if (wait > 0) {
      // The iteration of the arrival: the first mark at or after it; none yet: pending until that mark is read.
      auto m = std::lower_bound(e.mark_times.begin(), e.mark_times.end(), arrival,
                                [](const std::pair<int64_t, int64_t>& mt, int64_t v) { return mt.first < v; });
      if (m != e.mark_times.end()) e.waits[desc][m->second] += wait;
      else e.pending_waits.push_back({arrival, wait, desc});
    }
    int64_t last = GetInt(j, "wait_on_rank");
    if (last >= 0 && wait > 0) e.wait_on_ranks[static_cast<int>(last)] += wait;
    const int64_t opened = GetInt(j, "opened_ns", 0);
    if (opened > 0) {
      e.seen_opened = true;
      const double late = std::max<int64_t>(0, opened - std::max(release, arrival)) * 1e-9;
      if (late > 0) {
        e.coordinator_latency_s += late;
        auto m = std::lower_bound(e.mark_times.begin(), e.mark_times.end(), arrival,
                                  [](const std::pair<int64_t, int64_t>& mt, int64_t v) { return mt.first < v; });
        if (m != e.mark_times.end()) e.coordinator_latency[m->second] += late;
        else e.pending_latency.push_back({arrival, late, std::string()});
      }
    }
    if (e.ops.size() < kMaxTraceOpsPerRank && release > arrival) {
      e.ops.push_back({{"name", GetStr(j, "op").empty() ? std::string("op") : GetStr(j, "op")},
                       {"cat", "comm"},
                       {"ph", "X"},
                       {"pid", r},
                       {"tid", desc},
                       {"ts", arrival / 1000.0},
                       {"dur", (release - arrival) / 1000.0},
                       {"args", {{"seq", GetInt(j, "seq")}, {"bytes", GetInt(j, "bytes")},
                                 {"model_dur_us", model / 1000.0}, {"wait_on_rank", last}}}});
    }
  } else if (type == events::kError) {
    e.errors.push_back("rank " + std::to_string(r) + ": " + GetStr(j, "what"));
  }
  // Unknown types are from a newer shim: ignored on purpose.
}

std::vector<int64_t> RunReport::NewCompleteIterations(const std::function<bool(int)>& done) {
  // The iterations reported by every rank that can still report; ranks that are done contribute what they have.
  std::set<int64_t> candidates;
  for (int r : real_ranks_)
    for (const auto& [it, s] : ranks_[r].iterations) candidates.insert(it);
  std::vector<int64_t> out;
  for (int64_t it : candidates) {
    if (printed_any_ && it <= printed_through_) continue;
    bool complete = true;
    for (int r : real_ranks_) {
      const RankEvents& e = ranks_[r];
      if (e.iterations.count(it)) continue;
      if (done && done(r)) continue;
      complete = false;
    }
    if (!complete) break;  // keep the lines in order
    out.push_back(it);
    printed_through_ = it;
    printed_any_ = true;
  }
  return out;
}

std::string RunReport::ProgressLine(int64_t iteration) const {
  std::ostringstream o;
  o << "iter " << iteration;
  for (int r : real_ranks_) {
    const RankEvents& e = ranks_.at(r);
    auto it = e.iterations.find(iteration);
    o << " | rank " << r << ": ";
    if (it == e.iterations.end()) {
      o << "-";
      continue;
    }
    if (it->second.dur_ns > 0) o << Fixed(it->second.dur_ns / 1e6, 1) << " ms";
    else o << "first mark";
    int64_t peak = -1;
    for (const auto& [n, s] : e.iterations)
      if (n <= iteration) peak = std::max({peak, s.peak_bytes, s.torch_max_allocated});
    if (peak >= 0) o << ", peak " << HumanBytes(peak);
  }
  return o.str();
}

json RunReport::Build(double wall_s, const std::vector<std::string>& warnings, const json& extra) const {
  json rep;
  rep[std::string(report::kSchema)] = report::kSchemaVersion;
  rep[std::string(report::kWorldSize)] = world_size_;
  rep[std::string(report::kMode)] = "emulate";
  std::vector<std::string> warns = warnings;

  // Per-iteration slowest rank; iterations each rank measured (without its first).
  std::map<int64_t, double> slowest;
  int64_t iterations = 0;
  json ranks = json::array();
  for (int r : real_ranks_) {
    const RankEvents& e = ranks_.at(r);
    json jr;
    jr[std::string(report::kRank)] = r;
    std::vector<double> durs;
    json times = json::array();
    bool first = true;
    double first_dur = 0;
    for (const auto& [n, s] : e.iterations) {
      // Why skip dur <= 0: libprism's first mark has no previous mark to measure from.
      bool measured = s.dur_ns > 0;
      double d = s.dur_ns * 1e-9;
      times.push_back(measured ? json(d) : json(nullptr));
      if (measured) slowest[n] = std::max(slowest[n], d);
      if (first) {
        first = false;
        first_dur = measured ? d : 0;
        continue;
      }
      if (measured) durs.push_back(d);
    }
    if (durs.empty() && first_dur > 0) durs.push_back(first_dur);
    iterations = std::max<int64_t>(iterations, static_cast<int64_t>(e.iterations.size()));
    jr[std::string(report::kIterationTime)] = durs.empty() ? json(nullptr) : json(Median(durs));
    jr["iterations"] = e.iterations.size();
    jr["iteration_times_s"] = times;
    jr[std::string(report::kPeakMemory)] = e.peak_bytes >= 0 ? json(e.peak_bytes) : json(nullptr);
    jr["torch_max_allocated_bytes"] = e.torch_max_allocated >= 0 ? json(e.torch_max_allocated) : json(nullptr);
    json wait = json::object(), comm = json::object(), ops = json::object();
    for (const auto& [desc, c] : e.comms) {
      wait[desc] = c.wait_s;
      comm[desc] = c.comm_s;
      ops[desc] = c.ops;
    }
    jr[std::string(report::kWait)] = wait;
    jr[std::string(report::kWaitPerIteration)] = WaitPerIteration(e);
    if (e.seen_opened) {
      const std::vector<int64_t> measured = MeasuredIterations(e);
      jr[std::string(report::kCoordinatorLatency)] = e.coordinator_latency_s;
      jr[std::string(report::kCoordinatorLatencyPerIteration)] =
          measured.empty() ? json(nullptr) : json(MedianOver(measured, e.coordinator_latency));
    }
    jr["comm_s"] = comm;
    jr["comm_ops"] = ops;
    json on = json::object();
    for (const auto& [peer, s] : e.wait_on_ranks) on[std::to_string(peer)] = s;
    jr["wait_on_ranks"] = on;
    jr["status"] = e.status;
    jr["exit_code"] = e.exit_code ? json(*e.exit_code) : json(nullptr);
    if (e.pid >= 0) jr["pid"] = e.pid;
    if (!e.host.empty()) jr["host"] = e.host;
    if (e.gpu >= 0) jr["gpu"] = e.gpu;
    ranks.push_back(jr);
    for (const std::string& err : e.errors) warns.push_back(err);
    if (e.malformed > 1)
      warns.push_back("rank " + std::to_string(r) + " events: " + std::to_string(e.malformed) + " malformed lines skipped");
  }
  std::vector<double> measured;
  int64_t first_iteration = INT64_MAX;
  for (int r : real_ranks_) {
    const RankEvents& e = ranks_.at(r);
    if (!e.iterations.empty()) first_iteration = std::min(first_iteration, e.iterations.begin()->first);
  }
  for (const auto& [n, d] : slowest)
    if (n != first_iteration) measured.push_back(d);
  if (measured.empty() && !slowest.empty()) {
    measured.push_back(slowest.begin()->second);
    warns.push_back("only one iteration was measured: iteration_time_s includes warm-up");
  }
  rep[std::string(report::kIterationTime)] = measured.empty() ? json(nullptr) : json(Median(measured));
  rep[std::string(report::kIterations)] = iterations;
  rep["measured_iterations"] = measured.size();
  rep[std::string(report::kRanks)] = ranks;
  rep[std::string(report::kWall)] = wall_s;
  rep["warnings"] = warns;
  for (const auto& [k, v] : extra.items()) rep[k] = v;
  return rep;
}

json RunReport::BuildTrace() const {
  json events = json::array();
  for (int r : real_ranks_) {
    const RankEvents& e = ranks_.at(r);
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    for (const auto& [n, s] : e.iterations) {
      if (s.dur_ns <= 0 || s.t_ns <= 0) continue;
      // Why t_ns - dur_ns: the iter line is written when the iteration ends.
      events.push_back({{"name", "iteration " + std::to_string(n)},
                        {"cat", "iteration"},
                        {"ph", "X"},
                        {"pid", r},
                        {"tid", "iterations"},
                        {"ts", (s.t_ns - s.dur_ns) / 1000.0},
                        {"dur", s.dur_ns / 1000.0}});
    }
    for (const json& op : e.ops) events.push_back(op);
  }
  // Kernel records (prism-run --kernels, docs/kernels.md): each real rank's CUDA streams next to its collectives.
  json kernels = json::object();
  for (int r : KernelRanksIn(out_dir_)) {
    if (!ranks_.count(r)) continue;
    std::string error;
    auto rk = LoadRankKernels(out_dir_, r, &error);
    if (!rk) continue;
    const size_t left_out = AppendKernelTraceEvents(*rk, r, kMaxTraceKernelsPerRank, &events);
    json summary = KernelTraceSummary(*rk);
    if (left_out > 0) summary["left_out_of_trace"] = left_out;
    kernels[std::to_string(r)] = summary;
  }
  json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  if (!kernels.empty()) trace["kernels"] = kernels;
  return trace;
}

}  // namespace prism::analysis
