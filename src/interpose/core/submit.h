// What every intercepted collective and p2p call does (the one internal function the thin exports call): validate
// as NCCL does, queue inside ncclGroupStart/End (a group's operations on one stream act as one unit), and run each
// unit (unit_run.h); a passthrough communicator's operations go to the real NCCL (passthrough.h).
#pragma once

#include <nccl.h>

#include "interpose/core/operation.h"

namespace prism::interpose {

ncclResult_t Submit(const OpCall& call);
ncclResult_t GroupStart();
ncclResult_t GroupEnd();
ncclResult_t GroupSimulateEnd(ncclSimInfo_t* info);
// The calling thread's group nesting depth (0: outside any group).
int GroupDepth();

}  // namespace prism::interpose
