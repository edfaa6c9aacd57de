// Bounds on what prism reads from files and flags. A value past one is refused with a message naming the file or
// field and the bound (never read whole, never an abort). Each format's doc repeats the bounds that apply to it
// (docs/trace-format.md, docs/cli.md, docs/chakra.md, docs/coordinator.md).
#pragma once

#include <cstdint>

namespace prism::limits {

// Ranks in one job: what the launcher plans (launcher/plan.cc) and every reader and flag accepts.
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;

// Input files are refused above these sizes before a byte is read. Why these: the largest graphs written so far
// (8192 ranks) are a few MB, a rank's event file grows ~200 bytes per operation; a parsed JSON document takes
// ~10x its text in memory, so 1 GiB of graph is already ~10 GiB of RAM.
inline constexpr uint64_t kMaxGraphFileBytes = uint64_t{1} << 30;       // PrismTrace (.prism, .prism.json)
inline constexpr uint64_t kMaxEventFileBytes = uint64_t{4} << 30;       // rank<R>.events.jsonl
inline constexpr uint64_t kMaxReportFileBytes = uint64_t{256} << 20;    // report.json, comm_group files
inline constexpr uint64_t kMaxChakraFileBytes = uint64_t{4} << 30;      // a Chakra ET file (uncompressed bytes)

// Nesting of arrays and objects in a JSON or CBOR document. Why 64: a PrismTrace nests 8 deep; the readers'
// recursion (nlohmann's CBOR reader, the DOM's destructor) overflows the stack at ~100k levels.
inline constexpr int kMaxDocumentDepth = 64;
// Values (numbers, strings, arrays, maps, map keys) in one graph document: a parsed value takes ~16-48 bytes.
inline constexpr uint64_t kMaxDocumentValues = uint64_t{1} << 27;

// A clock stamp in an event file (ns: the Unix epoch, or a GPU clock), ~146 years. Why bounded: durations are
// differences of two stamps, and these never overflow an int64.
inline constexpr int64_t kMaxTimestampNs = int64_t{1} << 62;

// Numeric fields of a graph: one node's duration, and its bytes (a 1 PiB message is already past any real one).
inline constexpr double kMaxDurationUs = 1e12;  // ~11.6 days
inline constexpr uint64_t kMaxBytes = uint64_t{1} << 50;

}  // namespace prism::limits
