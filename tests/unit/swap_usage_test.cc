// Per-process GPU memory from NVML (coordinator/swap/swap_usage.h) against a fake libnvidia-ml (swap_fake_nvml.cc):
// usage summed over GPUs per pid, unknown and zero usage left out, a process list longer than the first buffer, and
// the errors when the library is missing or does not initialise.
#include "coordinator/swap/swap_usage.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace prism::coord {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

TEST(SwapUsage, NvmlUsagePerPidIsSummedOverGpus) {
  std::string error;
  GpuUsageFn usage = OpenNvmlUsage(PRISM_SWAP_FAKE_NVML, &error);
  ASSERT_TRUE(usage) << error;
  std::map<int, uint64_t> by_pid;
  ASSERT_TRUE(usage(&by_pid, &error)) << error;
  EXPECT_EQ(by_pid[100], 350 * kMiB);
  EXPECT_EQ(by_pid.count(101), 0u) << "NVML_VALUE_NOT_AVAILABLE is no measurement";
  EXPECT_EQ(by_pid.count(102), 0u) << "0 is no measurement";
  EXPECT_EQ(by_pid[1079], kMiB) << "the 81st process of GPU 1: asked again with a larger buffer";
  EXPECT_EQ(by_pid.size(), 81u);
  // Asked again (the coordinator asks every second): the same.
  ASSERT_TRUE(usage(&by_pid, &error)) << error;
  EXPECT_EQ(by_pid[100], 350 * kMiB);
}

TEST(SwapUsage, AMissingOrFailingNvmlIsAnErrorNotACrash) {
  std::string error;
  EXPECT_FALSE(OpenNvmlUsage("/nonexistent/libnvidia-ml.so.1", &error));
  EXPECT_NE(error.find("cannot load"), std::string::npos) << error;
  ::setenv("FAKE_NVML_INIT_ERROR", "1", 1);
  error.clear();
  EXPECT_FALSE(OpenNvmlUsage(PRISM_SWAP_FAKE_NVML, &error));
  ::unsetenv("FAKE_NVML_INIT_ERROR");
  EXPECT_NE(error.find("nvmlInit_v2: error 9: Driver Not Loaded"), std::string::npos) << error;
}

}  // namespace
}  // namespace prism::coord
