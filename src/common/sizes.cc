#include "common/sizes.h"

#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace prism {

bool ParseBytes(const std::string& text, uint64_t* bytes) {
  if (text.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || !std::isfinite(v) || v < 0) return false;
  std::string unit(end);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I')) unit.pop_back();
  double mul = 1;
  if (unit.empty()) {
    mul = 1;
  } else if (unit.size() == 1) {
    switch (unit[0]) {
      case 'k': case 'K': mul = 1024.0; break;
      case 'm': case 'M': mul = 1024.0 * 1024; break;
      case 'g': case 'G': mul = 1024.0 * 1024 * 1024; break;
      case 't': case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
      default: return false;
    }
  } else {
    return false;
  }
  // Why the bound: the conversion of a double past 2^64 is undefined; no size prism takes comes near 2^62.
  if (v * mul >= 0x1p62) return false;
  *bytes = static_cast<uint64_t>(v * mul);
  return true;
}

std::string FormatBytes(uint64_t b) {
  const double v = static_cast<double>(b);
  if (b >= (1ull << 30)) return fmt::format("{:.1f} GiB", v / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MiB", v / (1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", v / (1ull << 10));
  return fmt::format("{} B", b);
}

}  // namespace prism
