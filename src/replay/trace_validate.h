// Structural validation of a PrismTrace: everything the replay engine relies on. Each error names the rank,
// class, stream and node and says what is wrong.
#pragma once

#include <string>
#include <vector>

#include "prism/trace.h"

namespace prism::replay {

struct ValidationOptions {
  size_t max_errors = 20;  // stop collecting after this many
};

// Returns the errors found (empty: the trace is valid). Checks: world/layout sizes; rank_class covers the
// world, classes and comm bindings exist; comms hold distinct in-world ranks and every rank is a member of the
// comms it uses; node kinds/ops/dtypes valid, comm nodes have a slot, p2p peers and roots inside the comm;
// `after` ids exist in the class; node ids unique; a communicator's collectives lie on one stream per rank and
// all members agree at every sequence (op, bytes, dtype, root; alltoall may differ in bytes); every send has its
// receive in the same order with the same size.
std::vector<std::string> ValidateTrace(const trace::Trace& t, const ValidationOptions& opts = {});

}  // namespace prism::replay
