// What every intercepted collective and p2p call does (the one internal function the thin exports call):
// validate as NCCL does, queue inside ncclGroupStart/End (a group's operations on one stream act as one unit),
// then per unit on the user's stream: an arrival stamp (GPU clock), the payload steps of each operation
// (src/nccl_patch/semantics.h), and a gate the progress thread opens when the unit completes at the target scale.
//
// Hot path: no heap allocation after warm-up (thread-local buffers keep their capacity), no lock except the
// communicator's own mutex around its p2p history.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>

#include "interpose/core/comm.h"
#include "nccl_patch/semantics.h"

namespace prism::interpose {

struct OpCall {
  payload::OpKind op = payload::OpKind::kInvalid;
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t redop = ncclSum;
  uint64_t count = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  int root = 0;
  int peer = 0;
  Comm* comm = nullptr;
  cudaStream_t stream = nullptr;
};

ncclResult_t Submit(const OpCall& call);
ncclResult_t GroupStart();
ncclResult_t GroupEnd();
ncclResult_t GroupSimulateEnd(ncclSimInfo_t* info);
int GroupDepth();

ncclResult_t RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t dtype,
                                  ncclScalarResidence_t residence, Comm* comm);
ncclResult_t RedOpDestroy(ncclRedOp_t op, Comm* comm);

// Cross-stream dependencies for the graph (event file "wait" lines): cudaEventRecord / cudaStreamWaitEvent as the job
// made them. Cheap (a mutex and a map entry). Dependencies pass through streams without units (torch's compute
// stream): a stream carries the points it waited for, an event recorded on it carries them on, and a unit stream
// that waits for such an event depends on every one of them (a pipeline receive issued after a forward pass depends
// on that pass's tensor-parallel all-reduces, through the compute stream).
void NoteEventRecord(cudaEvent_t event, cudaStream_t stream);
void NoteStreamWaitEvent(cudaStream_t stream, cudaEvent_t event);
// Forgets a destroyed event's points (the table would otherwise grow with every event torch creates).
void NoteEventDestroy(cudaEvent_t event);
size_t EventPointsForTest();  // events with points held

// Iteration mark from the Python hook: stamps the GPU clock on `stream` (iteration time is GPU time).
// Returns the iteration number.
int IterationMark(cudaStream_t stream, uint64_t torch_max_allocated);

// Host time spent inside libprism per executed unit (a collective outside a group, or a group end), in ns:
// the q-quantile (0.5 = median) of everything measured so far; 0 when nothing was measured.
uint64_t HostOverheadQuantileNs(double q);
// The same less the time spent in driver calls (launches, stream waits, copies) within the unit.
uint64_t HostOwnQuantileNs(double q);
// Where a unit's own time goes, by phase of RunUnit (means over the sampled units; driver calls taken out):
// enter (validation, set-up checks, and the return), plan, steps (slot, exchange, recordings, payload launches),
// time (duration), gate (stamp and gate enqueue), describe (the unit's event), push (to the progress thread,
// its wake-up included), count (every 64 units, the clock re-measure: a probe at most once a second).
enum UnitPhase { kPhaseEnter, kPhasePlan, kPhaseSteps, kPhaseTime, kPhaseGate, kPhaseDescribe, kPhasePush,
                 kPhaseCount, kUnitPhases };
inline constexpr const char* kUnitPhaseNames[kUnitPhases] = {"enter", "plan", "steps", "time",
                                                             "gate", "describe", "push", "count"};
struct UnitPhaseMeans {
  uint64_t sampled = 0;
  uint64_t own_ns[kUnitPhases] = {};
  uint64_t driver_by_phase_ns[kUnitPhases] = {};  // the driver calls' time by phase (steps: payload launches, ...)
  uint64_t driver_ns = 0;  // the sum of driver_by_phase_ns
};
UnitPhaseMeans HostPhaseMeansNs();
uint64_t UnitsExecuted();
void ResetStatsForTest();

}  // namespace prism::interpose
