// The GPU-host clock offset (%globaltimer - CLOCK_REALTIME) as a line through libprism's probes of it.
//
// Why a line and not the last probe: the two clocks drift apart at a steady rate (9.1 us/s between the first
// calibrations of successive processes on the H200), and a probe needs a free SM within 0.2 ms, which a GPU-bound job
// can deny for minutes. A stale offset opens every timed gate late by the drift while logging it on time, so the
// lateness is counted as the rank's compute (docs/fill.md "Rounds and noise"). Between probes the offset follows
// the drift rate measured over the last probes that lie at least kMinSpanNs apart; with fewer, it stays the last
// probe's.
#pragma once

#include <atomic>
#include <cstdint>

namespace prism::interpose {

class ClockModel {
 public:
  static constexpr uint64_t kMinSpanNs = 5000000000ull;  // a rate from probes closer than this is probe noise
  static constexpr double kMaxRatePpm = 100;              // beyond this a rate is a bad probe, not a drift
  static constexpr int kRing = 32;                         // probes the rate is taken over (oldest to newest)

  // One good probe at host time `host_ns`. Single writer (the caller serialises Add and Reset).
  void Add(uint64_t host_ns, int64_t offset_ns);
  // Forgets every probe, then takes this one as the first.
  void Reset(uint64_t host_ns, int64_t offset_ns);
  // The offset at host time `host_ns` (any thread, lock-free).
  int64_t OffsetAt(uint64_t host_ns) const;
  // The drift in us per second (ppm) the model extrapolates with now; 0 until two probes kMinSpanNs apart.
  double RatePpm() const;

 private:
  void Publish(uint64_t host_ns, int64_t offset_ns, double rate);

  struct Probe {
    uint64_t host_ns;
    int64_t offset_ns;
  };
  Probe ring_[kRing] = {};
  int count_ = 0, next_ = 0;  // writer's state

  // What readers see, under a sequence lock: odd while the writer is between its stores.
  std::atomic<uint32_t> seq_{0};
  std::atomic<uint64_t> base_host_ns_{0};
  std::atomic<int64_t> base_offset_ns_{0};
  std::atomic<double> rate_{0};  // ns of offset per ns of host time
};

}  // namespace prism::interpose
