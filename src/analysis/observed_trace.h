// The observed ("bare") PrismTrace of a job, built from the event files its real ranks wrote
// (rank<R>.events.jsonl, include/prism/events.h): what `prism-run collect` outputs (issue 7), what emulate writes
// next to its report (issue 6), and what `prism-run graph build DIR` makes by hand. docs/collect.md has the model.
//
// Per real rank and per CUDA stream (the op lines' "stream"; one stream when the shim did not write it): the
// communication operations in stream order, with one compute node for every gap between two of them (its duration
// the GPU time from the end of one (its release, or its gate's opening when that came later: ObservedOp::opened_ns)
// to the arrival of the next, split at iteration marks), every collective
// and point-to-point operation (comm slot, op, bytes, dtype, root, peer), and iteration tags from the "iter"
// lines. A fused unit (ncclGroup, "nops" > 1) becomes one node per operation: collectives one after the other,
// point-to-point operations side by side on helper streams joined by `after` edges (they progress together in
// NCCL; in sequence a send/recv exchange between two ranks would deadlock).
//
// Classes: ranks with the same coordinates except the data-parallel ones (tp, cp, pp, gtp, etp, ep, egtp of
// world::Coords) are one class, whose nodes come from a real rank with those coordinates. An expert-parallel class
// with no real rank (collect without --real-routing: Megatron carves ep out of dp, so replica 0 holds ep 0 only)
// takes the nodes of the real rank that differs from it only in ep (EP symmetry assumed, a warning says so; see
// ObservedTraceOptions::mirror_expert_classes); its ranks still bind their own communicators. Every rank of the world
// gets its class and its communicators: a Megatron group's members from the layout (world::World), the world
// communicator, or, for any other communicator, the real one's members moved to the rank's data-parallel
// replica. Not recorded yet: cross-stream dependencies (event record/wait between streams), per-kernel compute.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/world.h"
#include "prism/trace.h"

namespace prism::analysis {

// One operation of a fused unit, as the op line's "ops" array lists it (when the shim writes it).
struct ObservedSubOp {
  std::string op;       // allreduce, ..., send, recv
  std::string dtype;
  uint64_t bytes = 0;
  int32_t peer = -1;    // communicator rank (send/recv)
  int32_t root = -1;    // communicator rank (broadcast/reduce)
  int64_t comm_id = -1;
  int64_t seq = -1;     // -1: a send or receive to the rank itself, a local copy libprism does not number
};

// One "op" line: a unit of one or more operations on one stream that complete together.
struct ObservedOp {
  int64_t comm_id = -1;
  int64_t seq = -1;  // of its first numbered operation; -1: the unit holds only copies to the rank itself
  std::string op;  // "group" when the unit mixes kinds
  std::string dtype;
  uint64_t bytes = 0;  // the whole unit's
  int32_t peer = -1;
  int32_t root = -1;
  int64_t arrival_ns = 0;
  int64_t release_ns = 0;
  // When the gate opened (GPU clock); 0: not recorded (files before the field, units without a gate). Later than
  // release_ns when the release time was decided after it had passed (the coordinator's decision latency): the
  // unit then ends at opened_ns.
  int64_t opened_ns = 0;
  int32_t stream = -1;  // -1: not recorded
  int64_t sseq = -1;    // position among the stream's units; -1: not recorded
  bool passthrough = false;  // ran on the real NCCL: arrival/release are GPU stamps around the real operation
  int32_t nops = 1;
  std::vector<ObservedSubOp> ops;  // empty unless the line lists them
  bool ops_truncated = false;      // the line said its list was incomplete ("ops_truncated"): not used
  int64_t line = 0;                // line number in the event file (messages)
};

struct ObservedComm {
  int64_t id = -1;
  std::string key, desc, name;
  int nranks = 0;
  int rank = -1;               // this rank's communicator rank
  std::vector<int> members;    // global ranks in communicator-rank order; empty when unknown
};

// A cross-stream dependency ("wait" line): unit `next` of stream `stream` waits for unit `after` of stream `on`.
struct ObservedWait {
  int32_t stream = -1;
  int64_t next = -1;
  int32_t on = -1;
  int64_t after = -1;
};

struct ObservedMark {
  int64_t iteration = 0;
  int64_t t_ns = 0;    // end of the iteration
  int32_t stream = 0;  // stream the mark was stamped on (-1: none of the op lines' streams; files before the field
                       // was written: 0, the stream of the job's first collective, torch's current stream)
};

// What one rank's event file says, as far as the graph needs it.
struct RankEventLog {
  int rank = -1;
  int world_size = 0;  // from the hello line; 0 when absent
  std::map<int64_t, ObservedComm> comms;  // by comm_id; a later line supersedes (members only when it has them)
  std::vector<ObservedOp> ops;            // file order
  std::vector<ObservedMark> marks;        // file order
  std::vector<ObservedWait> waits;        // file order
  int malformed = 0;
  std::string first_malformed;
};

// Feeds one line of rank `log->rank`'s event file. Malformed lines are counted, never fatal.
void FeedEventLine(RankEventLog* log, std::string_view line, int64_t line_no);
// Reads a whole event file. False with *error when it cannot be opened.
bool ReadRankEventLog(const std::string& path, int rank, RankEventLog* out, std::string* error);

enum class StreamFallback {
  kOne,      // every operation on one stream (what the brief of the shim asked for when "stream" is absent)
  kPerComm,  // one stream per communicator (what torch does: each process group has its own NCCL stream)
};

struct ObservedTraceOptions {
  std::vector<int> ranks;          // event files to read (dir form); empty: every rank<R>.events.jsonl in the dir
  int64_t skip_iterations = 0;     // drop the first K complete iterations (warm-up, set-up collectives)
  int64_t max_iterations = 0;      // keep at most this many after those (0: all complete ones)
  StreamFallback stream_fallback = StreamFallback::kOne;  // for op lines without "stream"
  std::string topology;            // written into the trace (preset name or topology JSON); "" none
  bool validate = true;            // run replay::ValidateTrace and fail on its errors
  // An expert-parallel class without events takes the nodes of the class with events that differs from it only in
  // ep (the lowest such ep, ep 0 for collect's replica 0): mirrored MoE routing, every expert-parallel rank assumed
  // to route like that one. Its ranks bind their own groups (their own EP, expert-DP, ... communicators). false: such
  // a class is missing, an error as for any other.
  bool mirror_expert_classes = true;
};

struct ObservedTrace {
  trace::Trace trace;
  std::vector<std::string> warnings;
  std::vector<int> class_ranks;    // per class: the real rank its nodes come from
  // Classes whose nodes are another ep coordinate's (mirror_expert_classes): class_ranks names the rank they come
  // from, which is not of their class. Ascending.
  std::vector<uint32_t> mirrored_classes;
  std::vector<int> unused_ranks;   // real ranks whose events were not needed (another rank of their class was used)
  int64_t first_iteration = -1;    // iterations kept (marks' numbers); -1 when the files had no marks
  int64_t last_iteration = -1;
  size_t nodes = 0;                // over all classes
  size_t dropped_ops = 0;          // op lines outside the kept iterations
  size_t wait_edges = 0;           // "wait" lines turned into cross-stream `after` edges
  size_t recorded_comm = 0;        // comm nodes timed from passthrough operations (prism-run record)
  size_t waits_skipped = 0;        // "wait" lines naming a unit outside the kept iterations (or out of time order)
  // Per rank whose nodes were used (class_ranks), per kept iteration: the time its gates opened after their release
  // (op lines' opened_ns - max(release_ns, arrival_ns) where positive; mostly the coordinator's decision latency
  // under --graph), counted in the communication nodes, not in the compute after them. Only ranks and iterations
  // with op lines carrying opened_ns; empty for files written before the field.
  std::map<int, std::map<int64_t, int64_t>> coordinator_latency_ns;
};

// Builds the observed trace from parsed logs (at most one per rank). nullopt with *error when the logs do not
// cover every class (the message names the missing coordinates), an operation cannot be represented, or (with
// options.validate) the result fails validation.
std::optional<ObservedTrace> BuildObservedTrace(const std::vector<RankEventLog>& logs, const world::World& world,
                                                const ObservedTraceOptions& options, std::string* error);
// Reads the event files in `dir` (options.ranks, or every rank<R>.events.jsonl) and builds.
std::optional<ObservedTrace> BuildObservedTrace(const std::string& dir, const world::World& world,
                                                const ObservedTraceOptions& options, std::string* error);

// Whether `ranks` hold one rank of every class of `world`; *covered and *classes (optional) count them.
bool CoversEveryClass(const world::World& world, const std::vector<int>& ranks, size_t* covered = nullptr,
                      size_t* classes = nullptr);

// Whether `ranks` cover every class once an expert-parallel class may take the nodes of a rank that differs from it
// only in ep (ObservedTraceOptions::mirror_expert_classes); *mirrored (optional) counts the classes that would.
bool CoversEveryClassOrEpStandIn(const world::World& world, const std::vector<int>& ranks, size_t* mirrored = nullptr);

// Whether ranks `a` and `b` are of one class (the same coordinates but the data-parallel ones).
bool SameClass(const world::World& world, int a, int b);

// What emulate does when a run ends: builds the observed trace of `real_ranks` from `dir` and writes
// dir/observed.prism. Returns one line for the terminal: where it went (naming the expert-parallel classes that
// repeat another ep coordinate's nodes, when some do), or why it was not written (the real ranks do not cover every
// class, or the build failed; `prism-run graph build DIR` then gives the whole message).
std::string WriteObservedTrace(const std::string& dir, const world::World& world, const std::vector<int>& real_ranks);

// Ranks with an event file in `dir`, sorted.
std::vector<int> EventFileRanks(const std::string& dir);

// "tp=1 pp=0" for the class-defining coordinates of `rank` (dimensions of size 1 left out; "replica" when all
// are). For messages.
std::string ClassCoordinates(const world::World& world, int rank);

}  // namespace prism::analysis
