// Byte sizes as people write them: --payload-max-bytes, collect --swap's caps, and the swap scheduler's lines.
#pragma once

#include <cstdint>
#include <string>

namespace prism {

// "80G", "80GiB", "512M", "1.5T", "123456" (bytes) -> bytes; false for anything else.
bool ParseBytes(const std::string& text, uint64_t* bytes);
// "80.0 GiB", "512.0 MiB", "12 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace prism
