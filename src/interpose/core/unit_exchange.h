// Real data between real members of a communicator (PRISM_EXCHANGE, docs/payload.md "Exchange"): a unit's inputs
// go to the host, to the coordinator, and its outputs come back into the receive buffers, host-synchronously, before
// the unit's gate. Sends complete when the coordinator acknowledges them (PRISM_SEND_RENDEZVOUS).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

#include "interpose/core/gpu.h"
#include "interpose/core/unit_run.h"
#include "nccl_patch/exchange.h"

namespace prism::interpose {

// Whether an operation of `comm` with data can move real data between real members (PRISM_EXCHANGE).
bool RealDataOn(const Comm* comm, uint64_t count);

// Whether an operation moves real data through the coordinator: a collective of a communicator with several real
// members, or a p2p whose peer is real (docs/payload.md "Exchange"); never a copy to the rank itself (IsSelf).
XKind ExchangeKindOf(const OpCall& c);

// The exchange's description of a prepared operation.
payload::ExchangeOp ExchangeOpOf(const Prepared& p);

// Waits for the coordinator's acknowledgement of every exchanged send posted so far (t.send_done): NCCL's
// rendezvous, a send completes once its receive is posted.
void WaitSendsDone(ThreadState& t);

// The exchange part of a unit (host-synchronous): inputs to the host, to the coordinator, outputs back into the
// receive buffers. The arrival stamp is already on the stream. Returns the first CUDA error, CUDA_SUCCESS else;
// an operation whose output no real data defines keeps `local` (its planned steps run afterwards).
CUresult RunExchange(ThreadState& t, Gpu& gpu, CUstream stream, std::vector<Prepared>& prep);

}  // namespace prism::interpose
