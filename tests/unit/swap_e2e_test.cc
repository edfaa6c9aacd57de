// `prism-run collect --swap` end to end without a GPU: four ranks (tests/data/swap/swap_shim.py, speaking the real
// store and event-bus protocols, real data through the coordinator's exchange) of 1 GiB each share a fake GPU of
// 2 GiB (tests/unit/swap_fake_cuda.cc, loaded by the coordinator as its CUDA driver). A rank that starts without room
// dies "out of memory", a rank never swapped back in exits 6, a wrong collective result exits 4: the run
// must finish with every rank's three iterations through swaps, and without --swap it must fail.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "e2e_harness.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using prism::test_util::ReadText;
int RunPrism(const std::string& env_prefix, const std::string& args, std::string* out) {
  return prism::test_util::RunPrismWithEnv(env_prefix, args, out);
}

class SwapE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(std::getenv("PRISM_RUN"), nullptr) << "PRISM_RUN is not set (ctest sets it)";
    if (std::system("python3 -c 'import fcntl, json, socket, struct' >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "python3 is needed for the fake ranks";
    base_ = fs::temp_directory_path() / ("prism-swap-e2e-" + std::to_string(getpid()));
    fs::remove_all(base_);
    fs::create_directories(base_ / "gpu");
  }
  void TearDown() override { fs::remove_all(base_); }

  std::string Env() const {
    return "FAKE_GPU_DIR=" + (base_ / "gpu").string() + " FAKE_GPU_BYTES=" + std::to_string(2ull << 30) +
           " FAKE_RANK_BYTES=" + std::to_string(1ull << 30) + " FAKE_CUDA_LOG=" + (base_ / "cuda.log").string() +
           " FAKE_ITERS=3 FAKE_CKPT_MS=20 FAKE_WAIT_S=60";
  }
  std::string Job() const {
    return " --layout tp=2,pp=2 --gpus 1 --no-preload --no-payloads --quiet torchrun --nnodes 1 --nproc-per-node 4 " +
           std::string(PRISM_SOURCE_DIR) + "/tests/data/swap/swap_shim.py";
  }
  fs::path base_;
};

TEST_F(SwapE2E, FourRanksOfOneGiBFinishOnATwoGiBGpuThroughSwaps) {
  fs::path out = base_ / "out";
  std::string log;
  int rc = RunPrism(Env(), "collect --out " + out.string() + " --gpu-mem-cap 2G --context-mem 0 --swap-driver " +
                               std::string(PRISM_SWAP_FAKE_CUDA) + Job(),
                    &log);
  ASSERT_EQ(rc, 0) << log << "\n--- driver calls:\n" << ReadText(base_ / "cuda.log");
  EXPECT_NE(log.find("prism: swap: on; GPU cap 2.0 GiB (--gpu-mem-cap)"), std::string::npos) << log;
  EXPECT_NE(log.find("rank(s) wait for room on their GPU before they start"), std::string::npos) << log;
  EXPECT_NE(log.find("prism collect: context switching: 4/4 rank(s) finished"), std::string::npos) << log;
  // Where the footprints came from (the fake ranks are no GPU processes: NVML, where there is one, does not list them).
  EXPECT_NE(log.find("; footprints: "), std::string::npos) << log;
  for (int r = 0; r < 4; ++r) {
    std::string rl = ReadText(out / "logs" / ("rank" + std::to_string(r) + ".log"));
    EXPECT_NE(rl.find("iteration 2 done"), std::string::npos) << "rank " << r << ":\n" << rl;
  }
  json rep = json::parse(ReadText(out / "report.json"), nullptr, false);
  ASSERT_FALSE(rep.is_discarded());
  ASSERT_TRUE(rep.contains("swap")) << rep.dump(2);
  const json& s = rep["swap"];
  EXPECT_GE(s["swaps_out"].get<int>(), 2) << s.dump();
  EXPECT_GE(s["swaps_in"].get<int>(), 1) << s.dump();
  EXPECT_EQ(s["failures"], 0) << s.dump();
  EXPECT_EQ(s["finished"], 4);
  EXPECT_EQ(s["footprints_measured"], 0) << s.dump();
  EXPECT_TRUE(s.contains("footprint_source")) << s.dump();
  EXPECT_LE(s["peak_gpu_bytes"].get<uint64_t>(), 2ull << 30) << s.dump();
  EXPECT_EQ(s["bytes_out"].get<uint64_t>(), s["swaps_out"].get<uint64_t>() << 30);
  // The driver saw the same: every checkpoint and restore it was asked for, never a restore without room, and the
  // fake GPU never held more than 2 GiB when a rank came back.
  std::istringstream calls(ReadText(base_ / "cuda.log"));
  std::string call;
  int pid = 0, checkpoints = 0, restores = 0;
  uint64_t bytes = 0, resident = 0;
  std::string word;
  while (calls >> call >> pid >> bytes >> word >> resident) {
    EXPECT_NE(call, "restore-oom");
    EXPECT_LE(resident, 2ull << 30) << call << " " << pid;
    checkpoints += call == "checkpoint";
    restores += call == "restore";
  }
  EXPECT_EQ(checkpoints, s["swaps_out"].get<int>());
  EXPECT_EQ(restores, s["swaps_in"].get<int>());
  json st = json::parse(ReadText(out / "status.json"), nullptr, false);
  ASSERT_FALSE(st.is_discarded());
  EXPECT_EQ(st["swap"]["gpu_cap_bytes"].get<uint64_t>(), 2ull << 30);
}

// A real rank's collective completes at a gate whose release needs every real member's kOpArrive, and libprism
// sends that only after the exchange returned: a member swapped out while blocked in the exchange sent it only once
// restored, so the others waited at the gate (outside any exchange) until the stall rule brought it back -- every
// swap in of the first GPU run. The coordinator now releases without a swapped-out member that posted its input.
// With --swap-stall 60 any stall-rule swap would take a minute: the run must finish long before, within the cap.
TEST_F(SwapE2E, GatedCollectivesRunAtSwapSpeedNotStallSpeed) {
  fs::path out = base_ / "out";
  std::string log;
  const auto t0 = std::chrono::steady_clock::now();
  int rc = RunPrism(Env() + " FAKE_GATED=1 FAKE_WAIT_S=150",
                    "collect --out " + out.string() + " --gpu-mem-cap 2G --context-mem 0 --swap-stall 60 --swap-driver " +
                        std::string(PRISM_SWAP_FAKE_CUDA) + Job(),
                    &log);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(rc, 0) << log << "\n--- driver calls:\n" << ReadText(base_ / "cuda.log");
  std::printf("gated collectives, 4 ranks on room for 2: %.1f s\n", s);
  EXPECT_LT(s, 40.0) << log;
  EXPECT_EQ(log.find("over the cap"), std::string::npos) << log;
  json rep = json::parse(ReadText(out / "report.json"), nullptr, false);
  ASSERT_TRUE(rep.contains("swap")) << log;
  EXPECT_EQ(rep["swap"]["finished"], 4) << rep["swap"].dump();
  EXPECT_EQ(rep["swap"]["failures"], 0) << rep["swap"].dump();
  EXPECT_GE(rep["swap"]["swaps_in"].get<int>(), 2) << rep["swap"].dump();
  for (int r = 0; r < 4; ++r) {
    std::string rl = ReadText(out / "logs" / ("rank" + std::to_string(r) + ".log"));
    EXPECT_NE(rl.find("iteration 2 done"), std::string::npos) << "rank " << r << ":\n" << rl;
  }
}

// Ranks that wait in torch-like store barriers (ADD, then WAIT for the last one's key) are blocked on ranks not on
// the GPU: the coordinator (the store's server) maps each blocked store connection to its rank through /proc and
// the GPU counts as stalled at once, not after --swap-stall of silence. Such a rank is not swapped out, so the next
// rank goes on over the cap: the fake GPU has room for that (4 GiB), the cap is 2 GiB.
TEST_F(SwapE2E, StoreBarrierWaitsAreSeenAtOnce) {
  fs::path out = base_ / "out";
  std::string log;
  const auto t0 = std::chrono::steady_clock::now();
  int rc = RunPrism(Env() + " FAKE_GATED=1 FAKE_STORE_BARRIERS=1 FAKE_WAIT_S=150 FAKE_GPU_BYTES=" +
                        std::to_string(4ull << 30),
                    "collect --out " + out.string() + " --gpu-mem-cap 2G --context-mem 0 --swap-stall 60 --swap-driver " +
                        std::string(PRISM_SWAP_FAKE_CUDA) + Job(),
                    &log);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(rc, 0) << log << "\n--- driver calls:\n" << ReadText(base_ / "cuda.log");
  std::printf("store barriers + gated collectives, 4 ranks on room for 2: %.1f s\n", s);
  EXPECT_LT(s, 40.0) << log;
  json rep = json::parse(ReadText(out / "report.json"), nullptr, false);
  ASSERT_TRUE(rep.contains("swap")) << log;
  EXPECT_EQ(rep["swap"]["finished"], 4) << rep["swap"].dump();
  EXPECT_EQ(rep["swap"]["failures"], 0) << rep["swap"].dump();
  for (int r = 0; r < 4; ++r) {
    std::string rl = ReadText(out / "logs" / ("rank" + std::to_string(r) + ".log"));
    EXPECT_NE(rl.find("iteration 2 done"), std::string::npos) << "rank " << r << ":\n" << rl;
  }
}

// The control: the same job without context switching does not fit (ranks die out of memory on the fake GPU).
TEST_F(SwapE2E, WithoutSwapTheJobDoesNotFit) {
  fs::path out = base_ / "out";
  std::string log;
  int rc = RunPrism(Env(), "collect --out " + out.string() + Job(), &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("out of memory"), std::string::npos) << log;
}

// --swap on with a library that is not a CUDA driver: a clear error before any rank starts.
TEST_F(SwapE2E, SwapWithoutADriverIsAClearError) {
  fs::path out = base_ / "out";
  std::string log;
  int rc = RunPrism(Env(), "collect --out " + out.string() + " --swap on --gpu-mem-cap 2G --swap-driver "
                               "/nonexistent/libcuda.so.1" + Job(),
                    &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("context switching (--swap) needs the CUDA driver's checkpoint API: cannot load the CUDA "
                     "driver '/nonexistent/libcuda.so.1'"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("rank 0 started"), std::string::npos) << log;
}

TEST_F(SwapE2E, DryRunSaysHowItWouldSwitch) {
  std::string log;
  int rc = RunPrism(Env(), "collect --dry-run --gpu-mem-cap 60G --rank-mem 20G" + Job(), &log);
  EXPECT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("context switching: on; GPU cap 60.0 GiB, host budget 80% of MemAvailable, 512.0 MiB per rank "
                     "beyond its allocations, ranks assumed 20.0 GiB until they report"),
            std::string::npos)
      << log;
}

TEST_F(SwapE2E, BadSizesAreRefused) {
  std::string log;
  int rc = RunPrism(Env(), "collect --gpu-mem-cap 12X" + Job(), &log);
  EXPECT_EQ(rc, 2) << log;
  EXPECT_NE(log.find("--gpu-mem-cap 12X: expected bytes"), std::string::npos) << log;
}

}  // namespace
