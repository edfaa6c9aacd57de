#include "interpose/core/unit_stats.h"

#include <algorithm>
#include <atomic>

#include "interpose/core/runtime.h"

namespace prism::interpose {

constinit thread_local UnitSample t_unit_sample;

namespace {

constexpr uint32_t kHistBucketNs = 25;
constexpr uint32_t kHistBuckets = 8000;  // up to 200 us; beyond goes in the last bucket

}  // namespace

struct UnitStats {
  std::atomic<uint64_t> hist[kHistBuckets] = {};      // host time per sampled unit
  std::atomic<uint64_t> own_hist[kHistBuckets] = {};  // the same less the time spent in driver calls
  std::atomic<uint64_t> units{0};
  // Sums over the sampled units of each phase's own time (driver calls taken out) and of its driver calls' time.
  std::atomic<uint64_t> phase_ns[kUnitPhases] = {};
  std::atomic<uint64_t> phase_driver_ns[kUnitPhases] = {};  // the driver calls' time, by the phase that made them
  std::atomic<uint64_t> sampled{0};
};

UnitStats* NewUnitStats() { return new UnitStats(); }
void DestroyPart(UnitStats* p) { delete p; }

namespace {

UnitStats& St() { return Rt().unit_stats(); }

uint64_t Quantile(const std::atomic<uint64_t>* hist, double q) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < kHistBuckets; ++i) total += hist[i].load(std::memory_order_relaxed);
  if (total == 0) return 0;
  uint64_t target = static_cast<uint64_t>(q * static_cast<double>(total - 1));
  uint64_t seen = 0;
  for (uint32_t i = 0; i < kHistBuckets; ++i) {
    seen += hist[i].load(std::memory_order_relaxed);
    if (seen > target) return static_cast<uint64_t>(i) * kHistBucketNs + kHistBucketNs / 2;
  }
  return static_cast<uint64_t>(kHistBuckets) * kHistBucketNs;
}

}  // namespace

// Why a hash of the count rather than every 8th: a fixed stride would fall in step with other per-unit strides (the
// clock re-measure every 64 units) and never sample, or always sample, the units they land on.
bool SampleThisUnit() {
  thread_local uint32_t n = 0;
  return ((n++ * 2654435761u) >> 29) == 0;  // the first unit is sampled
}

uint64_t StartSample() {
  UnitSample& s = t_unit_sample;
  s.on = true;
  s.driver_ns = 0;
  s.phase_driver = 0;
  for (uint64_t& v : s.phase_ns) v = 0;
  for (uint64_t& v : s.phase_driver_ns) v = 0;
  s.phase_at = MonoNs();
  return s.phase_at;
}

void RecordOverhead(uint64_t t0) {
  PhaseMark(kPhaseEnter);  // what is left after the last mark: the caller's return path
  UnitSample& s = t_unit_sample;
  const uint64_t ns = s.phase_at - t0;
  s.on = false;
  const uint64_t own = ns > s.driver_ns ? ns - s.driver_ns : 0;
  UnitStats& st = St();
  st.hist[std::min<uint64_t>(ns / kHistBucketNs, kHistBuckets - 1)].fetch_add(1, std::memory_order_relaxed);
  st.own_hist[std::min<uint64_t>(own / kHistBucketNs, kHistBuckets - 1)].fetch_add(1, std::memory_order_relaxed);
  for (int i = 0; i < kUnitPhases; ++i) {
    st.phase_ns[i].fetch_add(s.phase_ns[i], std::memory_order_relaxed);
    st.phase_driver_ns[i].fetch_add(s.phase_driver_ns[i], std::memory_order_relaxed);
  }
  st.sampled.fetch_add(1, std::memory_order_relaxed);
}

void CountUnit() { St().units.fetch_add(1, std::memory_order_relaxed); }

uint64_t HostOverheadQuantileNs(double q) { return Quantile(St().hist, q); }
uint64_t HostOwnQuantileNs(double q) { return Quantile(St().own_hist, q); }

UnitPhaseMeans HostPhaseMeansNs() {
  UnitPhaseMeans m;
  const UnitStats& st = St();
  m.sampled = st.sampled.load(std::memory_order_relaxed);
  if (m.sampled == 0) return m;
  for (int i = 0; i < kUnitPhases; ++i) {
    m.own_ns[i] = st.phase_ns[i].load(std::memory_order_relaxed) / m.sampled;
    m.driver_by_phase_ns[i] = st.phase_driver_ns[i].load(std::memory_order_relaxed) / m.sampled;
    m.driver_ns += m.driver_by_phase_ns[i];
  }
  return m;
}

uint64_t UnitsExecuted() { return St().units.load(); }

void ResetUnitStats() {
  for (auto& h : St().hist) h.store(0);
  for (auto& h : St().own_hist) h.store(0);
  for (auto& h : St().phase_ns) h.store(0);
  for (auto& h : St().phase_driver_ns) h.store(0);
  St().sampled.store(0);
  St().units.store(0);
}

}  // namespace prism::interpose
