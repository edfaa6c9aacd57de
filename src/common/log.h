// Named loggers per subsystem ("replay", "store", "coord", "launch", "interpose", "nccl", ...).
// Every line carries host, pid and logical rank. PRISM_LOG_LEVEL (trace..off, default info) and
// PRISM_LOG_FILE (%h host, %p pid) configure all of them.
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace prism {

// Returns the logger for `subsystem`, creating it on first use. Thread-safe, never throws.
std::shared_ptr<spdlog::logger> Log(const std::string& subsystem);

// Sets the logical rank shown in every line (-1: not a rank, e.g. the coordinator).
void SetLogRank(int rank);

}  // namespace prism
