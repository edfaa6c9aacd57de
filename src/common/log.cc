#include "common/log.h"

#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

namespace prism {
namespace {

std::string ExpandPath(std::string p) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  for (size_t i; (i = p.find("%h")) != std::string::npos;) p.replace(i, 2, host);
  for (size_t i; (i = p.find("%p")) != std::string::npos;) p.replace(i, 2, std::to_string(getpid()));
  return p;
}

struct Registry {
  std::mutex mu;
  spdlog::sink_ptr sink;
  spdlog::level::level_enum level = spdlog::level::info;
  int rank = -1;

  Registry() {
    if (const char* lvl = std::getenv("PRISM_LOG_LEVEL")) level = spdlog::level::from_str(lvl);
    try {
      if (const char* f = std::getenv("PRISM_LOG_FILE"); f && *f) {
        sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(ExpandPath(f));
      }
    } catch (...) {
      sink = nullptr;
    }
    if (!sink) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  }

  std::string Pattern() const {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    std::string r = rank >= 0 ? "r" + std::to_string(rank) : "-";
    return std::string("[%H:%M:%S.%e] [%n] [%l] [") + host + ":" + std::to_string(getpid()) + ":" + r + "] %v";
  }
};

Registry& Reg() {
  static Registry* r = new Registry();  // Why leaked: loggers are used from atexit paths in the shim.
  return *r;
}

}  // namespace

std::shared_ptr<spdlog::logger> Log(const std::string& subsystem) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string name = "prism." + subsystem;
  if (auto l = spdlog::get(name)) return l;
  auto l = std::make_shared<spdlog::logger>(name, r.sink);
  l->set_level(r.level);
  l->set_pattern(r.Pattern());
  try {
    spdlog::register_logger(l);
  } catch (...) {
  }
  return l;
}

void SetLogRank(int rank) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.rank = rank;
  std::string pat = r.Pattern();
  spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) {
    if (l->name().rfind("prism.", 0) == 0) l->set_pattern(pat);
  });
}

}  // namespace prism
