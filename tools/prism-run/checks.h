// Flag checks of prism-run. Why not CLI::PositiveNumber / NonNegativeNumber: their message prints the double's
// 309-digit maximum; and a check on the text runs before CLI11 converts it, so 2^64+5 is refused by its value
// instead of wrapping into an int.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "prism/limits.h"

namespace prism::cli {

// "1048576", "1e+12": a bound as the messages print it.
inline std::string BoundText(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

// A number within lo..hi (lo itself refused when low_open), checked on the flag's text.
inline CLI::Validator InRange(double lo, double hi, bool low_open = false) {
  const std::string desc = low_open ? "positive, at most " + BoundText(hi) : BoundText(lo) + ".." + BoundText(hi);
  return CLI::Validator(
      [lo, hi, low_open, desc](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0') return "\"" + text + "\" is not a number";
        if (!std::isfinite(v) || v < lo || v > hi || (low_open && v <= lo))
          return "\"" + text + "\" is outside the bounds: must be " + desc;
        return std::string();
      },
      low_open ? "POSITIVE" : "NUMBER in " + desc);
}

// Counts and sizes: positive, or non-negative, up to 1e15 (no flag of prism means more).
inline CLI::Validator Positive(double hi = 1e15) { return InRange(0, hi, /*low_open=*/true); }
inline CLI::Validator NonNegative(double hi = 1e15) { return InRange(0, hi); }
// A duration in microseconds, as a graph's durations (limits::kMaxDurationUs).
inline CLI::Validator DurationUs() { return InRange(0, limits::kMaxDurationUs); }
// A world size: 1..limits::kMaxWorldSize, what the launcher and the graph reader accept.
inline CLI::Validator WorldSize() { return InRange(1, static_cast<double>(limits::kMaxWorldSize)); }

}  // namespace prism::cli
