// replay_load_bench: where the "read + validate" time of `prism-run simulate` goes, phase by phase.
//
// Synthesizes the 8192-rank job of replay_bench (tp=8 pp=16 dp=64, 32 microbatches) unless a graph is given,
// writes it as CBOR, then times, median of --runs runs each: reading the file into memory, CBOR -> JSON
// document (nlohmann::json::from_cbor), JSON document -> PrismTrace (TraceFromJson), freeing the JSON document,
// ValidateTrace; then the two readers as simulate could call them: ReadTraceUncheckedDom (the document, the
// reference) and ReadTraceUnchecked (the streaming reader), alternately in the same run, with the ratio
// document / streaming (median of per-run ratios, each pair back to back). The streamed trace is checked equal
// to the document's (re-serialized) on the first run. Last, the whole simulate command on the symmetric path
// (read + validate + replay + report.json + trace.json of rank 0) in a fresh child process per run (time from
// fork to exit, peak RSS from wait4), with the document reader and the streaming reader alternately,
// --command-runs times each, and the ratio.
//
//   replay_load_bench [--runs N] [--command-runs N] [--graph FILE.prism] [--tp N --pp N --dp N --microbatches N] [--tp-comm]
#include <malloc.h>
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
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "replay/simulate.h"
#include "replay/synth.h"
#include "replay/trace_io.h"
#include "replay/trace_validate.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int Arg(int argc, char** argv, const char* name, int dflt) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return dflt;
}
std::string Str(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return "";
}
bool Flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return true;
  }
  return false;
}

struct CommandRun {
  double wall_s = 0, rss_mb = 0, iteration_s = 0;
  bool ok = false;
};

// The whole simulate command in a fresh child process: fork to exit, peak RSS from wait4.
CommandRun OneCommand(const std::string& graph, const fs::path& out, bool document_reader) {
  CommandRun r;
  auto t0 = Clock::now();
  pid_t pid = fork();
  if (pid < 0) return r;
  if (pid == 0) {
    prism::replay::SimulateOptions o;
    o.graph = graph;
    o.out_dir = out.string();
    o.quiet = true;
    o.document_reader = document_reader;
    std::ostringstream sink, err;
    int rc = prism::replay::RunSimulate(o, sink, err);
    if (rc != 0) std::fprintf(stderr, "%s", err.str().c_str());
    std::_Exit(rc);
  }
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  r.wall_s = Since(t0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return r;
  std::ifstream f(out / "report.json");
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) return r;
  r.iteration_s = j.value("iteration_time_s", 0.0);
  r.rss_mb = ru.ru_maxrss / 1024.0;
  r.ok = true;
  return r;
}

bool CommandBench(const std::string& graph, int runs) {
  std::printf("whole simulate command, symmetric path (fresh process per run, %d runs each, alternating):\n", runs);
  std::printf("%4s %12s %10s %12s %10s %8s\n", "run", "document_s", "rss_MB", "streaming_s", "rss_MB", "ratio");
  const fs::path out = fs::temp_directory_path() / ("replay_load_bench_out." + std::to_string(getpid()));
  std::vector<double> dom_s, sax_s, dom_mb, sax_mb, ratio;
  bool same = true;
  for (int i = 0; i < runs; ++i) {
    CommandRun d = OneCommand(graph, out / "dom", true);
    CommandRun x = OneCommand(graph, out / "sax", false);
    if (!d.ok || !x.ok) {
      std::fprintf(stderr, "replay_load_bench: simulate run %d failed\n", i);
      return false;
    }
    same = same && d.iteration_s == x.iteration_s;
    dom_s.push_back(d.wall_s);
    sax_s.push_back(x.wall_s);
    dom_mb.push_back(d.rss_mb);
    sax_mb.push_back(x.rss_mb);
    ratio.push_back(d.wall_s / x.wall_s);
    std::printf("%4d %12.4f %10.1f %12.4f %10.1f %8.2f\n", i, d.wall_s, d.rss_mb, x.wall_s, x.rss_mb,
                d.wall_s / x.wall_s);
  }
  std::printf("median whole command: document reader %.3f s (peak RSS %.1f MB), streaming reader %.3f s (peak RSS "
              "%.1f MB); ratio %.2f (median of per-run ratios); same iteration time: %s\n",
              Median(dom_s), Median(dom_mb), Median(sax_s), Median(sax_mb), Median(ratio), same ? "yes" : "NO");
  std::error_code ec;
  fs::remove_all(out, ec);
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = std::max(1, Arg(argc, argv, "--runs", 7));
  std::string graph = Str(argc, argv, "--graph");
  fs::path tmp;
  if (graph.empty()) {
    prism::replay::SynthOptions o;
    o.tp = Arg(argc, argv, "--tp", 8);
    o.pp = Arg(argc, argv, "--pp", 16);
    o.dp = Arg(argc, argv, "--dp", 64);
    o.microbatches = Arg(argc, argv, "--microbatches", 32);
    o.tp_comm = Flag(argc, argv, "--tp-comm");
    prism::trace::Trace t;
    std::string err;
    tmp = fs::temp_directory_path() / ("replay_load_bench." + std::to_string(getpid()) + ".prism");
    if (!prism::replay::Synthesize(o, &t, &err) || !prism::replay::WriteTrace(t, tmp.string(), &err)) {
      std::fprintf(stderr, "replay_load_bench: %s\n", err.c_str());
      return 1;
    }
    graph = tmp.string();
  }
  malloc_trim(0);  // Why: the children forked later should not start with the synthesized graph's pages
  std::printf("replay_load_bench: %s (%.2f MB), median of %d runs\n", graph.c_str(), fs::file_size(graph) / 1e6, runs);
  // Why first: the children are forked before this process has read the graph, so their peak RSS is theirs.
  int rc = CommandBench(graph, std::max(1, Arg(argc, argv, "--command-runs", 5))) ? 0 : 1;
  std::printf("\nloading phases, this process:\n");
  std::printf("%4s %9s %10s %12s %9s %10s %10s | %14s\n", "run", "file_s", "cbor_s", "from_json_s", "free_s",
              "validate_s", "sum_s", "dom_read_s | sax_read_s  ratio");
  std::vector<double> file_s, cbor_s, conv_s, free_s, val_s, sum_s, read_s, sax_s, ratio;
  size_t nodes = 0, errors = 0;
  for (int i = 0; i < runs; ++i) {
    auto t0 = Clock::now();
    std::string data;
    {
      std::ifstream in(graph, std::ios::binary);
      data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    double a = Since(t0);
    t0 = Clock::now();
    auto* j = new nlohmann::json(nlohmann::json::from_cbor(data, true, false));
    double b = Since(t0);
    t0 = Clock::now();
    prism::trace::Trace t;
    std::string err;
    if (!prism::replay::TraceFromJson(*j, &t, &err)) {
      std::fprintf(stderr, "replay_load_bench: %s\n", err.c_str());
      return 1;
    }
    double c = Since(t0);
    t0 = Clock::now();
    delete j;
    double d = Since(t0);
    t0 = Clock::now();
    errors = prism::replay::ValidateTrace(t).size();
    double e = Since(t0);
    t0 = Clock::now();
    prism::trace::Trace t2;
    if (!prism::replay::ReadTraceUncheckedDom(graph, &t2, &err)) return 1;
    double r = Since(t0);
    t0 = Clock::now();
    prism::trace::Trace t3;
    if (!prism::replay::ReadTraceUnchecked(graph, &t3, &err)) {
      std::fprintf(stderr, "replay_load_bench: %s\n", err.c_str());
      return 1;
    }
    double x = Since(t0);
    if (i == 0 && prism::replay::TraceToJson(t2) != prism::replay::TraceToJson(t3)) {
      std::fprintf(stderr, "replay_load_bench: the streaming reader's trace differs from the document's\n");
      return 1;
    }
    nodes = 0;
    for (const auto& cl : t.classes) {
      for (const auto& s : cl.streams) nodes += s.nodes.size();
    }
    file_s.push_back(a);
    cbor_s.push_back(b);
    conv_s.push_back(c);
    free_s.push_back(d);
    val_s.push_back(e);
    sum_s.push_back(a + b + c + d + e);
    read_s.push_back(r);
    sax_s.push_back(x);
    ratio.push_back(r / x);
    std::printf("%4d %9.4f %10.4f %12.4f %9.4f %10.4f %10.4f | %10.4f | %10.4f %6.1f\n", i, a, b, c, d, e,
                a + b + c + d + e, r, x, r / x);
  }
  double sum = Median(sum_s);
  std::printf("median: file %.4f s, CBOR->JSON document %.4f s, document->trace %.4f s, free document %.4f s, "
              "validate %.4f s; sum %.4f s (%zu nodes, %zu validator errors)\n",
              Median(file_s), Median(cbor_s), Median(conv_s), Median(free_s), Median(val_s), sum, nodes, errors);
  std::printf("read (no validation): document reader %.4f s, streaming reader %.4f s; ratio document / streaming "
              "%.1f (median of per-run ratios); same trace: yes\n",
              Median(read_s), Median(sax_s), Median(ratio));
  std::printf("shares of the sum: file %.0f%%, CBOR->document %.0f%%, document->trace %.0f%%, free %.0f%%, validate %.0f%%\n",
              100 * Median(file_s) / sum, 100 * Median(cbor_s) / sum, 100 * Median(conv_s) / sum,
              100 * Median(free_s) / sum, 100 * Median(val_s) / sum);
  if (!tmp.empty()) fs::remove(tmp);
  return rc;
}
