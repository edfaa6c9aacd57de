// Host time libprism spends per unit (a collective outside a group, or a group end), measured on one unit in 8:
// a histogram of the whole, the same less the driver calls made within the unit, and the own time by phase of the
// unit. Read by the event file's bye line (host_ns, host_phase_mean_ns), prism_host_overhead_ns and the benches.
//
// Hot path: a unit that is not sampled pays one thread-local test per driver call and per phase mark.
#pragma once

#include <time.h>

#include <cstdint>

namespace prism::interpose {

// Host time per executed unit, in ns: the q-quantile (0.5 = median) of everything measured so far; 0 when nothing
// was measured.
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
// Counts one executed unit (sampled or not).
void CountUnit();
// Forgets every measurement and the unit count (prism_reset_stats: a bench measures one phase of its run).
void ResetUnitStats();

// Whether the unit about to run is sampled. Why sampled: the clock reads are themselves host overhead; one unit in
// 8 gives the same distribution.
bool SampleThisUnit();

// The sampled unit of this thread: the driver calls' share (every CUDA driver call it makes: stamp and payload
// launches, the gate's stream wait, copies and synchronisations, the context and capture checks) is kept apart
// because a launch blocks while the stream's queue is full, time the job's next launch would have spent anyway, so
// the unit's host time of a GPU-bound job is not all libprism's (docs/libprism.md "Cost on a real rank"); the
// phase split says which calls.
struct UnitSample {
  bool on = false;
  uint64_t driver_ns = 0;
  uint64_t phase_at = 0, phase_driver = 0;
  uint64_t phase_ns[kUnitPhases] = {};
  uint64_t phase_driver_ns[kUnitPhases] = {};
};
// Why constinit and hidden: no TLS wrapper call and the same access model as a file-local thread_local.
[[gnu::visibility("hidden")]] extern constinit thread_local UnitSample t_unit_sample;

inline uint64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Runs one driver call of the unit (`call` returns its result), timed when the unit is sampled.
template <typename F>
auto DriverCall(F&& call) {
  UnitSample& s = t_unit_sample;
  if (!s.on) return call();
  const uint64_t t0 = MonoNs();
  const auto r = call();
  s.driver_ns += MonoNs() - t0;
  return r;
}

// A sampled unit's own time by phase (UnitPhase): each PhaseMark charges the time since the last mark, less the
// driver calls made meanwhile, to its phase. Costs one clock read per mark, on sampled units only.
inline void PhaseMark(UnitPhase phase) {
  UnitSample& s = t_unit_sample;
  if (!s.on) return;
  const uint64_t now = MonoNs();
  const uint64_t spent = now - s.phase_at, driver = s.driver_ns - s.phase_driver;
  s.phase_ns[phase] += spent > driver ? spent - driver : 0;
  s.phase_driver_ns[phase] += driver;
  s.phase_at = now;
  s.phase_driver = s.driver_ns;
}

// Starts timing a sampled unit; returns its start (RecordOverhead's argument).
uint64_t StartSample();
// Ends a sampled unit that started at `t0` (StartSample): one clock read ends both its last phase and the whole.
void RecordOverhead(uint64_t t0);
// Drops the sample under way (a call that failed its checks).
inline void CancelSample() { t_unit_sample.on = false; }

}  // namespace prism::interpose
