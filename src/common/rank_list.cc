#include "common/rank_list.h"

#include <unordered_set>

#include "prism/limits.h"

namespace prism {
namespace {

std::string Trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t") - a + 1);
}

// A decimal rank: digits only (no sign), at most 9 of them so it fits an int before the range checks.
bool ToRank(const std::string& s, int64_t* v) {
  if (s.empty() || s.size() > 9) return false;
  *v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    *v = *v * 10 + (c - '0');
  }
  return true;
}

}  // namespace

std::optional<std::vector<int>> ParseRankList(const std::string& spec, int64_t world_size, const std::string& flag,
                                              std::string* error) {
  const std::string head = flag + " \"" + spec + "\": ";
  if (Trim(spec).empty()) {
    *error = flag + " is empty (expected e.g. \"0\", \"0,517\", \"0-7\")";
    return std::nullopt;
  }
  const int64_t bound = world_size > 0 ? world_size : limits::kMaxWorldSize;
  std::vector<int> out;
  std::unordered_set<int> seen;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    const std::string item = Trim(spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    start = comma == std::string::npos ? spec.size() + 1 : comma + 1;
    if (item.empty()) {
      *error = head + "empty entry";
      return std::nullopt;
    }
    int64_t lo = 0, hi = 0;
    size_t dash = item.find('-');
    bool ok = dash == std::string::npos
                  ? ToRank(item, &lo) && (hi = lo, true)
                  : ToRank(Trim(item.substr(0, dash)), &lo) && ToRank(Trim(item.substr(dash + 1)), &hi);
    if (!ok || lo > hi) {
      *error = head + "\"" + item + "\" is not a rank or a range LOW-HIGH";
      return std::nullopt;
    }
    if (hi >= bound) {
      *error = head + "rank " + std::to_string(hi) +
               (world_size > 0 ? " is outside the world (ranks 0-" + std::to_string(world_size - 1) + ")"
                               : " is past the largest world prism runs (" +
                                     std::to_string(limits::kMaxWorldSize) + " ranks)");
      return std::nullopt;
    }
    for (int64_t r = lo; r <= hi; ++r) {
      if (!seen.insert(static_cast<int>(r)).second) {
        *error = head + "rank " + std::to_string(r) + " is given twice";
        return std::nullopt;
      }
      out.push_back(static_cast<int>(r));
    }
  }
  return out;
}

}  // namespace prism
