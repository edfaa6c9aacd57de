// `prism-run calibrate` as a user runs it (the real binary, via $PRISM_RUN): fit a measurement file, load the
// result with simulate's --topology, bad input (exit 2 with a message), and measuring where there is no GPU (exit 1
// with a message, no crash).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "calibrate/measurements.h"
#include "calibrate/synthetic.h"
#include "cli_runner.h"
#include "replay/topology.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using prism::test_util::RunPrism;

class CalibrateCli : public testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("PRISM_RUN") == nullptr) GTEST_SKIP() << "PRISM_RUN not set (run through ctest)";
    dir_ = fs::path(testing::TempDir()) / ("prism_calib_" + std::to_string(::getpid()) + "_" +
                                           testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }
  // Measurements computed from a known topology: h200-8x400g with slower NVLink and p2p (labelled synthetic).
  std::string WriteSynthetic(const std::string& name) const {
    prism::replay::Topology truth;
    std::string err;
    EXPECT_TRUE(prism::replay::LoadTopology("h200-8x400g", &truth, &err)) << err;
    truth.nvlink_bw_GBps = 300;
    truth.nccl_intra_latency_offset_us = 3;
    truth.p2p_intra = {8, 200};
    prism::calibrate::SyntheticSpec spec;
    spec.gpus = 2;
    spec.comm_sizes = {2};
    spec.noise_pct = 2;
    spec.gpu_name = "NVIDIA H200";
    prism::calibrate::MeasurementSet set = prism::calibrate::Synthesize(truth, spec);
    EXPECT_TRUE(prism::calibrate::WriteMeasurements(P(name), set, &err)) << err;
    return P(name);
  }
  fs::path dir_;
};

TEST_F(CalibrateCli, FitsAFileAndSimulateLoadsTheTopology) {
  std::string meas = WriteSynthetic("meas.json");
  auto r = RunPrism("calibrate --from " + meas + " --out " + P("topo.json"));
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* s : {"measurements from", "fitted (intra-node; base h200-8x400g)", "error summary", "allreduce",
                        "sendrecv", "notes:", "NCCL_NVLS_ENABLE=0", "wrote " }) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  }
  prism::replay::Topology t;
  std::string err;
  ASSERT_TRUE(prism::replay::LoadTopology(P("topo.json"), &t, &err)) << err;
  EXPECT_EQ(t.name, "h200-8x400g-calibrated");
  EXPECT_EQ(t.calibration["measurements_file"], meas);
  EXPECT_EQ(t.calibration["gpu"], "NVIDIA H200");
  EXPECT_NEAR(t.p2p_intra.bandwidth_GBps, 200, 8);
  EXPECT_FALSE(t.nvls);

  auto s = RunPrism("simulate " + std::string(PRISM_SOURCE_DIR) + "/examples/graphs/gpt-tp2-pp2-dp2.prism.json --topology " +
                    P("topo.json") + " --out " + P("sim") + " --quiet");
  ASSERT_EQ(s.rc, 0) << s.out;
  std::ifstream rep(P("sim/report.json"));
  json j = json::parse(rep, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_GT(j["iteration_time_s"].get<double>(), 0.0);

  // --quiet prints the summary, not every point; --name and --keep-nvls reach the file.
  auto q = RunPrism("calibrate --from " + meas + " --out " + P("topo2.json") + " --quiet --name mine --keep-nvls");
  ASSERT_EQ(q.rc, 0) << q.out;
  EXPECT_EQ(q.out.find("measured us"), std::string::npos) << q.out;
  ASSERT_TRUE(prism::replay::LoadTopology(P("topo2.json"), &t, &err)) << err;
  EXPECT_EQ(t.name, "mine");
  EXPECT_TRUE(t.nvls);
}

TEST_F(CalibrateCli, BadInputExitsTwoNamingTheProblem) {
  auto missing = RunPrism("calibrate --from " + P("nope.json") + " --out " + P("t.json"));
  EXPECT_EQ(missing.rc, 2) << missing.out;
  EXPECT_NE(missing.out.find("nope.json: cannot open"), std::string::npos) << missing.out;

  std::ofstream(P("bad.json")) << R"({"format": "prism-calibrate-measurements", "version": 1,
    "gpu": {"name": "x", "compute_capability": 90, "count": 2}, "nccl": {"version": "2.28.9"},
    "results": [{"op": "allreduce", "nranks": 2, "bytes": 8, "iterations": 1, "time_us": -3}]})";
  auto bad = RunPrism("calibrate --from " + P("bad.json") + " --out " + P("t.json"));
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(bad.out.find("results[0].time_us"), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(P("t.json")));

  std::string meas = WriteSynthetic("meas.json");
  auto base = RunPrism("calibrate --from " + meas + " --base no-such-topology --out " + P("t.json"));
  EXPECT_EQ(base.rc, 2) << base.out;
  EXPECT_NE(base.out.find("--base"), std::string::npos) << base.out;

  auto size = RunPrism("calibrate --max-bytes 12X --out " + P("t.json"));
  EXPECT_EQ(size.rc, 2) << size.out;
  EXPECT_NE(size.out.find("not a size"), std::string::npos) << size.out;
  auto ops = RunPrism("calibrate --ops allreduce,gather --out " + P("t.json"));
  EXPECT_EQ(ops.rc, 2) << ops.out;
  EXPECT_NE(ops.out.find("unknown op \"gather\""), std::string::npos) << ops.out;
}

TEST_F(CalibrateCli, MeasuringWithoutAGpuFailsClearly) {
  if (void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(h);
    GTEST_SKIP() << "this machine has a CUDA driver; tests/gpu/calibrate_suite.sh measures";
  }
  auto r = RunPrism("calibrate --out " + P("t.json"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("prism-run calibrate: cannot measure:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--from"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(P("t.json")));
  EXPECT_FALSE(fs::exists(P("t.measurements.json")));
}

#ifdef PRISM_CALIB_FAKE_CUDA
// The measuring form end to end, on the fakes of libcuda.so.1 (found through LD_LIBRARY_PATH, as the real one is)
// and NCCL (--nccl): both files written, the topology loads. The fakes' times mean nothing; the GPU suite
// (tests/gpu/calibrate_suite.sh) measures for real.
TEST_F(CalibrateCli, MeasuresThenFitsOnFakeGpus) {
  fs::create_directories(P("lib"));
  fs::create_symlink(PRISM_CALIB_FAKE_CUDA, P("lib/libcuda.so.1"));
  std::string cmd = "FAKE_CUDA_GPUS=2 LD_LIBRARY_PATH=" + P("lib") + " " + std::getenv("PRISM_RUN") +
                    " calibrate --nccl " + PRISM_CALIB_FAKE_NCCL + " --max-bytes 64K --target-ms 0.2 --out " +
                    P("out/topo.json") + " --measurements-out " + P("out/meas/m.json") + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  int st = pclose(f);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
  EXPECT_NE(out.find("measuring on 2 x Fake H200"), std::string::npos) << out;
  EXPECT_NE(out.find("wrote " + P("out/meas/m.json")), std::string::npos) << out;
  prism::calibrate::MeasurementSet set;
  std::string err;
  ASSERT_TRUE(prism::calibrate::LoadMeasurements(P("out/meas/m.json"), &set, &err)) << err;
  EXPECT_EQ(set.gpu_count, 2);
  EXPECT_EQ(set.Env("NCCL_NVLS_ENABLE"), "0");
  prism::replay::Topology t;
  ASSERT_TRUE(prism::replay::LoadTopology(P("out/topo.json"), &t, &err)) << err;
  EXPECT_EQ(t.calibration["gpu"], "Fake H200");
  EXPECT_EQ(t.calibration["measurements_file"], P("out/meas/m.json"));
  EXPECT_EQ(t.calibration["base_topology"], "h200-8x400g");
}
#endif

TEST_F(CalibrateCli, ListedInTheHelp) {
  auto r = RunPrism("--help");
  EXPECT_NE(r.out.find("calibrate"), std::string::npos) << r.out;
  auto c = RunPrism("calibrate --help");
  EXPECT_EQ(c.rc, 0) << c.out;
  for (const char* s : {"--from", "--out", "--measurements-out", "--gpus", "--base", "--nccl", "--min-bytes"}) {
    EXPECT_NE(c.out.find(s), std::string::npos) << s;
  }
}

}  // namespace
