#include "common/text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

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

std::string TimeNow(const char* format, bool utc) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  if (utc) {
    gmtime_r(&now, &tm);
  } else {
    localtime_r(&now, &tm);
  }
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

}  // namespace prism
