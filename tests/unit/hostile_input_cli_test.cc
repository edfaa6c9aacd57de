// prism-run itself meeting hostile input: every case ends with exit 2 and a message naming the file, flag or
// field, never an abort (include/prism/limits.h has the bounds).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace prism {
namespace {

namespace fs = std::filesystem;
using test_util::RunPrism;

class HostileInputCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::getenv("PRISM_RUN")) GTEST_SKIP() << "PRISM_RUN not set (ctest sets it)";
    dir_ = fs::temp_directory_path() / ("prism_hostile_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }
  std::string Write(const std::string& name, const std::string& bytes) const {
    std::ofstream(P(name), std::ios::binary) << bytes;
    return P(name);
  }
  // The example graph with its first collective's `key` set to `v`.
  std::string GraphWith(const std::string& key, const nlohmann::json& v) {
    std::ifstream in(std::string(PRISM_SOURCE_DIR) + "/examples/graphs/gpt-tp2-pp2-dp2.prism.json");
    nlohmann::json j = nlohmann::json::parse(in);
    for (auto& n : j["classes"][0]["streams"][0]["nodes"]) {
      if (n["kind"] == "coll") {
        n[key] = v;
        break;
      }
    }
    return Write("g.prism.json", j.dump());
  }
  fs::path dir_;
};

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST_F(HostileInputCli, SimulateRefusesCborNestedTwoMillionDeep) {
  std::string deep(2'000'000, '\x81');
  deep += '\x00';
  const std::string path = Write("deep.prism", deep);
  auto r = RunPrism("simulate " + path + " --out " + P("out"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, path + ": CBOR nested deeper than 64 levels")) << r.out;
}

TEST_F(HostileInputCli, SimulateRefusesALyingElementCountAndAnOversizeFile) {
  const std::string lie = Write("lie.prism", std::string("\x9b\x40\x00\x00\x00\x00\x00\x00\x00\x00", 10));
  auto r = RunPrism("simulate " + lie + " --out " + P("out"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "declares 4611686018427387904 elements but 1 bytes remain")) << r.out;
  const std::string big = Write("big.prism", "x");
  fs::resize_file(big, uint64_t{20} << 30);  // sparse: nothing on disk
  r = RunPrism("simulate " + big + " --out " + P("out"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, big + ": 21474836480 bytes is larger than the 1073741824-byte (1 GiB) cap")) << r.out;
  r = RunPrism("simulate /dev/zero --out " + P("out"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "/dev/zero: is a device")) << r.out;
}

TEST_F(HostileInputCli, SimulateRefusesNegativeBytesAndHugeDurationsNamingTheField) {
  auto r = RunPrism("simulate " + GraphWith("bytes", -5) + " --out " + P("out"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "\"bytes\" is -5: must be an integer in 0..")) << r.out;
  r = RunPrism("simulate " + GraphWith("dur_us", 1e308) + " --out " + P("out"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "\"dur_us\" is 1e+308: must be in 0..1e+12")) << r.out;
}

TEST_F(HostileInputCli, SynthBoundsItsFlagsWhereParsed) {
  auto r = RunPrism("synth -o " + P("g.prism") + " --microbatches 2000000000");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "--microbatches")) << r.out;
  EXPECT_TRUE(Has(r.out, "at most 65536")) << r.out;
  r = RunPrism("synth -o " + P("g.prism") + " --fwd-us -5");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "--fwd-us")) << r.out;
  EXPECT_TRUE(Has(r.out, "must be 0..1000000000000")) << r.out;
  EXPECT_FALSE(fs::exists(P("g.prism")));
}

TEST_F(HostileInputCli, CoordinatorWorldSizeIsBoundedAndNeverWraps) {
  for (const char* w : {"1000000000", "18446744073709551621", "0"}) {
    auto r = RunPrism(std::string("coordinator --world-size ") + w + " --port 0");
    EXPECT_EQ(r.rc, 2) << w << ": " << r.out;
    EXPECT_TRUE(Has(r.out, "--world-size")) << r.out;
    EXPECT_TRUE(Has(r.out, "must be 1..1048576")) << r.out;
    EXPECT_FALSE(Has(r.out, "-2147483648")) << r.out;
  }
}

TEST_F(HostileInputCli, RangeErrorsDoNotPrintADoublesMaximum) {
  auto r = RunPrism("report diff " + P("a") + " " + P("b") + " --max-regression -1");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "--max-regression")) << r.out;
  EXPECT_FALSE(Has(r.out, "1797693")) << r.out;
  EXPECT_LT(r.out.size(), 400u) << r.out;
}

TEST_F(HostileInputCli, ReportShowSaysDirectoryAndNamesAStringNumber) {
  fs::create_directories(P("run/report.json"));
  auto r = RunPrism("report show " + P("run/report.json"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "report.json: is a directory")) << r.out;
  nlohmann::json rep = {{"schema_version", 1}, {"world_size", "8"}, {"mode", "simulate"}, {"ranks", nlohmann::json::array()}};
  fs::create_directories(P("run2"));
  Write("run2/report.json", rep.dump());
  r = RunPrism("report show " + P("run2"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "\"world_size\" is \"8\": must be a number")) << r.out;
}

TEST_F(HostileInputCli, RankListsGetTheSameErrorInEverySubcommand) {
  auto r = RunPrism("coordinator --world-size 8 --ranks 1,1 --port 0");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "--ranks \"1,1\": rank 1 is given twice")) << r.out;
  const std::string graph = std::string(PRISM_SOURCE_DIR) + "/examples/graphs/gpt-tp2-pp2-dp2.prism.json";
  r = RunPrism("simulate " + graph + " --out " + P("out") + " --trace-ranks 1,1");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "--trace-ranks \"1,1\": rank 1 is given twice")) << r.out;
}

// A --topology file is read within its cap and its shape (limits::kMaxTopologyFileBytes, 16 MiB): a 20 GB file or
// a broken one is an error naming it, exit 2, in simulate and in graph build.
TEST_F(HostileInputCli, TopologyFilesAreBoundedAndNamed) {
  const std::string graph = std::string(PRISM_SOURCE_DIR) + "/examples/graphs/gpt-tp2-pp2-dp2.prism.json";
  const std::string big = Write("big.json", "x");
  fs::resize_file(big, uint64_t{20} << 30);  // sparse: nothing on disk
  const std::string cap = ": 21474836480 bytes is larger than the 16777216-byte (16 MiB) cap on topology files";
  auto r = RunPrism("simulate " + graph + " --out " + P("out") + " --topology " + big);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, big + cap)) << r.out;
  const std::string broken = Write("broken.json", R"({"node": {"gpus": )");
  r = RunPrism("simulate " + graph + " --out " + P("out") + " --topology " + broken);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, broken + ": not valid JSON")) << r.out;
  const std::string events = std::string(PRISM_SOURCE_DIR) + "/tests/data/graph/megatron_w64_collect";
  r = RunPrism("graph build " + events + " --out " + P("g.prism") + " --topology " + big);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, big + cap)) << r.out;
  const std::string deep = Write("deep.json", std::string(100000, '[') + std::string(100000, ']'));
  r = RunPrism("graph build " + events + " --out " + P("g.prism") + " --topology " + deep);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, deep + ": JSON nested deeper than 64 levels")) << r.out;
  EXPECT_FALSE(fs::exists(P("g.prism")));
}

// `report kernels` reads a run's kernel files within their cap (limits::kMaxKernelFileBytes, 4 GiB); a file over it,
// or one with nothing readable in it, is an error naming it, exit 2.
TEST_F(HostileInputCli, ReportKernelsBoundsAndNamesItsFiles) {
  fs::create_directories(P("run"));
  const std::string big = Write("run/rank0.kernels.jsonl", "x");
  fs::resize_file(big, uint64_t{5} << 30);
  auto r = RunPrism("report kernels " + P("run"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, big + ": 5368709120 bytes is larger than the 4294967296-byte (4 GiB) cap on kernel files"))
      << r.out;
  fs::create_directories(P("run2"));
  const std::string junk = Write("run2/rank0.kernels.jsonl", "garbage\n\x01\x02 more garbage\n");
  r = RunPrism("report kernels " + P("run2"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, junk + ": not a kernel file (no header line, no records, 2 unreadable lines)")) << r.out;
}

}  // namespace
}  // namespace prism
