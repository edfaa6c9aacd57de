// Planner: one NCCL operation -> a few primitive steps (the rules are in docs/payload.md).
#include "nccl_patch/semantics.h"

#include <cstring>

#include "nccl_patch/dtype_math.h"

namespace prism::payload {
namespace {

// Builds a plan in place; every helper checks capacity so a wrong rule can never write past the array.
class Planner {
 public:
  Planner(const OpDesc& d, StepList* out) : d_(d), out_(out), es_(DataTypeSize(d.dtype)) {}

  bool ok() const { return ok_; }

  // dst[0..bytes) = src[0..bytes), skipped when both are the same address.
  void Copy(BufferId dst, uint64_t dst_off, BufferId src, uint64_t src_off, uint64_t bytes) {
    if (bytes == 0 || SameAddr(dst, dst_off, src, src_off)) return;
    Step s = Base(StepKind::kCopy, dst, dst_off, src, src_off);
    s.bytes = bytes;
    Add(s);
  }

  void Tile(BufferId dst, uint64_t dst_off, BufferId src, uint64_t src_off, uint64_t bytes, uint64_t tile) {
    if (bytes == 0) return;
    if (bytes == tile) return Copy(dst, dst_off, src, src_off, bytes);
    Step s = Base(StepKind::kTile, dst, dst_off, src, src_off);
    s.bytes = bytes;
    s.tile_bytes = tile;
    Add(s);
  }

  // Fills `count` elements at dst_off of the output buffer with the policy's value for virtual data.
  // index_base = element index of dst_off within that output (random values depend on it).
  void Fill(BufferId dst, uint64_t dst_off, uint64_t count) { FillAs(d_.policy, dst, dst_off, count); }
  // Fill as `policy` (kZeros, else random).
  void FillAs(Policy policy, BufferId dst, uint64_t dst_off, uint64_t count) {
    if (count == 0) return;
    if (policy == Policy::kZeros) {
      Step s = Base(StepKind::kFillZero, dst, dst_off, BufferId::kNone, 0);
      s.bytes = count * es_;
      Add(s);
      return;
    }
    Step s = Base(StepKind::kFillRandom, dst, dst_off, BufferId::kNone, 0);
    s.count = count;
    s.bytes = count * es_;
    s.param = RandomKey(d_.seed, d_.comm_id, d_.seq);
    s.index_base = dst_off / es_;
    Add(s);
  }

  void Elementwise(StepKind kind, BufferId dst, uint64_t dst_off, BufferId src, uint64_t src_off, uint64_t count,
                   uint64_t param) {
    Step s = Base(kind, dst, dst_off, src, src_off);
    s.count = count;
    s.bytes = count * es_;
    s.param = param;
    if (kind == StepKind::kMulScalar) s.scalar_addr = d_.premul_scalar_addr;
    Add(s);
  }

  // The reduction of n equal contributions `src` into `dst` (mirror), or the policy's fill.
  void Reduce(BufferId dst, uint64_t dst_off, BufferId src, uint64_t src_off, uint64_t count) {
    if (d_.policy != Policy::kMirror) return Fill(dst, dst_off, count);
    const uint64_t n = static_cast<uint64_t>(d_.nranks);
    switch (d_.redop) {
      case RedOp::kSum:
        if (n == 1) return Copy(dst, dst_off, src, src_off, count * es_);
        return Elementwise(StepKind::kScale, dst, dst_off, src, src_off, count, n);
      case RedOp::kProd:
        if (n == 1) return Copy(dst, dst_off, src, src_off, count * es_);
        return Elementwise(StepKind::kPower, dst, dst_off, src, src_off, count, n);
      case RedOp::kAvg:
      case RedOp::kMax:
      case RedOp::kMin:
        return Copy(dst, dst_off, src, src_off, count * es_);
      case RedOp::kPreMulSum:
        Elementwise(StepKind::kMulScalar, dst, dst_off, src, src_off, count, d_.premul_scalar_bits);
        if (n > 1) Elementwise(StepKind::kScale, dst, dst_off, dst, dst_off, count, n);
        return;
    }
    ok_ = false;
  }

  // n chunks of `chunk` bytes in `dst` (all-gather, gather on the root): chunk `rank` comes from `src`.
  void Gather(BufferId dst, BufferId src, uint64_t count) {
    const uint64_t chunk = count * es_;
    const uint64_t n = static_cast<uint64_t>(d_.nranks);
    const uint64_t r = static_cast<uint64_t>(d_.rank);
    const bool in_place = SameAddr(dst, r * chunk, src, 0);
    if (d_.policy == Policy::kMirror) {
      if (!in_place) return Tile(dst, 0, src, 0, n * chunk, chunk);
      // Why two tiles: the own chunk is the source; both ranges start on a chunk boundary, so phase 0.
      Tile(dst, 0, src, 0, r * chunk, chunk);
      Tile(dst, (r + 1) * chunk, src, 0, (n - r - 1) * chunk, chunk);
      return;
    }
    Copy(dst, r * chunk, src, 0, chunk);
    Fill(dst, 0, r * count);
    Fill(dst, (r + 1) * chunk, (n - r - 1) * count);
  }

  void Fail() { ok_ = false; }

  // Every buffer a step touches must exist.
  bool BuffersPresent() const {
    for (uint32_t i = 0; i < out_->size; ++i) {
      const Step& s = out_->steps[i];
      if (Addr(s.dst_buf) == 0) return false;
      if (s.src_buf != BufferId::kNone && Addr(s.src_buf) == 0) return false;
    }
    return true;
  }

 private:
  uint64_t Addr(BufferId b) const { return StepAddr(d_, b, 0); }
  bool SameAddr(BufferId a, uint64_t a_off, BufferId b, uint64_t b_off) const {
    return StepAddr(d_, a, a_off) == StepAddr(d_, b, b_off) && Addr(a) != 0;
  }
  Step Base(StepKind kind, BufferId dst, uint64_t dst_off, BufferId src, uint64_t src_off) const {
    Step s;
    s.kind = kind;
    s.dtype = d_.dtype;
    s.dst_buf = dst;
    s.dst_offset = dst_off;
    s.src_buf = src;
    s.src_offset = src_off;
    return s;
  }
  void Add(const Step& s) {
    if (out_->size >= kMaxSteps) {
      ok_ = false;
      return;
    }
    out_->steps[out_->size++] = s;
  }

  const OpDesc& d_;
  StepList* out_;
  uint64_t es_;
  bool ok_ = true;
};

bool IsReduction(OpKind op) {
  return op == OpKind::kAllReduce || op == OpKind::kReduce || op == OpKind::kReduceScatter;
}
bool IsRooted(OpKind op) {
  return op == OpKind::kBroadcast || op == OpKind::kReduce || op == OpKind::kGather || op == OpKind::kScatter;
}
// Elements the largest buffer of the operation holds, in units of `count`.
uint64_t CountMultiplier(OpKind op, uint64_t n) {
  switch (op) {
    case OpKind::kAllGather: case OpKind::kReduceScatter: case OpKind::kAllToAll:
    case OpKind::kGather: case OpKind::kScatter:
      return n;
    default:
      return 1;
  }
}

Status Validate(const OpDesc& d) {
  if (static_cast<int>(d.dtype) < 0 || static_cast<int>(d.dtype) >= kNumDataTypes) return Status::kInvalidArgument;
  if (d.op <= OpKind::kInvalid || d.op > OpKind::kRecv) return Status::kInvalidArgument;
  if (d.policy <= Policy::kInvalid || d.policy > Policy::kRecorded) return Status::kInvalidArgument;
  if (d.nranks < 1 || d.rank < 0 || d.rank >= d.nranks) return Status::kInvalidArgument;
  if (IsRooted(d.op) && (d.root < 0 || d.root >= d.nranks)) return Status::kInvalidArgument;
  if ((d.op == OpKind::kSend || d.op == OpKind::kRecv) && (d.peer < 0 || d.peer >= d.nranks)) {
    return Status::kInvalidArgument;
  }
  if (IsReduction(d.op) && (static_cast<int>(d.redop) < 0 || d.redop > RedOp::kPreMulSum)) {
    return Status::kInvalidArgument;
  }
  // Every byte offset of the operation must fit in 63 bits.
  uint64_t elems = 0;
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(d.count, CountMultiplier(d.op, static_cast<uint64_t>(d.nranks)), &elems) ||
      __builtin_mul_overflow(elems, static_cast<uint64_t>(DataTypeSize(d.dtype)), &bytes) || (bytes >> 63) != 0) {
    return Status::kInvalidArgument;
  }
  return Status::kOk;
}

}  // namespace

uint64_t RandomKey(uint64_t seed, uint64_t comm_id, uint64_t seq) { return math::RandomKeyOf(seed, comm_id, seq); }

Status Plan(const OpDesc& d, StepList* out) {
  if (out == nullptr) return Status::kInvalidArgument;
  out->size = 0;
  if (Status s = Validate(d); s != Status::kOk) return s;
  if (d.policy == Policy::kRecorded) return Status::kUnsupported;
  if (d.count == 0) return Status::kOk;

  Planner p(d, out);
  const uint64_t es = DataTypeSize(d.dtype);
  const uint64_t n = static_cast<uint64_t>(d.nranks);
  const uint64_t r = static_cast<uint64_t>(d.rank);
  const uint64_t bytes = d.count * es;
  const bool mirror = d.policy == Policy::kMirror;
  const bool is_root = d.rank == d.root;

  switch (d.op) {
    case OpKind::kAllReduce:
      p.Reduce(BufferId::kRecv, 0, BufferId::kSend, 0, d.count);
      break;
    case OpKind::kReduce:
      if (is_root) p.Reduce(BufferId::kRecv, 0, BufferId::kSend, 0, d.count);
      break;
    case OpKind::kReduceScatter:
      // Own chunk of the input (index = comm rank); in place when recv == send + rank * count.
      p.Reduce(BufferId::kRecv, 0, BufferId::kSend, r * bytes, d.count);
      break;
    case OpKind::kBroadcast:
      if (is_root) {
        p.Copy(BufferId::kRecv, 0, BufferId::kSend, 0, bytes);
      } else if (mirror) {
        // Virtual root: it would send what this rank holds in sendbuff (ncclBcast: in place, nothing to do).
        // A non-root that passes sendbuff = NULL keeps recvbuff as it is.
        if (d.send_addr != 0) p.Copy(BufferId::kRecv, 0, BufferId::kSend, 0, bytes);
      } else {
        p.Fill(BufferId::kRecv, 0, d.count);
      }
      break;
    case OpKind::kAllGather:
      p.Gather(BufferId::kRecv, BufferId::kSend, d.count);
      break;
    case OpKind::kGather:
      if (is_root) p.Gather(BufferId::kRecv, BufferId::kSend, d.count);
      break;
    case OpKind::kAllToAll:
      if (mirror) {
        p.Copy(BufferId::kRecv, 0, BufferId::kSend, 0, n * bytes);
      } else {
        p.Copy(BufferId::kRecv, r * bytes, BufferId::kSend, r * bytes, bytes);
        p.Fill(BufferId::kRecv, 0, r * d.count);
        p.Fill(BufferId::kRecv, (r + 1) * bytes, (n - r - 1) * d.count);
      }
      break;
    case OpKind::kScatter:
      if (is_root) {
        p.Copy(BufferId::kRecv, 0, BufferId::kSend, r * bytes, bytes);
      } else if (!mirror) {
        p.Fill(BufferId::kRecv, 0, d.count);
      }
      // Mirror with a virtual root: the root's chunk for this rank is what this rank holds; recv unchanged.
      break;
    case OpKind::kSend:
      break;
    case OpKind::kRecv:
      if (mirror && d.mirror_send_addr != 0) {
        p.Copy(BufferId::kRecv, 0, BufferId::kMirrorSend, 0, bytes);
      } else if (mirror) {
        // No send of this size yet: seeded random, as the random policy would give.
        p.FillAs(Policy::kRandom, BufferId::kRecv, 0, d.count);
      } else {
        p.Fill(BufferId::kRecv, 0, d.count);
      }
      break;
    case OpKind::kInvalid:
      p.Fail();
      break;
  }
  if (!p.ok() || !p.BuffersPresent()) {
    out->size = 0;
    return Status::kInvalidArgument;
  }
  return Status::kOk;
}

Policy ParsePolicy(const char* name) {
  if (name == nullptr) return Policy::kInvalid;
  if (std::strcmp(name, "mirror") == 0) return Policy::kMirror;
  if (std::strcmp(name, "zeros") == 0) return Policy::kZeros;
  if (std::strcmp(name, "random") == 0) return Policy::kRandom;
  if (std::strcmp(name, "recorded") == 0) return Policy::kRecorded;
  return Policy::kInvalid;
}

const char* PolicyName(Policy p) {
  switch (p) {
    case Policy::kMirror: return "mirror";
    case Policy::kZeros: return "zeros";
    case Policy::kRandom: return "random";
    case Policy::kRecorded: return "recorded";
    case Policy::kInvalid: break;
  }
  return "invalid";
}

const char* OpKindName(OpKind op) {
  switch (op) {
    case OpKind::kAllReduce: return "allreduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kReduce: return "reduce";
    case OpKind::kAllGather: return "allgather";
    case OpKind::kReduceScatter: return "reducescatter";
    case OpKind::kAllToAll: return "alltoall";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kSend: return "send";
    case OpKind::kRecv: return "recv";
    case OpKind::kInvalid: break;
  }
  return "invalid";
}

const char* RedOpName(RedOp op) {
  switch (op) {
    case RedOp::kSum: return "sum";
    case RedOp::kProd: return "prod";
    case RedOp::kMax: return "max";
    case RedOp::kMin: return "min";
    case RedOp::kAvg: return "avg";
    case RedOp::kPreMulSum: return "premulsum";
  }
  return "invalid";
}

const char* DataTypeName(DataType t) {
  switch (t) {
    case DataType::kInt8: return "int8";
    case DataType::kUint8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kUint32: return "uint32";
    case DataType::kInt64: return "int64";
    case DataType::kUint64: return "uint64";
    case DataType::kFloat16: return "float16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBfloat16: return "bfloat16";
    case DataType::kFloat8e4m3: return "float8e4m3";
    case DataType::kFloat8e5m2: return "float8e5m2";
  }
  return "invalid";
}

const char* StatusName(Status s) {
  switch (s) {
    case Status::kOk: return "ok";
    case Status::kUnsupported: return "unsupported";
    case Status::kInvalidArgument: return "invalid argument";
  }
  return "invalid";
}

const char* KernelName(StepKind kind) {
  switch (kind) {
    case StepKind::kCopy: return "prism_payload_copy";
    case StepKind::kTile: return "prism_payload_tile";
    case StepKind::kScale: return "prism_payload_scale";
    case StepKind::kPower: return "prism_payload_power";
    case StepKind::kMulScalar: return "prism_payload_mul_scalar";
    case StepKind::kFillZero: return "prism_payload_fill_zero";
    case StepKind::kFillRandom: return "prism_payload_fill_random";
    case StepKind::kNoop: break;
  }
  return nullptr;
}

}  // namespace prism::payload
