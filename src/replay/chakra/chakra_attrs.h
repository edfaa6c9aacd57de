// Attribute names. Chakra's own (read by ASTRA-sim's feeder, with the value kinds it reads) and Prism's
// round-trip attributes, which ASTRA-sim keeps as "other attributes" and ignores. docs/chakra.md lists them.
#pragma once

#include <cstdint>

namespace prism::chakra {

// What comm_size of an ALL_GATHER node counts. ASTRA-sim's collectives read it as each rank's input (its ring
// sends comm_size per step and gathers comm_size x ranks: Ring::Ring in astra-sim/system/astraccl/
// native_collectives/collective_algorithm/Ring.cc); Prism's `bytes` is nccl-tests' S, the whole output.
// kOutput is for writers that put S there. The other collectives read the same under both (docs/chakra.md).
enum class AllGatherCommSize : uint8_t { kInput = 1, kOutput };

// Chakra node attributes (value kind ASTRA-sim reads).
inline constexpr const char* kAttrCommType = "comm_type";  // int64_val: CollectiveCommType
inline constexpr const char* kAttrCommSize = "comm_size";  // int64_val: bytes
inline constexpr const char* kAttrCommSrc = "comm_src";    // int32_val: global rank
inline constexpr const char* kAttrCommDst = "comm_dst";    // int32_val: global rank
inline constexpr const char* kAttrCommTag = "comm_tag";    // int32_val
inline constexpr const char* kAttrPgName = "pg_name";      // string_val: key of the comm_group JSON
inline constexpr const char* kAttrIsCpuOp = "is_cpu_op";   // bool_val

// Prism's node attributes: what a Chakra node cannot say, so that export then import gives the graph back.
inline constexpr const char* kAttrStream = "prism_stream";  // string_val: the Prism stream
inline constexpr const char* kAttrSlot = "prism_slot";      // string_val: the class's comm slot name
inline constexpr const char* kAttrIter = "prism_iter";      // int64_val: iteration (absent: 0)
inline constexpr const char* kAttrDtype = "prism_dtype";    // string_val: f32, bf16, ... (absent: u8)
inline constexpr const char* kAttrRoot = "prism_root";      // int32_val: broadcast/reduce root, comm rank
inline constexpr const char* kAttrDurUs = "prism_dur_us";   // double_val: exact dur_us (fractional, or 0 on comm)
// int64_val: Prism's bytes (S) of an all-gather whose S is not comm_size x ranks (written only then).
inline constexpr const char* kAttrBytes = "prism_bytes";

// Prism's GlobalMetadata attributes (string_val).
inline constexpr const char* kAttrClass = "prism_class";        // role class name; marks a file Prism wrote
inline constexpr const char* kAttrLayout = "prism_layout";      // JSON: the trace's layout
inline constexpr const char* kAttrTopology = "prism_topology";  // the trace's topology string
inline constexpr const char* kAttrComms = "prism_comms";        // JSON {"<pg_name>": "<desc>"} of this rank
inline constexpr const char* kAttrSendCompletion = "prism_send_completion";  // the trace's send_completion

// What GlobalMetadata.version says in files we write: the Chakra schema version these files follow.
inline constexpr const char* kEtVersion = "0.0.4";

}  // namespace prism::chakra
