// Fuzzes the event-file reader (src/analysis/event_file_reader.cc) and the observed-graph builder behind it
// (observed_trace.cc), as `prism-run graph build DIR` drives them: each part of the input (fuzz_split.h) is one
// rank's event file, its rank the one its first line's hello names (else its place). Nothing may crash, and a
// graph the builder accepts must read back through the trace reader (what `graph build` writes, `simulate` reads).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/observed_trace.h"
#include "fuzz_split.h"
#include "replay/trace_io.h"

namespace {

using nlohmann::json;
constexpr int kMaxFuzzWorld = 256;  // Why: the builder's work grows with the world; the bugs do not need more

// The rank named by the part's first line when it is a hello of a rank in 0..kMaxFuzzWorld-1, else -1.
int HelloRank(std::string_view part) {
  const json j = json::parse(part.substr(0, part.find('\n')), nullptr, false);
  if (!j.is_object() || !j.contains("rank") || !j["rank"].is_number_integer()) return -1;
  const int64_t r = j["rank"].get<int64_t>();
  return r >= 0 && r < kMaxFuzzWorld ? static_cast<int>(r) : -1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace prism;
  std::vector<analysis::RankEventLog> logs;
  int world_size = 0;
  for (std::string_view part : fuzz::SplitFiles(data, size, 8)) {
    analysis::RankEventLog log;
    const int named = HelloRank(part);
    log.rank = named >= 0 ? named : static_cast<int>(logs.size());
    bool taken = false;
    for (const auto& l : logs) taken = taken || l.rank == log.rank;
    if (taken) continue;  // one log per rank, as a directory holds one file per rank
    int64_t line_no = 0;
    // As ReadRankEventLog: lines end with '\n'; an unterminated last line is still being written.
    for (size_t start = 0, nl; (nl = part.find('\n', start)) != std::string_view::npos; start = nl + 1) {
      analysis::FeedEventLine(&log, part.substr(start, nl - start), ++line_no);
    }
    world_size = std::max({world_size, log.world_size <= kMaxFuzzWorld ? log.world_size : 0, log.rank + 1});
    logs.push_back(std::move(log));
  }
  // Why this layout: the seeds are four ranks of a tp=2,pp=2 job (tests/fuzz/seeds/event_file_fuzz.txt).
  world::Layout layout;
  if (logs.size() >= 4 && world_size % 4 == 0) layout.tp = layout.pp = 2;
  std::string error;
  if (!world::ResolveLayout(&layout, world_size, "the fuzz input", &error)) return 0;
  auto w = world::World::Make(layout, 8, &error);
  if (!w) return 0;
  analysis::ObservedTraceOptions o;
  o.stream_fallback = size % 2 ? analysis::StreamFallback::kPerComm : analysis::StreamFallback::kOne;
  auto g = analysis::BuildObservedTrace(logs, *w, o, &error);
  if (!g) return 0;
  const std::vector<uint8_t> cbor = json::to_cbor(replay::TraceToJson(g->trace));
  trace::Trace back;
  if (!replay::TraceFromBytes(std::string(cbor.begin(), cbor.end()), &back, &error)) {
    std::fprintf(stderr, "event_file_fuzz: the observed graph does not read back: %s\n", error.c_str());
    std::abort();
  }
  return 0;
}
