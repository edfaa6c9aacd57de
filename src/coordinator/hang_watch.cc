#include "coordinator/hang_watch.h"

#include <cstdio>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/atomic_file.h"
#include "common/log.h"
#include "coordinator/hang/flight_recorder.h"
#include "coordinator/hang/pickle.h"

namespace prism::coord {

void HangWatch::Check() {
  std::optional<HangDiagnosis> d;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    d = st_.hang.Check(NowNs());
  }
  if (!d) return;
  std::string path = (std::filesystem::path(st_.opts.out_dir) / "hang.json").string();
  std::string hang_json = d->ToJson();
  if (std::string error; !WriteFileAtomic(path, hang_json, &error)) Log("coord")->error("{}", error);
  store_.Call([&](store::StoreState& st) { st.Set(kHangKey, hang_json); });
  WriteFlightRecorder();
  std::string text = d->ToText();
  // Why stderr as well as the log: the diagnosis is the answer the user waits for, whatever the log level.
  std::fprintf(stderr, "%s  (written to %s)\n", text.c_str(), path.c_str());
  std::fflush(stderr);
  Log("coord")->warn("hang diagnosed: {} rank(s) waiting, {} mismatch(es), {} cycle(s); see {}", d->waits.size(),
                     d->mismatches.size(), d->cycles.size(), path);
  if (st_.opts.on_hang) st_.opts.on_hang(path);
}

void HangWatch::WriteFlightRecorder() {
  std::vector<FrDump> dumps;
  FrVirtualResult virt;
  std::string warning;
  const FrVirtualOptions vopt = FrVirtualOptionsFromEnv(&warning);
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    dumps = FrDumpsFromDetector(st_.hang, st_.opts.world_size, st_.opts.real_ranks);
    // Why also virtual ranks: torch's analyzer wants every member's dump (flight_recorder.h, docs/hang.md).
    if (!dumps.empty()) virt = FrVirtualDumps(st_.hang, st_.opts.world_size, st_.opts.real_ranks, vopt);
  }
  if (dumps.empty()) return;
  std::string dir = (std::filesystem::path(st_.opts.out_dir) / kFrDirName).string(), error;
  if (!WriteFrDumps(dumps, dir, &error)) Log("coord")->error("Flight Recorder dumps: {}", error);
  if (!warning.empty()) Log("coord")->warn("Flight Recorder: {}", warning);
  if (!virt.dumps.empty() && !WriteFrDumps(virt.dumps, dir, &error))
    Log("coord")->error("Flight Recorder virtual ranks' dumps: {}", error);
  Log("coord")->info("Flight Recorder: {} real and {} virtual rank dump(s) in {}; groups covered: {}{}", dumps.size(),
                     virt.dumps.size(), dir,
                     virt.covered.empty() ? "none" : fmt::format("{}", fmt::join(virt.covered, "; ")),
                     virt.uncovered.empty() ? ""
                                            : fmt::format("; not covered (torch's analyzer then needs "
                                                          "--allow-incomplete-ranks --mismatch_cap 1000000): {}",
                                                          fmt::join(virt.uncovered, "; ")));
  // For prism-runs on other hosts (they copy their ranks' dumps into their own output).
  store_.Call([&](store::StoreState& st) {
    for (const FrDump& d : dumps) {
      st.Set(std::string(kFrKeyPrefix) + kFrPrefix + std::to_string(d.rank), pickle::Dumps(*FrDumpToPickle(d)));
    }
  });
}

}  // namespace prism::coord
