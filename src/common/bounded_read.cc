#include "common/bounded_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace prism {

std::string ByteCap(uint64_t bytes) {
  std::string s = std::to_string(bytes) + "-byte";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  uint64_t v = bytes;
  int u = -1;
  while (v >= 1024 && v % 1024 == 0 && u < 3) {
    v /= 1024;
    ++u;
  }
  if (u >= 0) s += " (" + std::to_string(v) + " " + units[u] + ")";
  return s;
}

bool ReadFileBounded(const std::string& path, uint64_t max_bytes, const std::string& what, std::string* data,
                     std::string* error) {
  data->clear();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *error = path + ": cannot open: " + std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *error = path + ": cannot stat: " + std::strerror(errno);
    ::close(fd);
    return false;
  }
  auto refuse = [&](std::string why) {
    *error = path + ": " + std::move(why);
    ::close(fd);
    return false;
  };
  if (S_ISDIR(st.st_mode)) return refuse("is a directory, not a file");
  // Why pipes are read: `simulate <(zcat g.prism.gz)`; the cap below still bounds them. Devices never end.
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) return refuse("is a device or socket, not a file");
  auto too_big = [&](const std::string& size) {
    return refuse(size + " is larger than the " + ByteCap(max_bytes) + " cap on " + what);
  };
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes)
    return too_big(std::to_string(st.st_size) + " bytes");
  if (S_ISREG(st.st_mode)) data->reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return refuse(std::string("read error: ") + std::strerror(errno));
    if (n == 0) break;
    if (data->size() + static_cast<uint64_t>(n) > max_bytes) {
      data->clear();
      data->shrink_to_fit();
      return too_big("more than " + std::to_string(max_bytes) + " bytes");
    }
    data->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
}

}  // namespace prism
