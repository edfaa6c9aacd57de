// Checks of a JSON or CBOR document's shape before it is parsed: nesting depth, number of values, and (CBOR) every
// declared length against the bytes left. Why before: nlohmann's CBOR reader recurses once per level (2 million
// levels overflow the stack), and a parsed value costs 16-48 bytes, so a small file can ask for a huge document.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "prism/limits.h"

namespace prism {

struct DocumentBounds {
  int max_depth = limits::kMaxDocumentDepth;         // arrays and maps inside each other
  uint64_t max_values = limits::kMaxDocumentValues;  // numbers, strings, arrays, maps and map keys
};

// False with *why ("nested deeper than 64 levels at byte 70", "the array at byte 1 declares 4611686018427387904
// elements but 8 bytes remain", ...) when the first CBOR item of `bytes` breaks a bound or is cut short.
bool CheckCborShape(std::string_view bytes, const DocumentBounds& bounds, std::string* why);

// The same bounds for JSON text. Counts brackets, commas and colons outside strings: an upper bound of the values,
// a scan that is far cheaper than the parse. Leaves syntax errors to the parser.
bool CheckJsonShape(std::string_view text, const DocumentBounds& bounds, std::string* why);

}  // namespace prism
