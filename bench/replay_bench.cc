// replay_bench: how fast `prism-run simulate` replays a large synthesized job, with the symmetric fast path
// (replay one data-parallel replica, copy it to the others) and with the full replay of every rank.
//
// Synthesizes a Megatron-style graph (default tp=8 pp=16 dp=64, 32 microbatches: 8192 ranks), writes it as CBOR,
// then measures two things, alternating fast and full runs so that both see the same machine load:
//  - the replay alone: the loaded graph replayed in this process (Simulator::Run, what `simulate_s` reports),
//    fast path then full replay, `--engine-runs` times each;
//  - the whole simulate command (read + validate + replay + report.json + trace.json of rank 0), each run in a
//    fresh child process so that its peak RSS is its own, with and without --no-symmetric, `--runs` times each.
// Prints every run, the medians and the ratio full / fast. --scaling repeats the command runs for dp = 8 ... 64.
//
//   replay_bench [--runs N] [--engine-runs N] [--tp N --pp N --dp N --microbatches N --vpp N] [--tp-comm]
//                [--scaling] [--keep DIR]
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

#include "replay/cost_model.h"
#include "replay/engine.h"
#include "replay/simulate.h"
#include "replay/synth.h"
#include "replay/topology.h"
#include "replay/trace_io.h"

namespace {

namespace fs = std::filesystem;
using prism::replay::SynthOptions;

struct Run {
  double wall_s = 0, load_s = 0, simulate_s = 0;
  uint64_t events = 0, simulated_events = 0;
  double peak_rss_mb = 0;
  double iteration_s = 0;
  std::string path;
  bool ok = false;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// One simulate run in a child process; its peak RSS comes from wait4.
Run OneRun(const std::string& graph, const fs::path& out, bool symmetric) {
  Run r;
  pid_t pid = fork();
  if (pid < 0) return r;
  if (pid == 0) {
    prism::replay::SimulateOptions o;
    o.graph = graph;
    o.out_dir = out.string();
    o.quiet = true;
    o.symmetric = symmetric;
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
  if (j.contains("replay")) {
    r.path = j["replay"].value("path", "");
    r.simulated_events = j["replay"].value("simulated_events", uint64_t{0});
  }
  r.peak_rss_mb = ru.ru_maxrss / 1024.0;  // KiB on Linux
  r.ok = true;
  return r;
}

// Medians of one mode's command runs.
struct Mode {
  double wall_s = 0, load_s = 0, simulate_s = 0, peak_rss_mb = 0, iteration_s = 0;
  uint64_t simulated_events = 0;
  std::string path;
};

struct Summary {
  int world = 0;
  uint64_t events = 0;
  uintmax_t file_bytes = 0;
  size_t classes = 0, nodes = 0;
  Mode fast, full;
  double ratio_simulate = 0, ratio_wall = 0;  // medians over runs of full / fast, each run pair measured together
};

bool Synth(const SynthOptions& o, const fs::path& dir, prism::trace::Trace* t, fs::path* graph) {
  std::string err;
  if (!prism::replay::Synthesize(o, t, &err)) {
    std::fprintf(stderr, "replay_bench: %s\n", err.c_str());
    return false;
  }
  char name[128];
  std::snprintf(name, sizeof name, "tp%d-pp%d-dp%d-mb%d%s%s.prism", o.tp, o.pp, o.dp, o.microbatches,
                o.vpp > 1 ? ("-vpp" + std::to_string(o.vpp)).c_str() : "", o.tp_comm ? "-tpcomm" : "");
  *graph = dir / name;
  if (!prism::replay::WriteTrace(*t, graph->string(), &err)) {
    std::fprintf(stderr, "replay_bench: %s\n", err.c_str());
    return false;
  }
  return true;
}

// The replay alone, in this process: fast path and full replay alternately, `runs` times each.
bool EngineBench(const prism::trace::Trace& t, int runs) {
  using prism::replay::SimResult;
  prism::replay::Topology topo;
  std::string err;
  prism::replay::CostModel model;
  if (!prism::replay::LoadTopology(t.topology.empty() ? "h100-8x400g" : t.topology, &topo, &err) ||
      !model.Init(topo, {}, &err)) {
    std::fprintf(stderr, "replay_bench: %s\n", err.c_str());
    return false;
  }
  std::printf("replay alone (Simulator::Run on the loaded graph, this process, %d runs each, alternating):\n", runs);
  std::printf("%4s %12s %12s %8s\n", "run", "fast_s", "full_s", "full/fast");
  std::vector<double> fast, full, ratio;
  SimResult a, b;
  for (int i = 0; i < runs; ++i) {
    prism::replay::EngineOptions eo;
    eo.symmetric = true;
    a = prism::replay::Simulate(t, model, eo);
    eo.symmetric = false;
    b = prism::replay::Simulate(t, model, eo);
    if (a.status != SimResult::Status::kOk || b.status != SimResult::Status::kOk) {
      std::fprintf(stderr, "replay_bench: replay failed: %s%s\n", a.error.c_str(), b.error.c_str());
      return false;
    }
    fast.push_back(a.wall_s);
    full.push_back(b.wall_s);
    ratio.push_back(b.wall_s / a.wall_s);
    std::printf("%4d %12.4f %12.4f %8.1f\n", i, a.wall_s, b.wall_s, b.wall_s / a.wall_s);
  }
  std::printf("median: fast path %.4f s (%s; %llu of %llu events computed), full replay %.4f s, ratio %.1f; "
              "same iteration time: %s (%.6f s)\n\n",
              Median(fast), a.symmetric ? "symmetric" : ("refused: " + a.symmetric_refused).c_str(),
              static_cast<unsigned long long>(a.simulated_events), static_cast<unsigned long long>(a.events),
              Median(full), Median(ratio), a.iteration_time_s == b.iteration_time_s ? "yes" : "NO",
              a.iteration_time_s);
  return true;
}

// The whole command, fast and full alternately, `runs` times each.
bool Measure(const SynthOptions& o, int runs, const fs::path& dir, bool verbose, int engine_runs, Summary* s) {
  prism::trace::Trace t;
  fs::path graph;
  if (!Synth(o, dir, &t, &graph)) return false;
  s->world = t.world_size;
  s->classes = t.classes.size();
  for (const auto& c : t.classes) {
    for (const auto& st : c.streams) s->nodes += st.nodes.size();
  }
  s->file_bytes = fs::file_size(graph);
  if (verbose) {
    std::printf("graph %s: %d ranks, %zu classes, %zu nodes, %zu communicators, %.2f MB on disk\n\n", graph.c_str(),
                t.world_size, t.classes.size(), s->nodes, t.comms.size(), s->file_bytes / 1e6);
    if (engine_runs > 0 && !EngineBench(t, engine_runs)) return false;
    std::printf("whole simulate command (fresh process per run, %d runs each, alternating):\n", runs);
    std::printf("%4s %-9s %10s %10s %12s %10s %12s %14s\n", "run", "path", "total_s", "load_s", "simulate_s",
                "other_s", "peak_rss_MB", "events/s(sim)");
  }
  std::vector<double> wall[2], load[2], sim[2], rss[2], rsim, rwall;
  Run last[2];
  for (int i = 0; i < runs; ++i) {
    for (int m = 0; m < 2; ++m) {  // 0: fast path, 1: full replay
      Run r = OneRun(graph.string(), dir / ("out-" + graph.filename().string() + (m ? "-full" : "-fast")), m == 0);
      if (!r.ok) {
        std::fprintf(stderr, "replay_bench: run %d of %s failed\n", i, graph.c_str());
        return false;
      }
      wall[m].push_back(r.wall_s);
      load[m].push_back(r.load_s);
      sim[m].push_back(r.simulate_s);
      rss[m].push_back(r.peak_rss_mb);
      last[m] = r;
      if (verbose) {
        std::printf("%4d %-9s %10.3f %10.3f %12.4f %10.3f %12.1f %14.3g\n", i, r.path.c_str(), r.wall_s, r.load_s,
                    r.simulate_s, r.wall_s - r.load_s - r.simulate_s, r.peak_rss_mb, r.simulated_events / r.simulate_s);
      }
    }
    rsim.push_back(sim[1].back() / sim[0].back());
    rwall.push_back(wall[1].back() / wall[0].back());
  }
  s->events = last[1].events;
  for (int m = 0; m < 2; ++m) {
    Mode& x = m ? s->full : s->fast;
    x.wall_s = Median(wall[m]);
    x.load_s = Median(load[m]);
    x.simulate_s = Median(sim[m]);
    x.peak_rss_mb = *std::max_element(rss[m].begin(), rss[m].end());
    x.iteration_s = last[m].iteration_s;
    x.simulated_events = last[m].simulated_events;
    x.path = last[m].path;
  }
  s->ratio_simulate = Median(rsim);
  s->ratio_wall = Median(rwall);
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
  const int engine_runs = std::max(0, Arg(argc, argv, "--engine-runs", 7));
  std::string keep = Str(argc, argv, "--keep");
  fs::path dir = keep.empty() ? fs::temp_directory_path() / ("replay_bench." + std::to_string(getpid())) : fs::path(keep);
  fs::create_directories(dir);

  double load1 = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load1) != 1) load1 = 0;
    std::fclose(f);
  }
  std::printf("replay_bench: simulate of a synthesized Megatron job, symmetric fast path vs full replay "
              "(%ld CPUs online, load average %.2f)\n", sysconf(_SC_NPROCESSORS_ONLN), load1);
  Summary s;
  if (!Measure(o, runs, dir, true, engine_runs, &s)) return 1;
  for (int m = 0; m < 2; ++m) {
    const Mode& x = m ? s.full : s.fast;
    std::printf("median %-9s total %.3f s (read+validate %.3f s, replay %.4f s, reports %.3f s); %.3g of %.3g "
                "events computed; peak RSS %.1f MB; predicted iteration %.6f s\n",
                x.path.c_str(), x.wall_s, x.load_s, x.simulate_s, x.wall_s - x.load_s - x.simulate_s,
                static_cast<double>(x.simulated_events), static_cast<double>(s.events), x.peak_rss_mb, x.iteration_s);
  }
  std::printf("ratio full / fast (median of per-run ratios): replay %.1f, whole command %.2f; same iteration time: %s\n",
              s.ratio_simulate, s.ratio_wall, s.fast.iteration_s == s.full.iteration_s ? "yes" : "NO");

  if (Flag(argc, argv, "--scaling")) {
    std::printf("\nscaling (dp varies, tp=%d pp=%d, %d microbatches%s; median of %d runs each):\n", o.tp, o.pp,
                o.microbatches, o.tp_comm ? ", per-layer TP collectives" : "", runs);
    std::printf("%8s %12s %10s %12s %12s %10s %10s %12s\n", "ranks", "events", "load_s", "fast_sim_s", "full_sim_s",
                "fast_tot_s", "full_tot_s", "sim_ratio");
    for (int dp : {8, 16, 32, 64}) {
      SynthOptions so = o;
      so.dp = dp;
      Summary x;
      if (!Measure(so, runs, dir, false, 0, &x)) return 1;
      std::printf("%8d %12llu %10.3f %12.4f %12.4f %10.3f %10.3f %12.1f\n", x.world,
                  static_cast<unsigned long long>(x.events), x.full.load_s, x.fast.simulate_s, x.full.simulate_s,
                  x.fast.wall_s, x.full.wall_s, x.ratio_simulate);
    }
  }
  if (keep.empty()) fs::remove_all(dir);
  return 0;
}
