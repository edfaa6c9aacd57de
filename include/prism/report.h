// report.json: the keys every run writes (schema version 1). Tests and CI jobs read these; extend, do not
// rename. docs/cli.md lists them with units.
#pragma once

#include <string_view>

namespace prism::report {

inline constexpr int kSchemaVersion = 1;
inline constexpr std::string_view kFileName = "report.json";

// Top level.
inline constexpr std::string_view kSchema = "schema_version";
inline constexpr std::string_view kWorldSize = "world_size";
inline constexpr std::string_view kMode = "mode";                   // emulate | simulate | collect | fill
inline constexpr std::string_view kIterationTime = "iteration_time_s";  // median over measured iterations
inline constexpr std::string_view kIterations = "iterations";
inline constexpr std::string_view kRanks = "ranks";
inline constexpr std::string_view kWall = "wall_s";
// Per rank (objects in "ranks").
inline constexpr std::string_view kRank = "rank";
inline constexpr std::string_view kPeakMemory = "peak_memory_bytes";
inline constexpr std::string_view kWait = "wait_s";  // object: communicator description -> seconds
// object: communicator description -> the median over measured iterations of the seconds waited in that iteration
// (an operation counts in the iteration whose marks bracket its arrival; iterations without a wait count as 0)
inline constexpr std::string_view kWaitPerIteration = "wait_per_iteration_s";
// Seconds the rank's gates opened after their decided release time (op lines' opened_ns - max(release_ns,
// arrival_ns), clamped at 0): mostly the coordinator's decision latency under --graph. Only when the rank's op lines
// carry opened_ns. The per-iteration key: the median over measured iterations, as
// wait_per_iteration_s (an operation counts in the iteration in which it arrived).
inline constexpr std::string_view kCoordinatorLatency = "coordinator_latency_s";
inline constexpr std::string_view kCoordinatorLatencyPerIteration = "coordinator_latency_per_iteration_s";

}  // namespace prism::report
