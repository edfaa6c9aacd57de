// PrismTrace: the execution graph of a distributed training job (schema version 1).
//
// This header is the boundary: the in-memory form that src/replay reads and writes (CBOR `.prism`, JSON
// `.prism.json`), the replay engine walks, and the shim/coordinator produce. docs/trace-format.md documents
// every field; keep the two in step and bump kSchemaVersion on any incompatible change.
//
// Data-parallel deduplication: a RoleClass holds the per-stream node lists of one rank; many ranks share a
// class. Nodes therefore name communicators by *slot* (a name local to the class, e.g. "tp", "dp", "pp"), and
// each rank binds the class's slots to concrete communicator ids (RankBinding::comms).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace prism::trace {

inline constexpr std::string_view kMagic = "PRISMTRACE";
inline constexpr int kSchemaVersion = 1;

// Enums start at an invalid 0 so that an unset field never reads as a real value.
enum class NodeKind : uint8_t { kInvalid = 0, kCompute, kColl, kSend, kRecv };
enum class CollOp : uint8_t {
  kInvalid = 0,
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAllToAll,
  kBarrier,
};
enum class DType : uint8_t {
  kInvalid = 0,
  kF32,
  kF16,
  kBF16,
  kF64,
  kF8E4M3,
  kF8E5M2,
  kI8,
  kU8,
  kI32,
  kU32,
  kI64,
  kU64,
};

// When a send completes (top-level key kSendCompletionKey; docs/trace-format.md, "Send completion"):
//  kRendezvous: with its receive, at max(send posted, receive posted) + transfer;
//  kEager:      after its transfer, whether the receive was posted or not (ASTRA-sim's sends);
//  kNccl:       eager up to the buffer NCCL's p2p protocol writes into without the receiver, rendezvous above.
// kInvalid (absent) means the replay's default for a PrismTrace, kRendezvous.
enum class SendCompletion : uint8_t { kInvalid = 0, kRendezvous, kEager, kNccl };
inline constexpr std::string_view kSendCompletionKey = "send_completion";

inline constexpr uint32_t kNoIndex = std::numeric_limits<uint32_t>::max();

struct Node {
  uint32_t id = kNoIndex;            // unique within its RoleClass (all streams)
  NodeKind kind = NodeKind::kInvalid;
  CollOp op = CollOp::kInvalid;      // kColl only
  uint32_t comm_slot = kNoIndex;     // index into RoleClass::comm_slots (comm nodes)
  int32_t peer = -1;                 // kSend/kRecv: the other side, in communicator ranks
  int32_t root = -1;                 // kBroadcast/kReduce: root, in communicator ranks
  uint64_t bytes = 0;                // comm nodes: nccl-tests' S (see docs/trace-format.md)
  DType dtype = DType::kInvalid;     // comm nodes
  double dur_us = -1.0;              // compute: duration; comm: recorded duration, < 0 when unknown
  uint32_t iter = 0;                 // training iteration this node belongs to
  std::vector<uint32_t> after;       // node ids (other streams) that must complete before this one starts
  std::string name;                  // optional label ("fwd mb3", a kernel name, ...)
};

struct Stream {
  std::string name;  // "compute", "comm", "pp", ...
  std::vector<Node> nodes;
};

struct RoleClass {
  std::string name;
  std::vector<std::string> comm_slots;  // slot names used by this class's comm nodes
  std::vector<Stream> streams;
};

struct Comm {
  uint32_t id = kNoIndex;
  std::vector<int32_t> ranks;  // global ranks in communicator-rank order
  std::string desc;            // e.g. Megatron's group name "TENSOR_MODEL_PARALLEL"
};

struct RankBinding {
  uint32_t cls = kNoIndex;      // index into Trace::classes
  std::vector<uint32_t> comms;  // comm id bound to each of the class's comm_slots
};

struct Layout {
  int tp = 1, pp = 1, dp = 1, cp = 1, ep = 1, etp = 1;
  std::string order = "tp-cp-ep-dp-pp";  // leftmost varies fastest (Megatron's convention)
};

struct Trace {
  int32_t world_size = 0;
  Layout layout;
  std::string topology;              // optional: a preset name or the topology JSON as text
  SendCompletion send_completion = SendCompletion::kInvalid;  // optional (kSendCompletionKey)
  std::vector<Comm> comms;
  std::vector<RoleClass> classes;
  std::vector<RankBinding> ranks;    // size world_size: rank -> class and comm bindings
};

// Names as they appear on disk (lower case). Unknown strings map to kInvalid.
std::string_view ToString(NodeKind k);
std::string_view ToString(CollOp op);
std::string_view ToString(DType t);
std::string_view ToString(SendCompletion c);  // "rendezvous", "eager", "nccl"
NodeKind ParseNodeKind(std::string_view s);
CollOp ParseCollOp(std::string_view s);
DType ParseDType(std::string_view s);
SendCompletion ParseSendCompletion(std::string_view s);
// Bytes per element; 0 for kInvalid.
int DTypeSize(DType t);

}  // namespace prism::trace
