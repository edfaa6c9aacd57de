#include "common/text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace prism {

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

std::string MinutesSeconds(double seconds) {
  const long t = std::lround(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

}  // namespace prism
