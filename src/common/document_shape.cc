#include "common/document_shape.h"

#include <vector>

namespace prism {
namespace {

std::string At(size_t offset) { return " at byte " + std::to_string(offset); }

}  // namespace

bool CheckCborShape(std::string_view bytes, const DocumentBounds& bounds, std::string* why) {
  constexpr uint64_t kIndefinite = ~uint64_t{0};
  struct Open {
    uint64_t left;  // items still to come; kIndefinite until a break byte
  };
  std::vector<Open> stack;
  uint64_t values = 0;
  size_t pos = 0;
  const size_t n = bytes.size();
  auto fail = [&](std::string msg) {
    *why = std::move(msg);
    return false;
  };
  // Why a loop and an explicit stack (not recursion): the depth is what is being checked.
  for (;;) {
    if (pos >= n) return fail("cut short" + At(pos) + " (truncated)");
    const size_t start = pos;
    const uint8_t head = static_cast<uint8_t>(bytes[pos++]);
    const int major = head >> 5, info = head & 31;
    if (head == 0xff) {  // break: closes the innermost indefinite array or map
      if (stack.empty() || stack.back().left != kIndefinite) return fail("stray break byte" + At(start));
      stack.pop_back();
    } else {
      uint64_t arg = 0;
      const bool indefinite = info == 31;
      if (info < 24) {
        arg = static_cast<uint64_t>(info);
      } else if (info <= 27) {
        const size_t len = size_t{1} << (info - 24);
        if (n - pos < len) return fail("cut short" + At(start) + " (truncated)");
        for (size_t i = 0; i < len; ++i) arg = (arg << 8) | static_cast<uint8_t>(bytes[pos++]);
      } else if (indefinite && major >= 2 && major <= 5) {
      } else {
        return fail("item" + At(start) + " has a reserved length code");
      }
      const size_t left = n - pos;
      if (major == 6) continue;  // a tag: it qualifies the next item, which is the value
      if (++values > bounds.max_values)
        return fail("more than " + std::to_string(bounds.max_values) + " values" + At(start));
      if (major == 2 || major == 3) {
        if (indefinite) {
          // Chunks of the same type until a break; they are not containers the reader recurses into.
          for (;;) {
            if (pos >= n) return fail("string" + At(start) + " cut short (truncated)");
            const uint8_t c = static_cast<uint8_t>(bytes[pos]);
            if (c == 0xff) {
              ++pos;
              break;
            }
            if ((c >> 5) != major || (c & 31) > 27) return fail("string chunk" + At(pos) + " is malformed");
            const size_t clen_bytes = (c & 31) < 24 ? 0 : size_t{1} << ((c & 31) - 24);
            if (n - pos - 1 < clen_bytes) return fail("cut short" + At(pos) + " (truncated)");
            uint64_t clen = (c & 31) < 24 ? (c & 31) : 0;
            for (size_t i = 0; i < clen_bytes; ++i) clen = (clen << 8) | static_cast<uint8_t>(bytes[pos + 1 + i]);
            pos += 1 + clen_bytes;
            if (clen > n - pos)
              return fail("the string chunk" + At(pos) + " declares " + std::to_string(clen) + " bytes but " +
                          std::to_string(n - pos) + " remain");
            pos += clen;
          }
        } else {
          if (arg > left)
            return fail("the string" + At(start) + " declares " + std::to_string(arg) + " bytes but " +
                        std::to_string(left) + " remain");
          pos += arg;
        }
      } else if (major == 4 || major == 5) {
        uint64_t items = kIndefinite;
        if (!indefinite) {
          // Why against the bytes left: every item takes at least one byte, so a larger count is a lie.
          const bool map = major == 5;
          if (map ? arg > left / 2 : arg > left)
            return fail(std::string("the ") + (map ? "map" : "array") + At(start) + " declares " +
                        std::to_string(arg) + (map ? " entries" : " elements") + " but " + std::to_string(left) +
                        " bytes remain");
          items = map ? arg * 2 : arg;
        }
        if (items != 0) {
          if (static_cast<int>(stack.size()) >= bounds.max_depth)
            return fail("nested deeper than " + std::to_string(bounds.max_depth) + " levels" + At(start));
          stack.push_back({items});
          continue;  // the container's first item comes next
        }
      }
    }
    // One item is complete: count it off its container, closing every container it finishes.
    while (!stack.empty() && stack.back().left != kIndefinite) {
      if (--stack.back().left != 0) break;
      stack.pop_back();
    }
    if (stack.empty()) return true;
  }
}

bool CheckJsonShape(std::string_view text, const DocumentBounds& bounds, std::string* why) {
  int depth = 0;
  uint64_t values = 1;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > bounds.max_depth) {
          *why = "nested deeper than " + std::to_string(bounds.max_depth) + " levels" + At(i);
          return false;
        }
        [[fallthrough]];
      case ',':
      case ':':
        if (++values > bounds.max_values) {
          *why = "more than " + std::to_string(bounds.max_values) + " values" + At(i);
          return false;
        }
        break;
      case ']':
      case '}': --depth; break;
      default: break;
    }
  }
  return true;
}

}  // namespace prism
