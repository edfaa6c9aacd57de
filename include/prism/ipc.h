// Messages between libprism.so (inside each real rank) and the coordinator (schema version 3: version 2 plus
// passthrough, real NCCL among the members of a communicator that are all real and on distinct GPUs: kHello's
// gpu_id/passthrough, kCommInfo's passthrough, kRealNcclId/kRealNcclIdInfo; version 2 added kOpData/kOpResult, the
// real data between real members). Added within version 3, without changing any other message: kHelloAck's "swap"
// and kMemRoom/kMemRoomAnswer (allocation admission under context switching), which a shim sends only to a
// coordinator whose kHelloAck said "swap": true.
//
// Transport: a Unix stream socket (PRISM_COORD_SOCKET) on one host, TCP (PRISM_COORD_ADDR=host:port) across
// hosts. Every message is one frame: FrameHeader then `length` payload bytes. Hot-path messages (arrivals,
// releases, op records) are fixed-size little-endian PODs; rare ones (hello, communicator setup, status)
// carry a JSON object. A peer that sees a bad magic, an unknown version or an oversized frame drops the
// connection with a logged reason; it never crashes.
#pragma once

#include <cstdint>
#include <type_traits>

namespace prism::ipc {

inline constexpr uint32_t kFrameMagic = 0x4D535250;  // "PRSM" little-endian
inline constexpr uint16_t kVersion = 3;
inline constexpr uint32_t kMaxFrameBytes = 16u << 20;

enum class MsgType : uint16_t {
  kInvalid = 0,
  // shim -> coordinator
  kHello = 1,        // JSON: {rank, world_size, local_rank, pid, host, gpu, gpu_id, passthrough, version}: gpu_id
                     // names the physical GPU ("host/CUDA_VISIBLE_DEVICES entry"), passthrough whether this rank
                     // can run real NCCL (PRISM_PASSTHROUGH and a real libnccl found)
  kCommInit = 2,     // JSON: {key, nranks, rank, desc, parent?, color?, members?} ; answered by kCommInfo. members:
                     // global ranks, sent for a split or shrink (the coordinator cannot derive them otherwise)
  kOpArrive = 3,     // OpArrive: the GPU reached an operation that needs the coordinator's release time
  kOpRecord = 4,     // OpRecord: one completed operation, for reports and status
  kMemory = 5,       // MemorySample
  kIteration = 6,    // IterationMark
  kBye = 7,          // JSON: {reason}
  kOpData = 8,       // ExchangeHeader + bytes: a real member's input to a collective with other real members, a
                     // p2p send to a real peer, or (flags kExchangeRecvRequest, no bytes) a p2p receive from one
  kRealNcclId = 9,   // JSON {comm_id, id?}: communicator rank 0 of a passthrough communicator posts the real NCCL
                     // unique id (hex of 128 bytes); without id, a member asks for it. Answered by kRealNcclIdInfo
  kMemRoom = 10,     // JSON {id, bytes, current, peak, idle?}: a device allocation of `bytes` failed for lack of
                     // memory; the rank waits for room on its GPU (sent only when kHelloAck said "swap": true, so a
                     // coordinator without it never sees one). Answered by kMemRoomAnswer with the same id. idle
                     // (added within version 3; absent: false): the rank synchronised its device before asking, no
                     // GPU work in flight, so the coordinator may swap it out for another rank's room meanwhile
  // coordinator -> shim
  kHelloAck = 64,    // JSON: {run_id, payload, topology, out_dir, ..., swap?}: swap true under context switching
                     // (collect --swap): the rank may send kMemRoom
  kCommInfo = 65,    // JSON: {key, comm_id, members: [global ranks], real: [bool], passthrough: bool}: passthrough
                     // when every member is real, on its own GPU and able to run real NCCL: the members then build a
                     // real NCCL communicator (kRealNcclId) and call real NCCL for its operations
  kOpRelease = 66,   // OpRelease
  kError = 67,       // JSON: {what}
  kOpResult = 68,    // ExchangeHeader + bytes: this member's output (or flags kExchangeLocal / kExchangeNothing), or
                     // (flags kExchangeSendDone, no bytes) the acknowledgement that a p2p send's receive was posted
  kRealNcclIdInfo = 69,  // JSON {comm_id, id} once rank 0 posted it, or {comm_id, error}
  kMemRoomAnswer = 70,   // JSON {id, ok, why}: ok: ranks were swapped out to make room, retry the allocation;
                         // not ok: nothing could be freed in time, the allocation fails as it did
  kOpPrerelease = 71,    // OpPrerelease (added within version 3; sent only to a rank whose kHello said
                         // "prerelease": true): an operation's release rule, sent before the rank reaches it, when
                         // every other member is virtual and their arrivals are known (--graph). The rank releases
                         // the operation itself on arrival, with no round trip, and the coordinator sends no
                         // kOpRelease for a unit whose every operation it prereleased (it still takes the kOpArrive)
};

#pragma pack(push, 1)
struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kVersion;
  uint16_t type = 0;  // MsgType
  uint32_t length = 0;
};

struct OpArrive {
  uint32_t comm_id;
  uint32_t op;        // prism::trace::CollOp, or 100 + NodeKind for p2p
  uint64_t seq;       // per-communicator sequence number on this rank
  uint64_t bytes;
  uint64_t arrival_ns;    // GPU clock (%globaltimer, Unix epoch ns)
  uint64_t model_dur_ns;  // duration the shim's cost model (or the graph) gives this operation at target scale
  int32_t peer;           // p2p peer in communicator ranks, -1 otherwise
  uint32_t nops;          // operations of this communicator the unit holds (a group's send and receive on one
                          // stream: 2, `op` then 0 when they differ); they took sequence numbers seq .. seq+nops-1
};

struct OpRelease {
  uint32_t comm_id;
  uint32_t reserved;
  uint64_t seq;
  uint64_t release_ns;  // when the operation completes at target scale (same clock as arrival_ns)
  int32_t last_rank;    // global rank whose arrival decided the release (-1: duration-bound)
  uint32_t reserved2;
};

// The release of operation (comm_id, seq) once this rank arrives at `arrival`:
//   release_ns = max(arrival, floor_ns) + (dur_ns >= 0 ? dur_ns : the unit's own model duration)
//   last_rank  = floor_rank < 0 ? -1 : (arrival > floor_ns ? this rank : floor_rank)
// the coordinator's own rule for that operation (GraphRelease: max of the members' arrivals plus the duration), with
// the virtual members' latest arrival known ahead. A unit of several operations releases at the latest of theirs.
// A unit takes its prereleases only when every operation of it has one whose `op` matches the unit's (OpArrive::op,
// or the unit's op is 0); the coordinator applies the same test to the kOpArrive to decide whether to answer.
struct OpPrerelease {
  uint32_t comm_id;
  uint32_t op;          // the graph's operation there (OpArrive::op's code): a unit whose op differs (the job left
                        // the graph: an extra set-up collective, past its end) does not take the prerelease; both
                        // sides test it alike (a unit of op 0, mixed, takes it)
  uint64_t seq;
  uint64_t floor_ns;    // the latest virtual member's arrival (same clock as arrival_ns); 0 when there is none
  int64_t dur_ns;       // the operation's duration; -1: the rank's own model duration (OpArrive::model_dur_ns)
  int32_t floor_rank;   // global rank of that member (-1: no other member)
  uint32_t reserved2;
};

struct OpRecord {
  uint32_t comm_id;
  uint32_t op;
  uint64_t seq;
  uint64_t bytes;
  uint64_t arrival_ns;
  uint64_t release_ns;
  uint64_t model_dur_ns;  // duration the cost model / graph assigned
  int32_t wait_on_rank;   // global rank the op waited for last (-1: none)
  uint8_t dtype;          // prism::trace::DType
  uint8_t algo;           // cost-model algorithm chosen (0 unknown)
  uint8_t proto;          // cost-model protocol chosen (0 unknown)
  uint8_t reserved;
  int32_t peer;           // p2p peer in communicator ranks (-1: a collective or a fused unit)
};

// Real data between real members (src/nccl_patch/exchange.h). A payload larger than kExchangeChunkBytes travels
// as several frames of the same header with growing `offset`; the receiver assembles `total_bytes`.
// Keys: collectives use the communicator's count of exchanged collectives (the same on every real member);
// p2p uses the count of exchanged sends from `rank` to `peer` on that communicator (the k-th send matches the
// k-th receive, as NCCL orders p2p between a pair).
// Sends rendezvous as NCCL's do: the coordinator answers a send (kOpResult, flags kExchangeSendDone, no bytes, the
// send's header: comm_id, key, rank = source, peer = destination) once the matching receive was posted, and the
// shim completes the send only then. A refused kOpData is answered with kExchangeError (plus kExchangeSendDone for
// a send), so no shim waits for a frame the coordinator dropped.
inline constexpr uint32_t kExchangeChunkBytes = 8u << 20;
inline constexpr uint32_t kExchangeRecvRequest = 1;  // kOpData: a p2p receive asks for the matching send's bytes
inline constexpr uint32_t kExchangeLocal = 2;        // kOpResult: no real data defines the output: local policy
inline constexpr uint32_t kExchangeNothing = 4;      // kOpResult: this member has no output (non-root of reduce)
inline constexpr uint32_t kExchangeError = 8;        // kOpResult: members disagree / bad arguments: local policy
inline constexpr uint32_t kExchangeSendDone = 16;    // kOpResult: the receive matching this p2p send was posted

struct ExchangeHeader {
  uint32_t comm_id;       // coordinator communicator id
  uint16_t op;            // payload::OpKind
  uint8_t dtype;          // payload::DataType
  uint8_t redop;          // payload::RedOp
  uint64_t key;           // see above
  int32_t rank;           // sender's communicator rank (p2p: the source)
  int32_t peer;           // p2p: the destination; collectives: the root
  uint64_t count;         // NCCL's count argument
  uint64_t scalar_bits;   // PreMulSum scalar (one element of dtype)
  uint64_t total_bytes;   // size of the whole payload
  uint64_t offset;        // offset of this frame's bytes in the payload
  uint32_t flags;
  uint32_t seq;           // low 32 bits of the operation's per-communicator sequence (kOpArrive's seq): the
                          // coordinator reports a rank waiting in an exchange at (comm_id, seq) to the hang diagnosis
};

struct MemorySample {
  uint64_t t_ns;
  uint64_t current_bytes;
  uint64_t peak_bytes;
};

struct IterationMark {
  uint32_t iteration;
  uint32_t reserved;
  uint64_t t_ns;            // end of the iteration (GPU clock where available)
  uint64_t dur_ns;          // since the previous mark
  uint64_t peak_bytes;      // device bytes peak so far (cudaMalloc family)
  uint64_t torch_max_allocated;  // torch.cuda.max_memory_allocated() when the hook reports it, else 0
};
#pragma pack(pop)

// OpPrerelease's rule for one operation: when it completes for a rank that arrived at `arrival_ns` (`own_dur_ns`:
// the rank's model duration, taken when dur_ns is -1). libprism and the coordinator both apply this.
inline uint64_t PrereleaseAt(uint64_t arrival_ns, uint64_t floor_ns, int64_t dur_ns, uint64_t own_dur_ns) {
  return (arrival_ns > floor_ns ? arrival_ns : floor_ns) + (dur_ns >= 0 ? static_cast<uint64_t>(dur_ns) : own_dur_ns);
}

static_assert(sizeof(FrameHeader) == 12);
static_assert(std::is_trivially_copyable_v<OpArrive> && sizeof(OpArrive) == 48);
static_assert(sizeof(OpRelease) == 32);
static_assert(sizeof(OpPrerelease) == 40);
static_assert(sizeof(OpRecord) == 60);
static_assert(sizeof(MemorySample) == 24);
static_assert(std::is_trivially_copyable_v<ExchangeHeader> && sizeof(ExchangeHeader) == 64);
static_assert(sizeof(IterationMark) == 40);

}  // namespace prism::ipc
