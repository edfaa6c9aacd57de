// PyTorch Flight Recorder (FR) dumps, both ways.
//
// Format (torch/csrc/distributed/c10d/FlightRecorder.hpp, FlightRecorderDetail.hpp; version "2.10"): one file per
// rank, <prefix><rank> (torch's default prefix is nccl_trace_rank_), holding a pickled dict
//   {"version": "2.10", "comm_lib_version": str,
//    "pg_config": {pg_name: {"name": pg_name, "desc": str, "ranks": "[0, 1, 2]"}},
//    "pg_status": {str(pg_id): {"last_enqueued_collective", "last_started_collective", "last_completed_collective"}},
//    "entries": [{"record_id", "pg_id", "process_group": (pg_name, desc), "thread_id", "thread_name",
//                 "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name" ("nccl:all_reduce",
//                 "nccl:send 0->1", "nccl:recv 1<-0"), "time_created_ns", "duration_ms"?, "input_sizes" [[...]],
//                 "input_dtypes" ["Float"], "output_sizes", "output_dtypes", "state" (scheduled|started|completed),
//                 "time_discovered_started_ns", "time_discovered_completed_ns" (int or None), "retired",
//                 "timeout_ms", "is_p2p", "frames"?}]}
// which torch's analyzer (`torchfrtrace DIR`, torch/distributed/flight_recorder) reads.
//
// Prism writes one dump per real rank from what its coordinator saw (HangDetector's operation log), so the same
// tooling works on an emulation; and reads production dumps to give its own diagnosis (hang_detector.h) with the
// ranks to run for real to reproduce it. Prism's dumps add a "prism" key (world size, real ranks) that torch's
// analyzer ignores.
//
// torch's analyzer wants a dump from every member of every group named in any dump's pg_config (else it stops with
// "Missing dump files from ranks ...", unless --allow-incomplete-ranks), and it decides "not all ranks joined" only
// when the absent members have dumps. So prism also synthesises dumps for the virtual members of the real ranks'
// groups (FrVirtualDumps): on each communicator shared with real ranks a virtual member is modelled as having issued
// the collectives the real members issued, in their order, with the real members' sequence ids, sizes, dtypes and
// times, completed where the real ones completed and "started" (blocked) where they wait. Where the real members
// disagree at one sequence the virtual members take the operation most real members issued (a tie: the smallest
// real rank's), so the odd real rank is the one that differs from the group, as in prism's diagnosis.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/hang/hang_detector.h"
#include "coordinator/hang/pickle.h"

namespace prism::coord {

inline constexpr const char* kFrVersion = "2.10";
inline constexpr const char* kFrPrefix = "nccl_trace_rank_";
inline constexpr const char* kFrDirName = "flight_recorder";  // under the run's output directory

struct FrEntry {
  int64_t record_id = 0;
  int64_t pg_id = 0;
  std::string pg_name, pg_desc;
  int64_t collective_seq_id = 0, p2p_seq_id = 0, op_id = 0;
  std::string profiling_name;
  int64_t time_created_ns = 0;
  std::optional<double> duration_ms;
  std::vector<std::vector<int64_t>> input_sizes, output_sizes;
  std::vector<std::string> input_dtypes, output_dtypes;
  std::string state = "scheduled";
  std::optional<int64_t> time_started_ns, time_completed_ns;
  bool retired = false;
  int64_t timeout_ms = 600000;
  bool is_p2p = false;
};

struct FrGroup {
  std::string name, desc;
  std::vector<int> ranks;  // global ranks, group order
};

struct FrDump {
  int rank = -1;
  std::string file;
  std::string version = kFrVersion;
  std::string comm_lib_version;
  std::map<std::string, FrGroup> pg_config;  // by pg name
  std::map<std::string, std::array<int64_t, 3>> pg_status;  // pg_id -> last enqueued, started, completed
  std::vector<FrEntry> entries;
  // Only in prism's own dumps.
  bool from_prism = false;
  int world_size = 0;
  std::vector<int> real_ranks;
  uint64_t omitted = 0;  // operations prism could not express as FR entries (a p2p op whose peer it never learned)
  bool synthesized = false;  // a virtual rank's dump, modelled from the real members (FrVirtualDumps)
};

pickle::ValuePtr FrDumpToPickle(const FrDump& d);
// Tolerant of missing fields (they keep their defaults); nullopt with *error when it is not an FR dump at all.
std::optional<FrDump> FrDumpFromPickle(const pickle::Value& v, std::string* error);

// One dump per real rank the detector has an operation log for.
std::vector<FrDump> FrDumpsFromDetector(const HangDetector& d, int world_size, const std::vector<int>& real_ranks);
// Which virtual ranks get a synthesised dump: every virtual member of the chosen process groups (a group is taken
// whole or not at all: torch's analyzer needs all of a group's dumps), at most max_dumps in all.
//   kNone:   none
//   kStuck:  the groups of operations a real rank has not completed (the hang's groups)
//   kGroups: those first, then every other group a real rank is in, smallest first (the default)
struct FrVirtualOptions {
  enum class Scope { kNone, kStuck, kGroups };
  Scope scope = Scope::kGroups;
  size_t max_dumps = 256;  // Why 256: a hang's group (a data-parallel group of 64, a tp group of 8) fits; a
                           // 1024-rank world group does not, so no run writes 1024 pickles unasked
};
// PRISM_FR_VIRTUAL=none|stuck|groups and PRISM_FR_VIRTUAL_MAX=N (unset: the defaults). *warning: a value not taken.
FrVirtualOptions FrVirtualOptionsFromEnv(std::string* warning);

struct FrVirtualResult {
  std::vector<FrDump> dumps;          // by rank
  std::vector<std::string> covered;   // groups whose every member now has a dump: "name (desc, N ranks)"
  std::vector<std::string> uncovered; // groups of the real ranks left out, with why
};
// Dumps for the virtual members of the real ranks' process groups (see the top of this file); collectives only
// (a virtual rank's p2p operations are not modelled).
FrVirtualResult FrVirtualDumps(const HangDetector& d, int world_size, const std::vector<int>& real_ranks,
                               const FrVirtualOptions& o = {});

// Writes <dir>/<kFrPrefix><rank> for each dump (atomically); false with *error on the first failure.
bool WriteFrDumps(const std::vector<FrDump>& dumps, const std::string& dir, std::string* error);

struct FrReadResult {
  std::vector<FrDump> dumps;          // by rank
  std::vector<std::string> problems;  // files that could not be read, and why
};
// Every regular file in `dir` (not recursive) whose name ends in the rank's digits, as torch's analyzer takes them.
FrReadResult ReadFrDir(const std::string& dir);

struct FrAnalysis {
  HangDiagnosis diagnosis;
  std::vector<std::pair<int, std::string>> reproduce;  // ReproduceRanks
  int world_size = 0;
  std::vector<int> ranks;           // with a dump
  std::vector<int> missing_dumps;   // members of some group without a dump (production: a rank that died)
  size_t groups = 0, entries = 0;
  std::string Text() const;
  std::string Json() const;
};
FrAnalysis AnalyzeFr(const std::vector<FrDump>& dumps);

// torch's ScalarType name of a prism::trace::DType (-1 or unknown: "Byte"), and back (-1 when not one of ours).
std::string FrDtypeName(int dtype);
int FrDtypeFromName(const std::string& name);

}  // namespace prism::coord
