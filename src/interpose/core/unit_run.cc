#include "interpose/core/unit_run.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>

#include "common/log.h"
#include "interpose/core/config.h"
#include "interpose/core/gpu.h"
#include "interpose/core/iteration.h"
#include "interpose/core/recorded.h"
#include "interpose/core/unit_exchange.h"
#include "interpose/core/unit_stats.h"
#include "nccl_patch/exchange.h"

namespace prism::interpose {

using payload::OpKind;
using payload::StepKind;

// Hands a unit to the progress thread (its gate opens and it is logged when it is released).
void PushUnit(const GateUnit& u) {
  static std::atomic<bool> warned_full{false};
  if (!ProgressPush(u)) {
    LogOnce(&warned_full, "more than 16384 operations in flight: releasing gates immediately");
    __atomic_store_n(TheGpu().GateWord(u.slot), u.ticket, __ATOMIC_RELEASE);
  }
}

namespace {

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

// RunUnit's state and steps, in its order, on RunUnit's stack; the vectors it fills are the thread's (ThreadState), reused
// from unit to unit. Why the steps RunUnit calls are always_inline: they are its body, run once per unit, and GCC's
// growth limit for a small caller would otherwise leave some of them out of line, a call per unit.
class UnitRun {
 public:
  UnitRun(ThreadState& t, Gpu& gpu, const OpCall* ops, size_t n)
      : t_(t), gpu_(gpu), cfg_(Cfg()), ops_(ops), n_(n), stream_(reinterpret_cast<CUstream>(ops[0].stream)),
        capturing_(DriverCall([&] { return gpu.Capturing(stream_); })) {
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
    gated_ = cfg_.gate != GateKind::kNone && !capturing_ && !GatesToggledOff();
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
      r_ = DriverCall([&] { return gpu_.Stamp(stream_, slot_); });
      stamped_ = true;
      if (r_ == CUDA_SUCCESS) r_ = RunExchange(t_, gpu_, stream_, prep_);
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
        r_ = DriverCall([&] { return gpu_.Stamp(stream_, slot_); });
        stamped_ = true;
      }
      if (r_ == CUDA_SUCCESS)
        r_ = DriverCall([&] { return gpu_.CopyAsync(stream_, p.desc.recv_addr, reinterpret_cast<uint64_t>(rec), want); });
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
    if (!stamped_ && r_ == CUDA_SUCCESS) r_ = DriverCall([&] { return gpu_.Stamp(stream_, slot_); });
    if (r_ == CUDA_SUCCESS && gated_)
      r_ = DriverCall([&] { return gpu_.Gate(stream_, slot_, ticket_, cfg_.gate, ops_[0].comm->spin_ctas); });
    if (r_ == CUDA_SUCCESS && gated_ && cfg_.gate_open_stamps) {
      open_slot_ = NextSlot();
      gpu_.ClearArrival(open_slot_);
      r_ = DriverCall([&] { return gpu_.Stamp(stream_, open_slot_); });
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
        rs = DriverCall([&] { return gpu_.StampAndStep(stream_, slot_, p.desc, st); });
        stamped_ = true;
      } else {
        rs = DriverCall([&] { return gpu_.RunStep(stream_, p.desc, st); });
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
    if (xsends && t_.defer_send_done && cfg_.send_rendezvous && !u.via_coordinator) {
      try {
        t_.held_units.push_back(u);
        held = true;
      } catch (...) {
      }
    }
    if (!held) PushUnit(u);
  }

  void Count() const {
    thread_local uint32_t since_check = 0;
    if ((++since_check & 63u) == 0) gpu_.MaybeRecalibrate();  // Why every 64: it reads the clock
    CountUnit();
  }

  ThreadState& t_;
  Gpu& gpu_;
  const Config& cfg_;
  const OpCall* const ops_;
  const size_t n_;
  const CUstream stream_;
  const bool capturing_;
  std::vector<Prepared>& prep_ = t_.prepared;
  std::vector<UnitSend>& sends_ = t_.sends;
  std::vector<UnitSend>& by_size_ = t_.sends_by_size;
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

}  // namespace

ncclResult_t RunUnit(ThreadState& t, const OpCall* ops, size_t n) {
  if (n == 0) return ncclSuccess;
  Gpu& gpu = TheGpu();
  if (!gpu.EnsureReady()) {
    SetLastError("libprism could not set up its GPU work");
    return ncclUnhandledCudaError;
  }
  DriverCall([&] {
    gpu.EnsureContext();
    return true;
  });
  UnitRun run(t, gpu, ops, n);
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

}  // namespace prism::interpose
