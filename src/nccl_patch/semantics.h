// Payload semantics: what an NCCL operation writes into its output buffers when some members of the
// communicator are virtual, under the run's payload policy. Written once; used by
//   - the shim (src/interpose/), which plans each collective/p2p on the host and runs the steps on the
//     user's stream with our own kernels (src/interpose/kernels/payload.cu) and cuMemcpyAsync/cuMemsetD8Async;
//   - tests and collect, which run the same steps on the CPU with ExecuteCpu().
// The exact rule per operation x policy, the rounding and the random seeds are in docs/payload.md.
//
// HOW THE SHIM USES THIS (hot path; nothing here allocates, throws, locks or touches CUDA):
//
//   payload::OpDesc d;                       // defaults: policy mirror, no buffers
//   d.op = payload::OpKind::kAllReduce;      // from the hooked entry point
//   d.dtype = static_cast<payload::DataType>(datatype);   // ncclDataType_t value, unchanged
//   d.redop = payload::RedOp::kSum;          // ncclSum..ncclAvg unchanged (0..4); a handle from
//                                            // ncclRedOpCreatePreMulSum -> kPreMulSum + premul_scalar_*
//   d.count = count;  d.nranks = n;  d.rank = r;  d.root = root;  d.peer = peer;
//   d.send_addr = (uint64_t)sendbuff;  d.recv_addr = (uint64_t)recvbuff;
//   d.seed = run_seed; d.comm_id = comm_id; d.seq = per_comm_seq;
//   payload::StepList steps;
//   payload::Status s = payload::Plan(d, &steps);          // kOk, kUnsupported (policy recorded), kInvalidArgument
//   for (uint32_t i = 0; i < steps.size; ++i) {
//     const payload::Step& st = steps.steps[i];
//     uint64_t dst = payload::StepAddr(d, st.dst_buf, st.dst_offset);
//     uint64_t src = payload::StepAddr(d, st.src_buf, st.src_offset);
//     switch (st.kind) {                                   // argument layouts: see "GPU EXECUTOR" below
//       case kCopy:  cuMemcpyAsync(dst, src, st.bytes, stream); break;
//       case kFillZero: cuMemsetD8Async(dst, 0, st.bytes, stream); break;
//       default: cuLaunchKernel(<KernelName(st.kind)>, blocks, kPayloadThreadsPerBlock, ... args ...);
//     }
//   }
//
// Steps of one plan must run in order on one stream (a later step may read what an earlier one wrote).
//
// P2P (mirror policy): a recv is filled from this rank's own most recent send of the same byte size on the
// same communicator (preferring a send to the same peer). The shim keeps one P2pSendHistory per communicator:
//   - a send outside a group: history.RecordSend(peer, bytes, sendbuff) when it is posted;
//   - a recv outside a group: history.Find(peer, bytes, &addr); set d.mirror_send_addr = addr (0 if none); Plan.
//   - inside ncclGroupStart/End (send/recv pairs act as one unit): at the outermost ncclGroupEnd, FIRST record
//     every send of the group in posting order, THEN Find + Plan every recv of the group in posting order.
//     So a recv sees the sends of its own group even when they were posted after it.
//     Why: NCCL progresses a group's sends and recvs concurrently; the pair is one exchange.
//     A recv whose group sends on the communicator takes only a send of that group (libprism's RunUnit: same
//     peer, else the own rank, else any peer, of its size), else 0. Why: an older call's buffer may have been
//     reused by the caching allocator (stale bytes).
//   - the copy reads the send buffer when the recv's step runs on the recv's stream: if the send was on another
//     stream, the shim makes the recv's stream wait for the send's stream first (NCCL joins a group's streams).
//   - when the user frees memory (cudaFree, VMM unmap), call history.InvalidateRange(addr, bytes) so a recv
//     never copies from freed memory (it falls back to random).
//
// Real members: when a communicator has more than one real rank, every real rank still applies the rule for
// ITS OWN view (each real rank sees its own mirror); no data moves between real ranks outside collect.
#pragma once

#include <cstdint>

namespace prism::payload {

// ---- Enums ----------------------------------------------------------------------------------------------------

// Data types: the numeric values ARE ncclDataType_t's (nccl.h 2.28), so the shim casts and kernels take the
// same int. Why not start at 1 (STYLE's "zero is not a real value"): the value crosses into device code as
// NCCL's own int; OpDesc validation rejects anything outside [0, kNumDataTypes).
enum class DataType : int32_t {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFloat8e4m3 = 10,
  kFloat8e5m2 = 11,
};
inline constexpr int kNumDataTypes = 12;

// Reduction ops: 0..4 are ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg. kPreMulSum is ours: the shim maps a
// handle made by ncclRedOpCreatePreMulSum (NCCL handles are >= ncclNumOps) to kPreMulSum plus the scalar.
enum class RedOp : int32_t {
  kSum = 0,
  kProd = 1,
  kMax = 2,
  kMin = 3,
  kAvg = 4,
  kPreMulSum = 5,
};

enum class OpKind : int32_t {
  kInvalid = 0,
  kAllReduce = 1,      // count = elements of send and recv
  kBroadcast = 2,      // ncclBroadcast; ncclBcast is kBroadcast with send_addr == recv_addr
  kReduce = 3,         // recv used on the root only
  kAllGather = 4,      // count = sendcount; recv has nranks * count elements
  kReduceScatter = 5,  // count = recvcount; send has nranks * count elements
  kAllToAll = 6,       // count = elements per peer; send and recv have nranks * count elements
  kGather = 7,         // count = elements per rank; recv (root only) has nranks * count elements
  kScatter = 8,        // count = elements per rank; send (root only) has nranks * count elements
  kSend = 9,           // plans no steps (see P2pSendHistory)
  kRecv = 10,          // count elements into recv_addr from `peer`
};

enum class Policy : int32_t {
  kInvalid = 0,
  kMirror = 1,    // default: a virtual peer contributes exactly what this real rank contributes
  kZeros = 2,     // data that depends on a virtual peer is zero
  kRandom = 3,    // data that depends on a virtual peer is seeded random, never NaN/Inf
  kRecorded = 4,  // tensors captured by collect: NOT IMPLEMENTED YET, Plan returns kUnsupported
};

enum class Status : int32_t {
  kOk = 0,
  kUnsupported = 1,      // valid request this library cannot do yet (policy recorded)
  kInvalidArgument = 2,  // bad dtype/op/redop/rank/root/nranks, missing buffer, size overflow
};

// Parses "mirror" | "zeros" | "random" | "recorded" (PRISM_PAYLOAD). Returns kInvalid for anything else.
Policy ParsePolicy(const char* name);
const char* PolicyName(Policy p);
const char* OpKindName(OpKind op);
const char* RedOpName(RedOp op);
const char* DataTypeName(DataType t);
const char* StatusName(Status s);

// Bytes per element (0 for an invalid type).
constexpr uint32_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kInt8: case DataType::kUint8: case DataType::kFloat8e4m3: case DataType::kFloat8e5m2: return 1;
    case DataType::kFloat16: case DataType::kBfloat16: return 2;
    case DataType::kInt32: case DataType::kUint32: case DataType::kFloat32: return 4;
    case DataType::kInt64: case DataType::kUint64: case DataType::kFloat64: return 8;
  }
  return 0;
}

// ---- One operation ----------------------------------------------------------------------------------------------

struct OpDesc {
  OpKind op = OpKind::kInvalid;
  DataType dtype = DataType::kFloat32;
  RedOp redop = RedOp::kSum;       // reductions only (AllReduce, Reduce, ReduceScatter)
  Policy policy = Policy::kMirror;
  int32_t nranks = 0;              // communicator size n (real + virtual members), >= 1
  int32_t rank = 0;                // this rank's index in the communicator
  int32_t root = 0;                // Broadcast, Reduce, Gather, Scatter
  int32_t peer = 0;                // Send, Recv
  uint64_t count = 0;              // NCCL's count argument, see OpKind
  uint64_t send_addr = 0;          // sendbuff (device address on the GPU, host pointer on the CPU); 0 = NULL
  uint64_t recv_addr = 0;          // recvbuff; 0 = NULL
  // PreMulSum scalar: one element of `dtype`. ncclScalarHostImmediate: its bits in premul_scalar_bits (low bytes,
  // little-endian) and premul_scalar_addr = 0. ncclScalarDevice: premul_scalar_addr = the device address, read by
  // the kernel when the step runs.
  uint64_t premul_scalar_bits = 0;
  uint64_t premul_scalar_addr = 0;
  // Random policy and the p2p fallback: values depend only on (seed, comm_id, seq, element index).
  uint64_t seed = 0;               // run seed (PRISM_SEED)
  uint64_t comm_id = 0;            // stable communicator id (the same on every rank of the communicator)
  uint64_t seq = 0;                // per-communicator operation counter (collectives and p2p calls)
  // Recv under mirror: address of the matched send buffer from P2pSendHistory::Find; 0 = no prior send.
  uint64_t mirror_send_addr = 0;
};

// ---- Steps --------------------------------------------------------------------------------------------------------

enum class StepKind : int32_t {
  kNoop = 0,        // nothing (never emitted by Plan; a placeholder)
  kCopy = 1,        // dst[0..bytes) = src[0..bytes); src and dst never partially overlap; never src == dst
  kTile = 2,        // dst[j] = src[j % tile_bytes] for j in [0, bytes); bytes is a multiple of tile_bytes
  kScale = 3,       // dst[i] = n * src[i], i < count: the sum of n equal values (param = n); docs/payload.md
  kPower = 4,       // dst[i] = src[i]^n, i < count (param = n): the product of n equal values
  kMulScalar = 5,   // dst[i] = s * src[i], i < count: s = scalar_addr ? *(T*)scalar_addr : bits of param
  kFillZero = 6,    // dst[0..bytes) = 0
  kFillRandom = 7,  // dst[i] = Random(dtype, key = param, element index = index_base + i), i < count
};

// Which buffer an address in a step is relative to.
enum class BufferId : int32_t {
  kNone = 0,
  kSend = 1,        // OpDesc::send_addr
  kRecv = 2,        // OpDesc::recv_addr
  kMirrorSend = 3,  // OpDesc::mirror_send_addr (p2p recv under mirror)
};
inline constexpr int kNumBufferIds = 4;

struct Step {
  StepKind kind = StepKind::kNoop;
  DataType dtype = DataType::kUint8;
  BufferId dst_buf = BufferId::kNone;
  BufferId src_buf = BufferId::kNone;   // kNone for fills
  uint64_t dst_offset = 0;              // bytes from the buffer's start
  uint64_t src_offset = 0;              // bytes
  uint64_t bytes = 0;                   // bytes written to dst (== count * DataTypeSize(dtype))
  uint64_t count = 0;                   // elements written (elementwise kinds, kFillRandom)
  uint64_t tile_bytes = 0;              // kTile
  uint64_t param = 0;                   // kScale/kPower: n; kMulScalar: scalar bits; kFillRandom: key
  uint64_t index_base = 0;              // kFillRandom: element index of dst[0] within the output buffer
  uint64_t scalar_addr = 0;             // kMulScalar: device/host address of the scalar, 0 = use param
};

// Plans have at most this many steps (all-gather/gather/all-to-all under zeros/random are the longest: 3).
inline constexpr uint32_t kMaxSteps = 4;

struct StepList {
  Step steps[kMaxSteps];
  uint32_t size = 0;
};

// Turns one operation into steps. No allocation, no exceptions. count == 0 gives an empty list and kOk.
// On error `out->size` is 0.
Status Plan(const OpDesc& desc, StepList* out);

// The address a step refers to: base of `buf` in `desc` + offset (0 for kNone).
inline uint64_t StepAddr(const OpDesc& desc, BufferId buf, uint64_t offset) {
  switch (buf) {
    case BufferId::kSend: return desc.send_addr + offset;
    case BufferId::kRecv: return desc.recv_addr + offset;
    case BufferId::kMirrorSend: return desc.mirror_send_addr + offset;
    case BufferId::kNone: break;
  }
  return 0;
}

// The random key of one operation: SplitMix64 chain over (seed, comm_id, seq); docs/payload.md.
uint64_t RandomKey(uint64_t seed, uint64_t comm_id, uint64_t seq);

// ---- CPU executor (reference; tests, collect) -----------------------------------------------------------------------

// Host base address of each BufferId (index = static_cast<int>(BufferId)); kMulScalar's scalar_addr is
// dereferenced as a host pointer.
struct HostBuffers {
  void* base[kNumBufferIds] = {nullptr, nullptr, nullptr, nullptr};
};
// Buffers of a plan made from `desc` whose addresses are host pointers.
HostBuffers HostBuffersOf(const OpDesc& desc);

// Runs one step on host memory, bit-for-bit what the GPU kernels write. kInvalidArgument on a bad step.
Status ExecuteCpu(const Step& step, const HostBuffers& buffers);
// Plans and runs every step; the addresses in `desc` must be host pointers.
Status RunCpu(const OpDesc& desc);

// ---- GPU executor contract (kernels in src/interpose/kernels/payload.cu, in the embedded fatbin) ------------------
//
// All kernels: 1-D grid-stride loop, any grid; kPayloadThreadsPerBlock threads per block recommended, grid =
// PayloadBlocks(work items). cuLaunchKernel kernelParams point at these arguments, in this order and these C types
// (dtype is the DataType value as int; pointers are CUdeviceptr-sized):
//
//   kTile       "prism_payload_tile"        (void* dst, const void* src, uint64_t bytes, uint64_t tile_bytes)
//                                           work items = bytes
//   kScale      "prism_payload_scale"       (void* dst, const void* src, uint64_t count, int dtype, uint64_t n)
//   kPower      "prism_payload_power"       (void* dst, const void* src, uint64_t count, int dtype, uint64_t n)
//   kMulScalar  "prism_payload_mul_scalar"  (void* dst, const void* src, uint64_t count, int dtype,
//                                            uint64_t scalar_bits, const void* scalar_ptr)  // ptr 0 -> bits
//   kFillRandom "prism_payload_fill_random" (void* dst, uint64_t count, int dtype, uint64_t key,
//                                            uint64_t index_base)
//   kCopy       cuMemcpyAsync(dst, src, bytes)   (kernel "prism_payload_copy"(void* dst, const void* src,
//                                                 uint64_t bytes) exists too, e.g. for graph capture)
//   kFillZero   cuMemsetD8Async(dst, 0, bytes)   (kernel "prism_payload_fill_zero"(void* dst, uint64_t bytes))
//   kNoop       nothing
//   elementwise kinds: work items = count; dst == src is allowed (in place).

inline constexpr uint32_t kPayloadThreadsPerBlock = 256;
inline constexpr uint32_t kPayloadMaxBlocks = 1024;

// Blocks for `work_items` (>= 1).
constexpr uint32_t PayloadBlocks(uint64_t work_items) {
  uint64_t b = (work_items + kPayloadThreadsPerBlock - 1) / kPayloadThreadsPerBlock;
  if (b < 1) b = 1;
  if (b > kPayloadMaxBlocks) b = kPayloadMaxBlocks;
  return static_cast<uint32_t>(b);
}

// The kernel name for a step kind (nullptr for kNoop).
const char* KernelName(StepKind kind);

// ---- P2P send history (mirror policy) -------------------------------------------------------------------------------

// Remembers this rank's recent sends on one communicator. Fixed memory (allocated once, on the first send),
// no allocation afterwards. Not thread-safe: the shim calls it under the communicator's lock.
// A direct-mapped cache of kSlots entries per table; a newer send replaces an older one in its slot.
class P2pSendHistory {
 public:
  P2pSendHistory() = default;
  ~P2pSendHistory();
  P2pSendHistory(const P2pSendHistory&) = delete;
  P2pSendHistory& operator=(const P2pSendHistory&) = delete;

  // Records a send of `bytes` bytes from `addr` to `peer`. False only if the table could not be allocated.
  bool RecordSend(int32_t peer, uint64_t bytes, uint64_t addr);
  // The most recent send of exactly `bytes` bytes to `peer`; else to any peer. False (addr 0) if none.
  bool Find(int32_t peer, uint64_t bytes, uint64_t* addr) const;
  // Forgets sends whose buffer overlaps [addr, addr + bytes) (the memory was freed).
  void InvalidateRange(uint64_t addr, uint64_t bytes);

  static constexpr uint32_t kSlots = 4096;

 private:
  struct Entry {
    uint64_t bytes = 0;  // 0 = empty
    uint64_t addr = 0;
    int32_t peer = -1;
  };
  Entry* by_peer_ = nullptr;   // key (peer, bytes)
  Entry* by_size_ = nullptr;   // key bytes
};

}  // namespace prism::payload
