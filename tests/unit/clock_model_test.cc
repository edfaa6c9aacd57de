// libprism's GPU-host clock offset between probes (interpose/core/clock_model.h): it follows the drift the probes
// show, so that a GPU-bound job whose probes fail for a while does not open its timed gates late.
#include "interpose/core/clock_model.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>

namespace prism::interpose {
namespace {

constexpr uint64_t kS = 1000000000ull;
constexpr uint64_t kT0 = 1796288426ull * kS;  // a host time of the H200 run, in ns

// The H200's drift: 9.1 us of offset per second of host time.
int64_t Drifted(uint64_t t) { return 1819531 + std::llround(9.1e-6 * static_cast<double>(t - kT0)); }

TEST(ClockModel, OneProbeIsTheOffsetEverAfter) {
  ClockModel m;
  m.Reset(kT0, 1819531);
  EXPECT_EQ(m.OffsetAt(kT0), 1819531);
  EXPECT_EQ(m.OffsetAt(kT0 + 100 * kS), 1819531);
  EXPECT_EQ(m.RatePpm(), 0);
}

TEST(ClockModel, FollowsTheDriftWhileProbesFail) {
  ClockModel m;
  m.Reset(kT0, Drifted(kT0));
  for (int s = 1; s <= 6; ++s) m.Add(kT0 + s * kS, Drifted(kT0 + s * kS));  // a warm-up with an idle GPU
  EXPECT_NEAR(m.RatePpm(), 9.1, 0.01);
  // Then no probe for 60 s (a GPU-bound job): the last probe alone would be 546 us stale.
  const uint64_t later = kT0 + 66 * kS;
  EXPECT_NEAR(static_cast<double>(m.OffsetAt(later)), static_cast<double>(Drifted(later)), 2.0);
  EXPECT_GT(Drifted(later) - Drifted(kT0 + 6 * kS), 500000);
}

TEST(ClockModel, NoRateFromProbesCloserThanTheMinimumSpan) {
  ClockModel m;
  m.Reset(kT0, 1000000);
  m.Add(kT0 + kS, 1000050);  // 50 ppm over 1 s: probe noise at this span
  EXPECT_EQ(m.RatePpm(), 0);
  EXPECT_EQ(m.OffsetAt(kT0 + 30 * kS), 1000050);  // the last probe, not extrapolated
}

TEST(ClockModel, AWildProbeDoesNotBecomeTheRate) {
  ClockModel m;
  m.Reset(kT0, Drifted(kT0));
  m.Add(kT0 + 10 * kS, Drifted(kT0 + 10 * kS));
  ASSERT_NEAR(m.RatePpm(), 9.1, 0.01);
  m.Add(kT0 + 20 * kS, Drifted(kT0 + 20 * kS) + 5000000);  // 5 ms off: 250 ppm over the ring
  EXPECT_NEAR(m.RatePpm(), 9.1, 0.01);
}

TEST(ClockModel, TheRateIsTakenOverTheLastProbesOnly) {
  ClockModel m;
  m.Reset(kT0, 0);
  // 40 s at +20 us/s, then the drift turns to -5 us/s for longer than the ring holds (32 probes, one per second).
  int64_t off = 0;
  uint64_t t = kT0;
  for (int s = 0; s < 40; ++s) m.Add(t += kS, off += 20000);
  EXPECT_NEAR(m.RatePpm(), 20, 0.01);
  for (int s = 0; s < ClockModel::kRing + 1; ++s) m.Add(t += kS, off -= 5000);
  EXPECT_NEAR(m.RatePpm(), -5, 0.01);
}

TEST(ClockModel, ReadersNeverSeeAHalfWrittenLine) {
  // Probes one second apart on one line (9100 ns of offset per second): every consistent read at a later time T
  // gives the same value, and a read that took one probe's time with another's offset would be off by 9100 ns
  // per second between them.
  ClockModel m;
  m.Reset(kT0, 0);
  int i = 1;
  for (; i <= 10; ++i) m.Add(kT0 + i * kS, 9100LL * i);
  ASSERT_NEAR(m.RatePpm(), 9.1, 1e-9);
  const uint64_t T = kT0 + 1000000 * kS;
  const int64_t want = 9100LL * 1000000;
  std::atomic<bool> stop{false};
  std::atomic<long> reads{0}, bad{0};
  std::thread reader([&] {
    while (!stop.load()) {
      const int64_t o = m.OffsetAt(T);
      reads.fetch_add(1);
      if (o < want - 2 || o > want + 2) bad.fetch_add(1);
    }
  });
  while (reads.load() == 0) std::this_thread::yield();  // the reader is running before the writer starts
  for (; i <= 200000; ++i) m.Add(kT0 + i * kS, 9100LL * i);
  stop.store(true);
  reader.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace prism::interpose
