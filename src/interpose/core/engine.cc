#include "interpose/core/engine.h"

#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/log.h"
#include "interpose/core/config.h"
#include "interpose/core/coord_client.h"
#include "interpose/core/event_log.h"
#include "interpose/core/gpu.h"
#include "interpose/core/kernel_trace.h"
#include "interpose/core/progress.h"
#include "interpose/core/real_symbols.h"
#include "interpose/core/recorded.h"
#include "interpose/core/streams.h"
#include "nccl_patch/exchange.h"
#include "prism/ipc.h"

namespace prism::interpose {
namespace {

// PRISM_GATE_TOGGLE's state: set at iteration marks (IterationMark), read per unit.
std::atomic<bool> g_gates_toggled_off{false};

using payload::OpKind;
using payload::StepKind;

constexpr uint32_t kHistBucketNs = 25;
constexpr uint32_t kHistBuckets = 8000;  // up to 200 us; beyond goes in the last bucket

struct Stats {
  std::atomic<uint64_t> hist[kHistBuckets] = {};      // host time per sampled unit
  std::atomic<uint64_t> own_hist[kHistBuckets] = {};  // the same less the time spent in driver calls
  std::atomic<uint64_t> units{0};
  // Sums over the sampled units of each phase's own time (driver calls taken out) and of its driver calls' time.
  std::atomic<uint64_t> phase_ns[kUnitPhases] = {};
  std::atomic<uint64_t> phase_driver_ns[kUnitPhases] = {};  // the driver calls' time, by the phase that made them
  std::atomic<uint64_t> sampled{0};
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

// The driver calls' share of a sampled unit (every CUDA driver call it makes: stamp and payload launches, the gate's
// stream wait, copies and synchronisations, the context and capture checks): kept apart because a launch blocks
// while the stream's queue is full, time the job's next launch would have spent anyway, so the unit's host time of
// a GPU-bound job is not all libprism's (docs/libprism.md "Cost on a real rank"); the phase split says which calls.
thread_local bool t_sampling = false;
thread_local uint64_t t_driver_ns = 0;

template <typename F>
auto Driver(F&& call) {
  if (!t_sampling) return call();
  const uint64_t t0 = MonoNs();
  const auto r = call();
  t_driver_ns += MonoNs() - t0;
  return r;
}

// A sampled unit's own time by phase (UnitPhase): each PhaseMark charges the time since the last mark, less the
// driver calls made meanwhile, to its phase. Costs one clock read per mark, on sampled units only.
thread_local uint64_t t_phase_at = 0, t_phase_driver = 0;
thread_local uint64_t t_phase_ns[kUnitPhases], t_phase_driver_ns[kUnitPhases];

void PhaseMark(UnitPhase phase) {
  if (!t_sampling) return;
  const uint64_t now = MonoNs();
  const uint64_t spent = now - t_phase_at, driver = t_driver_ns - t_phase_driver;
  t_phase_ns[phase] += spent > driver ? spent - driver : 0;
  t_phase_driver_ns[phase] += driver;
  t_phase_at = now;
  t_phase_driver = t_driver_ns;
}

// Starts timing a sampled unit; returns its start (RecordOverhead's argument).
uint64_t StartSample() {
  t_sampling = true;
  t_driver_ns = 0;
  t_phase_driver = 0;
  for (uint64_t& v : t_phase_ns) v = 0;
  for (uint64_t& v : t_phase_driver_ns) v = 0;
  t_phase_at = MonoNs();
  return t_phase_at;
}

// Ends a sampled unit that started at `t0` (StartSample): one clock read ends both its last phase and the whole.
void RecordOverhead(uint64_t t0) {
  PhaseMark(kPhaseEnter);  // what is left after the last mark: the caller's return path
  const uint64_t ns = t_phase_at - t0;
  t_sampling = false;
  const uint64_t own = ns > t_driver_ns ? ns - t_driver_ns : 0;
  Stats& st = St();
  st.hist[std::min<uint64_t>(ns / kHistBucketNs, kHistBuckets - 1)].fetch_add(1, std::memory_order_relaxed);
  st.own_hist[std::min<uint64_t>(own / kHistBucketNs, kHistBuckets - 1)].fetch_add(1, std::memory_order_relaxed);
  for (int i = 0; i < kUnitPhases; ++i) {
    st.phase_ns[i].fetch_add(t_phase_ns[i], std::memory_order_relaxed);
    st.phase_driver_ns[i].fetch_add(t_phase_driver_ns[i], std::memory_order_relaxed);
  }
  st.sampled.fetch_add(1, std::memory_order_relaxed);
}

// One operation of a unit, ready to run.
enum class XKind : uint8_t { kNone, kColl, kSend, kRecv };

struct Prepared {
  OpCall call;
  payload::OpDesc desc;
  payload::StepList steps;
  uint64_t bytes = 0;
  uint64_t seq = 0;
  XKind xkind = XKind::kNone;  // moves real data through the coordinator (exchange)
  bool local = true;           // its planned steps run (false when real data wrote its output)
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
  std::vector<bool> real_level;  // per nesting level: its ncclGroupStart went to the real NCCL too (passthrough)
  // Passthrough operations of the open group to time at its end (issue order, with their sequence numbers).
  std::vector<std::pair<OpCall, uint64_t>> real_group;
  std::vector<OpCall> group;
  std::vector<Prepared> prepared;
  std::vector<OpCall> scratch;
  std::vector<UnitSend> sends;
  std::vector<UnitSend> sends_by_size;  // the same, ordered by (comm, bytes)
  std::vector<uint8_t> done;
  // Sends of a group's units waiting for the coordinator's acknowledgement (comm id, key, destination): GroupEnd
  // waits for them after every unit was posted, so a group spanning streams does not wait on its own receives.
  bool defer_send_done = false;
  std::vector<std::tuple<uint32_t, uint64_t, int32_t>> send_done;
  // Units of the open group with an exchanged send under PRISM_SEND_RENDEZVOUS=1: handed to the progress thread only
  // after GroupEnd got their sends' acknowledgements. Why: released earlier, the gate would open and the unit's
  // kOpRecord tell the coordinator the send completed while this thread still waits for its receive, which took the
  // wait off the hang diagnosis (torch's dist.send is a group of one: a both-send-first deadlock went unreported).
  std::vector<GateUnit> held_units;
  Tls() {
    group.reserve(4096);
    prepared.reserve(4096);
    scratch.reserve(4096);
    sends.reserve(4096);
    sends_by_size.reserve(4096);
    done.reserve(4096);
    held_units.reserve(64);
  }
};
thread_local Tls tls;

payload::Policy ConfiguredPolicy() {
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

bool RecordedOn() { return ConfiguredPolicy() == payload::Policy::kRecorded; }

// The policy of the payload steps: `recorded` replays what it has (FindRecorded) and falls back to mirror.
payload::Policy PolicyOf() {
  return RecordedOn() ? payload::Policy::kMirror : ConfiguredPolicy();
}

bool IsP2p(OpKind op) { return op == OpKind::kSend || op == OpKind::kRecv; }

// A send to or a receive from the rank itself (torch's all-to-all on NCCL holds one of each, the tokens a MoE rank
// keeps): a local copy, as NCCL runs it. It takes no sequence number on its communicator (kNoSeq). Why: it is no
// communication, the graph has no node for it (observed_trace.cc), and the coordinator maps a rank's n-th numbered
// operation on a communicator to the graph's n-th node there (GraphRelease::MapOp); numbered, the copies would shift
// every later operation onto the wrong node. Nor is it exchanged or recorded: payloads are named by sequence, and its
// receive copies this rank's own send.
bool IsSelf(const OpCall& c) { return IsP2p(c.op) && c.peer == c.comm->rank; }

uint64_t NextSeq(const OpCall& c) {
  return IsSelf(c) ? kNoSeq : c.comm->seq.fetch_add(1, std::memory_order_relaxed);
}

// The operation a unit is named by (op line, kOpArrive): its first numbered one, else its first.
template <typename T, typename SeqOf>
size_t LeadOf(const T* ops, size_t n, SeqOf seq_of) {
  for (size_t i = 0; i < n; ++i)
    if (seq_of(ops[i]) != kNoSeq) return i;
  return 0;
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

// Whether an operation of `comm` with data can move real data between real members (PRISM_EXCHANGE).
bool RealDataOn(const Comm* comm, uint64_t count) {
  return Cfg().exchange && comm->use_coordinator && comm->coord_comm_id != 0 && count != 0 && comm->real_members >= 2;
}

// Whether an operation moves real data through the coordinator: a collective of a communicator with several real
// members, or a p2p whose peer is real (docs/payload.md "Exchange"); never a copy to the rank itself (IsSelf).
XKind ExchangeKindOf(const OpCall& c) {
  const Comm* comm = c.comm;
  if (!RealDataOn(comm, c.count) || IsSelf(c)) return XKind::kNone;
  if (IsP2p(c.op)) {
    if (c.peer < 0 || static_cast<size_t>(c.peer) >= comm->member_real.size() || !comm->member_real[c.peer]) {
      return XKind::kNone;
    }
    return c.op == OpKind::kSend ? XKind::kSend : XKind::kRecv;
  }
  return XKind::kColl;
}

payload::ExchangeOp ExchangeOpOf(const Prepared& p) {
  payload::ExchangeOp x;
  x.op = p.call.op;
  x.dtype = p.desc.dtype;
  x.redop = p.desc.redop;
  x.premul_scalar_bits = p.desc.premul_scalar_bits;
  x.nranks = p.call.comm->nranks;
  x.root = p.call.root;
  x.count = p.call.count;
  return x;
}

// Waits for the coordinator's acknowledgement of every exchanged send posted so far (tls.send_done): NCCL's
// rendezvous, a send completes once its receive is posted.
void WaitSendsDone() {
  static std::atomic<bool> warned_lost{false}, warned_refused{false};
  if (!Cfg().send_rendezvous) {
    // PRISM_SEND_RENDEZVOUS=0: sends complete when posted (the acknowledgements are dropped by the reader).
    tls.send_done.clear();
    return;
  }
  for (const auto& [comm_id, key, dst] : tls.send_done) {
    uint32_t flags = 0;
    if (!CoordWaitSendDone(comm_id, key, dst, &flags)) {
      LogOnce(&warned_lost, "the coordinator is gone: real data between real ranks falls back to the local policy");
      break;
    }
    if (flags & ipc::kExchangeError) {
      LogOnce(&warned_refused, "the coordinator refused a send to a real rank (see its log): the receiver gets the "
                               "local policy");
    }
  }
  tls.send_done.clear();
}

// The exchange part of a unit (host-synchronous): inputs to the host, to the coordinator, outputs back into the
// receive buffers. The arrival stamp is already on the stream. Returns the first CUDA error, CUDA_SUCCESS else;
// an operation whose output no real data defines keeps `local` (its planned steps run afterwards).
CUresult RunExchange(Gpu& gpu, CUstream stream, std::vector<Prepared>& prep) {
  static std::atomic<bool> warned_lost{false}, warned_error{false}, warned_staging{false};
  // Host staging (page-locked) for every input, every output (the coordinator's bytes land there straight from
  // the socket, and go to the GPU from there) and device-resident PreMulSum scalars.
  uint64_t total = 0;
  std::vector<uint64_t> in_bytes(prep.size(), 0), out_bytes(prep.size(), 0);
  for (size_t i = 0; i < prep.size(); ++i) {
    const Prepared& p = prep[i];
    if (p.xkind == XKind::kColl) {
      in_bytes[i] = payload::ExchangeInputBytes(ExchangeOpOf(p), p.call.comm->rank);
      out_bytes[i] = payload::ExchangeOutputBytes(ExchangeOpOf(p), p.call.comm->rank);
    }
    if (p.xkind == XKind::kSend) in_bytes[i] = p.bytes;
    if (p.xkind == XKind::kRecv) out_bytes[i] = p.bytes;
    total += in_bytes[i] + out_bytes[i] + 8;
  }
  uint8_t* stage = gpu.HostStaging(total);
  if (stage == nullptr) {
    LogOnce(&warned_staging, "no page-locked host memory for real data between real ranks: local policy used");
    for (Prepared& p : prep) p.xkind = XKind::kNone;
    return CUDA_SUCCESS;
  }
  std::vector<uint8_t*> host(prep.size(), nullptr), host_out(prep.size(), nullptr);
  uint64_t off = 0;
  CUresult r = CUDA_SUCCESS;
  for (size_t i = 0; i < prep.size() && r == CUDA_SUCCESS; ++i) {
    Prepared& p = prep[i];
    if (p.xkind == XKind::kNone) continue;
    host[i] = stage + off;
    off += in_bytes[i];
    host_out[i] = stage + off;
    off += out_bytes[i];
    if (in_bytes[i]) {
      r = Driver([&] {
        return gpu.CopyAsync(stream, reinterpret_cast<uint64_t>(host[i]), p.desc.send_addr, in_bytes[i]);
      });
    }
    if (r == CUDA_SUCCESS && p.desc.redop == payload::RedOp::kPreMulSum && p.desc.premul_scalar_addr != 0) {
      uint8_t* sc = stage + off;
      off += 8;
      std::memset(sc, 0, 8);
      r = Driver([&] {
        return gpu.CopyAsync(stream, reinterpret_cast<uint64_t>(sc), p.desc.premul_scalar_addr,
                             payload::DataTypeSize(p.desc.dtype));
      });
      if (r == CUDA_SUCCESS) r = Driver([&] { return gpu.Synchronize(stream); });
      if (r == CUDA_SUCCESS) std::memcpy(&p.desc.premul_scalar_bits, sc, 8);
    }
  }
  if (r == CUDA_SUCCESS) r = Driver([&] { return gpu.Synchronize(stream); });
  if (r != CUDA_SUCCESS) return r;
  // Post every input and send first, then wait: a group's send/recv pairs must not wait on each other. A send
  // completes when the coordinator acknowledges it (its receive was posted, as NCCL's rendezvous), so two real
  // ranks that both send first outside a group deadlock here as they would in NCCL, and the coordinator's hang
  // diagnosis sees both waiting.
  std::vector<uint64_t> keys(prep.size(), 0);
  for (size_t i = 0; i < prep.size(); ++i) {
    Prepared& p = prep[i];
    if (p.xkind == XKind::kNone) continue;
    Comm* c = p.call.comm;
    ipc::ExchangeHeader h{};
    h.comm_id = c->coord_comm_id;
    h.op = static_cast<uint16_t>(p.call.op);
    h.dtype = static_cast<uint8_t>(p.desc.dtype);
    h.redop = static_cast<uint8_t>(p.desc.redop);
    h.count = p.call.count;
    h.scalar_bits = p.desc.premul_scalar_bits;
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (p.xkind == XKind::kColl) keys[i] = c->xcoll++;
      else if (p.xkind == XKind::kSend) keys[i] = c->xsend[p.call.peer]++;
      else keys[i] = c->xrecv[p.call.peer]++;
    }
    h.key = keys[i];
    h.seq = static_cast<uint32_t>(p.seq);  // low bits (ipc.h): the hang diagnosis names where this rank waits
    if (p.xkind == XKind::kColl) {
      h.rank = c->rank;
      h.peer = p.call.root;
    } else if (p.xkind == XKind::kSend) {
      h.rank = c->rank;
      h.peer = p.call.peer;
    } else {
      h.rank = p.call.peer;
      h.peer = c->rank;
      h.flags = ipc::kExchangeRecvRequest;
    }
    const int32_t src = p.xkind == XKind::kRecv ? p.call.peer : -1;
    const bool answered = p.xkind == XKind::kColl || p.xkind == XKind::kRecv;
    if (answered) CoordExpectResult(c->coord_comm_id, keys[i], src, host_out[i], out_bytes[i]);
    if (!CoordSendData(h, host[i], in_bytes[i])) {
      if (answered) CoordForgetResult(c->coord_comm_id, keys[i], src);
      LogOnce(&warned_lost, "the coordinator is gone: real data between real ranks falls back to the local policy");
      for (Prepared& q : prep) q.xkind = XKind::kNone;
      return CUDA_SUCCESS;
    }
  }
  std::vector<std::string> results(prep.size());
  for (size_t i = 0; i < prep.size(); ++i) {
    Prepared& p = prep[i];
    if (p.xkind != XKind::kColl && p.xkind != XKind::kRecv) {
      if (p.xkind == XKind::kSend) p.local = false;  // a send writes nothing
      continue;
    }
    uint32_t flags = 0;
    const int32_t src = p.xkind == XKind::kRecv ? p.call.peer : -1;
    uint64_t size = 0;
    bool in_place = false;
    if (!CoordWaitResultAt(p.call.comm->coord_comm_id, keys[i], src, &flags, &size, &in_place, &results[i])) {
      LogOnce(&warned_lost, "the coordinator is gone: real data between real ranks falls back to the local policy");
      continue;
    }
    if (flags & ipc::kExchangeError) {
      LogOnce(&warned_error, "real members of a communicator disagreed on an operation (see the coordinator's log): "
                             "its output follows the local policy");
      continue;
    }
    if (flags & (ipc::kExchangeLocal)) continue;
    p.local = false;
    if (flags & ipc::kExchangeNothing) continue;
    const uint64_t want = p.xkind == XKind::kRecv ? p.bytes : payload::ExchangeOutputBytes(ExchangeOpOf(p), p.call.comm->rank);
    const uint8_t* data = in_place ? host_out[i] : reinterpret_cast<const uint8_t*>(results[i].data());
    if (size != want || (!in_place && results[i].size() != want)) {
      LogOnce(&warned_error, "real data of the wrong size came back for an operation: local policy used");
      p.local = true;
      continue;
    }
    r = Driver([&] {
      return gpu.CopyAsync(stream, p.desc.recv_addr, reinterpret_cast<uint64_t>(data), want);
    });
    if (r != CUDA_SUCCESS) return r;
    RecordPayload(p.call.comm->id, p.seq, static_cast<uint16_t>(p.call.op), static_cast<uint8_t>(p.desc.dtype),
                  data, want);
  }
  for (size_t i = 0; i < prep.size(); ++i) {
    const Prepared& p = prep[i];
    if (p.xkind != XKind::kSend) continue;
    tls.send_done.emplace_back(p.call.comm->coord_comm_id, keys[i], p.call.peer);
  }
  if (!tls.defer_send_done) WaitSendsDone();
  // Why wait: the results live in host staging reused by the next unit (or host strings freed on return).
  return Driver([&] { return gpu.Synchronize(stream); });
}

// Hands a unit to the progress thread (its gate opens and it is logged when it is released).
void PushUnit(const GateUnit& u) {
  static std::atomic<bool> warned_full{false};
  if (!ProgressPush(u)) {
    LogOnce(&warned_full, "more than 16384 operations in flight: releasing gates immediately");
    __atomic_store_n(TheGpu().GateWord(u.slot), u.ticket, __ATOMIC_RELEASE);
  }
}

// The unit's sends ordered by (comm, bytes).
struct BySize {
  bool operator()(const UnitSend& a, const UnitSend& b) const {
    return a.comm != b.comm ? a.comm < b.comm : a.bytes < b.bytes;
  }
};

// What a unit moves and how long it takes at the target scale (TimeUnit).
struct UnitTime {
  uint64_t total = 0;  // bytes, over its operations
  uint64_t dur = 0;
  bool mixed = false;  // operations of more than one kind
  OpCost last{};       // the last cost taken (the op line's algorithm, protocol and source)
};

// Duration of the unit at the target scale: collectives add up; the p2p part of a group moves its larger
// direction as one exchange.
inline UnitTime TimeUnit(const std::vector<Prepared>& prep, const Config& cfg) {
  UnitTime t;
  uint64_t p2p_send = 0, p2p_recv = 0;
  int32_t p2p_peer = -1;
  for (const Prepared& p : prep) {
    t.total += p.bytes;
    if (p.call.op != prep[0].call.op) t.mixed = true;
    if (IsSelf(p.call)) continue;  // a local copy: no traffic at target scale
    if (IsP2p(p.call.op)) {
      (p.call.op == OpKind::kSend ? p2p_send : p2p_recv) += p.bytes;
      if (p2p_peer < 0) p2p_peer = p.call.comm->GlobalRank(p.call.peer);
      continue;
    }
    t.last = OperationCost(p.call.comm->cost.get(), p.call.op, p.bytes, p.desc.dtype, -1, -1);
    t.dur += t.last.dur_ns;
  }
  if (p2p_send + p2p_recv > 0 || (IsP2p(prep[0].call.op))) {
    t.last = OperationCost(prep[0].call.comm->cost.get(), OpKind::kSend, std::max(p2p_send, p2p_recv),
                           prep[0].desc.dtype, static_cast<int32_t>(cfg.rank), p2p_peer);
    t.dur += t.last.dur_ns;
  }
  if (cfg.fixed_dur_us >= 0) t.dur = t.last.dur_ns;  // a fixed duration is per unit, not per operation
  return t;
}

// Said once, when an operation keeps its own bytes as a broadcast from a virtual root under mirror.
inline void WarnVirtualRoot(const Prepared& p) {
  static std::atomic<bool> warned_root{false};
  if (p.local && p.call.op == OpKind::kBroadcast && p.call.root != p.call.comm->rank && p.call.count > 0 &&
      PolicyOf() == payload::Policy::kMirror && !warned_root.load(std::memory_order_relaxed)) {
    // Why say it: a receiver of a virtual root keeps its own bytes under mirror, which is wrong whenever the
    // program needs the root's data (Megatron's batch and train flags); recorded payloads fix that.
    // (The flag is checked first so the message is built once, not on every such broadcast.)
    LogOnce(&warned_root,
            "a broadcast from a virtual root (communicator " + std::to_string(p.call.comm->id) + ", root " +
                std::to_string(p.call.root) + ") leaves this rank's buffer as it was under mirror; if the job needs "
                "the root's data (Megatron broadcasts its batch from tensor-parallel rank 0 and its train flags "
                "from rank 0), run `prism-run collect` and emulate with --payload recorded --payload-dir");
  }
}

// RunUnit's state and steps, in its order, on RunUnit's stack; the vectors it fills are the thread's (tls), reused
// from unit to unit. Why the steps RunUnit calls are always_inline: they are its body, run once per unit, and GCC's
// growth limit for a small caller would otherwise leave some of them out of line, a call per unit.
class UnitRun {
 public:
  UnitRun(Gpu& gpu, const OpCall* ops, size_t n)
      : gpu_(gpu), cfg_(Cfg()), ops_(ops), n_(n), stream_(reinterpret_cast<CUstream>(ops[0].stream)),
        capturing_(Driver([&] { return gpu.Capturing(stream_); })) {
    static std::atomic<bool> warned_capture{false};
    if (capturing_)
      LogOnce(&warned_capture, "a collective is captured into a CUDA graph: it writes its payload but is not gated");
  }

  bool capturing() const { return capturing_; }

  // Plan every operation first (p2p mirror rule: a group's sends are recorded before its receives look).
  [[gnu::always_inline]] ncclResult_t Plan() {
    prep_.clear();
    for (size_t i = 0; i < n_; ++i) {
      Prepared p;
      p.call = ops_[i];
      p.seq = NextSeq(ops_[i]);
      p.bytes = OperationBytes(ops_[i].op, ops_[i].count, static_cast<payload::DataType>(ops_[i].dtype),
                               ops_[i].comm->nranks);
      prep_.push_back(p);
    }
    RecordSends();
    for (Prepared& p : prep_) {
      if (const ncclResult_t planned = PlanOp(p); planned != ncclSuccess) return planned;
    }
    return ncclSuccess;
  }

  // The unit's arrival slot and gate ticket.
  [[gnu::always_inline]] void TakeSlot() {
    slot_ = NextSlot();
    ticket_ = NextTicket();
    gated_ = cfg_.gate != GateKind::kNone && !capturing_ && !g_gates_toggled_off.load(std::memory_order_relaxed);
    gpu_.ClearArrival(slot_);
    // The arrival stamp rides on the first payload step (one launch); earlier operations of the unit have none.
    stamped_ = capturing_;
  }

  // Real data between real members, through the coordinator (RunExchange), for the operations that carry some.
  [[gnu::always_inline]] void Exchange() {
    bool exchanges = false, real_data = false;
    if (!capturing_) {
      for (Prepared& p : prep_) {
        p.xkind = ExchangeKindOf(p.call);
        exchanges = exchanges || p.xkind != XKind::kNone;
        // Why the copy to itself counts here: its unit is routed as when the copy went through the exchange (a p2p
        // unit with real data is released locally, below), whether or not its peer operations carry data.
        real_data = real_data || p.xkind != XKind::kNone || (IsSelf(p.call) && RealDataOn(p.call.comm, p.call.count));
      }
    }
    p2p_only_exchange_ = real_data;
    if (exchanges) {
      // Why stamp first: the arrival is when the GPU reached the operation, before the host-side exchange.
      r_ = Driver([&] { return gpu_.Stamp(stream_, slot_); });
      stamped_ = true;
      if (r_ == CUDA_SUCCESS) r_ = RunExchange(gpu_, stream_, prep_);
    }
    for (const Prepared& p : prep_) {
      if (!IsP2p(p.call.op)) p2p_only_exchange_ = false;
    }
  }

  // Operations that real data did not define: the recorded output of the same operation, where collect has one.
  [[gnu::always_inline]] void ApplyRecorded() {
    if (!RecordedOn() || capturing_ || r_ != CUDA_SUCCESS) return;
    for (Prepared& p : prep_) {
      // A copy to itself is its own send's bytes, never a recording (nor has it the sequence that names one).
      if (!p.local || p.call.count == 0 || p.call.op == OpKind::kSend || p.seq == kNoSeq) continue;
      // A root's own broadcast/scatter output is its own data, never someone else's recording.
      const bool own_root = (p.call.op == OpKind::kBroadcast || p.call.op == OpKind::kScatter) &&
                            p.call.root == p.call.comm->rank;
      if (own_root) continue;
      const uint64_t want =
          p.call.op == OpKind::kRecv ? p.bytes : payload::ExchangeOutputBytes(ExchangeOpOf(p), p.call.comm->rank);
      if (want == 0) continue;
      const void* rec = FindRecorded(p.call.comm->id, p.seq, static_cast<uint16_t>(p.call.op),
                                     static_cast<uint8_t>(p.desc.dtype), want);
      if (rec == nullptr) continue;
      if (!stamped_) {
        r_ = Driver([&] { return gpu_.Stamp(stream_, slot_); });
        stamped_ = true;
      }
      if (r_ == CUDA_SUCCESS)
        r_ = Driver([&] { return gpu_.CopyAsync(stream_, p.desc.recv_addr, reinterpret_cast<uint64_t>(rec), want); });
      p.local = false;
    }
  }

  // The planned payload steps of every operation that neither real data nor a recording defined.
  [[gnu::always_inline]] void RunSteps() {
    for (const Prepared& p : prep_) {
      WarnVirtualRoot(p);
      if (p.local) RunOpSteps(p);
    }
  }

  // The unit's duration at the target scale and whether the coordinator releases it. Why no gate for a unit
  // released here at its own arrival (duration 0: a communicator of one member, copies to itself): the gate would
  // open at the arrival at the earliest, so it can only add the progress thread's round trip, and where the job
  // runs with CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron) a held stream holds every stream behind it. Exchanged
  // operations keep theirs (the host-side exchange orders them).
  [[gnu::always_inline]] void Time() {
    time_ = TimeUnit(prep_, cfg_);
    lead_ = LeadOf(prep_.data(), prep_.size(), [](const Prepared& p) { return p.seq; });
    const Prepared& lead = prep_[lead_];
    // Why not through the coordinator for an exchanged p2p unit: release matching is by communicator sequence, which
    // two sides of a pipeline need not share; the exchange already waited for the real peer's data. A unit of only
    // copies to itself is no communication: released locally too.
    via_coordinator_ = lead.call.comm->use_coordinator && !p2p_only_exchange_ && lead.seq != kNoSeq;
    bool exchanged = false;
    for (const Prepared& p : prep_) exchanged = exchanged || p.xkind != XKind::kNone;
    if (time_.dur == 0 && !via_coordinator_ && !exchanged) gated_ = false;
  }

  // The arrival stamp when no step carried it, the gate, and the stamp after it (PRISM_GATE_OPEN_STAMPS). On a
  // CUDA error the gate is opened and the error returned.
  [[gnu::always_inline]] ncclResult_t EnqueueGate() {
    if (!stamped_ && r_ == CUDA_SUCCESS) r_ = Driver([&] { return gpu_.Stamp(stream_, slot_); });
    if (r_ == CUDA_SUCCESS && gated_)
      r_ = Driver([&] { return gpu_.Gate(stream_, slot_, ticket_, cfg_.gate, ops_[0].comm->spin_ctas); });
    if (r_ == CUDA_SUCCESS && gated_ && cfg_.gate_open_stamps) {
      open_slot_ = NextSlot();
      gpu_.ClearArrival(open_slot_);
      r_ = Driver([&] { return gpu_.Stamp(stream_, open_slot_); });
    }
    if (r_ != CUDA_SUCCESS) {
      SetLastError("CUDA error " + std::to_string(static_cast<int>(r_)) + " while enqueueing on the stream");
      Log("nccl")->error("{}", LastError());
      __atomic_store_n(gpu_.GateWord(slot_), ticket_, __ATOMIC_RELEASE);  // never leave a half-built gate closed
      return ncclUnhandledCudaError;
    }
    return ncclSuccess;
  }

  // The unit to the progress thread (or held for GroupEnd), counted.
  [[gnu::always_inline]] void Release() {
    GateUnit u;
    Describe(time_, &u);
    const bool xsends = CountExchanged(&u);
    PhaseMark(kPhaseDescribe);
    HoldOrPush(u, xsends);
    PhaseMark(kPhasePush);
    Count();
    PhaseMark(kPhaseCount);
  }

 private:
  // Why an exact in-unit match first: the history is a direct-mapped cache; with hundreds of peers in one
  // all-to-all, colliding entries made a receive take another peer's send.
  void RecordSends() {
    sends_.clear();
    for (Prepared& p : prep_) {
      if (p.call.op != OpKind::kSend || p.call.count == 0) continue;
      const uint64_t addr = reinterpret_cast<uint64_t>(p.call.send);
      sends_.push_back(UnitSend{p.call.comm, p.call.peer, p.bytes, static_cast<uint32_t>(sends_.size()), addr});
      std::lock_guard<std::mutex> lock(p.call.comm->mu);
      p.call.comm->history.RecordSend(p.call.peer, p.bytes, addr);
    }
    std::sort(sends_.begin(), sends_.end());
  }

  // An operation's description and payload steps.
  ncclResult_t PlanOp(Prepared& p) {
    static std::atomic<bool> warned_plan{false};
    p.desc = DescOf(p.call, p.seq);
    // Why mirror under every policy: the receive from the rank itself is its own send's bytes (NCCL copies them),
    // data that depends on no virtual peer; the unit's send to itself is its exact match (MirrorSendAddr).
    if (IsSelf(p.call)) p.desc.policy = payload::Policy::kMirror;
    if (p.call.op == OpKind::kRecv && p.call.count > 0) p.desc.mirror_send_addr = MirrorSendAddr(p);
    payload::Status st = payload::Plan(p.desc, &p.steps);
    if (st == payload::Status::kInvalidArgument) {
      SetLastError(std::string("invalid arguments for ") + payload::OpKindName(p.call.op));
      return ncclInvalidArgument;
    }
    if (st == payload::Status::kUnsupported) {
      LogOnce(&warned_plan,
              std::string("payload policy '") + cfg_.payload + "' is not implemented: outputs are left as they are");
      p.steps.size = 0;
    }
    return ncclSuccess;
  }

  // The buffer whose bytes a receive takes under mirror: the unit's own send on (comm, peer, bytes); else, when the
  // unit sends on the communicator, a same-size send of the unit; else this rank's earlier send in the history.
  uint64_t MirrorSendAddr(const Prepared& p) {
    const Comm* comm = p.call.comm;
    const UnitSend* s = UnitSendOf(comm, p.call.peer, p.bytes);
    if (s != nullptr) return s->addr;
    uint64_t addr = 0;
    const std::vector<UnitSend>& by_size = SendsBySize();
    auto on_comm = std::lower_bound(by_size.begin(), by_size.end(), UnitSend{comm, 0, 0, 0, 0}, BySize());
    if (on_comm != by_size.end() && on_comm->comm == comm) {
      // Why not the history when the unit sends on the communicator (an all-to-all with uneven splits, MoE
      // token dispatch): an older call's buffer has often been reused by torch's caching allocator by now
      // (entries go only on a real free), and its stale bytes read as bf16 gave NaN gradients. A same-size send
      // of this unit holds live data (the rank's send to itself first); without one, the random fill (addr 0).
      s = UnitSendOf(comm, comm->rank, p.bytes);
      auto it = std::lower_bound(on_comm, by_size.end(), UnitSend{comm, 0, p.bytes, 0, 0}, BySize());
      if (s == nullptr && it != by_size.end() && it->comm == comm && it->bytes == p.bytes) s = &*it;
      if (s != nullptr) addr = s->addr;
    } else {
      // A unit without a send on the communicator (a pipeline stage's lone receive): its own earlier send.
      std::lock_guard<std::mutex> lock(p.call.comm->mu);
      p.call.comm->history.Find(p.call.peer, p.bytes, &addr);
    }
    return addr;
  }

  // The latest send of the unit on (comm, peer, bytes); nullptr if none.
  const UnitSend* UnitSendOf(const Comm* comm, int32_t peer, uint64_t bytes) const {
    UnitSend key{comm, peer, bytes, UINT32_MAX, 0};
    auto it = std::upper_bound(sends_.begin(), sends_.end(), key);
    return it != sends_.begin() && (it - 1)->SameKey(key) ? &*(it - 1) : nullptr;
  }

  // The unit's sends by (comm, bytes), built only when a receive has no exact match (most units never need it).
  const std::vector<UnitSend>& SendsBySize() {
    if (!by_size_built_) {
      by_size_ = sends_;
      std::sort(by_size_.begin(), by_size_.end(), BySize());
      by_size_built_ = true;
    }
    return by_size_;
  }

  void RunOpSteps(const Prepared& p) {
    static std::atomic<bool> warned_step{false};
    for (uint32_t k = 0; k < p.steps.size && r_ == CUDA_SUCCESS; ++k) {
      const payload::Step& st = p.steps.steps[k];
      CUresult rs;
      if (!stamped_ && st.kind != StepKind::kNoop) {
        rs = Driver([&] { return gpu_.StampAndStep(stream_, slot_, p.desc, st); });
        stamped_ = true;
      } else {
        rs = Driver([&] { return gpu_.RunStep(stream_, p.desc, st); });
      }
      if (rs == CUDA_ERROR_NOT_FOUND) {
        LogOnce(&warned_step, "a payload kernel is missing from the fatbin: that step was skipped");
      } else {
        r_ = rs;
      }
    }
  }

  // The gate unit: slot, ticket, duration, how it is released, and its op line.
  void Describe(const UnitTime& t, GateUnit* u) const {
    // The unit is named by its first numbered operation (a unit of only copies to itself has none).
    const size_t lead = lead_;  // Time() found it
    const Comm* c0 = prep_[lead].call.comm;
    u->slot = slot_;
    u->ticket = ticket_;
    u->open_slot = open_slot_;
    u->dur_ns = t.dur;
    u->no_gate = !gated_;
    u->release_lat_ns = !gated_ ? 0
                       : cfg_.gate == GateKind::kSpin ? gpu_.SpinReleaseNs(c0->spin_ctas)
                                                      : gpu_.WaitReleaseNs();
    u->via_coordinator = via_coordinator_;
    u->coord_comm_id = c0->coord_comm_id;
    u->comm_ops = 0;
    for (const Prepared& p : prep_) u->comm_ops += p.call.comm == c0 && p.seq != kNoSeq ? 1 : 0;
    FillUnitEvent(prep_[lead].call, prep_[lead].seq, n_, t.mixed, t.total, t.dur, t.last, stream_, &u->event);
    ReserveUnitOps(&u->event, n_);
    for (size_t i = 0; i < u->event.ops_n; ++i)
      SetUnitOp(u->event, i, UnitOpOf(prep_[i].call, prep_[i].seq, prep_[i].bytes));
  }

  // The op line's count of exchanged operations; whether the unit has exchanged sends, whose acknowledgement
  // GroupEnd waits for (RunExchange left them pending).
  bool CountExchanged(GateUnit* u) const {
    bool xsends = false;
    for (const Prepared& p : prep_) {
      u->event.exchanged += p.xkind != XKind::kNone && !p.local ? 1 : 0;
      xsends = xsends || p.xkind == XKind::kSend;
    }
    return xsends;
  }

  void HoldOrPush(const GateUnit& u, bool xsends) const {
    bool held = false;
    // Why not a unit released through the coordinator (a collective on the send's stream): its kOpArrive would wait
    // for the send's receive, and the other members' gates for that arrival; a member that reads the collective's
    // result before it posts that receive would never get there (NCCL completes the collective without the send).
    if (xsends && tls.defer_send_done && cfg_.send_rendezvous && !u.via_coordinator) {
      try {
        tls.held_units.push_back(u);
        held = true;
      } catch (...) {
      }
    }
    if (!held) PushUnit(u);
  }

  void Count() const {
    thread_local uint32_t since_check = 0;
    if ((++since_check & 63u) == 0) gpu_.MaybeRecalibrate();  // Why every 64: it reads the clock
    St().units.fetch_add(1, std::memory_order_relaxed);
  }

  Gpu& gpu_;
  const Config& cfg_;
  const OpCall* const ops_;
  const size_t n_;
  const CUstream stream_;
  const bool capturing_;
  std::vector<Prepared>& prep_ = tls.prepared;
  std::vector<UnitSend>& sends_ = tls.sends;
  std::vector<UnitSend>& by_size_ = tls.sends_by_size;
  bool by_size_built_ = false;
  uint32_t slot_ = 0, ticket_ = 0;
  uint32_t open_slot_ = UINT32_MAX;  // PRISM_GATE_OPEN_STAMPS: the slot stamped after the gate
  bool gated_ = false;
  UnitTime time_;
  size_t lead_ = 0;  // the operation the unit is named by (LeadOf)
  bool via_coordinator_ = false;
  bool stamped_ = false;  // the unit's arrival stamp is on the stream
  bool p2p_only_exchange_ = false;  // real data and only p2p operations: the unit is released locally
  CUresult r_ = CUDA_SUCCESS;
};

// Runs one unit: operations on one stream that complete together.
ncclResult_t RunUnit(const OpCall* ops, size_t n) {
  if (n == 0) return ncclSuccess;
  Gpu& gpu = TheGpu();
  if (!gpu.EnsureReady()) {
    SetLastError("libprism could not set up its GPU work");
    return ncclUnhandledCudaError;
  }
  Driver([&] {
    gpu.EnsureContext();
    return true;
  });
  UnitRun run(gpu, ops, n);
  PhaseMark(kPhaseEnter);
  if (const ncclResult_t planned = run.Plan(); planned != ncclSuccess) return planned;
  PhaseMark(kPhasePlan);
  run.TakeSlot();
  run.Exchange();
  run.ApplyRecorded();
  run.RunSteps();
  PhaseMark(kPhaseSteps);
  run.Time();
  PhaseMark(kPhaseTime);
  if (const ncclResult_t enqueued = run.EnqueueGate(); enqueued != ncclSuccess) return enqueued;
  PhaseMark(kPhaseGate);
  if (run.capturing()) return ncclSuccess;
  run.Release();
  return ncclSuccess;
}

}  // namespace

// Why sampled: the clock reads are themselves host overhead; one unit in 8 gives the same distribution.
// Why a hash of the count rather than every 8th: a fixed stride would fall in step with other per-unit strides (the
// clock re-measure every 64 units) and never sample, or always sample, the units they land on.
bool SampleThisUnit() {
  thread_local uint32_t n = 0;
  return ((n++ * 2654435761u) >> 29) == 0;  // the first unit is sampled
}

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

ncclResult_t SubmitReal(const OpCall& c) {
  const uint64_t seq = NextSeq(c);
  if (tls.depth > 0) {
    // Why only when the outermost level reached the real NCCL: then the real operations launch at its end, where
    // GroupEnd stamps around them; otherwise they ran at an inner level's end and are not timed.
    if (!tls.real_level.empty() && tls.real_level[0] && TimeReal(c.stream)) {
      try {
        tls.real_group.emplace_back(c, seq);
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

ncclResult_t Submit(const OpCall& call) {
  if (call.comm != nullptr && call.comm->real != nullptr) return SubmitReal(call);
  const bool sample = tls.depth == 0 && SampleThisUnit();
  const uint64_t t0 = sample ? StartSample() : 0;
  if (ncclResult_t v = Validate(call); v != ncclSuccess) {
    t_sampling = false;
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
  ncclResult_t r = RunUnit(&call, 1);
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

// Closes the real group of the current nesting level if its start was forwarded (the outermost real end launches
// the real operations).
ncclResult_t RealGroupEnd() {
  const size_t level = static_cast<size_t>(tls.depth) - 1;
  if (level >= tls.real_level.size() || !tls.real_level[level]) return ncclSuccess;
  tls.real_level[level] = false;
  return RealNccl().ncclGroupEnd();
}

ncclResult_t GroupEnd() {
  if (tls.depth <= 0) {
    SetLastError("ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  // The outermost end launches the group's real operations: stamp each of their streams before and after it.
  std::vector<std::pair<size_t, std::pair<uint32_t, uint32_t>>> stamped;  // first op index of a stream -> slots
  if (tls.depth == 1 && !tls.real_group.empty()) {
    Gpu& gpu = TheGpu();
    for (size_t k = 0; k < tls.real_group.size(); ++k) {
      bool seen = false;
      for (const auto& st : stamped) seen = seen || tls.real_group[st.first].first.stream == tls.real_group[k].first.stream;
      if (seen) continue;
      const uint32_t slot = NextSlot(), end = NextSlot();
      gpu.ClearArrival(slot);
      gpu.ClearArrival(end);
      if (gpu.Stamp(reinterpret_cast<CUstream>(tls.real_group[k].first.stream), slot) == CUDA_SUCCESS)
        stamped.push_back({k, {slot, end}});
    }
  }
  ncclResult_t real_result = RealGroupEnd();
  if (!stamped.empty()) {
    Gpu& gpu = TheGpu();
    std::vector<std::pair<OpCall, uint64_t>> same;
    for (const auto& [k, slots] : stamped) {
      const cudaStream_t stream = tls.real_group[k].first.stream;
      if (real_result != ncclSuccess || gpu.Stamp(reinterpret_cast<CUstream>(stream), slots.second) != CUDA_SUCCESS)
        continue;
      same.clear();
      for (const auto& op : tls.real_group)
        if (op.first.stream == stream) same.push_back(op);
      PushRealUnit(same.data(), same.size(), slots.first, slots.second);
    }
  }
  if (tls.depth == 1) tls.real_group.clear();
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
    ncclResult_t r = RunUnit(one.data(), one.size());
    if (r != ncclSuccess && result == ncclSuccess) result = r;
  }
  tls.defer_send_done = false;
  PhaseMark(kPhaseEnter);
  WaitSendsDone();
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
  RealGroupEnd();
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

ncclResult_t RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t dtype,
                                  ncclScalarResidence_t residence, Comm* comm) {
  // Why the real operator as is: it is only ever used with this communicator, whose operations go to the real NCCL.
  if (comm->real != nullptr) return RealNccl().ncclRedOpCreatePreMulSum(op, scalar, dtype, residence, comm->real);
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
  if (comm->real != nullptr) return RealNccl().ncclRedOpDestroy(op, comm->real);
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

namespace {
// PRISM_GATE_TOGGLE=N: after mark `it`, units are gated when (it / N) is even (the convention of
// PRISM_KERNELS_TOGGLE: tests/gpu/overhead_toggle.sh pools iteration times by block).
void GateToggleAtIteration(uint32_t it) {
  const Config& cfg = Cfg();
  if (cfg.gate_toggle <= 0) return;
  const bool off = (it / static_cast<uint32_t>(cfg.gate_toggle)) % 2 == 1;
  if (g_gates_toggled_off.exchange(off, std::memory_order_relaxed) == off) return;
  static std::atomic<bool> warned{false};
  if (cfg.world_size > 1 && !warned.exchange(true))
    Log("interpose")->warn("PRISM_GATE_TOGGLE at world {}: ungated blocks run ahead of the virtual ranks", cfg.world_size);
  Log("interpose")->info("PRISM_GATE_TOGGLE: units {} from iteration {}", off ? "not gated" : "gated", it + 1);
}
}  // namespace

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
  LogIteration(it, word, HostNowNs(), torch_max_allocated, KnownStreamIndex(reinterpret_cast<CUstream>(stream)));
  KernelTraceAtIteration(it);
  GateToggleAtIteration(it);
  return static_cast<int>(it);
}

namespace {
uint64_t Quantile(const std::atomic<uint64_t>* hist, double q) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < kHistBuckets; ++i) total += hist[i].load(std::memory_order_relaxed);
  if (total == 0) return 0;
  uint64_t target = static_cast<uint64_t>(q * static_cast<double>(total - 1));
  uint64_t seen = 0;
  for (uint32_t i = 0; i < kHistBuckets; ++i) {
    seen += hist[i].load(std::memory_order_relaxed);
    if (seen > target) return static_cast<uint64_t>(i) * kHistBucketNs + kHistBucketNs / 2;
  }
  return static_cast<uint64_t>(kHistBuckets) * kHistBucketNs;
}
}  // namespace

uint64_t HostOverheadQuantileNs(double q) { return Quantile(St().hist, q); }
uint64_t HostOwnQuantileNs(double q) { return Quantile(St().own_hist, q); }

UnitPhaseMeans HostPhaseMeansNs() {
  UnitPhaseMeans m;
  const Stats& st = St();
  m.sampled = st.sampled.load(std::memory_order_relaxed);
  if (m.sampled == 0) return m;
  for (int i = 0; i < kUnitPhases; ++i) {
    m.own_ns[i] = st.phase_ns[i].load(std::memory_order_relaxed) / m.sampled;
    m.driver_by_phase_ns[i] = st.phase_driver_ns[i].load(std::memory_order_relaxed) / m.sampled;
    m.driver_ns += m.driver_by_phase_ns[i];
  }
  return m;
}

uint64_t UnitsExecuted() { return St().units.load(); }

void ResetStatsForTest() {
  for (auto& h : St().hist) h.store(0);
  for (auto& h : St().own_hist) h.store(0);
  for (auto& h : St().phase_ns) h.store(0);
  for (auto& h : St().phase_driver_ns) h.store(0);
  St().sampled.store(0);
  St().units.store(0);
}

}  // namespace prism::interpose
