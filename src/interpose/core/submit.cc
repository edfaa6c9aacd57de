#include "interpose/core/submit.h"

#include "interpose/core/comm.h"
#include "interpose/core/cost.h"
#include "interpose/core/passthrough.h"
#include "interpose/core/real_symbols.h"
#include "interpose/core/unit_exchange.h"
#include "interpose/core/unit_run.h"
#include "interpose/core/unit_stats.h"

namespace prism::interpose {
namespace {

thread_local ThreadState tls;

}  // namespace

ncclResult_t Submit(const OpCall& call) {
  if (call.comm != nullptr && call.comm->real != nullptr) return SubmitReal(tls, call);
  const bool sample = tls.depth == 0 && SampleThisUnit();
  const uint64_t t0 = sample ? StartSample() : 0;
  if (ncclResult_t v = Validate(call); v != ncclSuccess) {
    CancelSample();
    return v;
  }
  if (tls.depth > 0) {
    try {
      tls.group.push_back(call);
    } catch (...) {
      return ncclSystemError;
    }
    return ncclSuccess;
  }
  ncclResult_t r = RunUnit(tls, &call, 1);
  if (sample) RecordOverhead(t0);
  return r;
}

ncclResult_t GroupStart() {
  ++tls.depth;
  // Why only while passthrough communicators live: their operations inside this group must fuse as NCCL's do.
  const bool real = PassthroughComms() > 0;
  if (real) {
    if (ncclResult_t r = RealNccl().ncclGroupStart(); r != ncclSuccess) {
      --tls.depth;
      return r;
    }
  }
  try {
    tls.real_level.resize(static_cast<size_t>(tls.depth));
    tls.real_level[static_cast<size_t>(tls.depth) - 1] = real;
  } catch (...) {
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t GroupEnd() {
  if (tls.depth <= 0) {
    SetLastError("ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  const ncclResult_t real_result = EndRealGroup(tls);
  if (--tls.depth > 0) return real_result;
  if (tls.group.empty()) return real_result;
  const bool sample = SampleThisUnit();
  const uint64_t t0 = sample ? StartSample() : 0;
  ncclResult_t result = ncclSuccess;
  // One unit per stream, in posting order of each stream's first operation.
  std::vector<OpCall>& ops = tls.group;
  std::vector<OpCall>& one = tls.scratch;
  std::vector<uint8_t>& done = tls.done;
  done.assign(ops.size(), 0);
  tls.defer_send_done = true;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (done[i]) continue;
    one.clear();
    for (size_t j = i; j < ops.size(); ++j) {
      if (!done[j] && ops[j].stream == ops[i].stream) {
        one.push_back(ops[j]);
        done[j] = 1;
      }
    }
    ncclResult_t r = RunUnit(tls, one.data(), one.size());
    if (r != ncclSuccess && result == ncclSuccess) result = r;
  }
  tls.defer_send_done = false;
  PhaseMark(kPhaseEnter);
  WaitSendsDone(tls);
  PhaseMark(kPhaseSteps);  // the exchanged sends' acknowledgement, as RunExchange's own wait
  // The units with sends complete now, as NCCL's group does once every receive of its sends was posted.
  for (const GateUnit& u : tls.held_units) PushUnit(u);
  PhaseMark(kPhasePush);
  tls.held_units.clear();
  ops.clear();
  if (sample) RecordOverhead(t0);
  return result != ncclSuccess ? result : real_result;
}

ncclResult_t GroupSimulateEnd(ncclSimInfo_t* info) {
  if (info == nullptr || info->magic != 0x74685283u) {
    SetLastError("ncclSimInfo_t was not initialized with NCCL_SIM_INFO_INITIALIZER");
    return ncclInvalidArgument;
  }
  if (tls.depth <= 0) return ncclInvalidUsage;
  // Why the real end: the real group must close; its passthrough operations then run (NCCL's simulate-end would
  // only estimate them, and libprism's estimate below covers the group's other operations). Not timed.
  RealGroupEnd(tls);
  if (tls.depth == 1) tls.real_group.clear();
  if (--tls.depth > 0) return ncclSuccess;
  double us = 0;
  for (const OpCall& c : tls.group) {
    if (IsSelf(c)) continue;  // a local copy, as RunUnit times it
    uint64_t bytes = OperationBytes(c.op, c.count, static_cast<payload::DataType>(c.dtype), c.comm->nranks);
    us += OperationCost(c.comm->cost.get(), c.op, bytes, static_cast<payload::DataType>(c.dtype), -1, -1).dur_ns / 1e3;
  }
  info->estimatedTime = static_cast<float>(us);
  tls.group.clear();
  return ncclSuccess;
}

int GroupDepth() { return tls.depth; }

}  // namespace prism::interpose
