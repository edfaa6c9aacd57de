// One unit: the operations of one stream that complete together (a collective outside a group, or a group's
// operations on one stream). RunUnit plans each operation's payload steps, moves real data between real members
// (unit_exchange.h) or replays recorded payloads, launches the steps, times the unit at the target scale, enqueues
// its arrival stamp and gate on the user's stream, and hands it to the progress thread (progress.h).
//
// Hot path: no heap allocation after warm-up (the thread's buffers, ThreadState, keep their capacity), no lock
// except the communicator's own mutex around its p2p history.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "interpose/core/operation.h"
#include "interpose/core/progress.h"
#include "nccl_patch/semantics.h"

namespace prism::interpose {

// How an operation of a unit moves real data through the coordinator (unit_exchange.h), if it does.
enum class XKind : uint8_t { kNone, kColl, kSend, kRecv };

// One operation of a unit, ready to run.
struct Prepared {
  OpCall call;
  payload::OpDesc desc;
  payload::StepList steps;
  uint64_t bytes = 0;
  uint64_t seq = 0;
  XKind xkind = XKind::kNone;  // moves real data through the coordinator (exchange)
  bool local = true;           // its planned steps run (false when real data wrote its output)
};

// A send of the unit being run: (comm, peer, bytes) -> buffer.
struct UnitSend {
  const Comm* comm;
  int32_t peer;
  uint64_t bytes;
  uint32_t index;  // posting order: the latest matching send wins
  uint64_t addr;
  bool operator<(const UnitSend& o) const {
    if (comm != o.comm) return comm < o.comm;
    if (peer != o.peer) return peer < o.peer;
    if (bytes != o.bytes) return bytes < o.bytes;
    return index < o.index;
  }
  bool SameKey(const UnitSend& o) const { return comm == o.comm && peer == o.peer && bytes == o.bytes; }
};

// The calling thread's state: its group nesting and queued operations (submit.cc), and the buffers units reuse
// from unit to unit.
struct ThreadState {
  int depth = 0;
  std::vector<bool> real_level;  // per nesting level: its ncclGroupStart went to the real NCCL too (passthrough)
  // Passthrough operations of the open group to time at its end (issue order, with their sequence numbers).
  std::vector<std::pair<OpCall, uint64_t>> real_group;
  std::vector<OpCall> group;
  std::vector<Prepared> prepared;
  std::vector<OpCall> scratch;
  std::vector<UnitSend> sends;
  std::vector<UnitSend> sends_by_size;  // the same, ordered by (comm, bytes)
  std::vector<uint8_t> done;
  // Sends of a group's units waiting for the coordinator's acknowledgement (comm id, key, destination): GroupEnd
  // waits for them after every unit was posted, so a group spanning streams does not wait on its own receives.
  bool defer_send_done = false;
  std::vector<std::tuple<uint32_t, uint64_t, int32_t>> send_done;
  // Units of the open group with an exchanged send under PRISM_SEND_RENDEZVOUS=1: handed to the progress thread only
  // after GroupEnd got their sends' acknowledgements. Why: released earlier, the gate would open and the unit's
  // kOpRecord tell the coordinator the send completed while this thread still waits for its receive, which took the
  // wait off the hang diagnosis (torch's dist.send is a group of one: a both-send-first deadlock went unreported).
  std::vector<GateUnit> held_units;
  ThreadState() {
    group.reserve(4096);
    prepared.reserve(4096);
    scratch.reserve(4096);
    sends.reserve(4096);
    sends_by_size.reserve(4096);
    done.reserve(4096);
    held_units.reserve(64);
  }
};

// Runs one unit of `n` operations of one stream on thread state `t`.
ncclResult_t RunUnit(ThreadState& t, const OpCall* ops, size_t n);

// Hands a unit to the progress thread (its gate opens and it is logged when it is released).
void PushUnit(const GateUnit& u);

}  // namespace prism::interpose
