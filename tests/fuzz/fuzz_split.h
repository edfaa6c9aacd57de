// Inputs that stand for several files: the parts between separators, as tests/fuzz/seeds/*.txt join a line's
// files (dev.sh test-fuzz) and split.dict offers the separator to the fuzzer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace prism::fuzz {

inline constexpr std::string_view kFileSeparator = "\n--next-file--\n";

// At most `max_parts`; the last part keeps whatever follows.
inline std::vector<std::string_view> SplitFiles(const uint8_t* data, size_t size, size_t max_parts) {
  std::vector<std::string_view> parts;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (parts.size() + 1 < max_parts) {
    const size_t at = rest.find(kFileSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kFileSeparator.size());
  }
  parts.push_back(rest);
  return parts;
}

}  // namespace prism::fuzz
