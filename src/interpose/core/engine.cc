#include "interpose/core/engine.h"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "common/log.h"
#include "interpose/core/config.h"
#include "interpose/core/event_log.h"
#include "interpose/core/gpu.h"
#include "interpose/core/progress.h"

namespace prism::interpose {
namespace {

using payload::OpKind;
using payload::StepKind;

constexpr uint32_t kHistBucketNs = 25;
constexpr uint32_t kHistBuckets = 8000;  // up to 200 us; beyond goes in the last bucket

struct Stats {
  std::atomic<uint64_t> hist[kHistBuckets] = {};
  std::atomic<uint64_t> units{0};
};
Stats& St() {
  static Stats* s = new Stats();
  return *s;
}

uint64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void RecordOverhead(uint64_t ns) {
  uint64_t b = std::min<uint64_t>(ns / kHistBucketNs, kHistBuckets - 1);
  St().hist[b].fetch_add(1, std::memory_order_relaxed);
}

// One operation of a unit, ready to run.
struct Prepared {
  OpCall call;
  payload::OpDesc desc;
  payload::StepList steps;
  uint64_t bytes = 0;
  uint64_t seq = 0;
};

// A send of the unit being run: (comm, peer, bytes) -> buffer.
struct UnitSend {
  const Comm* comm;
  int32_t peer;
  uint64_t bytes;
  uint32_t index;  // posting order: the latest matching send wins
  uint64_t addr;
  bool operator<(const UnitSend& o) const {
    if (comm != o.comm) return comm < o.comm;
    if (peer != o.peer) return peer < o.peer;
    if (bytes != o.bytes) return bytes < o.bytes;
    return index < o.index;
  }
  bool SameKey(const UnitSend& o) const { return comm == o.comm && peer == o.peer && bytes == o.bytes; }
};

struct Tls {
  int depth = 0;
  std::vector<OpCall> group;
  std::vector<Prepared> prepared;
  std::vector<OpCall> scratch;
  std::vector<UnitSend> sends;
  std::vector<uint8_t> done;
  Tls() {
    group.reserve(4096);
    prepared.reserve(4096);
    scratch.reserve(4096);
    sends.reserve(4096);
    done.reserve(4096);
  }
};
thread_local Tls tls;

payload::Policy PolicyOf() {
  static const payload::Policy p = [] {
    payload::Policy q = payload::ParsePolicy(Cfg().payload.c_str());
    if (q == payload::Policy::kInvalid) {
      Log("nccl")->error("PRISM_PAYLOAD='{}' is not mirror, zeros, random or recorded; using mirror", Cfg().payload);
      q = payload::Policy::kMirror;
    }
    return q;
  }();
  return p;
}

bool IsP2p(OpKind op) { return op == OpKind::kSend || op == OpKind::kRecv; }

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

// Runs one unit: operations on one stream that complete together.
ncclResult_t RunUnit(const OpCall* ops, size_t n) {
  static std::atomic<bool> warned_capture{false}, warned_plan{false}, warned_step{false}, warned_full{false};
  if (n == 0) return ncclSuccess;
  Gpu& gpu = TheGpu();
  if (!gpu.EnsureReady()) {
    SetLastError("libprism could not set up its GPU work");
    return ncclUnhandledCudaError;
  }
  gpu.EnsureContext();
  const Config& cfg = Cfg();
  CUstream stream = reinterpret_cast<CUstream>(ops[0].stream);
  const bool capturing = gpu.Capturing(stream);
  if (capturing) LogOnce(&warned_capture, "a collective is captured into a CUDA graph: it writes its payload but is not gated");

  // Plan every operation first (p2p mirror rule: a group's sends are recorded before its receives look).
  std::vector<Prepared>& prep = tls.prepared;
  prep.clear();
  for (size_t i = 0; i < n; ++i) {
    Prepared p;
    p.call = ops[i];
    p.seq = ops[i].comm->seq.fetch_add(1, std::memory_order_relaxed);
    p.bytes = OperationBytes(ops[i].op, ops[i].count, static_cast<payload::DataType>(ops[i].dtype), ops[i].comm->nranks);
    prep.push_back(p);
  }
  // Why an exact in-unit match first: the history is a direct-mapped cache; with hundreds of peers in one
  // all-to-all, colliding entries made a receive take another peer's send.
  std::vector<UnitSend>& sends = tls.sends;
  sends.clear();
  for (Prepared& p : prep) {
    if (p.call.op != OpKind::kSend || p.call.count == 0) continue;
    const uint64_t addr = reinterpret_cast<uint64_t>(p.call.send);
    sends.push_back(UnitSend{p.call.comm, p.call.peer, p.bytes, static_cast<uint32_t>(sends.size()), addr});
    std::lock_guard<std::mutex> lock(p.call.comm->mu);
    p.call.comm->history.RecordSend(p.call.peer, p.bytes, addr);
  }
  std::sort(sends.begin(), sends.end());
  for (Prepared& p : prep) {
    p.desc = DescOf(p.call, p.seq);
    if (p.call.op == OpKind::kRecv && p.call.count > 0) {
      uint64_t addr = 0;
      UnitSend key{p.call.comm, p.call.peer, p.bytes, UINT32_MAX, 0};
      auto it = std::upper_bound(sends.begin(), sends.end(), key);
      if (it != sends.begin() && (it - 1)->SameKey(key)) {
        addr = (it - 1)->addr;
      } else {
        std::lock_guard<std::mutex> lock(p.call.comm->mu);
        p.call.comm->history.Find(p.call.peer, p.bytes, &addr);
      }
      p.desc.mirror_send_addr = addr;
    }
    payload::Status st = payload::Plan(p.desc, &p.steps);
    if (st == payload::Status::kInvalidArgument) {
      SetLastError(std::string("invalid arguments for ") + payload::OpKindName(p.call.op));
      return ncclInvalidArgument;
    }
    if (st == payload::Status::kUnsupported) {
      LogOnce(&warned_plan, std::string("payload policy '") + cfg.payload + "' is not implemented: outputs are left as they are");
      p.steps.size = 0;
    }
  }

  const uint32_t slot = NextSlot();
  const uint32_t ticket = NextTicket();
  const bool gated = cfg.gate != GateKind::kNone && !capturing;
  *gpu.ArrivalWord(slot) = 0;
  CUresult r = CUDA_SUCCESS;
  // The arrival stamp rides on the first payload step (one launch); earlier operations of the unit have none.
  bool stamped = capturing;
  for (const Prepared& p : prep) {
    for (uint32_t k = 0; k < p.steps.size && r == CUDA_SUCCESS; ++k) {
      const payload::Step& st = p.steps.steps[k];
      CUresult rs;
      if (!stamped && st.kind != StepKind::kNoop) {
        rs = gpu.StampAndStep(stream, slot, p.desc, st);
        stamped = true;
      } else {
        rs = gpu.RunStep(stream, p.desc, st);
      }
      if (rs == CUDA_ERROR_NOT_FOUND) {
        LogOnce(&warned_step, "a payload kernel is missing from the fatbin: that step was skipped");
      } else {
        r = rs;
      }
    }
  }
  if (!stamped && r == CUDA_SUCCESS) r = gpu.Stamp(stream, slot);
  if (r == CUDA_SUCCESS && gated) r = gpu.Gate(stream, slot, ticket, cfg.gate, ops[0].comm->spin_ctas);
  if (r != CUDA_SUCCESS) {
    SetLastError("CUDA error " + std::to_string(static_cast<int>(r)) + " while enqueueing on the stream");
    Log("nccl")->error("{}", LastError());
    __atomic_store_n(gpu.GateWord(slot), ticket, __ATOMIC_RELEASE);  // never leave a half-built gate closed
    return ncclUnhandledCudaError;
  }
  if (capturing) return ncclSuccess;

  // Duration of the unit at the target scale: collectives add up; the p2p part of a group moves its larger
  // direction as one exchange.
  GateUnit u;
  uint64_t p2p_send = 0, p2p_recv = 0, total = 0;
  int32_t p2p_peer = -1;
  uint64_t dur = 0;
  bool mixed = false;
  OpCost last{};
  for (const Prepared& p : prep) {
    total += p.bytes;
    if (p.call.op != prep[0].call.op) mixed = true;
    if (IsP2p(p.call.op)) {
      (p.call.op == OpKind::kSend ? p2p_send : p2p_recv) += p.bytes;
      if (p2p_peer < 0) p2p_peer = p.call.comm->GlobalRank(p.call.peer);
      continue;
    }
    last = OperationCost(p.call.comm->cost.get(), p.call.op, p.bytes, p.desc.dtype, -1, -1);
    dur += last.dur_ns;
  }
  if (p2p_send + p2p_recv > 0 || (IsP2p(prep[0].call.op))) {
    last = OperationCost(prep[0].call.comm->cost.get(), OpKind::kSend, std::max(p2p_send, p2p_recv),
                         prep[0].desc.dtype, static_cast<int32_t>(cfg.rank), p2p_peer);
    dur += last.dur_ns;
  }
  if (cfg.fixed_dur_us >= 0) dur = last.dur_ns;  // a fixed duration is per unit, not per operation
  const Comm* c0 = prep[0].call.comm;
  u.slot = slot;
  u.ticket = ticket;
  u.dur_ns = dur;
  u.no_gate = !gated;
  u.release_lat_ns = !gated ? 0
                    : cfg.gate == GateKind::kSpin ? gpu.SpinReleaseNs(c0->spin_ctas)
                                                  : gpu.Calibration().wait_release_ns;
  u.via_coordinator = c0->use_coordinator;
  u.coord_comm_id = c0->coord_comm_id;
  u.event.comm_id = c0->id;
  u.event.seq = prep[0].seq;
  u.event.op = mixed ? 0xff : static_cast<uint8_t>(prep[0].call.op);
  u.event.dtype = static_cast<uint8_t>(prep[0].call.dtype);
  u.event.bytes = total;
  u.event.peer = n == 1 && IsP2p(prep[0].call.op) ? prep[0].call.peer : -1;
  u.event.model_dur_ns = dur;
  u.event.algo = last.algo;
  u.event.proto = last.proto;
  u.event.source = static_cast<uint8_t>(last.source);
  u.event.nops = static_cast<uint16_t>(std::min<size_t>(n, 65535));
  if (!ProgressPush(u)) {
    LogOnce(&warned_full, "more than 16384 operations in flight: releasing gates immediately");
    __atomic_store_n(gpu.GateWord(slot), ticket, __ATOMIC_RELEASE);
  }
  thread_local uint32_t since_check = 0;
  if ((++since_check & 63u) == 0) gpu.MaybeRecalibrate();  // Why every 64: it reads the clock
  St().units.fetch_add(1, std::memory_order_relaxed);
  return ncclSuccess;
}

}  // namespace

// Why sampled: the clock reads are themselves host overhead; one unit in 8 gives the same distribution.
bool SampleThisUnit() {
  thread_local uint32_t n = 0;
  return (n++ & 7u) == 0;
}

ncclResult_t Submit(const OpCall& call) {
  const bool sample = tls.depth == 0 && SampleThisUnit();
  const uint64_t t0 = sample ? MonoNs() : 0;
  if (ncclResult_t v = Validate(call); v != ncclSuccess) return v;
  if (tls.depth > 0) {
    try {
      tls.group.push_back(call);
    } catch (...) {
      return ncclSystemError;
    }
    return ncclSuccess;
  }
  ncclResult_t r = RunUnit(&call, 1);
  if (sample) RecordOverhead(MonoNs() - t0);
  return r;
}

ncclResult_t GroupStart() {
  ++tls.depth;
  return ncclSuccess;
}

ncclResult_t GroupEnd() {
  if (tls.depth <= 0) {
    SetLastError("ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--tls.depth > 0) return ncclSuccess;
  if (tls.group.empty()) return ncclSuccess;
  const bool sample = SampleThisUnit();
  const uint64_t t0 = sample ? MonoNs() : 0;
  ncclResult_t result = ncclSuccess;
  // One unit per stream, in posting order of each stream's first operation.
  std::vector<OpCall>& ops = tls.group;
  std::vector<OpCall>& one = tls.scratch;
  std::vector<uint8_t>& done = tls.done;
  done.assign(ops.size(), 0);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (done[i]) continue;
    one.clear();
    for (size_t j = i; j < ops.size(); ++j) {
      if (!done[j] && ops[j].stream == ops[i].stream) {
        one.push_back(ops[j]);
        done[j] = 1;
      }
    }
    ncclResult_t r = RunUnit(one.data(), one.size());
    if (r != ncclSuccess && result == ncclSuccess) result = r;
  }
  ops.clear();
  if (sample) RecordOverhead(MonoNs() - t0);
  return result;
}

ncclResult_t GroupSimulateEnd(ncclSimInfo_t* info) {
  if (info == nullptr || info->magic != 0x74685283u) {
    SetLastError("ncclSimInfo_t was not initialized with NCCL_SIM_INFO_INITIALIZER");
    return ncclInvalidArgument;
  }
  if (tls.depth <= 0) return ncclInvalidUsage;
  if (--tls.depth > 0) return ncclSuccess;
  double us = 0;
  for (const OpCall& c : tls.group) {
    uint64_t bytes = OperationBytes(c.op, c.count, static_cast<payload::DataType>(c.dtype), c.comm->nranks);
    us += OperationCost(c.comm->cost.get(), c.op, bytes, static_cast<payload::DataType>(c.dtype), -1, -1).dur_ns / 1e3;
  }
  info->estimatedTime = static_cast<float>(us);
  tls.group.clear();
  return ncclSuccess;
}

int GroupDepth() { return tls.depth; }

ncclResult_t RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t dtype,
                                  ncclScalarResidence_t residence, Comm* comm) {
  if (op == nullptr || scalar == nullptr || dtype < 0 || dtype >= ncclNumTypes) return ncclInvalidArgument;
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate) return ncclInvalidArgument;
  PreMulSumOp p;
  p.used = true;
  p.dtype = static_cast<payload::DataType>(dtype);
  if (residence == ncclScalarHostImmediate) {
    std::memcpy(&p.bits, scalar, payload::DataTypeSize(p.dtype));
  } else {
    p.addr = reinterpret_cast<uint64_t>(scalar);
  }
  std::lock_guard<std::mutex> lock(comm->mu);
  size_t idx = 0;
  while (idx < comm->redops.size() && comm->redops[idx].used) ++idx;
  try {
    if (idx == comm->redops.size()) comm->redops.push_back(p);
    else comm->redops[idx] = p;
  } catch (...) {
    return ncclSystemError;
  }
  if (idx + ncclNumOps > static_cast<size_t>(ncclMaxRedOp)) return ncclInvalidUsage;
  *op = static_cast<ncclRedOp_t>(ncclNumOps + static_cast<int>(idx));
  return ncclSuccess;
}

ncclResult_t RedOpDestroy(ncclRedOp_t op, Comm* comm) {
  if (static_cast<int>(op) < ncclNumOps) {
    SetLastError("ncclRedOpDestroy: built-in operators cannot be destroyed");
    return ncclInvalidArgument;
  }
  std::lock_guard<std::mutex> lock(comm->mu);
  size_t idx = static_cast<size_t>(op) - ncclNumOps;
  if (idx >= comm->redops.size() || !comm->redops[idx].used) return ncclInvalidArgument;
  comm->redops[idx].used = false;
  return ncclSuccess;
}

int IterationMark(cudaStream_t stream, uint64_t torch_max_allocated) {
  static std::atomic<uint32_t> next{0};
  EventLogStart();
  uint32_t it = next.fetch_add(1);
  Gpu& gpu = TheGpu();
  volatile uint64_t* word = nullptr;
  if (gpu.EnsureReady()) {
    gpu.EnsureContext();
    word = gpu.IterWord(it);
    *word = 0;
    if (gpu.StampIteration(reinterpret_cast<CUstream>(stream), it) != CUDA_SUCCESS) word = nullptr;
  }
  LogIteration(it, word, HostNowNs(), torch_max_allocated);
  return static_cast<int>(it);
}

uint64_t HostOverheadQuantileNs(double q) {
  Stats& s = St();
  uint64_t total = 0;
  for (uint32_t i = 0; i < kHistBuckets; ++i) total += s.hist[i].load(std::memory_order_relaxed);
  if (total == 0) return 0;
  uint64_t target = static_cast<uint64_t>(q * static_cast<double>(total - 1));
  uint64_t seen = 0;
  for (uint32_t i = 0; i < kHistBuckets; ++i) {
    seen += s.hist[i].load(std::memory_order_relaxed);
    if (seen > target) return static_cast<uint64_t>(i) * kHistBucketNs + kHistBucketNs / 2;
  }
  return static_cast<uint64_t>(kHistBuckets) * kHistBucketNs;
}

uint64_t UnitsExecuted() { return St().units.load(); }

void ResetStatsForTest() {
  for (auto& h : St().hist) h.store(0);
  St().units.store(0);
}

}  // namespace prism::interpose
