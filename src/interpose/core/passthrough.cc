#include "interpose/core/passthrough.h"

#include <vector>

#include "interpose/core/config.h"
#include "interpose/core/gpu.h"
#include "interpose/core/real_symbols.h"

namespace prism::interpose {

using payload::OpKind;

namespace {

// Whether passthrough operations on `stream` get GPU stamps (not while it is captured into a CUDA graph).
bool TimeReal(cudaStream_t stream) {
  if (!Cfg().passthrough_events) return false;
  Gpu& gpu = TheGpu();
  if (!gpu.EnsureReady()) return false;
  gpu.EnsureContext();
  return !gpu.Capturing(reinterpret_cast<CUstream>(stream));
}

// Hands the progress thread one passthrough unit: operations `ops` (same stream) between the stamps of `slot` and
// `end`; it logs them as one op line with the stamps as arrival and release.
void PushRealUnit(const std::pair<OpCall, uint64_t>* ops, size_t n, uint32_t slot, uint32_t end) {
  const size_t lead = LeadOf(ops, n, [](const std::pair<OpCall, uint64_t>& o) { return o.second; });
  const OpCall& first = ops[lead].first;
  const Comm* c0 = first.comm;
  GateUnit u;
  u.slot = slot;
  u.end_slot = end;
  u.no_gate = true;
  u.via_coordinator = false;
  u.coord_comm_id = c0->coord_comm_id;
  uint64_t total = 0, dur = 0;
  bool mixed = false;
  OpCost last;
  ReserveUnitOps(&u.event, n);
  for (size_t k = 0; k < n; ++k) {
    const OpCall& c = ops[k].first;
    const auto dt = static_cast<payload::DataType>(c.dtype);
    const uint64_t bytes = OperationBytes(c.op, c.count, dt, c.comm->nranks);
    total += bytes;
    mixed = mixed || c.op != first.op;
    last = OperationCost(c.comm->cost.get(), c.op, bytes, dt, -1, -1);
    dur += last.dur_ns;
    SetUnitOp(u.event, k, UnitOpOf(c, ops[k].second, bytes));
  }
  u.dur_ns = dur;
  u.comm_ops = 0;
  for (size_t k = 0; k < n; ++k) u.comm_ops += ops[k].first.comm == c0 && ops[k].second != kNoSeq ? 1 : 0;
  FillUnitEvent(first, ops[lead].second, n, mixed, total, dur, last, reinterpret_cast<CUstream>(first.stream),
                &u.event);
  u.event.passthrough = true;
  ProgressPush(u);
}

}  // namespace

// A passthrough communicator's operation: the real NCCL, on its real communicator (comm.h).
ncclResult_t CallReal(const OpCall& c) {
  const NcclFns& n = RealNccl();
  ncclComm_t rc = c.comm->real;
  cudaStream_t st = c.stream;
  switch (c.op) {
    case OpKind::kAllReduce: return n.ncclAllReduce(c.send, c.recv, c.count, c.dtype, c.redop, rc, st);
    case OpKind::kBroadcast: return n.ncclBroadcast(c.send, c.recv, c.count, c.dtype, c.root, rc, st);
    case OpKind::kReduce: return n.ncclReduce(c.send, c.recv, c.count, c.dtype, c.redop, c.root, rc, st);
    case OpKind::kAllGather: return n.ncclAllGather(c.send, c.recv, c.count, c.dtype, rc, st);
    case OpKind::kReduceScatter: return n.ncclReduceScatter(c.send, c.recv, c.count, c.dtype, c.redop, rc, st);
    case OpKind::kAllToAll: return n.ncclAlltoAll(c.send, c.recv, c.count, c.dtype, rc, st);
    case OpKind::kGather: return n.ncclGather(c.send, c.recv, c.count, c.dtype, c.root, rc, st);
    case OpKind::kScatter: return n.ncclScatter(c.send, c.recv, c.count, c.dtype, c.root, rc, st);
    case OpKind::kSend: return n.ncclSend(c.send, c.count, c.dtype, c.peer, rc, st);
    case OpKind::kRecv: return n.ncclRecv(c.recv, c.count, c.dtype, c.peer, rc, st);
    default: break;
  }
  SetLastError("passthrough: operation not supported");
  return ncclInvalidArgument;
}

ncclResult_t SubmitReal(ThreadState& t, const OpCall& c) {
  const uint64_t seq = NextSeq(c);
  if (t.depth > 0) {
    // Why only when the outermost level reached the real NCCL: then the real operations launch at its end, where
    // GroupEnd stamps around them; otherwise they ran at an inner level's end and are not timed.
    if (!t.real_level.empty() && t.real_level[0] && TimeReal(c.stream)) {
      try {
        t.real_group.emplace_back(c, seq);
      } catch (...) {
      }
    }
    return CallReal(c);
  }
  if (!TimeReal(c.stream)) return CallReal(c);
  Gpu& gpu = TheGpu();
  const uint32_t slot = NextSlot(), end = NextSlot();
  gpu.ClearArrival(slot);
  gpu.ClearArrival(end);
  const auto s = reinterpret_cast<CUstream>(c.stream);
  if (gpu.Stamp(s, slot) != CUDA_SUCCESS) return CallReal(c);
  const ncclResult_t r = CallReal(c);
  if (gpu.Stamp(s, end) != CUDA_SUCCESS || r != ncclSuccess) {
    gpu.ClearArrival(slot);  // nothing to report: the slot is simply not used
    return r;
  }
  std::pair<OpCall, uint64_t> one(c, seq);
  PushRealUnit(&one, 1, slot, end);
  return r;
}

ncclResult_t RealGroupEnd(ThreadState& t) {
  const size_t level = static_cast<size_t>(t.depth) - 1;
  if (level >= t.real_level.size() || !t.real_level[level]) return ncclSuccess;
  t.real_level[level] = false;
  return RealNccl().ncclGroupEnd();
}

ncclResult_t EndRealGroup(ThreadState& t) {
  // The outermost end launches the group's real operations: stamp each of their streams before and after it.
  std::vector<std::pair<size_t, std::pair<uint32_t, uint32_t>>> stamped;  // first op index of a stream -> slots
  if (t.depth == 1 && !t.real_group.empty()) {
    Gpu& gpu = TheGpu();
    for (size_t k = 0; k < t.real_group.size(); ++k) {
      bool seen = false;
      for (const auto& st : stamped) seen = seen || t.real_group[st.first].first.stream == t.real_group[k].first.stream;
      if (seen) continue;
      const uint32_t slot = NextSlot(), end = NextSlot();
      gpu.ClearArrival(slot);
      gpu.ClearArrival(end);
      if (gpu.Stamp(reinterpret_cast<CUstream>(t.real_group[k].first.stream), slot) == CUDA_SUCCESS)
        stamped.push_back({k, {slot, end}});
    }
  }
  ncclResult_t real_result = RealGroupEnd(t);
  if (!stamped.empty()) {
    Gpu& gpu = TheGpu();
    std::vector<std::pair<OpCall, uint64_t>> same;
    for (const auto& [k, slots] : stamped) {
      const cudaStream_t stream = t.real_group[k].first.stream;
      if (real_result != ncclSuccess || gpu.Stamp(reinterpret_cast<CUstream>(stream), slots.second) != CUDA_SUCCESS)
        continue;
      same.clear();
      for (const auto& op : t.real_group)
        if (op.first.stream == stream) same.push_back(op);
      PushRealUnit(same.data(), same.size(), slots.first, slots.second);
    }
  }
  if (t.depth == 1) t.real_group.clear();
  return real_result;
}

}  // namespace prism::interpose
