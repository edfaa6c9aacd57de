// libprism's side of the coordinator connection (include/prism/ipc.h, framing in src/common/ipc_io.h):
// kHello once; kCommInit -> kCommInfo when a communicator is created (members, which are real); and for
// communicators with more than one real member, kOpArrive -> kOpRelease per operation (from the progress thread).
// One reader thread receives every frame; requests wait on it with a timeout. Nothing here throws or calls CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "prism/ipc.h"

namespace prism::interpose {

struct GateUnit;

// Connects to PRISM_COORD_SOCKET and says hello (once; false when unset or unreachable, logged once).
bool CoordConnect();
bool CoordActive();

struct CoordCommInfo {
  uint32_t comm_id = 0;
  std::vector<int32_t> members;
  std::vector<bool> real;
  std::string desc;   // the group's description when the coordinator knows it (Megatron's group name)
  std::string group;  // torch's group name when known
  bool passthrough = false;  // every member is real, on its own GPU: build a real NCCL communicator (ipc.h)
};
enum class CoordReply { kOk, kRefused, kNoAnswer };
// kCommInit {key, nranks, rank, desc, name, parent?, color?, members?}; waits up to timeout_ms for kCommInfo.
// members: the global ranks when this rank knows them (a split or shrink), for the coordinator to adopt.
// kRefused: the coordinator answered but does not know the members (its "error").
CoordReply CoordCommInit(const std::string& key, int nranks, int rank, const std::string& desc, const std::string& name,
                   int64_t parent_comm_id, int color, int timeout_ms, CoordCommInfo* out,
                   const std::vector<int32_t>* members = nullptr);

// Allocation admission under context switching (ipc.h kMemRoom): whether the coordinator said swap is on (its
// kHelloAck), and the request: a device allocation of `bytes` failed while this rank held `current` tracked bytes;
// waits up to timeout_ms for kMemRoomAnswer. kOk: retry the allocation; kRefused: nothing could be freed (*why);
// kNoAnswer: no coordinator, lost, or timed out. `idle`: this rank's device was synchronised before asking (the
// coordinator may swap it out meanwhile).
bool CoordSwapOn();
CoordReply CoordAskRoom(uint64_t id, uint64_t bytes, uint64_t current, uint64_t peak, int timeout_ms,
                        std::string* why, bool idle = false);

// Passthrough (ipc.h kRealNcclId): communicator rank 0 posts the real NCCL unique id (`post_hex` not empty), the
// others ask for it; both wait up to timeout_ms for kRealNcclIdInfo and get the id (hex) in *id_hex.
bool CoordRealNcclId(uint32_t comm_id, const std::string& post_hex, int timeout_ms, std::string* id_hex,
                     std::string* error);
// "host/<entry of CUDA_VISIBLE_DEVICES at phys_device>" (or "host/<phys_device>"): names a physical GPU, so the
// coordinator can tell whether real members share one.
std::string PhysicalGpuId(const std::string& host, const char* visible_devices, int phys_device);

// From the progress thread: kOpArrive for a unit, then its release: the coordinator's kOpRelease (matched by
// (comm_id, seq)), or, when the coordinator prereleased every operation of the unit for the unit's op (kOpPrerelease,
// ipc.h OpPrerelease has the rule; it then sends no kOpRelease), the rule applied to the unit's arrival and model
// duration. Either way the unit's entries leave the tables. False while neither is there.
bool CoordSendArrive(const GateUnit& unit);
bool CoordTakeRelease(const GateUnit& unit, uint64_t* release_ns, int32_t* last_rank);

// Status feed for `prism-run status` (from the event writer thread; best effort, never blocks the job).
struct OpEvent;
void CoordSendRecord(const OpEvent& e);
void CoordSendIteration(uint32_t iteration, uint64_t t_ns, uint64_t dur_ns, uint64_t peak, uint64_t torch_max);
void CoordSendMemory(uint64_t t_ns, uint64_t current, uint64_t peak);

// Real data between real members (ipc.h kOpData / kOpResult). Sends `bytes` (chunked) under header `h`; false
// when the coordinator is not reachable.
bool CoordSendData(const ipc::ExchangeHeader& h, const void* bytes, uint64_t len);
// Waits (no timeout: a real peer that never comes is a hang, which the coordinator diagnoses) for the kOpResult
// of a collective (`p2p_src` = -1) or of a p2p receive from communicator rank `p2p_src`. False when the connection
// is lost. `flags` gets the result's flags, `bytes` its assembled payload.
bool CoordWaitResult(uint32_t comm_id, uint64_t key, int32_t p2p_src, uint32_t* flags, std::string* bytes);
// Before sending the input of an operation whose result it will wait for: the result's bytes go straight from the
// socket to `dst` (at most `capacity` bytes; e.g. page-locked staging, so the copy to the GPU needs no other), not
// to a string. CoordForgetResult undoes it when the input could not be sent.
void CoordExpectResult(uint32_t comm_id, uint64_t key, int32_t p2p_src, void* dst, uint64_t capacity);
void CoordForgetResult(uint32_t comm_id, uint64_t key, int32_t p2p_src);
// CoordWaitResult for an expected result: *size = the result's size; *in_place: its bytes are at the registered
// `dst`; else (larger than `capacity`, or never registered) they are in *bytes.
bool CoordWaitResultAt(uint32_t comm_id, uint64_t key, int32_t p2p_src, uint32_t* flags, uint64_t* size,
                       bool* in_place, std::string* bytes);
// Waits (no timeout, as above) for the acknowledgement of this rank's send `key` to communicator rank `dst`
// (kExchangeSendDone: the receiver posted the matching receive). False when the connection is lost.
bool CoordWaitSendDone(uint32_t comm_id, uint64_t key, int32_t dst, uint32_t* flags);

// Parses a kCommInfo JSON payload (tests). False when malformed or when it carries the coordinator's "error".
bool ParseCommInfo(const std::string& json, CoordCommInfo* out, std::string* error);

}  // namespace prism::interpose
