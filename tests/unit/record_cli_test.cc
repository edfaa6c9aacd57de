// prism-run record at the user's level (dry runs): every rank of the world real, each on its own GPU, every
// communicator on the real NCCL; a world larger than this host's GPUs is refused with the numbers.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace {

using prism::test_util::RunPrism;

TEST(RecordCli, EveryRankRealOnItsOwnGpuAndEverythingOnTheRealNccl) {
  ASSERT_NE(std::getenv("PRISM_RUN"), nullptr) << "PRISM_RUN is not set (ctest sets it)";
  const std::string job =
      "torchrun --nnodes 1 --nproc-per-node 4 pretrain_gpt.py --tensor-model-parallel-size 2 "
      "--pipeline-model-parallel-size 2";
  auto r = RunPrism("record --dry-run --json --gpus 4 " + job);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  std::vector<int> ranks, gpus;
  for (const auto& x : j.at("real_ranks")) {
    ranks.push_back(x.at("rank").get<int>());
    gpus.push_back(x.at("gpu").get<int>());
  }
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(gpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(j.at("passthrough"), true);
  EXPECT_EQ(j.at("passthrough_min_members"), 1);
  auto text = RunPrism("record --dry-run --gpus 4 " + job);
  ASSERT_EQ(text.rc, 0) << text.out;
  EXPECT_NE(text.out.find("every communicator runs on the real NCCL"), std::string::npos) << text.out;

  // Four ranks on two GPUs: refused, with the numbers.
  auto small = RunPrism("record --dry-run --gpus 2 " + job);
  EXPECT_EQ(small.rc, 2) << small.out;
  EXPECT_NE(small.out.find("needs 4 GPUs here, 2 are visible"), std::string::npos) << small.out;
  // --ranks does not apply; a job is needed.
  EXPECT_NE(RunPrism("record --ranks 0 --dry-run --gpus 4 " + job).rc, 0);
  EXPECT_EQ(RunPrism("record").rc, 2);
}

}  // namespace
