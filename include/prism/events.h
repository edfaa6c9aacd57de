// Per-rank event files: what a real rank's shim writes as it runs, so nothing measured is lost if the rank
// or the run dies. One JSON object per line in $PRISM_OUT_DIR/rank<R>.events.jsonl (schema version 1),
// appended by a background thread (never from the hot path, never through CUDA).
//
// Lines (key "type"):
//   hello  {type, v, rank, world_size, local_rank, pid, host, gpu, t_ns}
//   comm   {type, comm_id, key, desc, nranks, rank, members:[global ranks] (if known)}
//   op     {type, comm_id, seq, op, dtype, bytes, peer, arrival_ns, release_ns, model_dur_ns, wait_on_rank,
//           algo, proto, nops, root, stream, sseq, exchanged, cost[, opened_ns, ops, ops_truncated]}
//           opened_ns (gated units; absent for units without a gate and in files of older libprism builds): when
//           the gate opened, GPU clock (the host time the gate word was written, converted, plus the gate's release
//           latency); later than release_ns by the time the release came late (the coordinator's decision latency)
//           nops: operations fused in the unit (a group); root: of a rooted op (-1 otherwise); stream: process-local index of the CUDA stream (order of
//           first use); sseq: the unit's position among its stream's units; exchanged: operations of the unit whose
//           output came from other real members' data; ops (nops > 1): the unit's operations in issue order, at most
//           16, [{op, dtype, bytes, peer, root, comm_id, seq}] (peer/root communicator ranks, -1 if none);
//           seq -1: a send or receive to the rank itself, a local copy that takes no sequence number (the op line's
//           seq is its first numbered operation's; -1 when the unit holds only such copies);
//           ops_truncated: 1 when the list is incomplete (more than 16 operations, or lost before the line was written)
//   wait   {type, stream, next, on, after}: the stream's unit `next` (and the work before it, after its previous
//           unit) waits for unit `after` of stream `on` (cudaEventRecord on `on`, cudaStreamWaitEvent on `stream`)
//   iter   {type, iteration, t_ns, dur_ns, peak_bytes, torch_max_allocated}
//   mem    {type, t_ns, current_bytes, peak_bytes}
//   error  {type, what}
//   bye    {type, t_ns, peak_bytes, recorded?, host_ns?, host_phase_mean_ns?, host_phase_driver_mean_ns?}
//           host_ns {units, p50, p90, own_p50, own_p90, wakes}: libprism's host time per executed unit (ns; one
//           unit in 8 sampled, its timing's clock reads included; own_*: less its CUDA driver calls; wakes: futex
//           wakes of the progress thread that pushes issued), present when a unit was sampled;
//           host_phase_mean_ns {enter, plan, steps, time, gate, describe, push, count, driver, sampled}: the
//           sampled units' mean own time by phase of the unit, and in driver calls (ns);
//           host_phase_driver_mean_ns {enter, plan, steps, time, gate, describe, push, count}: the driver calls'
//           mean time by the phase that made them (enter: context and capture checks; steps: payload launches and
//           exchange copies; gate: the stream wait)
// Times are Unix-epoch nanoseconds (GPU %globaltimer where the event comes from the GPU).
#pragma once

#include <string>
#include <string_view>

namespace prism::events {

inline constexpr int kSchemaVersion = 1;

inline std::string FileName(int rank) { return "rank" + std::to_string(rank) + ".events.jsonl"; }

inline constexpr std::string_view kHello = "hello";
inline constexpr std::string_view kComm = "comm";
inline constexpr std::string_view kOp = "op";
inline constexpr std::string_view kIter = "iter";
inline constexpr std::string_view kMem = "mem";
inline constexpr std::string_view kError = "error";
inline constexpr std::string_view kBye = "bye";
inline constexpr std::string_view kWait = "wait";

}  // namespace prism::events
