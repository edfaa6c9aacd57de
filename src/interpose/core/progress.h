// The progress thread: watches arrival stamps (Gpu::Arrival: an event query, or a word of host-mapped memory),
// computes when each gated unit completes at the target scale, and writes its gate word at that moment (minus the
// measured release latency). Its only CUDA calls are the event queries of event stamps. Units whose communicator has several real members get their release time from the coordinator
// (kOpArrive -> kOpRelease); all others take the local fast path: mirror arrivals, release = arrival + duration.
//
// Producers (the threads calling NCCL) hand units over through a bounded lock-free queue: no allocation and no
// lock on the hot path. The thread spins only while a release is near; otherwise it sleeps (timer slack 1 ns)
// or, with nothing pending, blocks on a futex until a push wakes it.
#pragma once

#include <cstdint>

#include "interpose/core/event_log.h"

namespace prism::interpose {

struct GateUnit {
  uint32_t slot = 0;
  uint32_t ticket = 0;
  uint64_t dur_ns = 0;
  int64_t release_lat_ns = 0;   // measured latency of this gate kind: the word is written that much early
  bool no_gate = false;         // PRISM_GATE=none or capture: only record, release at arrival
  bool via_coordinator = false;
  uint32_t coord_comm_id = 0;
  uint32_t comm_ops = 1;        // operations of the unit on its first communicator (ipc.h OpArrive::nops)
  // A passthrough unit (real NCCL, comm.h): its release is the GPU stamp Arrival(end_slot), made on the
  // stream after the real operations; UINT32_MAX for every emulated unit.
  uint32_t end_slot = UINT32_MAX;
  // PRISM_GATE_OPEN_STAMPS: the slot whose arrival word the stream stamps right after the gate; the unit is logged
  // once that stamp landed (event.gate_open_ns). UINT32_MAX: none.
  uint32_t open_slot = UINT32_MAX;
  OpEvent event;                // filled with comm/op/bytes; arrival/release set by the thread
};

// Starts the thread on first use (idempotent).
void ProgressStart();
// Hands a unit over. False when the queue is full (the caller then opens the gate itself after logging).
bool ProgressPush(const GateUnit& unit);
// Futex wakes the pushes issued (a system call on the pushing thread each): pushes that found the thread blocked, or
// about to block.
uint64_t ProgressWakes();
// Units handed over and not yet released.
uint64_t ProgressPending();
// Blocks until every unit handed over so far is released (tests, shutdown); false on timeout.
bool ProgressDrain(uint64_t timeout_ns);
// Ticket source (monotonic, never 0).
uint32_t NextTicket();
// Slots for gated units (the last few gate slots are reserved for calibration).
uint32_t NextSlot();

}  // namespace prism::interpose
