// Runs `$PRISM_RUN ARGS` (ctest sets PRISM_RUN) and returns its exit status and output (stdout and stderr
// together), for tests that meet prism-run the way a user does.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace prism::test_util {

struct CliRun {
  int rc = -1;  // -1: PRISM_RUN unset, or the process did not exit normally
  std::string out;
};

inline CliRun RunPrism(const std::string& args) {
  CliRun r;
  const char* bin = std::getenv("PRISM_RUN");
  if (bin == nullptr) return r;
  FILE* f = popen((std::string(bin) + " " + args + " 2>&1").c_str(), "r");
  if (f == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  const int st = pclose(f);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace prism::test_util
