// The checkpoint driver (coordinator/swap/swap_driver.h) against the fake libcuda of swap_fake_cuda.cc: a real child
// process is locked (stopped), checkpointed, restored and unlocked; wrong states, a restore without room and
// libraries that are not a usable driver give errors that name the call, the pid and the driver's text.
#include "coordinator/swap/swap_driver.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

extern char** environ;

namespace prism::coord {
namespace {

namespace fs = std::filesystem;

// State letter of a process in /proc/<pid>/stat ('T' stopped, 'S' sleeping, ...).
char ProcState(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t p = all.rfind(')');
  return p == std::string::npos || p + 2 >= all.size() ? '?' : all[p + 2];
}

std::string FileText(const fs::path& p) {
  std::ifstream f(p);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

class SwapDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("prism-swapdrv-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    setenv("FAKE_GPU_DIR", dir_.c_str(), 1);
    setenv("FAKE_GPU_BYTES", "3000", 1);
    setenv("FAKE_CKPT_MS", "1", 1);
    unsetenv("FAKE_CUDA_INIT_ERROR");
    const char* argv[] = {"sleep", "30", nullptr};
    ASSERT_EQ(posix_spawnp(&child_, "sleep", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
    std::ofstream(dir_ / std::to_string(child_)) << "2000 running\n";
  }
  void TearDown() override {
    if (child_ > 0) {
      kill(child_, SIGKILL);
      kill(child_, SIGCONT);
      waitpid(child_, nullptr, 0);
    }
    fs::remove_all(dir_);
  }
  fs::path dir_;
  pid_t child_ = -1;
};

TEST_F(SwapDriverTest, OutAndInMoveTheProcessAndStopItMeanwhile) {
  std::string error;
  auto d = OpenCudaCheckpointDriver(PRISM_SWAP_FAKE_CUDA, &error);
  ASSERT_TRUE(d) << error;
  EXPECT_EQ(d->DeviceMemory(0), 3000u);
  SwapResult out = d->SwapOut(child_, 1000);
  ASSERT_TRUE(out.ok) << out.error;
  EXPECT_GT(out.seconds, 0.0);
  EXPECT_EQ(FileText(dir_ / std::to_string(child_)), "2000 checkpointed");
  for (int i = 0; i < 100 && ProcState(child_) != 'T'; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(ProcState(child_), 'T') << "a locked process makes no progress";
  SwapResult in = d->SwapIn(child_);
  ASSERT_TRUE(in.ok) << in.error;
  EXPECT_EQ(FileText(dir_ / std::to_string(child_)), "2000 running");
  for (int i = 0; i < 100 && ProcState(child_) == 'T'; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_NE(ProcState(child_), 'T');
}

TEST_F(SwapDriverTest, WrongStatesAndAFullGpuAreNamedErrors) {
  std::string error;
  auto d = OpenCudaCheckpointDriver(PRISM_SWAP_FAKE_CUDA, &error);
  ASSERT_TRUE(d) << error;
  SwapResult in = d->SwapIn(child_);
  EXPECT_FALSE(in.ok);
  EXPECT_NE(in.error.find("cuCheckpointProcessRestore(pid " + std::to_string(child_) + "): CUDA_ERROR_ILLEGAL_STATE"),
            std::string::npos)
      << in.error;
  EXPECT_NE(in.error.find("the process is now running"), std::string::npos) << in.error;
  ASSERT_TRUE(d->SwapOut(child_, 1000).ok);
  SwapResult again = d->SwapOut(child_, 1000);
  EXPECT_FALSE(again.ok);
  EXPECT_NE(again.error.find("cuCheckpointProcessLock"), std::string::npos) << again.error;
  // Another process took the GPU meanwhile: 2000 + 2000 > 3000.
  std::ofstream(dir_ / "1") << "2000 running\n";
  SwapResult full = d->SwapIn(child_);
  EXPECT_FALSE(full.ok);
  EXPECT_NE(full.error.find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos) << full.error;
  EXPECT_EQ(FileText(dir_ / std::to_string(child_)), "2000 checkpointed");
  fs::remove(dir_ / "1");
  EXPECT_TRUE(d->SwapIn(child_).ok);
  SwapResult unknown = d->SwapOut(999999, 1000);
  EXPECT_FALSE(unknown.ok);
  EXPECT_NE(unknown.error.find("pid 999999"), std::string::npos) << unknown.error;
}

TEST_F(SwapDriverTest, LibrariesThatAreNotAUsableDriver) {
  std::string error;
  EXPECT_FALSE(OpenCudaCheckpointDriver("/nonexistent/libcuda.so.1", &error));
  EXPECT_NE(error.find("cannot load the CUDA driver '/nonexistent/libcuda.so.1'"), std::string::npos) << error;
  error.clear();
  EXPECT_FALSE(OpenCudaCheckpointDriver("libm.so.6", &error));
  EXPECT_NE(error.find("no cuCheckpointProcess* entry points"), std::string::npos) << error;
  error.clear();
  setenv("FAKE_CUDA_INIT_ERROR", "1", 1);
  EXPECT_FALSE(OpenCudaCheckpointDriver(PRISM_SWAP_FAKE_CUDA, &error));
  EXPECT_NE(error.find("cuInit(0)"), std::string::npos) << error;
  unsetenv("FAKE_CUDA_INIT_ERROR");
}

}  // namespace
}  // namespace prism::coord
