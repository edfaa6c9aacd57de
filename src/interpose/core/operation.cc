#include "interpose/core/operation.h"

#include <algorithm>
#include <mutex>

#include "common/log.h"
#include "interpose/core/config.h"
#include "interpose/core/runtime.h"
#include "interpose/core/streams.h"

namespace prism::interpose {

using payload::OpKind;

payload::Policy ConfiguredPolicy() {
  const auto p = static_cast<payload::Policy>(Rt().payload_policy());
  if (p != payload::Policy::kInvalid) [[likely]] return p;
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true))
    Log("nccl")->error("PRISM_PAYLOAD='{}' is not mirror, zeros, random or recorded; using mirror", Cfg().payload);
  return payload::Policy::kMirror;
}

bool RecordedOn() { return ConfiguredPolicy() == payload::Policy::kRecorded; }

// The policy of the payload steps: `recorded` replays what it has (FindRecorded) and falls back to mirror.
payload::Policy PolicyOf() {
  return RecordedOn() ? payload::Policy::kMirror : ConfiguredPolicy();
}

// NCCL's argument checks (enqueue.cc ArgsCheck): type, op, root/peer, buffers.
ncclResult_t Validate(const OpCall& c) {
  if (c.comm == nullptr) {
    SetLastError("invalid communicator");
    return ncclInvalidArgument;
  }
  if (c.comm->revoked.load(std::memory_order_relaxed)) {
    SetLastError("communicator was revoked");
    return ncclInvalidUsage;
  }
  if (c.dtype < 0 || c.dtype >= ncclNumTypes) {
    SetLastError("invalid data type " + std::to_string(static_cast<int>(c.dtype)));
    return ncclInvalidArgument;
  }
  const bool reduces = c.op == OpKind::kAllReduce || c.op == OpKind::kReduce || c.op == OpKind::kReduceScatter;
  if (reduces && static_cast<int>(c.redop) >= ncclNumOps) {
    size_t idx = static_cast<size_t>(c.redop) - ncclNumOps;
    std::lock_guard<std::mutex> lock(c.comm->mu);
    if (idx >= c.comm->redops.size() || !c.comm->redops[idx].used ||
        c.comm->redops[idx].dtype != static_cast<payload::DataType>(c.dtype)) {
      SetLastError("invalid reduction operator " + std::to_string(static_cast<int>(c.redop)));
      return ncclInvalidArgument;
    }
  } else if (reduces && c.redop < 0) {
    SetLastError("invalid reduction operator");
    return ncclInvalidArgument;
  }
  const int n = c.comm->nranks;
  const bool rooted = c.op == OpKind::kBroadcast || c.op == OpKind::kReduce || c.op == OpKind::kGather ||
                      c.op == OpKind::kScatter;
  if (rooted && (c.root < 0 || c.root >= n)) {
    SetLastError("invalid root " + std::to_string(c.root));
    return ncclInvalidArgument;
  }
  if (IsP2p(c.op) && (c.peer < 0 || c.peer >= n)) {
    SetLastError("invalid peer " + std::to_string(c.peer));
    return ncclInvalidArgument;
  }
  if (c.count > 0) {
    const bool me_root = c.root == c.comm->rank;
    bool need_send = c.op != OpKind::kRecv && !(c.op == OpKind::kScatter && !me_root) &&
                     !(c.op == OpKind::kBroadcast && !me_root);
    bool need_recv = c.op != OpKind::kSend && !((c.op == OpKind::kReduce || c.op == OpKind::kGather) && !me_root);
    if ((need_send && c.send == nullptr) || (need_recv && c.recv == nullptr)) {
      SetLastError("NULL buffer");
      return ncclInvalidArgument;
    }
  }
  return ncclSuccess;
}

payload::OpDesc DescOf(const OpCall& c, uint64_t seq) {
  payload::OpDesc d;
  d.op = c.op;
  d.dtype = static_cast<payload::DataType>(c.dtype);
  d.policy = PolicyOf();
  d.nranks = c.comm->nranks;
  d.rank = c.comm->rank;
  d.root = c.root;
  d.peer = c.peer;
  d.count = c.count;
  d.send_addr = reinterpret_cast<uint64_t>(c.send);
  d.recv_addr = reinterpret_cast<uint64_t>(c.recv);
  d.seed = Cfg().seed;
  d.comm_id = c.comm->stable_id;
  d.seq = seq;
  if (static_cast<int>(c.redop) >= ncclNumOps) {
    std::lock_guard<std::mutex> lock(c.comm->mu);
    const PreMulSumOp& p = c.comm->redops[static_cast<size_t>(c.redop) - ncclNumOps];
    d.redop = payload::RedOp::kPreMulSum;
    d.premul_scalar_bits = p.bits;
    d.premul_scalar_addr = p.addr;
  } else {
    d.redop = static_cast<payload::RedOp>(c.redop);
  }
  return d;
}

void LogOnce(std::atomic<bool>* flag, const std::string& what) {
  if (!flag->exchange(true)) Log("nccl")->warn("{}", what);
}

// The op line's description of a unit (emulated or passthrough): what it ran, on which communicator and stream,
// and its position among that stream's units. `first` is its first operation, `seq` that operation's sequence.
void FillUnitEvent(const OpCall& first, uint64_t seq, size_t n, bool mixed, uint64_t bytes, uint64_t dur,
                   const OpCost& last, CUstream stream, OpEvent* e) {
  const Comm* c0 = first.comm;
  const OpKind k = first.op;
  const bool rooted = k == OpKind::kBroadcast || k == OpKind::kReduce || k == OpKind::kGather || k == OpKind::kScatter;
  e->comm_id = c0->id;
  e->coord_comm_id = c0->coord_comm_id;
  e->seq = seq;
  e->op = mixed ? 0xff : static_cast<uint8_t>(k);
  e->dtype = static_cast<uint8_t>(first.dtype);
  e->bytes = bytes;
  e->peer = n == 1 && IsP2p(k) ? first.peer : -1;
  e->root = n == 1 && rooted ? first.root : -1;
  e->model_dur_ns = dur;
  e->algo = last.algo;
  e->proto = last.proto;
  e->source = static_cast<uint8_t>(last.source);
  e->nops = static_cast<uint16_t>(std::min<size_t>(n, 65535));
  e->stream = StreamIndex(stream);
  if (e->stream < kCountedStreams) e->stream_seq = StreamUnits(e->stream).fetch_add(1);
}

// The "ops" entry of operation `c` of a unit of several (the op line lists them: their peers, roots and sizes
// differ, e.g. a pipeline stage's send to the next stage and receive from the previous one).
UnitOpEvent UnitOpOf(const OpCall& c, uint64_t seq, uint64_t bytes) {
  const OpKind k = c.op;
  const bool rooted = k == OpKind::kBroadcast || k == OpKind::kReduce || k == OpKind::kGather || k == OpKind::kScatter;
  UnitOpEvent o;
  o.comm_id = c.comm->id;
  o.seq = seq;
  o.op = static_cast<uint8_t>(k);
  o.dtype = static_cast<uint8_t>(c.dtype);
  o.bytes = bytes;
  o.peer = IsP2p(k) ? c.peer : -1;
  o.root = rooted ? c.root : -1;
  return o;
}

}  // namespace prism::interpose
