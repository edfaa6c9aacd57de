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
// rank<R>.kernels.jsonl: one ~100-byte line per kernel, copy or marker CUPTI recorded (a long run: a few 100 MB).
inline constexpr uint64_t kMaxKernelFileBytes = uint64_t{4} << 30;
// A --topology file: the presets are under 1 KiB.
inline constexpr uint64_t kMaxTopologyFileBytes = uint64_t{16} << 20;

// Recorded payloads larger than this are neither recorded nor replayed (PRISM_PAYLOAD_MAX_BYTES, --payload-max-bytes;
// 0: all). Why here: the launcher keys the graph cache on the size libprism will use, default included.
inline constexpr uint64_t kDefaultPayloadMaxBytes = uint64_t{4} << 20;

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

// The coordinator's event bus, per client connection (docs/coordinator.md, the event bus's "Limits"). A client past
// one is dropped with a log line naming it; the others are served on.
// One frame (ipc::kMaxFrameBytes): a larger length drops the client as soon as its header arrives.
inline constexpr uint32_t kMaxBusFrameBytes = 16u << 20;
// Replies to the client's own requests (kHelloAck, kCommInfo, kError, ...) that it has not read yet, checked as each
// is queued. Why a cap: a 60-byte kCommInit is answered with its communicator's members (7 MB for a world of 2^20
// ranks), so a client that sends requests without reading could make the coordinator hold any amount.
inline constexpr uint64_t kMaxBusReplyBytes = uint64_t{256} << 20;
// Everything queued for the client, exchange results (kOpResult) included. Why this large: a result carries real
// members' outputs (a gradient bucket can be hundreds of MB), read by the shim's own reader thread.
inline constexpr uint64_t kMaxBusQueuedBytes = uint64_t{8} << 30;
// kCommInit requests of one client waiting for their communicator's id (bytes of their JSON text).
inline constexpr uint64_t kMaxBusParkedBytes = uint64_t{64} << 20;
// Nesting and values of one JSON message (checked before it is parsed: a kCommInit's members are ~1 value a rank).
inline constexpr int kMaxBusJsonDepth = 16;
inline constexpr uint64_t kMaxBusJsonValues = uint64_t{1} << 22;
// Real data between real members (src/coordinator/bus/exchange_hub.h): one operation's payload, and what the hub holds
// for one rank at once (inputs being assembled, posted and waiting for the other members, sends waiting for their
// receive). A result larger than kMaxBusQueuedBytes is refused (kExchangeError) before it is computed.
inline constexpr uint64_t kMaxExchangeBytes = uint64_t{64} << 30;
inline constexpr uint64_t kMaxExchangeHeldBytes = uint64_t{64} << 30;

}  // namespace prism::limits
