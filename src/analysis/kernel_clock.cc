// The clocks of kernel records (kernel_report.h, "Clock alignment"): CUPTI time -> host -> GPU time from the sync
// lines, and the stamp fit that corrects what is left against libprism's own stamp kernels.
#include "analysis/kernel_report.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <utility>
#include <vector>

#include "analysis/run_report.h"

namespace prism::analysis {
namespace {

// Piecewise-linear interpolation over points sorted by x, clamped at both ends; 0 without points.
int64_t Interp(const std::vector<std::pair<int64_t, int64_t>>& pts, int64_t x) {
  if (pts.empty()) return 0;
  if (x <= pts.front().first) return pts.front().second;
  if (x >= pts.back().first) return pts.back().second;
  auto it = std::upper_bound(pts.begin(), pts.end(), x,
                             [](int64_t v, const std::pair<int64_t, int64_t>& p) { return v < p.first; });
  const auto& [x1, y1] = *it;
  const auto& [x0, y0] = *(it - 1);
  if (x1 == x0) return y1;
  const long double f = static_cast<long double>(x - x0) / static_cast<long double>(x1 - x0);
  return y0 + static_cast<int64_t>(std::llround(f * static_cast<long double>(y1 - y0)));
}

int64_t MedianI(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Clocks

KernelClock::KernelClock(std::vector<KernelSync> syncs) {
  for (const KernelSync& s : syncs) {
    cupti_.emplace_back(s.host_ns + s.cupti_minus_host_ns, s.cupti_minus_host_ns);
    if (s.gpu_known) gpu_.emplace_back(s.host_ns, s.gpu_minus_host_ns);
  }
  std::sort(cupti_.begin(), cupti_.end());
  std::sort(gpu_.begin(), gpu_.end());
}

int64_t KernelClock::CuptiToHost(int64_t cupti_ns) const { return cupti_ns - Interp(cupti_, cupti_ns); }

int64_t KernelClock::HostToGpu(int64_t host_ns) const { return host_ns + Interp(gpu_, host_ns); }

int64_t StampFit::Correction(int64_t t) const { return applied ? Interp(knots, t) : 0; }

StampFit FitStamps(const std::vector<int64_t>& starts, std::vector<int64_t> stamps) {
  StampFit fit;
  std::sort(stamps.begin(), stamps.end());
  fit.stamps = static_cast<int>(stamps.size());
  if (starts.empty() || stamps.empty()) return fit;
  // 1. The offset at the start of the run: the most common stamp - start difference (a 4 us window) over the
  // first 3 s of stamps, against every stamp kernel within 2 ms (50 ms if that finds nothing). A stamp's own kernel
  // gives the same difference every time; wrong pairings spread out.
  constexpr int64_t kWindow = 4000, kTrack = 10000;
  auto initial_offset = [&](int64_t search, int64_t* delta) {
    std::vector<int64_t> diffs;
    size_t considered = 0;
    for (size_t i = 0; i < stamps.size() && i < 2000 && stamps[i] - stamps.front() < 3000000000ll; ++i) {
      ++considered;
      const int64_t s = stamps[i];
      auto lo = std::lower_bound(starts.begin(), starts.end(), s - search);
      for (int n = 0; lo != starts.end() && *lo <= s + search && n < 400; ++lo, ++n) diffs.push_back(s - *lo);
    }
    if (diffs.empty()) return false;
    std::sort(diffs.begin(), diffs.end());
    std::vector<size_t> count(diffs.size());
    size_t best_n = 0;
    for (size_t i = 0, j = 0; i < diffs.size(); ++i) {
      while (j < diffs.size() && diffs[j] - diffs[i] <= kWindow) ++j;
      count[i] = j - i;
      best_n = std::max(best_n, count[i]);
    }
    // Why a share of the stamps: each stamp adds exactly one difference to the true offset's window, while chance
    // clusters of wrong pairings hold a few.
    if (best_n < std::min<size_t>(3, considered) || best_n * 10 < considered * 3) return false;
    // Why the tie-break towards 0: a train of evenly spaced stamps matches at every multiple of its period nearly
    // as well; the sync lines are good to far less than a period, so the true offset is the one nearest 0.
    size_t best_i = 0;
    int64_t best_abs = INT64_MAX;
    for (size_t i = 0; i < diffs.size(); ++i) {
      if (count[i] * 5 < best_n * 4) continue;
      const int64_t mid = diffs[i] + kWindow / 2;
      if (std::llabs(mid) < best_abs) {
        best_abs = std::llabs(mid);
        best_i = i;
      }
    }
    *delta = MedianI(std::vector<int64_t>(diffs.begin() + static_cast<std::ptrdiff_t>(best_i),
                                          diffs.begin() + static_cast<std::ptrdiff_t>(best_i + count[best_i])));
    return true;
  };
  // Within 2 ms first (what the sync lines should give); 50 ms when that finds nothing.
  int64_t delta = 0;
  if (!initial_offset(2000000, &delta) && !initial_offset(50000000, &delta)) return fit;
  // 2. Along the run: each stamp's kernel is the stamp kernel starting nearest to stamp - offset (within 10 us);
  // the offset follows the last matches (the clocks drift by a few us per second).
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (stamp, stamp - start)
  std::deque<int64_t> recent;
  for (int64_t s : stamps) {
    const int64_t target = s - delta;
    auto it = std::lower_bound(starts.begin(), starts.end(), target);
    int64_t best = -1, best_d = kTrack + 1;
    for (auto c : {it, it == starts.begin() ? starts.end() : it - 1}) {
      if (c == starts.end()) continue;
      const int64_t d = std::llabs(*c - target);
      if (d < best_d) {
        best_d = d;
        best = *c;
      }
    }
    if (best < 0) continue;
    pairs.emplace_back(s, s - best);
    recent.push_back(s - best);
    if (recent.size() > 9) recent.pop_front();
    delta = MedianI(std::vector<int64_t>(recent.begin(), recent.end()));
  }
  fit.matched = static_cast<int>(pairs.size());
  if (pairs.size() < 3) return fit;
  // 3. One knot per second of run: the median correction there.
  std::vector<int64_t> ts, rs;
  int64_t bucket_start = pairs.front().first;
  auto flush = [&] {
    if (ts.empty()) return;
    fit.knots.emplace_back(MedianI(ts), MedianI(rs));
    ts.clear();
    rs.clear();
  };
  for (const auto& [s, r] : pairs) {
    if (s - bucket_start >= 1000000000ll) {
      flush();
      bucket_start = s;
    }
    ts.push_back(s);
    rs.push_back(r);
  }
  flush();
  fit.applied = true;
  std::vector<double> res;
  for (const auto& [s, r] : pairs) res.push_back(std::fabs(static_cast<double>(r - fit.Correction(s))));
  fit.residual_median_ns = Median(res);
  return fit;
}

}  // namespace prism::analysis
