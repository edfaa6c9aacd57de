// replay_bench: how fast `prism-run simulate` replays a large synthesized job.
//
// Synthesizes a Megatron-style graph (default tp=8 pp=16 dp=64, 32 microbatches: 8192 ranks), writes it as CBOR,
// then runs the whole simulate command (read + validate + replay of every rank + report.json + trace.json of
// rank 0) several times, each run in a fresh child process so that its peak RSS is its own. Prints every run and
// the medians. --scaling repeats this for dp = 8, 16, 32, 64 (1024 ... 8192 ranks).
//
//   replay_bench [--runs N] [--tp N --pp N --dp N --microbatches N --vpp N] [--tp-comm] [--scaling] [--keep DIR]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "replay/simulate.h"
#include "replay/synth.h"
#include "replay/trace_io.h"

namespace {

namespace fs = std::filesystem;
using prism::replay::SynthOptions;

struct Run {
  double wall_s = 0, load_s = 0, simulate_s = 0;
  uint64_t events = 0;
  double peak_rss_mb = 0;
  double iteration_s = 0;
  bool ok = false;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// One simulate run in a child process; its peak RSS comes from wait4.
Run OneRun(const std::string& graph, const fs::path& out) {
  Run r;
  pid_t pid = fork();
  if (pid < 0) return r;
  if (pid == 0) {
    prism::replay::SimulateOptions o;
    o.graph = graph;
    o.out_dir = out.string();
    o.quiet = true;
    std::ostringstream sink, err;
    int rc = prism::replay::RunSimulate(o, sink, err);
    if (rc != 0) std::fprintf(stderr, "%s", err.str().c_str());
    std::_Exit(rc);
  }
  int status = 0;
  struct rusage ru {};
  auto t0 = std::chrono::steady_clock::now();
  wait4(pid, &status, 0, &ru);
  double outer = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return r;
  std::ifstream f(out / "report.json");
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) return r;
  r.wall_s = j.value("wall_s", outer);
  r.load_s = j.value("load_s", 0.0);
  r.simulate_s = j.value("simulate_s", 0.0);
  r.events = j.value("events", uint64_t{0});
  r.iteration_s = j.value("iteration_time_s", 0.0);
  r.peak_rss_mb = ru.ru_maxrss / 1024.0;  // KiB on Linux
  r.ok = true;
  return r;
}

struct Summary {
  int world = 0;
  uint64_t events = 0;
  double wall_s = 0, load_s = 0, simulate_s = 0, peak_rss_mb = 0, iteration_s = 0;
  uintmax_t file_bytes = 0;
  size_t classes = 0, nodes = 0;
};

bool Measure(const SynthOptions& o, int runs, const fs::path& dir, bool verbose, Summary* s) {
  prism::trace::Trace t;
  std::string err;
  if (!prism::replay::Synthesize(o, &t, &err)) {
    std::fprintf(stderr, "replay_bench: %s\n", err.c_str());
    return false;
  }
  char name[128];
  std::snprintf(name, sizeof name, "tp%d-pp%d-dp%d-mb%d%s%s.prism", o.tp, o.pp, o.dp, o.microbatches,
                o.vpp > 1 ? ("-vpp" + std::to_string(o.vpp)).c_str() : "", o.tp_comm ? "-tpcomm" : "");
  fs::path graph = dir / name;
  if (!prism::replay::WriteTrace(t, graph.string(), &err)) {
    std::fprintf(stderr, "replay_bench: %s\n", err.c_str());
    return false;
  }
  s->world = t.world_size;
  s->classes = t.classes.size();
  for (const auto& c : t.classes) {
    for (const auto& st : c.streams) s->nodes += st.nodes.size();
  }
  s->file_bytes = fs::file_size(graph);
  if (verbose) {
    std::printf("graph %s: %d ranks, %zu classes, %zu nodes, %zu communicators, %.2f MB on disk\n", graph.c_str(),
                t.world_size, t.classes.size(), s->nodes, t.comms.size(), s->file_bytes / 1e6);
    std::printf("%4s %10s %10s %12s %10s %12s %14s\n", "run", "total_s", "load_s", "simulate_s", "other_s",
                "peak_rss_MB", "events/s(sim)");
  }
  std::vector<double> wall, load, sim, rss;
  for (int i = 0; i < runs; ++i) {
    Run r = OneRun(graph.string(), dir / ("out-" + std::string(name)));
    if (!r.ok) {
      std::fprintf(stderr, "replay_bench: run %d of %s failed\n", i, name);
      return false;
    }
    wall.push_back(r.wall_s);
    load.push_back(r.load_s);
    sim.push_back(r.simulate_s);
    rss.push_back(r.peak_rss_mb);
    s->events = r.events;
    s->iteration_s = r.iteration_s;
    if (verbose) {
      std::printf("%4d %10.3f %10.3f %12.3f %10.3f %12.1f %14.3g\n", i, r.wall_s, r.load_s, r.simulate_s,
                  r.wall_s - r.load_s - r.simulate_s, r.peak_rss_mb, r.events / r.simulate_s);
    }
  }
  s->wall_s = Median(wall);
  s->load_s = Median(load);
  s->simulate_s = Median(sim);
  s->peak_rss_mb = *std::max_element(rss.begin(), rss.end());
  return true;
}

int Arg(int argc, char** argv, const char* name, int dflt) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return dflt;
}
bool Flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return true;
  }
  return false;
}
std::string Str(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  SynthOptions o;
  o.tp = Arg(argc, argv, "--tp", 8);
  o.pp = Arg(argc, argv, "--pp", 16);
  o.dp = Arg(argc, argv, "--dp", 64);
  o.microbatches = Arg(argc, argv, "--microbatches", 32);
  o.vpp = Arg(argc, argv, "--vpp", 1);
  o.tp_comm = Flag(argc, argv, "--tp-comm");
  const int runs = std::max(1, Arg(argc, argv, "--runs", 5));
  std::string keep = Str(argc, argv, "--keep");
  fs::path dir = keep.empty() ? fs::temp_directory_path() / ("replay_bench." + std::to_string(getpid())) : fs::path(keep);
  fs::create_directories(dir);

  std::printf("replay_bench: simulate of a synthesized Megatron job, %d runs, each in a fresh process "
              "(%ld CPUs online)\n", runs, sysconf(_SC_NPROCESSORS_ONLN));
  Summary s;
  if (!Measure(o, runs, dir, true, &s)) return 1;
  std::printf("median: total %.3f s (read+validate %.3f s, replay %.3f s, reports %.3f s); %.3g events, "
              "%.3g events/s in the replay, %.3g events/s end to end; peak RSS %.1f MB; predicted iteration %.3f s\n",
              s.wall_s, s.load_s, s.simulate_s, s.wall_s - s.load_s - s.simulate_s, static_cast<double>(s.events),
              s.events / s.simulate_s, s.events / s.wall_s, s.peak_rss_mb, s.iteration_s);

  if (Flag(argc, argv, "--scaling")) {
    std::printf("\nscaling (dp varies, tp=%d pp=%d, %d microbatches%s; median of %d runs):\n", o.tp, o.pp,
                o.microbatches, o.tp_comm ? ", per-layer TP collectives" : "", runs);
    std::printf("%8s %12s %10s %10s %12s %14s %12s\n", "ranks", "events", "total_s", "load_s", "simulate_s",
                "events/s(sim)", "peak_rss_MB");
    for (int dp : {8, 16, 32, 64}) {
      SynthOptions so = o;
      so.dp = dp;
      Summary x;
      if (!Measure(so, runs, dir, false, &x)) return 1;
      std::printf("%8d %12llu %10.3f %10.3f %12.3f %14.3g %12.1f\n", x.world, static_cast<unsigned long long>(x.events),
                  x.wall_s, x.load_s, x.simulate_s, x.events / x.simulate_s, x.peak_rss_mb);
    }
  }
  if (keep.empty()) fs::remove_all(dir);
  return 0;
}
