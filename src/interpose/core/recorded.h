// Recorded payloads (policy `recorded`, docs/payload.md): what a rank received from real data in `collect`
// (exchange outputs: collectives with other real members, p2p from real peers), replayed later by a rank of the
// same class (a data-parallel replica of it) for operations whose other members are then virtual.
//
// File (one per recorded rank, payloads/rank<R>.bin): "PRSMPAY1" then records, each a RecordHeader followed by
// `bytes` bytes. An operation is named by (process-local communicator id, per-communicator sequence): the same
// program creates its communicators in the same order and issues the same operations on every replica.
#pragma once

#include <cstdint>
#include <string>

namespace prism::interpose {

inline constexpr char kPayloadMagic[8] = {'P', 'R', 'S', 'M', 'P', 'A', 'Y', '1'};

#pragma pack(push, 1)
struct RecordHeader {
  uint32_t comm_id;  // Comm::id of the recording process
  uint16_t op;       // payload::OpKind
  uint8_t dtype;     // payload::DataType
  uint8_t reserved;
  uint64_t seq;      // Comm::seq value of the operation
  uint64_t bytes;    // output bytes that follow
};
#pragma pack(pop)
static_assert(sizeof(RecordHeader) == 24);

// Payloads larger than PRISM_PAYLOAD_MAX_BYTES (default 4 MiB, 0: no limit) are neither recorded nor replayed: the
// control data a program branches on (Megatron's batch broadcast, loss and found-inf flags, grad norms) is small, while
// activations and gradient buckets are large, and copying them from the file to the GPU inside the operation would
// stretch every emulated collective by milliseconds (the medium model's recorded payloads: 18 GB over 10 iterations).

// Appends one record to PRISM_RECORD_PAYLOADS (no-op when unset or over the limit). Thread-safe; never throws.
void RecordPayload(uint32_t comm_id, uint64_t seq, uint16_t op, uint8_t dtype, const void* data, uint64_t bytes);

// The recorded output of (comm_id, seq) from PRISM_PAYLOAD_FILE, if it exists with this op, dtype and size:
// a host pointer valid for the life of the runtime (runtime.h); nullptr otherwise, or when over the limit (the caller applies
// mirror).
const void* FindRecorded(uint32_t comm_id, uint64_t seq, uint16_t op, uint8_t dtype, uint64_t bytes);

// Counters for the log and tests: records written, lookups answered, lookups missed, and payloads left out for the
// size limit (not recorded, or not replayed).
struct RecordedStats {
  uint64_t written = 0, hits = 0, misses = 0, mismatches = 0, over_limit = 0;
};
RecordedStats GetRecordedStats();

}  // namespace prism::interpose
