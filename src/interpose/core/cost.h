// How long one operation lasts at the target scale, for the gate: PRISM_FIXED_DUR_US when set (tests), else the
// replay library's cost model (src/replay/cost_model.h: NCCL's tuner model or alpha-beta, over PRISM_TOPOLOGY),
// else -- when libprism is built without the replay library -- a plain alpha-beta ring model over the default
// topology (labelled "fallback" in the event file).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "nccl_patch/semantics.h"
#include "prism/trace.h"

namespace prism::interpose {

struct CommCostState;  // per-communicator tables (opaque)

enum class CostSource : uint8_t { kFixed = 1, kModel = 2, kFallback = 3 };

struct OpCost {
  uint64_t dur_ns = 0;
  CostSource source = CostSource::kFallback;
  uint8_t algo = 0;   // NcclAlgo + 1 (0 unknown)
  uint8_t proto = 0;  // NcclProto + 1 (0 unknown)
};

// Builds a communicator's tables (once, at communicator creation; may allocate). members may be empty (unknown):
// then a contiguous placement of nranks ranks is assumed.
std::shared_ptr<CommCostState> MakeCommCost(const std::vector<int32_t>& members, int nranks);

// Channel count NCCL would use on this communicator (the spinning gate's CTAs); 0 when unknown.
int CommChannels(const CommCostState* state);

// Duration of one operation. bytes = nccl-tests' S (docs/trace-format.md). No allocation, never throws.
// self/peer: global ranks for send/recv (-1 when unknown).
OpCost OperationCost(const CommCostState* state, payload::OpKind op, uint64_t bytes, payload::DataType dtype,
                     int32_t self, int32_t peer);

// nccl-tests' S of an operation given NCCL's count argument.
uint64_t OperationBytes(payload::OpKind op, uint64_t count, payload::DataType dtype, int nranks);

// The PrismTrace dtype of an NCCL/payload dtype (ipc.h's OpRecord carries trace::DType).
trace::DType TraceDTypeOf(payload::DataType t);

// Human-readable description of the model in use (logged once).
const char* CostModelDescription();

// How many times OperationCost evaluated the model (not answered from its per-thread memo), all threads.
uint64_t CostModelEvaluations();

}  // namespace prism::interpose
