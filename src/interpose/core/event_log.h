// The rank's event stream: $PRISM_OUT_DIR/rank<R>.events.jsonl (include/prism/events.h), appended by one
// background thread so that nothing measured is lost if the run dies. Producers (the progress thread, the
// iteration hook, communicator creation) only queue records; no CUDA is ever called from here.
//
// A later "comm" line for the same comm_id supersedes an earlier one (members can become known after creation,
// when the Python hook registers the group).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace prism::interpose {

// Operations of one unit listed on its op line ("ops", docs/collect.md); a longer unit lists its first ones and says
// "ops_truncated".
inline constexpr size_t kMaxUnitOps = 16;

// The sequence number of a send or receive to the rank itself: a local copy, which takes none (operation.h IsSelf).
// Written as -1 ("seq" of an op line of only such copies, and of their "ops" entries).
inline constexpr uint64_t kNoSeq = UINT64_MAX;

// One operation of a unit of several (the op line's "ops" entry).
struct UnitOpEvent {
  uint32_t comm_id = 0;  // process-local communicator id
  uint64_t seq = 0;      // its sequence number on that communicator (kNoSeq: a copy to the rank itself)
  uint8_t op = 0;        // payload::OpKind
  uint8_t dtype = 0;     // ncclDataType_t
  uint64_t bytes = 0;
  int32_t peer = -1;     // communicator rank (send/recv), -1 otherwise
  int32_t root = -1;     // communicator rank (rooted collectives), -1 otherwise
};

struct OpEvent {
  uint32_t comm_id = 0;       // process-local communicator id (the event file's)
  uint32_t coord_comm_id = 0; // the coordinator's id of that communicator (kOpRecord's comm_id), 0 when none
  uint64_t seq = 0;           // of the unit's first numbered operation; kNoSeq: the unit holds only copies to itself
  uint8_t op = 0;       // payload::OpKind; 0xff = a group of several kinds
  uint8_t dtype = 0;    // payload::DataType
  uint8_t algo = 0;     // cost model NcclAlgo + 1 (0 unknown)
  uint8_t proto = 0;
  uint8_t source = 0;   // CostSource
  uint16_t nops = 1;    // operations fused in this unit (a group)
  uint16_t stream = 0;  // process-local index of the CUDA stream (0 = the first stream a collective used)
  uint16_t exchanged = 0;  // operations of the unit whose output came from real data (other real members)
  uint32_t stream_seq = 0;  // this unit's position among the units of its stream (0-based; "wait" lines name it)
  bool passthrough = false;  // ran on the real NCCL: arrival and release are the GPU stamps around it
  uint64_t bytes = 0;
  int32_t peer = -1;
  int32_t root = -1;    // broadcast/reduce/gather/scatter root in communicator ranks (a unit of one operation)
  uint64_t arrival_ns = 0;
  uint64_t release_ns = 0;
  uint64_t model_dur_ns = 0;
  int32_t wait_on_rank = -1;
  // A gated unit: when its gate opened, on the GPU clock: the host time the progress thread wrote the gate word
  // plus the gate's release latency (when the stream is to pass it). Later than release_ns when the release came
  // late (the coordinator's decision under --graph); 0 for a unit without a gate (not written).
  uint64_t opened_ns = 0;
  // PRISM_GATE_OPEN_STAMPS=1 (gate diagnosis, docs/libprism.md): when the progress thread wrote the gate word, on
  // the GPU clock, and when the stream passed the gate (a stamp after it); 0 otherwise.
  uint64_t gate_written_ns = 0;
  uint64_t gate_open_ns = 0;
  // A unit of several operations: where ReserveUnitOps put their list (kept aside so that the event stays small;
  // ops_n entries from ops_at, fewer than nops when the unit had more than kMaxUnitOps). ops_n 0: no list.
  uint64_t ops_at = 0;
  uint8_t ops_n = 0;
};

struct CommEvent {
  uint32_t comm_id = 0;
  std::string key;
  std::string desc;
  std::string name;
  int nranks = 0;
  int rank = 0;
  std::vector<int32_t> members;
  int real_members = 1;
  std::string origin;  // init | split | shrink | initall
};

// Starts the writer thread and writes the hello line (no-op when PRISM_OUT_DIR is unset). Idempotent.
void EventLogStart();
void LogComm(const CommEvent& e);
void LogOp(const OpEvent& e);
// The operation list of a unit of `n` operations (n > 1; nothing otherwise): ReserveUnitOps sets e->ops_at/ops_n,
// then SetUnitOp fills entry i < e->ops_n, before the event is handed on. No allocation per unit: the lists live in
// one ring, and a list overwritten before its line was written (a unit kept longer than the ring's turn) is written
// as "ops_truncated" without entries.
void ReserveUnitOps(OpEvent* e, size_t n);
void SetUnitOp(const OpEvent& e, size_t i, const UnitOpEvent& op);
// An iteration mark whose GPU time arrives later in the host-mapped word `stamp` (nullptr: use host time), stamped
// on the stream of index `stream` (op lines' "stream"; -1: a stream that carried no unit). The graph builder keeps
// the work before the mark on that stream (docs/trace-format.md "Event files").
void LogIteration(uint32_t iteration, volatile uint64_t* stamp, uint64_t host_ns, uint64_t torch_max_allocated,
                  int stream = -1);
void LogError(const std::string& what);
// A cross-stream dependency (docs/trace-format.md, event file "wait"): the unit `next` of stream `stream` and all the
// work before it on that stream wait for unit `after` of stream `on` (cudaEventRecord on `on`, cudaStreamWaitEvent on
// `stream`).
void LogWait(uint16_t stream, uint32_t next, uint16_t on, uint32_t after);
// Flushes, writes the bye line and stops the thread (at exit).
void EventLogStop();
// Path of the event file ("" when none).
std::string EventLogPath();

// JSON string escaping (tests).
std::string JsonEscape(const std::string& s);

}  // namespace prism::interpose
