// graph_release_bench: how long a real rank waits for the coordinator's answer when it runs against a graph
// (`prism-run --graph`, `prism-run fill`): GraphRelease::Decide timed in closed loop (support/graph_closed_loop.h:
// the real rank's class replayed with its own durations, every other rank virtual), without and with the event
// loop's idle work (GraphRelease::Idle between decisions, as the coordinator does while the real rank computes).
// The decision latency lands in the real rank's timeline (the gate opens when the answer comes), so it must stay far
// below the compute between two operations.
//
//   graph_release_bench [--graph FILE.prism] [--rank R] [--reps N] [--runs N]
//
// Default: the 4-stage Megatron graph filled on an H200 (tests/data/graph/megatron_w128pp4_fill/filled.prism, world
// 128, tp 2 pp 4), rank 0, 4 repetitions, 5 runs. Prints, per mode, the median over runs of: mean and max decision
// time, the slowest repetition's total decision time, and the ratio of the means (without / with idle work); then
// how many decisions a prerelease sent ahead (ipc::OpPrerelease) would have answered before the rank arrived.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "support/graph_closed_loop.h"
#include "replay/trace_io.h"

namespace {

struct RunStats {
  double mean_us = 0, max_us = 0, worst_rep_ms = 0, slice_p99_us = 0, slice_max_us = 0;
  int64_t end_ns = 0;
  size_t decisions = 0;
};

RunStats Measure(const prism::trace::Trace& t, int rank, uint32_t reps, bool idle) {
  prism::coord::ClosedLoopOptions o;
  o.reps = reps;
  o.idle = idle;
  prism::coord::LoopResult r = prism::coord::ClosedLoop(t, rank, o);
  RunStats s;
  s.end_ns = r.end_ns;
  if (!r.idle_slice_ns.empty()) {
    std::vector<int64_t> v = r.idle_slice_ns;
    std::sort(v.begin(), v.end());
    s.slice_p99_us = v[v.size() * 99 / 100] / 1e3;
    s.slice_max_us = v.back() / 1e3;
  }
  s.decisions = r.decide_ns.size();
  std::vector<double> per_rep(reps, 0.0);
  double sum = 0;
  for (size_t i = 0; i < r.decide_ns.size(); ++i) {
    const double us = r.decide_ns[i] / 1e3;
    sum += us;
    s.max_us = std::max(s.max_us, us);
    if (r.decide_rep[i] < reps) per_rep[r.decide_rep[i]] += us / 1e3;
  }
  s.mean_us = r.decide_ns.empty() ? 0 : sum / static_cast<double>(r.decide_ns.size());
  s.worst_rep_ms = per_rep.empty() ? 0 : *std::max_element(per_rep.begin(), per_rep.end());
  return s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string graph = std::string(PRISM_SOURCE_DIR) + "/tests/data/graph/megatron_w128pp4_fill/filled.prism";
  int rank = 0, runs = 5;
  uint32_t reps = 4;
  for (int i = 1; i < argc; ++i) {
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--graph")) graph = next();
    else if (!std::strcmp(argv[i], "--rank")) rank = std::atoi(next());
    else if (!std::strcmp(argv[i], "--reps")) reps = static_cast<uint32_t>(std::atoi(next()));
    else if (!std::strcmp(argv[i], "--runs")) runs = std::atoi(next());
    else {
      std::fprintf(stderr, "usage: graph_release_bench [--graph FILE.prism] [--rank R] [--reps N] [--runs N]\n");
      return 2;
    }
  }
  prism::trace::Trace t;
  std::string err;
  if (!prism::replay::ReadTrace(graph, &t, &err)) {
    std::fprintf(stderr, "graph_release_bench: %s\n", err.c_str());
    return 1;
  }
  if (rank < 0 || rank >= t.world_size) {
    std::fprintf(stderr, "graph_release_bench: rank %d outside the graph's world of %d\n", rank, t.world_size);
    return 1;
  }
  std::printf("graph %s (world %d), real rank %d, %u repetitions, %d runs each, alternating\n", graph.c_str(),
              t.world_size, rank, reps, runs);
  std::vector<double> mean[2], mx[2], worst[2], slice_p99, slice_max;
  int64_t end[2] = {0, 0};
  size_t decisions = 0;
  for (int k = 0; k < runs; ++k)
    for (int idle = 0; idle < 2; ++idle) {
      RunStats s = Measure(t, rank, reps, idle != 0);
      mean[idle].push_back(s.mean_us);
      mx[idle].push_back(s.max_us);
      worst[idle].push_back(s.worst_rep_ms);
      if (idle) {
        slice_p99.push_back(s.slice_p99_us);
        slice_max.push_back(s.slice_max_us);
      }
      end[idle] = s.end_ns;
      decisions = s.decisions;
    }
  const char* name[2] = {"decisions advance the virtual ranks", "idle work ahead (coordinator)"};
  for (int idle = 0; idle < 2; ++idle)
    std::printf("  %-38s mean %8.1f us  max %8.2f ms  slowest repetition %8.2f ms of decisions\n", name[idle],
                Median(mean[idle]), Median(mx[idle]) / 1e3, Median(worst[idle]));
  std::printf("  %zu decisions per run; mean ratio (without / with idle work) %.1fx; max ratio %.1fx\n", decisions,
              Median(mean[0]) / std::max(Median(mean[1]), 1e-9), Median(mx[0]) / std::max(Median(mx[1]), 1e-9));
  // A message that arrives during an idle slice waits for its end; on a loaded machine the OS's preemption (a few ms)
  // shows in the max, not in the p99.
  std::printf("  idle slices (200 us budget; a message arriving meanwhile waits): p99 %.1f us, max %.1f us\n",
              Median(slice_p99), Median(slice_max));
  std::printf("  the real rank ends at %.3f ms both ways: %s\n", end[0] / 1e6, end[0] == end[1] ? "same" : "DIFFERENT");
  // Prereleases sent ahead as the coordinator sends them (after each decision and the idle work): how many of the
  // decisions libprism could have taken on arrival, and the rule against every decision.
  prism::coord::ClosedLoopOptions o;
  o.reps = reps;
  o.idle = true;
  o.predict_ahead = true;
  prism::coord::LoopResult pr = prism::coord::ClosedLoop(t, rank, o);
  std::printf("  prereleased before the arrival: %llu of %zu decisions (%.1f %%); rule differs from the decision: "
              "%llu; same end: %s\n",
              static_cast<unsigned long long>(pr.prereleased), pr.decisions.size(),
              pr.decisions.empty() ? 0.0 : 100.0 * static_cast<double>(pr.prereleased) / pr.decisions.size(),
              static_cast<unsigned long long>(pr.mispredicted), pr.end_ns == end[1] ? "yes" : "NO");
  std::vector<int64_t> pass = pr.prerelease_pass_ns;
  std::sort(pass.begin(), pass.end());
  if (!pass.empty())
    std::printf("  prerelease passes (the event loop is held meanwhile): median %.1f us, p99 %.1f us, max %.1f us\n",
                pass[pass.size() / 2] / 1e3, pass[pass.size() * 99 / 100] / 1e3, pass.back() / 1e3);
  // In real time: the idle work gets only the real rank's compute time (on this machine), so what it has not done
  // by a decision is paid inside it, as on the GPU at each repetition's start.
  std::vector<double> rt_mean, rt_max, rt_p99;
  int64_t rt_end = end[1];
  for (int k = 0; k < runs; ++k) {
    prism::coord::ClosedLoopOptions ro;
    ro.reps = reps;
    ro.idle_realtime = true;
    prism::coord::LoopResult rr = prism::coord::ClosedLoop(t, rank, ro);
    std::vector<int64_t> d = rr.decide_ns;
    std::sort(d.begin(), d.end());
    double sum = 0;
    for (int64_t x : d) sum += x / 1e3;
    rt_mean.push_back(d.empty() ? 0 : sum / d.size());
    rt_p99.push_back(d.empty() ? 0 : d[d.size() * 99 / 100] / 1e3);
    rt_max.push_back(d.empty() ? 0 : d.back() / 1e3);
    rt_end = rr.end_ns;
  }
  std::printf("  real-time idle work (the rank's compute time): decision mean %.1f us, p99 %.1f us, max %.2f ms; same "
              "end: %s\n",
              Median(rt_mean), Median(rt_p99), Median(rt_max) / 1e3, rt_end == end[1] ? "yes" : "NO");
  return end[0] == end[1] && pr.end_ns == end[1] && rt_end == end[1] && pr.mispredicted == 0 ? 0 : 1;
}
