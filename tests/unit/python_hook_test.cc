// Runs tests/unit/python_hook_test.py (fake torch) against src/interpose/python/sitecustomize.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

TEST(PythonHook, AnnouncesGroupMembersThroughTheGroupStore) {
  if (std::system("python3 -c '' >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found";
  std::string src = PRISM_SOURCE_DIR;
  std::string cmd = "python3 " + src + "/tests/unit/python_hook_test.py " + src + "/src/interpose/python/sitecustomize.py";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}
