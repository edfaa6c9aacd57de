// prism-run as a user meets the kernel records: `report kernels` on synthetic output directories, the --kernels
// options in the plan, and (with the real libprism.so preloaded into a CPU stand-in job, tests/data/kernels/worker.py)
// a whole run with a fake libcupti, and one where no CUPTI exists: the job must run on.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using prism::test_util::RunPrism;

fs::path FreshDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("prism-kcli-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string ReadText(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// An output directory with rank `rank`'s kernel and event files: `iters` iterations of 10 ms, each with a gemm
// (100 us * gemm_scale) at +1 ms and a copy kernel at +3 ms (+ shift_us), and libprism's stamp kernel for the mark.
void WriteRun(const fs::path& dir, int rank, int iters, double gemm_scale, int shift_us) {
  fs::create_directories(dir);
  std::ofstream k(dir / ("rank" + std::to_string(rank) + ".kernels.jsonl"));
  std::ofstream e(dir / ("rank" + std::to_string(rank) + ".events.jsonl"));
  const int64_t t0 = 1700000000000000000;
  k << R"({"type":"kernels","v":1,"rank":)" << rank
    << R"(,"pid":1,"status":"on","why":"","cupti":"/x/libcupti.so.13","cupti_version":130001,"kinds":["kernel"]})" "\n";
  k << R"({"type":"sync","host_ns":)" << t0 << R"(,"cupti_minus_host_ns":0,"err_ns":1,"gpu_minus_host_ns":0,"gpu":true})" "\n";
  k << R"J({"type":"name","id":0,"name":"void gemm_kernel<cutlass::Gemm>(int)"})J" "\n";
  k << R"({"type":"name","id":1,"name":"copy_kernel"})" "\n";
  k << R"({"type":"name","id":2,"name":"prism_stamp"})" "\n";
  for (int i = 0; i <= iters; ++i) {
    const int64_t w = t0 + i * 10000000ll;
    k << R"({"type":"k","s":)" << w - 2000 << R"(,"e":)" << w - 1000 << R"(,"st":9,"n":2})" "\n";
    e << R"({"type":"iter","iteration":)" << i << R"(,"t_ns":)" << w - 1700 << R"(,"dur_ns":1,"clock":"gpu"})" "\n";
    if (i == iters) break;
    const int64_t g = static_cast<int64_t>(100000 * gemm_scale) + (i % 2 ? 1000 : -1000);
    k << R"({"type":"k","s":)" << w + 1000000 << R"(,"e":)" << w + 1000000 + g << R"(,"st":7,"n":0,"g":2,"gn":4})" "\n";
    k << R"({"type":"k","s":)" << w + 3000000 + shift_us * 1000 << R"(,"e":)" << w + 3010000 + shift_us * 1000
      << R"(,"st":7,"n":1})" "\n";
  }
  k << R"({"type":"end","records":1,"dropped":0})" "\n";
}

class KernelCli : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NE(std::getenv("PRISM_RUN"), nullptr) << "PRISM_RUN is not set (ctest sets it)"; }
};

TEST_F(KernelCli, ReportKernelsTextAndJson) {
  fs::path d = FreshDir("report");
  WriteRun(d / "native", 0, 6, 1.0, 0);
  WriteRun(d / "prism", 0, 6, 1.2, 50);
  auto r = RunPrism("report kernels " + (d / "native").string() + " " + (d / "prism").string());
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("gemm_kernel<Gemm> [g]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("+19.8"), std::string::npos) << r.out;  // gemm 20% longer in B (medians 101 vs 121 us)
  EXPECT_NE(r.out.find("5 iterations (from 2, 1 skipped)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("7 of 7 libprism stamps matched"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("duration deviation |B-A|/A"), std::string::npos) << r.out;

  auto j = RunPrism("report kernels --json --skip 0 " + (d / "native").string() + " " + (d / "prism").string());
  ASSERT_EQ(j.rc, 0) << j.out;
  json c = json::parse(j.out, nullptr, false);
  ASSERT_FALSE(c.is_discarded()) << j.out;
  EXPECT_EQ(c["a"]["iterations"], 6);
  bool found = false;
  for (const json& row : c["rows"]) {
    if (row["name"] != "copy_kernel") continue;
    found = true;
    EXPECT_DOUBLE_EQ(row["off_dev_pct"].get<double>(), 0.5);  // 50 us of a 10 ms iteration
    EXPECT_DOUBLE_EQ(row["dur_dev_pct"].get<double>(), 0.0);
  }
  EXPECT_TRUE(found) << j.out;

  // One run alone: its own spread; a kernel file names its rank; --rank-b compares different ranks.
  auto self = RunPrism("report kernels " + (d / "native").string());
  EXPECT_EQ(self.rc, 0) << self.out;
  WriteRun(d / "prism", 63, 6, 1.0, 0);
  auto ranks = RunPrism("report kernels --json " + (d / "native" / "rank0.kernels.jsonl").string() + " " +
                        (d / "prism").string() + " --rank-b 63");
  ASSERT_EQ(ranks.rc, 0) << ranks.out;
  json rc = json::parse(ranks.out, nullptr, false);
  EXPECT_EQ(rc["a"]["rank"], 0);
  EXPECT_EQ(rc["b"]["rank"], 63);
  fs::remove_all(d);
}

TEST_F(KernelCli, ReportKernelsBadInput) {
  fs::path d = FreshDir("bad");
  auto none = RunPrism("report kernels " + d.string());
  EXPECT_EQ(none.rc, 2) << none.out;
  EXPECT_NE(none.out.find("--kernels"), std::string::npos) << none.out;
  auto missing = RunPrism("report kernels " + (d / "nope").string());
  EXPECT_EQ(missing.rc, 2) << missing.out;
  EXPECT_NE(missing.out.find("not an output directory"), std::string::npos) << missing.out;
  WriteRun(d / "short", 1, 1, 1.0, 0);  // two marks: one iteration, skipped by default
  auto few = RunPrism("report kernels " + (d / "short").string());
  EXPECT_EQ(few.rc, 2) << few.out;
  EXPECT_NE(few.out.find("try --skip 0"), std::string::npos) << few.out;
  EXPECT_EQ(RunPrism("report kernels --skip 0 " + (d / "short").string()).rc, 0);
  auto wrong_rank = RunPrism("report kernels --rank 5 " + (d / "short").string());
  EXPECT_EQ(wrong_rank.rc, 2) << wrong_rank.out;
  EXPECT_NE(wrong_rank.out.find("no kernel file"), std::string::npos) << wrong_rank.out;
  fs::remove_all(d);
}

TEST_F(KernelCli, PlanPassesTheOption) {
  auto on = RunPrism("--dry-run --json --no-preload --kernels torchrun --nproc-per-node 1 train.py");
  ASSERT_EQ(on.rc, 0) << on.out;
  json p = json::parse(on.out, nullptr, false);
  ASSERT_FALSE(p.is_discarded()) << on.out;
  EXPECT_EQ(p["env"]["PRISM_KERNELS"], "1");
  bool warned = false;
  for (const json& w : p["warnings"]) warned |= w.get<std::string>().find("--kernels with --no-preload") != std::string::npos;
  EXPECT_TRUE(warned) << on.out;
  auto nvtx = RunPrism("--dry-run --json --no-preload --kernels-nvtx torchrun --nproc-per-node 1 train.py");
  EXPECT_EQ(json::parse(nvtx.out, nullptr, false)["env"]["PRISM_KERNELS"], "nvtx") << nvtx.out;
  auto off = RunPrism("--dry-run --json --no-preload torchrun --nproc-per-node 1 train.py");
  EXPECT_FALSE(json::parse(off.out, nullptr, false)["env"].contains("PRISM_KERNELS")) << off.out;
}

// The whole path on a CPU: prism-run --kernels preloads the real libprism.so into the stand-in job, which starts
// the collector (cudaGetDeviceCount) against the fake libcupti, marks iterations, and exits; trace.json then holds
// the kernels next to the iterations, and `report kernels` reads the run.
class KernelRun : public KernelCli {
 protected:
  struct RunResult {
    int rc = -1;
    std::string out;
  };
  void SetUp() override {
    KernelCli::SetUp();
    lib_ = fs::path(PRISM_BINARY_DIR) / "lib" / "libprism.so";
    if (!fs::exists(lib_)) GTEST_SKIP() << "libprism.so is not built (no CUDA headers)";
    if (std::system("python3 -c 'import ctypes' >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 is needed";
  }
  RunResult Run(const fs::path& out, const std::string& cupti) {
    const std::string worker = std::string(PRISM_SOURCE_DIR) + "/tests/data/kernels/worker.py";
    std::string cmd = "env PYTHON_EXEC=python3 PRISM_CUPTI_LIBRARY=" + cupti + " " + std::getenv("PRISM_RUN") +
                      " --policy mirror --kernels --quiet --out " + out.string() + " --ranks 0 --gpus 1 --hang-timeout 0 torchrun "
                      "--nproc-per-node 1 " + worker + " 2>&1";
    RunResult r;
    FILE* f = popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
    const int st = pclose(f);
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
  }
  fs::path lib_;
};

#ifdef PRISM_FAKE_CUPTI
TEST_F(KernelRun, FakeCuptiEndToEnd) {
  fs::path out = FreshDir("run");
  auto r = Run(out, PRISM_FAKE_CUPTI);
  ASSERT_EQ(r.rc, 0) << r.out << ReadText(out / "logs" / "rank0.log");
  EXPECT_NE(ReadText(out / "logs" / "rank0.log").find("kernels worker done"), std::string::npos);
  const std::string kfile = ReadText(out / "rank0.kernels.jsonl");
  EXPECT_NE(kfile.find("\"status\":\"on\""), std::string::npos) << kfile;
  EXPECT_NE(kfile.find("\"type\":\"end\""), std::string::npos) << kfile;  // flushed at exit
  json trace = json::parse(ReadText(out / "trace.json"), nullptr, false);
  ASSERT_FALSE(trace.is_discarded());
  int kernels = 0, graphs = 0, memcpys = 0;
  for (const json& e : trace["traceEvents"]) {
    const std::string cat = e.value("cat", "");
    if (cat == "kernel") {
      ++kernels;
      EXPECT_EQ(e["pid"], 0);
      EXPECT_TRUE(e["tid"] == "stream 7" || e["tid"] == "stream 8") << e.dump();
    }
    graphs += cat == "graph";
    memcpys += cat == "memcpy";
  }
  EXPECT_EQ(kernels, 12);
  EXPECT_EQ(graphs, 4);
  EXPECT_EQ(memcpys, 4);
  EXPECT_EQ(trace["kernels"]["0"]["status"], "on");
  // The run's own iterations (libprism's marks, host clock without a GPU) frame the kernels.
  auto rep = RunPrism("report kernels --json --skip 0 " + out.string());
  ASSERT_EQ(rep.rc, 0) << rep.out;
  json c = json::parse(rep.out, nullptr, false);
  EXPECT_EQ(c["a"]["iterations"], 4);
  EXPECT_DOUBLE_EQ(c["a"]["records_per_iteration"].get<double>(), 4.0);
  fs::remove_all(out);
}
#endif

TEST_F(KernelRun, NoCuptiTheJobRunsOn) {
  fs::path out = FreshDir("nocupti");
  auto r = Run(out, "/nonexistent/libcupti.so.13");
  ASSERT_EQ(r.rc, 0) << r.out << ReadText(out / "logs" / "rank0.log");
  const std::string log = ReadText(out / "logs" / "rank0.log");
  EXPECT_NE(log.find("kernels worker done"), std::string::npos) << log;
  EXPECT_NE(log.find("running without kernel records"), std::string::npos) << log;
  EXPECT_NE(ReadText(out / "rank0.kernels.jsonl").find("\"status\":\"off\""), std::string::npos);
  json rep = json::parse(ReadText(out / "report.json"), nullptr, false);
  ASSERT_FALSE(rep.is_discarded());
  EXPECT_EQ(rep["status"], "finished");
  std::string warnings = rep["warnings"].dump();
  EXPECT_NE(warnings.find("kernels: no usable libcupti"), std::string::npos) << warnings;
  fs::remove_all(out);
}

}  // namespace
