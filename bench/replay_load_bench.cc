// replay_load_bench: where the "read + validate" time of `prism-run simulate` goes, phase by phase.
//
// Synthesizes the 8192-rank job of replay_bench (tp=8 pp=16 dp=64, 32 microbatches) unless a graph is given,
// writes it as CBOR, then times, median of --runs runs each: reading the file into memory, CBOR -> JSON
// document (nlohmann::json::from_cbor), JSON document -> PrismTrace (TraceFromJson), freeing the JSON document,
// ValidateTrace, and for comparison ReadTraceUnchecked as simulate calls it.
//
//   replay_load_bench [--runs N] [--graph FILE.prism] [--tp N --pp N --dp N --microbatches N] [--tp-comm]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
  std::printf("replay_load_bench: %s (%.2f MB), median of %d runs\n", graph.c_str(), fs::file_size(graph) / 1e6, runs);
  std::printf("%4s %9s %10s %12s %9s %10s %10s | %14s\n", "run", "file_s", "cbor_s", "from_json_s", "free_s",
              "validate_s", "sum_s", "ReadUnchecked");
  std::vector<double> file_s, cbor_s, conv_s, free_s, val_s, sum_s, read_s;
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
    if (!prism::replay::ReadTraceUnchecked(graph, &t2, &err)) return 1;
    double r = Since(t0);
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
    std::printf("%4d %9.4f %10.4f %12.4f %9.4f %10.4f %10.4f | %14.4f\n", i, a, b, c, d, e, a + b + c + d + e, r);
  }
  double sum = Median(sum_s);
  std::printf("median: file %.4f s, CBOR->JSON document %.4f s, document->trace %.4f s, free document %.4f s, "
              "validate %.4f s; sum %.4f s (%zu nodes, %zu validator errors); ReadTraceUnchecked %.4f s\n",
              Median(file_s), Median(cbor_s), Median(conv_s), Median(free_s), Median(val_s), sum, nodes, errors,
              Median(read_s));
  std::printf("shares of the sum: file %.0f%%, CBOR->document %.0f%%, document->trace %.0f%%, free %.0f%%, validate %.0f%%\n",
              100 * Median(file_s) / sum, 100 * Median(cbor_s) / sum, 100 * Median(conv_s) / sum,
              100 * Median(free_s) / sum, 100 * Median(val_s) / sum);
  if (!tmp.empty()) fs::remove(tmp);
  return 0;
}
