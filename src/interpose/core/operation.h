// One intercepted collective or p2p call (OpCall) and what is said about it before it runs: NCCL's argument checks,
// its sequence number on its communicator, its payload description (src/nccl_patch/semantics.h) and its entry on
// the unit's op line.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "interpose/core/comm.h"
#include "interpose/core/cost.h"
#include "interpose/core/event_log.h"
#include "nccl_patch/semantics.h"

namespace prism::interpose {

struct OpCall {
  payload::OpKind op = payload::OpKind::kInvalid;
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t redop = ncclSum;
  uint64_t count = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  int root = 0;
  int peer = 0;
  Comm* comm = nullptr;
  cudaStream_t stream = nullptr;
};

inline bool IsP2p(payload::OpKind op) { return op == payload::OpKind::kSend || op == payload::OpKind::kRecv; }

// A send to or a receive from the rank itself (torch's all-to-all on NCCL holds one of each, the tokens a MoE rank
// keeps): a local copy, as NCCL runs it. It takes no sequence number on its communicator (kNoSeq). Why: it is no
// communication, the graph has no node for it (observed_trace.cc), and the coordinator maps a rank's n-th numbered
// operation on a communicator to the graph's n-th node there (GraphRelease::MapOp); numbered, the copies would shift
// every later operation onto the wrong node. Nor is it exchanged or recorded: payloads are named by sequence, and its
// receive copies this rank's own send.
inline bool IsSelf(const OpCall& c) { return IsP2p(c.op) && c.peer == c.comm->rank; }

inline uint64_t NextSeq(const OpCall& c) {
  return IsSelf(c) ? kNoSeq : c.comm->seq.fetch_add(1, std::memory_order_relaxed);
}

// The operation a unit is named by (op line, kOpArrive): its first numbered one, else its first.
template <typename T, typename SeqOf>
size_t LeadOf(const T* ops, size_t n, SeqOf seq_of) {
  for (size_t i = 0; i < n; ++i)
    if (seq_of(ops[i]) != kNoSeq) return i;
  return 0;
}

// The configured payload policy (PRISM_PAYLOAD; a bad value is logged once and mirror used).
payload::Policy ConfiguredPolicy();
// PRISM_PAYLOAD=recorded.
bool RecordedOn();
// The policy of the payload steps: `recorded` replays what it has (FindRecorded) and falls back to mirror.
payload::Policy PolicyOf();

// NCCL's argument checks (enqueue.cc ArgsCheck): type, op, root/peer, buffers. Sets the last error.
ncclResult_t Validate(const OpCall& c);

// The payload description of operation `c` with sequence number `seq`.
payload::OpDesc DescOf(const OpCall& c, uint64_t seq);

// The op line's description of a unit (emulated or passthrough): what it ran, on which communicator and stream,
// and its position among that stream's units. `first` is its first operation, `seq` that operation's sequence.
void FillUnitEvent(const OpCall& first, uint64_t seq, size_t n, bool mixed, uint64_t bytes, uint64_t dur,
                   const OpCost& last, CUstream stream, OpEvent* e);

// The "ops" entry of operation `c` of a unit of several (the op line lists them: their peers, roots and sizes
// differ, e.g. a pipeline stage's send to the next stage and receive from the previous one).
UnitOpEvent UnitOpOf(const OpCall& c, uint64_t seq, uint64_t bytes);

// Logs `what` as a warning of the "nccl" logger the first time `flag` is raised.
void LogOnce(std::atomic<bool>* flag, const std::string& what);

}  // namespace prism::interpose
