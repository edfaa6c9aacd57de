// `prism-run status`: where every logical rank of an emulation is, for people. Built from the coordinator's
// documents (coordinator.json, status.json, hang.json: docs/coordinator.md, docs/hang.md), read from an output
// directory or, live, from the coordinator's store (kStatusKey, kHangKey in coordinator.h).
//
// Real ranks are listed by name; per communicator the last operation each completed and the one it waits at
// (sequence, op, bytes, dtype, how long). Virtual ranks are grouped where they are alike: under payload "mirror"
// a virtual member of a communicator is where its real members are, so virtual ranks that belong to the same
// communicators (among those real ranks created) are one line. Communicators are named by their torch group
// description, and by the Megatron group with exactly their members when the layout is known.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace prism::coord {

struct StatusDocs {
  nlohmann::json info;    // coordinator.json (may be null: remote)
  nlohmann::json status;  // status.json (may be null: not written yet)
  nlohmann::json hang;    // hang.json (null when no hang was diagnosed)
  std::string where;      // the directory or HOST:PORT it came from
  std::string alive;      // "running", "stopped", "not running (the coordinator died)", ...
};

struct StatusViewOptions {
  uint64_t now_ns = 0;     // for "how long ago"
  size_t max_groups = 24;  // virtual-rank lines shown
};

std::string RenderStatus(const StatusDocs& docs, const StatusViewOptions& opts);

// Megatron group descriptions by exact members ("TENSOR_MODEL_PARALLEL_GROUP", several joined with '|'), from a
// layout spec (coordinator.json "layout") and world size; empty map when the layout is empty or does not resolve.
std::map<std::vector<int>, std::string> MegatronLabels(const std::string& layout, int world_size);

}  // namespace prism::coord
