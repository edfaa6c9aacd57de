// Passthrough communicators (comm.h: every member real, each on its own GPU) run on the real NCCL: their
// operations are forwarded on the real communicator, their group starts and ends too, and each operation (or each
// stream's share of a group) is timed between two GPU stamps and logged as one op line (PRISM_PASSTHROUGH_EVENTS).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "interpose/core/unit_run.h"

namespace prism::interpose {

// A passthrough communicator's operation: the real NCCL, on its real communicator (comm.h).
ncclResult_t CallReal(const OpCall& c);

// Submit for a passthrough communicator's operation: forwarded, and timed when PRISM_PASSTHROUGH_EVENTS is on
// (inside a group: at the group's end, EndRealGroup).
ncclResult_t SubmitReal(ThreadState& t, const OpCall& c);

// Closes the real group of the current nesting level if its start was forwarded (the outermost real end launches
// the real operations).
ncclResult_t RealGroupEnd(ThreadState& t);

// The passthrough part of ncclGroupEnd at nesting level t.depth (not yet decremented): the real group's end, with
// the outermost level's real operations stamped before and after it per stream and handed to the progress thread.
// Returns the real ncclGroupEnd's result.
ncclResult_t EndRealGroup(ThreadState& t);

}  // namespace prism::interpose
