// The one parser of rank lists ("0", "0,517", "0-7,64"): --ranks, --remote-ranks, --trace-ranks, graph build's
// ranks and the coordinator's. Same input, same error everywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace prism {

// Ranks in the order given. Refused, with `flag` and `spec` in *error: an empty list or entry, an entry that is not
// a decimal rank or LOW-HIGH with LOW <= HIGH, a rank given twice, a rank >= world_size (when world_size > 0),
// a rank >= limits::kMaxWorldSize (always: ranges are expanded, so "0-2000000000" must not allocate).
std::optional<std::vector<int>> ParseRankList(const std::string& spec, int64_t world_size, const std::string& flag,
                                              std::string* error);

}  // namespace prism
