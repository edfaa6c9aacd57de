// libprism's CUPTI collector (src/interpose/core/kernel_trace.h) against a fake libcupti (kernel_fake_cupti.cc, the
// real record structs): what it writes, that the launcher's reader reads it back (clock, names, CUDA graph ids,
// NVTX), and that every way CUPTI can be missing leaves the job running without kernel records.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "analysis/kernel_report.h"
#include "interpose/core/config.h"
#include "interpose/core/gpu.h"
#include "interpose/core/kernel_trace.h"
#include "interpose/core/runtime.h"
#include "prism/kernels.h"

namespace {

namespace fs = std::filesystem;
namespace pi = prism::interpose;
namespace pl = prism::analysis;

[[maybe_unused]] std::string ReadText(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(KernelTracePure, CuptiCandidates) {
  EXPECT_EQ(pi::CuptiCandidates("/x/libcupti.so", "/loaded/libcupti.so.13", {"/a"}),
            std::vector<std::string>{"/x/libcupti.so"});
  // A loaded copy is the only candidate: a second one would hook the driver twice.
  EXPECT_EQ(pi::CuptiCandidates("", "/loaded/libcupti.so.13", {"/a"}),
            std::vector<std::string>{"/loaded/libcupti.so.13"});
  auto c = pi::CuptiCandidates("", "", {"/site/nvidia/cu13/lib", "/site/torch/lib"});
  ASSERT_GE(c.size(), 6u);
  EXPECT_EQ(c[0], "/site/nvidia/cu13/lib/libcupti.so.13");
  EXPECT_NE(std::find(c.begin(), c.end(), "/site/torch/lib/../../nvidia/cu13/lib/libcupti.so.13"), c.end());
  EXPECT_NE(std::find(c.begin(), c.end(), "/site/torch/lib/../../nvidia/cuda_cupti/lib/libcupti.so.13"), c.end());
  auto loader = std::find(c.begin(), c.end(), "libcupti.so.13");
  auto toolkit = std::find(c.begin(), c.end(), "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13");
  ASSERT_NE(loader, c.end());
  ASSERT_NE(toolkit, c.end());
  EXPECT_LT(loader, toolkit);  // the wheel's and the loader path's before the toolkit's
}

TEST(KernelTracePure, VersionsAndNames) {
  EXPECT_TRUE(pi::CuptiVersionCompatible(130001, 130001));
  EXPECT_TRUE(pi::CuptiVersionCompatible(130001, 130100));
  EXPECT_FALSE(pi::CuptiVersionCompatible(130001, 120000));
  EXPECT_FALSE(pi::CuptiVersionCompatible(130001, 24));
  EXPECT_FALSE(pi::CuptiVersionCompatible(130001, 140000));
  EXPECT_EQ(pi::DemangleKernelName("_Z10gemm_tilediPf"), "gemm_tiled(int, float*)");
  EXPECT_EQ(pi::DemangleKernelName("prism_stamp"), "prism_stamp");  // extern "C"
  EXPECT_EQ(pi::DemangleKernelName(nullptr), "?");
}

#ifdef PRISM_FAKE_CUPTI

// The fake's controls, from the copy the collector loaded (dlopen of the same path gives the same object).
struct Fake {
  void* h = nullptr;
  uint64_t (*now)() = nullptr;
  int (*enabled)(int) = nullptr;
  int (*flushes)() = nullptr;
  void (*reset)() = nullptr;
  void (*kernel)(const char*, uint64_t, uint64_t, uint32_t, uint32_t, uint64_t, uint32_t) = nullptr;
  void (*memcpy)(uint64_t, uint64_t, uint32_t, uint64_t, int) = nullptr;
  void (*memset)(uint64_t, uint64_t, uint32_t, uint64_t) = nullptr;
  void (*marker)(uint64_t, uint32_t, uint32_t, const char*, uint32_t) = nullptr;

  bool Load() {
    h = dlopen(PRISM_FAKE_CUPTI, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return false;
    now = reinterpret_cast<decltype(now)>(dlsym(h, "fake_cupti_now"));
    enabled = reinterpret_cast<decltype(enabled)>(dlsym(h, "fake_cupti_enabled"));
    flushes = reinterpret_cast<decltype(flushes)>(dlsym(h, "fake_cupti_flushes"));
    reset = reinterpret_cast<decltype(reset)>(dlsym(h, "fake_cupti_reset"));
    kernel = reinterpret_cast<decltype(kernel)>(dlsym(h, "fake_cupti_add_kernel"));
    memcpy = reinterpret_cast<decltype(memcpy)>(dlsym(h, "fake_cupti_add_memcpy"));
    memset = reinterpret_cast<decltype(memset)>(dlsym(h, "fake_cupti_add_memset"));
    marker = reinterpret_cast<decltype(marker)>(dlsym(h, "fake_cupti_add_marker"));
    return now && enabled && flushes && reset && kernel && memcpy && memset && marker;
  }
};

class KernelTrace : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("prism-ktrace-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* v : {"FAKE_CUPTI_VERSION", "FAKE_CUPTI_FAIL_ENABLE", "FAKE_CUPTI_SKEW_NS", "FAKE_CUPTI_DROPPED",
                          "NVTX_INJECTION64_PATH"})
      unsetenv(v);
    setenv("PRISM_CUPTI_LIBRARY", PRISM_FAKE_CUPTI, 1);
    ASSERT_TRUE(fake_.Load()) << dlerror();
    fake_.reset();
    Configure(1);
  }
  void TearDown() override {
    pi::KernelTraceFinish();  // while its runtime is installed (CUPTI flushes into it)
    rt_.reset();
    unsetenv("PRISM_CUPTI_LIBRARY");
    unsetenv("NVTX_INJECTION64_PATH");
    fs::remove_all(dir_);
  }
  void Configure(int kernels, bool out_dir = true) {
    pi::Config c;
    c.rank = 3;
    c.world_size = 8;
    c.kernels = kernels;
    if (out_dir) c.out_dir = dir_.string();
    rt_.reset();  // a fresh runtime: the trace starts again
    rt_.emplace(pi::Runtime::Parts{.config = c});
  }
  fs::path File() const { return dir_ / prism::kernels::FileName(3); }

  fs::path dir_;
  Fake fake_;
  std::optional<pi::ScopedRuntime> rt_;
};

TEST_F(KernelTrace, RecordsKernelsCopiesAndGraphLaunches) {
  pi::KernelTraceAtCudaInit();
  ASSERT_EQ(pi::KernelTraceState(), "on") << pi::KernelTraceWhy();
  EXPECT_EQ(pi::KernelTracePath(), File().string());
  EXPECT_TRUE(fake_.enabled(10));   // CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
  EXPECT_TRUE(fake_.enabled(1));    // MEMCPY
  EXPECT_TRUE(fake_.enabled(2));    // MEMSET
  EXPECT_FALSE(fake_.enabled(12));  // MARKER: only with PRISM_KERNELS=nvtx
  pi::KernelTraceAtCudaInit();      // later calls do nothing
  const uint64_t t = fake_.now();
  const char* fill = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEEEEviT0_";
  fake_.kernel("_Z10gemm_tilediPf", t + 1000, t + 51000, 7, 0, 0, 11);
  fake_.kernel(fill, t + 60000, t + 63000, 7, 0, 0, 12);
  fake_.kernel(fill, t + 70000, t + 72000, 7, 0, 0, 13);
  fake_.kernel("prism_stamp", t + 80000, t + 82000, 9, 5, 77, 14);  // inside CUDA graph 5
  fake_.kernel("_Z10gemm_tilediPf", 0, 0, 7, 0, 0, 15);             // no timing (CUPTI had no memory): skipped
  fake_.memcpy(t + 90000, t + 95000, 7, 4096, 1);
  fake_.memset(t + 96000, t + 97000, 7, 512);
  pi::KernelTraceFinish();
  EXPECT_GE(fake_.flushes(), 1);
  EXPECT_FALSE(fake_.enabled(10));  // disabled after the final flush

  const std::string text = ReadText(File());
  EXPECT_NE(text.find("\"status\":\"on\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"kinds\":[\"kernel\",\"memcpy\",\"memset\"]"), std::string::npos) << text;
  EXPECT_NE(text.find("\"incomplete\":1"), std::string::npos) << text;
  std::string error;
  auto f = pl::ReadKernelFile(File().string(), &error);
  ASSERT_TRUE(f) << error;
  EXPECT_TRUE(f->has_header);
  EXPECT_EQ(f->rank, 3);
  EXPECT_EQ(f->status, "on");
  EXPECT_NE(f->cupti.find("kernel_fake_cupti"), std::string::npos) << f->cupti;
  EXPECT_TRUE(f->ended);
  EXPECT_EQ(f->malformed, 0);
  EXPECT_GE(f->syncs.size(), 2u);  // at start and at the end
  ASSERT_EQ(f->records.size(), 6u);
  // Names are demangled once each (a name table), kernels point at them.
  ASSERT_EQ(f->names.size(), 3u);
  EXPECT_EQ(f->names[static_cast<size_t>(f->records[0].name)], "gemm_tiled(int, float*)");
  EXPECT_EQ(f->names[static_cast<size_t>(f->records[1].name)],
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int, "
            "at::native::FillFunctor<float>)");
  EXPECT_EQ(f->records[1].name, f->records[2].name);
  const pl::KernelRecord& g = f->records[3];
  EXPECT_EQ(f->names[static_cast<size_t>(g.name)], "prism_stamp");
  EXPECT_EQ(g.graph, 5u);
  EXPECT_EQ(g.graph_node, 77u);
  EXPECT_EQ(g.stream, 9u);
  EXPECT_EQ(g.correlation, 14u);
  EXPECT_EQ(g.grid[0], 108);
  EXPECT_EQ(g.block[0], 256);
  EXPECT_EQ(f->records[0].graph, 0u);
  EXPECT_EQ(f->records[0].start_ns, static_cast<int64_t>(t + 1000));  // raw CUPTI time in the file
  EXPECT_EQ(f->records[4].kind, pl::KernelKind::kMemcpy);
  EXPECT_EQ(f->records[4].bytes, 4096u);
  EXPECT_EQ(f->records[4].copy_kind, 1);
  EXPECT_EQ(f->records[5].kind, pl::KernelKind::kMemset);
  EXPECT_EQ(f->records[5].bytes, 512u);
}

TEST_F(KernelTrace, SyncLinesMeasureCuptisClock) {
  setenv("FAKE_CUPTI_SKEW_NS", "5000000", 1);  // CUPTI's clock 5 ms ahead of the host's
  pi::KernelTraceAtCudaInit();
  ASSERT_EQ(pi::KernelTraceState(), "on") << pi::KernelTraceWhy();
  const uint64_t c = fake_.now();
  const int64_t host = static_cast<int64_t>(pi::HostNowNs());
  pi::KernelTraceFinish();
  std::string error;
  auto f = pl::ReadKernelFile(File().string(), &error);
  ASSERT_TRUE(f) << error;
  ASSERT_GE(f->syncs.size(), 2u);
  for (const pl::KernelSync& s : f->syncs) {
    EXPECT_NEAR(static_cast<double>(s.cupti_minus_host_ns), 5e6, 2e5);
    EXPECT_FALSE(s.gpu_known);  // no GPU here: libprism never measured its offset
  }
  pl::KernelClock clock(f->syncs);
  EXPECT_NEAR(static_cast<double>(clock.CuptiToHost(static_cast<int64_t>(c))), static_cast<double>(host), 2e5);
}

TEST_F(KernelTrace, NvtxRangesWithPrismKernelsNvtx) {
  Configure(2);
  pi::KernelTraceAtCudaInit();
  ASSERT_EQ(pi::KernelTraceState(), "on") << pi::KernelTraceWhy();
  EXPECT_TRUE(fake_.enabled(12));
  const char* inj = std::getenv("NVTX_INJECTION64_PATH");
  ASSERT_NE(inj, nullptr);
  EXPECT_EQ(std::string(inj), PRISM_FAKE_CUPTI);
  const uint64_t t = fake_.now();
  fake_.marker(t + 100, 1, prism::kernels::kMarkerStart, "forward", 4242);
  fake_.marker(t + 5100, 1, prism::kernels::kMarkerEnd, nullptr, 4242);
  fake_.marker(t + 6000, 2, prism::kernels::kMarkerInstant, "tick", 4242);
  pi::KernelTraceFinish();
  std::string error;
  auto rk = pl::LoadRankKernels(dir_.string(), 3, &error);
  ASSERT_TRUE(rk) << error;
  ASSERT_EQ(rk->file.markers.size(), 3u) << ReadText(File());
  ASSERT_EQ(rk->nvtx.size(), 2u);
  EXPECT_EQ(rk->file.names[static_cast<size_t>(rk->nvtx[0].name)], "forward");
  EXPECT_NEAR(static_cast<double>(rk->nvtx[0].end_ns - rk->nvtx[0].start_ns), 5000.0, 50.0);
  EXPECT_EQ(rk->nvtx[0].thread, 4242u);
  EXPECT_EQ(rk->nvtx[1].end_ns, rk->nvtx[1].start_ns);  // instantaneous
}

// Every way CUPTI can be unusable: state off, the reason in the file's header, nothing thrown, the job goes on.
// PRISM_KERNELS_TOGGLE=2: recording on for iterations 0-1, off for 2-3, on for 4-5 (the overhead within one run).
TEST_F(KernelTrace, ToggleSwitchesRecordingAtIterationMarks) {
  pi::Config c = pi::Cfg();
  c.kernels_toggle = 2;
  (*rt_)->set_config(c);
  pi::KernelTraceAtCudaInit();
  ASSERT_EQ(pi::KernelTraceState(), "on") << pi::KernelTraceWhy();
  std::vector<int> on;
  for (uint32_t it = 0; it < 6; ++it) {
    pi::KernelTraceAtIteration(it);
    on.push_back(fake_.enabled(10) + fake_.enabled(1) + fake_.enabled(2));  // kernel, memcpy, memset
  }
  EXPECT_EQ(on, (std::vector<int>{3, 3, 0, 0, 3, 3}));
  pi::KernelTraceFinish();
  EXPECT_NE(ReadText(File()).find("\"toggle\":2"), std::string::npos);
}

TEST_F(KernelTrace, NoToggleLeavesRecordingOn) {
  pi::KernelTraceAtCudaInit();
  ASSERT_EQ(pi::KernelTraceState(), "on") << pi::KernelTraceWhy();
  for (uint32_t it = 0; it < 6; ++it) pi::KernelTraceAtIteration(it);
  EXPECT_TRUE(fake_.enabled(10));
  pi::KernelTraceFinish();
}

TEST_F(KernelTrace, NoCuptiLibrary) {
  setenv("PRISM_CUPTI_LIBRARY", "/nonexistent/libcupti.so.13", 1);
  pi::KernelTraceAtCudaInit();
  EXPECT_EQ(pi::KernelTraceState(), "off");
  EXPECT_NE(pi::KernelTraceWhy().find("no such file"), std::string::npos) << pi::KernelTraceWhy();
  pi::KernelTraceFinish();
  const std::string text = ReadText(File());
  EXPECT_NE(text.find("\"status\":\"off\""), std::string::npos) << text;
  EXPECT_NE(text.find("PRISM_CUPTI_LIBRARY"), std::string::npos) << text;
  std::string error;
  auto rk = pl::LoadRankKernels(dir_.string(), 3, &error);
  ASSERT_TRUE(rk) << error;
  ASSERT_FALSE(rk->warnings.empty());
  EXPECT_NE(rk->warnings[0].find("not recorded"), std::string::npos) << rk->warnings[0];
}

TEST_F(KernelTrace, WrongCuptiVersionIsRefused) {
  setenv("FAKE_CUPTI_VERSION", "120000", 1);
  pi::KernelTraceAtCudaInit();
  EXPECT_EQ(pi::KernelTraceState(), "off");
  EXPECT_NE(pi::KernelTraceWhy().find("CUPTI API version 120000"), std::string::npos) << pi::KernelTraceWhy();
}

TEST_F(KernelTrace, KernelsRefusedByCupti) {
  setenv("FAKE_CUPTI_FAIL_ENABLE", "10", 1);  // e.g. another profiler holds CUPTI
  pi::KernelTraceAtCudaInit();
  EXPECT_EQ(pi::KernelTraceState(), "off");
  EXPECT_NE(pi::KernelTraceWhy().find("CONCURRENT_KERNEL"), std::string::npos) << pi::KernelTraceWhy();
  EXPECT_NE(ReadText(File()).find("\"status\":\"off\""), std::string::npos);
}

TEST_F(KernelTrace, MemcpyRefusedKeepsKernels) {
  setenv("FAKE_CUPTI_FAIL_ENABLE", "1", 1);
  pi::KernelTraceAtCudaInit();
  ASSERT_EQ(pi::KernelTraceState(), "on") << pi::KernelTraceWhy();
  pi::KernelTraceFinish();
  EXPECT_NE(ReadText(File()).find("\"kinds\":[\"kernel\",\"memset\"]"), std::string::npos) << ReadText(File());
}

TEST_F(KernelTrace, DroppedRecordsAreCounted) {
  setenv("FAKE_CUPTI_DROPPED", "17", 1);
  pi::KernelTraceAtCudaInit();
  ASSERT_EQ(pi::KernelTraceState(), "on");
  const uint64_t t = fake_.now();
  fake_.kernel("_Z10gemm_tilediPf", t, t + 10, 7, 0, 0, 1);
  pi::KernelTraceFinish();
  std::string error;
  auto f = pl::ReadKernelFile(File().string(), &error);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->dropped, 17);
}

TEST_F(KernelTrace, OneProcessPerRankRecords) {
  // Another process of the rank (here: another open file description) holds the file: this one stays off and
  // leaves the file alone.
  const int fd = open(File().c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "theirs\n", 7), 7);
  ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  pi::KernelTraceAtCudaInit();
  EXPECT_EQ(pi::KernelTraceState(), "off");
  EXPECT_NE(pi::KernelTraceWhy().find("another process of rank 3"), std::string::npos) << pi::KernelTraceWhy();
  pi::KernelTraceFinish();
  close(fd);
  EXPECT_EQ(ReadText(File()), "theirs\n");
}

TEST_F(KernelTrace, NotRequestedOrNowhereToWrite) {
  Configure(0);
  pi::KernelTraceAtCudaInit();
  EXPECT_EQ(pi::KernelTraceState(), "off");
  EXPECT_FALSE(fs::exists(File()));
  EXPECT_FALSE(fake_.enabled(10));
  Configure(1, /*out_dir=*/false);
  pi::KernelTraceAtCudaInit();
  EXPECT_EQ(pi::KernelTraceState(), "off");
  EXPECT_NE(pi::KernelTraceWhy().find("PRISM_OUT_DIR"), std::string::npos);
  EXPECT_FALSE(fake_.enabled(10));
}

#endif  // PRISM_FAKE_CUPTI

}  // namespace
