// Reading a whole input file with a size cap: a 20 GB file, /dev/zero or a directory is refused by name before it
// is read (include/prism/limits.h has the caps).
#pragma once

#include <cstdint>
#include <string>

namespace prism {

// Reads `path` into *data when it is a regular file (or a pipe) of at most `max_bytes` bytes. Otherwise false and
// *error says "<path>: is a directory", "<path>: is a device, not a file", "<path>: 21474836480 bytes is larger
// than the 1073741824-byte (1 GiB) cap on <what>" or "<path>: cannot open: <errno text>". An empty file is read.
bool ReadFileBounded(const std::string& path, uint64_t max_bytes, const std::string& what, std::string* data,
                     std::string* error);

// "1073741824-byte (1 GiB)": a cap as the errors print it.
std::string ByteCap(uint64_t bytes);

}  // namespace prism
