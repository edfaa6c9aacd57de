#include "interpose/core/clock_model.h"

#include <cmath>

namespace prism::interpose {

void ClockModel::Reset(uint64_t host_ns, int64_t offset_ns) {
  count_ = next_ = 0;
  Add(host_ns, offset_ns);
}

void ClockModel::Add(uint64_t host_ns, int64_t offset_ns) {
  ring_[next_] = {host_ns, offset_ns};
  next_ = (next_ + 1) % kRing;
  if (count_ < kRing) ++count_;
  // The rate from the oldest probe kept to this one; the base is this probe itself, so a good probe always wins
  // over the extrapolation.
  const Probe& oldest = ring_[count_ < kRing ? 0 : next_];
  double rate = 0;
  if (host_ns > oldest.host_ns && host_ns - oldest.host_ns >= kMinSpanNs) {
    rate = static_cast<double>(offset_ns - oldest.offset_ns) / static_cast<double>(host_ns - oldest.host_ns);
    if (std::fabs(rate) * 1e6 > kMaxRatePpm) rate = RatePpm() * 1e-6;  // keep the last sane one
  } else {
    rate = RatePpm() * 1e-6;
  }
  Publish(host_ns, offset_ns, rate);
}

void ClockModel::Publish(uint64_t host_ns, int64_t offset_ns, double rate) {
  const uint32_t s = seq_.load(std::memory_order_relaxed);
  seq_.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  base_host_ns_.store(host_ns, std::memory_order_relaxed);
  base_offset_ns_.store(offset_ns, std::memory_order_relaxed);
  rate_.store(rate, std::memory_order_relaxed);
  seq_.store(s + 2, std::memory_order_release);
}

int64_t ClockModel::OffsetAt(uint64_t host_ns) const {
  for (;;) {
    const uint32_t s0 = seq_.load(std::memory_order_acquire);
    if (s0 & 1u) continue;
    const uint64_t t = base_host_ns_.load(std::memory_order_relaxed);
    const int64_t off = base_offset_ns_.load(std::memory_order_relaxed);
    const double rate = rate_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq_.load(std::memory_order_relaxed) != s0) continue;
    // Why only forward: before the last probe its own value is the best there is (callers ask about "now").
    if (host_ns <= t) return off;
    return off + static_cast<int64_t>(std::llround(rate * static_cast<double>(host_ns - t)));
  }
}

double ClockModel::RatePpm() const { return rate_.load(std::memory_order_relaxed) * 1e6; }

}  // namespace prism::interpose
