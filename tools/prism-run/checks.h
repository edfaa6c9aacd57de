// Flag checks of prism-run. Why not CLI::PositiveNumber / NonNegativeNumber: their message prints the double's
// 309-digit maximum; and a check on the text runs before CLI11 converts it, so 2^64+5 is refused by its value
// instead of wrapping into an int.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "common/sizes.h"
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

// A size flag ("4M", "4MiB", "4194304", "0"), turned into bytes where it is parsed, so that one size spelled two
// ways is one value everywhere after (the graph cache's key). A text that is no size is refused naming the flag.
inline CLI::Option* AddSizeOption(CLI::App* app, const std::string& name, std::optional<uint64_t>* to,
                                  const std::string& help) {
  return app->add_option_function<std::string>(
      name,
      [name, to](const std::string& text) {
        uint64_t n = 0;
        if (!ParseBytes(text, &n))
          throw CLI::ValidationError(name, "\"" + text + "\": expected bytes such as 4M, 65536 or 0");
        *to = n;
      },
      help)->type_name("SIZE");
}

}  // namespace prism::cli
