// What the end-to-end tests share: they run the real prism-run (ctest sets PRISM_RUN) on stand-in jobs under
// tests/data and read what it wrote. One copy here instead of one per test file.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace prism::test_util {

// An empty path under the temporary directory, unique to this test process: /tmp/prism-<prefix>-<name>-<pid>.
inline std::filesystem::path FreshDir(const std::string& prefix, const std::string& name) {
  std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("prism-" + prefix + "-" + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  return d;
}

inline std::string ReadText(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The file's JSON, or a discarded value when it is missing or malformed.
inline nlohmann::json ReadJson(const std::filesystem::path& p) {
  return nlohmann::json::parse(ReadText(p), nullptr, false);
}

// Runs `env ENV_PREFIX PYTHON_EXEC=python3 $PRISM_RUN ARGS` with stdout and stderr into *out; returns its exit
// status (128 + N when it died of signal N).
inline int RunPrismWithEnv(const std::string& env_prefix, const std::string& args, std::string* out) {
  const std::string cmd =
      "env " + env_prefix + " PYTHON_EXEC=python3 " + std::getenv("PRISM_RUN") + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  out->clear();
  if (f == nullptr) return -1;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out->append(buf, n);
  const int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace prism::test_util
