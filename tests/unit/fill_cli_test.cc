// prism-run fill at the user's level, without a GPU: the bare graph of a collect run (real Megatron event files,
// tests/data/graph/megatron_w64_collect) is built and simulated; the first slice then fails on this machine (no
// job can run) and fill says which slice failed and where its output is.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "cli_runner.h"

namespace {

namespace fs = std::filesystem;

using Result = prism::test_util::CliRun;
Result PrismRun(const std::string& args) { return prism::test_util::RunPrism(args); }

TEST(FillCli, BuildsAndSimulatesTheBareGraphThenNamesTheFailingSlice) {
  ASSERT_NE(std::getenv("PRISM_RUN"), nullptr) << "PRISM_RUN is not set (ctest sets it)";
  const fs::path data = fs::path(PRISM_SOURCE_DIR) / "tests/data/graph/megatron_w64_collect";
  const fs::path out = fs::temp_directory_path() / ("prism_fill_" + std::to_string(getpid()));
  fs::remove_all(out);
  // A job that cannot start here: the slice exits non-zero at once (--no-preload is not a fill option; the
  // workers' python fails on the missing script).
  Result r = PrismRun("fill --from " + data.string() + " --out " + out.string() + " --rounds 1 --hang-timeout 5 " +
                      "torchrun --nnodes 8 --nproc-per-node 8 /nonexistent/pretrain_gpt.py " +
                      "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("4 classes (ranks 0 1 32 33)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bare graph from"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(out / "bare.prism"));
  EXPECT_TRUE(fs::exists(out / "events" / "rank33.events.jsonl"));
  EXPECT_NE(r.out.find("the slice of rank 0 failed"), std::string::npos) << r.out;
  // The slice ran with the slots within its stage in lockstep (GraphRelease::SetLockstepSlots; --lockstep auto: this
  // graph's tp and dp); --lockstep none: none.
  auto command_of = [](const fs::path& dir) {
    std::ifstream f(dir / "round1" / "rank0" / "command.json");
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_NE(command_of(out).find("\"PRISM_LOCKSTEP_SLOTS\": \"tp,dp\""), std::string::npos) << command_of(out);
  EXPECT_NE(r.out.find("lockstep slots: tp,dp (their virtual members do not hold"), std::string::npos) << r.out;
  // Round 1's graph leaves out the collect's set-up compute of the classes without a slice (ClearUnsampledSetUp).
  EXPECT_NE(r.out.find("set-up (iteration 0) compute is left out of the slices' graph for the 4 class(es)"),
            std::string::npos) << r.out;
  fs::remove_all(out);
  r = PrismRun("fill --from " + data.string() + " --out " + out.string() + " --rounds 1 --hang-timeout 5 " +
               "--lockstep none torchrun --nnodes 8 --nproc-per-node 8 /nonexistent/pretrain_gpt.py " +
               "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_TRUE(fs::exists(out / "round1" / "rank0" / "command.json")) << r.out;
  EXPECT_EQ(command_of(out).find("PRISM_LOCKSTEP_SLOTS"), std::string::npos) << command_of(out);
  fs::remove_all(out);
}

// With 2 GPUs a slice is a tensor-parallel group (ranks 0,1 and 32,33 of the tp2 pp2 graph), each rank on its own
// GPU so that the group's communicator runs on the real NCCL.
TEST(FillCli, TwoGpusSliceByTensorParallelGroup) {
  const fs::path data = fs::path(PRISM_SOURCE_DIR) / "tests/data/graph/megatron_w64_collect";
  const fs::path out = fs::temp_directory_path() / ("prism_fill_g2_" + std::to_string(getpid()));
  fs::remove_all(out);
  Result r = PrismRun("fill --from " + data.string() + " --out " + out.string() + " --rounds 1 --gpus 2 " +
                      "--hang-timeout 5 torchrun --nnodes 8 --nproc-per-node 8 /nonexistent/pretrain_gpt.py " +
                      "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("2 GPUs: 2 slice(s) per round: [0,1] [32,33]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the slice of ranks 0,1 failed"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(out / "round1" / "rank0_1")) << r.out;
  fs::remove_all(out);
}

TEST(FillCli, RefusesADirectoryWithoutEventFiles) {
  const fs::path empty = fs::temp_directory_path() / ("prism_fill_empty_" + std::to_string(getpid()));
  fs::create_directories(empty);
  Result r = PrismRun("fill --from " + empty.string() + " torchrun --nproc-per-node 1 x.py");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("no rank<R>.events.jsonl"), std::string::npos) << r.out;
  Result none = PrismRun("fill torchrun --nproc-per-node 1 x.py");
  EXPECT_EQ(none.rc, 2) << none.out;
  fs::remove_all(empty);
}

// The same collect as an ep 2 job (its report's layout says ep=2): replica 0 holds ep 0 only, so the graph's four
// ep-1 classes repeat the nodes of ranks 0, 1, 32, 33. Fill runs each of those ranks once per round (not once per
// class, which ran every slice twice: [0,1] [0,1] [32,33] [32,33]) and says their slices time the mirrored classes.
TEST(FillCli, ExpertClassesWithoutARealRankShareTheirSourceRanksSlice) {
  const fs::path data = fs::path(PRISM_SOURCE_DIR) / "tests/data/graph/megatron_w64_collect";
  const fs::path from = fs::temp_directory_path() / ("prism_fill_ep_from_" + std::to_string(getpid()));
  const fs::path out = fs::temp_directory_path() / ("prism_fill_ep_" + std::to_string(getpid()));
  fs::remove_all(from);
  fs::remove_all(out);
  fs::create_directories(from);
  for (const auto& f : fs::directory_iterator(data)) fs::copy_file(f.path(), from / f.path().filename());
  std::string rep;
  {
    std::ifstream in(from / "report.json");
    rep.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t at = rep.find("ep=1,etp=2");
  ASSERT_NE(at, std::string::npos) << "the test data's layout spec changed";
  rep.replace(at, 4, "ep=2");
  std::ofstream(from / "report.json", std::ios::trunc) << rep;
  Result r = PrismRun("fill --from " + from.string() + " --out " + out.string() + " --rounds 1 --gpus 2 " +
                      "--hang-timeout 5 torchrun --nnodes 8 --nproc-per-node 8 /nonexistent/pretrain_gpt.py " +
                      "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("8 classes (ranks 0 1 32 33)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4 expert-parallel class(es) repeat the nodes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 GPUs: 2 slice(s) per round: [0,1] [32,33]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the slice of ranks 0,1 failed"), std::string::npos) << r.out;
  fs::remove_all(out);
  fs::remove_all(from);
}

}  // namespace
