// prism-run collect and --payload recorded at the user's level (dry runs: which ranks run, what each gets).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli_runner.h"

namespace {

namespace fs = std::filesystem;

using Result = prism::test_util::CliRun;
Result PrismRun(const std::string& args) { return prism::test_util::RunPrism(args); }

const char* kJob =
    "torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
    "--pipeline-model-parallel-size 2";

TEST(CollectCli, RunsDataParallelReplicaZeroAndRecordsPayloads) {
  ASSERT_NE(std::getenv("PRISM_RUN"), nullptr) << "PRISM_RUN is not set (ctest sets it)";
  fs::path out = fs::temp_directory_path() / ("prism_collect_" + std::to_string(getpid()));
  Result r = PrismRun("collect --dry-run --json --out " + out.string() + " " + kJob);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  std::vector<int> ranks;
  for (const auto& x : j.at("real_ranks")) ranks.push_back(x.at("rank").get<int>());
  // world 64, tp 2, pp 2, order tp-cp-ep-dp-pp: dp 0 is ranks 0, 1 (stage 0) and 32, 33 (stage 1).
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 32, 33}));
  for (const auto& w : j.at("workers")) {
    const int rank = w.at("rank").get<int>();
    EXPECT_EQ(w.at("env").at("PRISM_RECORD_PAYLOADS").get<std::string>(),
              (out / "payloads" / ("rank" + std::to_string(rank) + ".bin")).string());
  }
  EXPECT_NE(PrismRun("collect --ranks 5 --dry-run " + std::string(kJob)).rc, 0);
  // --iterations K (the "one, or --iterations K, iterations"): accepted, and not negative.
  EXPECT_EQ(PrismRun("collect --iterations 3 --dry-run --out " + out.string() + " " + kJob).rc, 0);
  EXPECT_NE(PrismRun("collect --iterations -1 --dry-run --out " + out.string() + " " + kJob).rc, 0);
  // --payload-max-bytes: libprism's PRISM_PAYLOAD_MAX_BYTES in bytes; unset without it (libprism's 4 MiB default).
  Result lim = PrismRun("collect --payload-max-bytes 1M --dry-run --json --out " + out.string() + " " + kJob);
  ASSERT_EQ(lim.rc, 0) << lim.out;
  EXPECT_NE(lim.out.find("\"PRISM_PAYLOAD_MAX_BYTES\": \"1048576\""), std::string::npos) << lim.out;
  EXPECT_EQ(r.out.find("PRISM_PAYLOAD_MAX_BYTES"), std::string::npos);
  EXPECT_EQ(PrismRun("--payload-max-bytes lots --dry-run " + std::string(kJob)).rc, 2);
}

TEST(CollectCli, RecordedPayloadsGoToEachRankByClass) {
  fs::path dir = fs::temp_directory_path() / ("prism_payloads_" + std::to_string(getpid()));
  fs::create_directories(dir / "payloads");
  std::ofstream(dir / "payloads" / "rank33.bin") << "PRSMPAY1";
  Result r = PrismRun("--dry-run --json --ranks 63 --payload recorded --payload-dir " + dir.string() + " " + kJob);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  // Rank 63 (tp 1, dp 15, pp 1) replays rank 33's payloads (tp 1, dp 0, pp 1).
  EXPECT_EQ(j.at("workers").at(0).at("env").at("PRISM_PAYLOAD_FILE").get<std::string>(),
            (dir / "payloads" / "rank33.bin").string());
  // Rank 62's class (32) was not collected: a clear error naming what to run.
  Result miss = PrismRun("--dry-run --ranks 62 --payload recorded --payload-dir " + dir.string() + " " + kJob);
  EXPECT_EQ(miss.rc, 2);
  EXPECT_NE(miss.out.find("rank32.bin"), std::string::npos) << miss.out;
  EXPECT_NE(miss.out.find("prism-run collect"), std::string::npos) << miss.out;
  // recorded without a directory, or a directory without recorded: refused.
  EXPECT_EQ(PrismRun("--dry-run --ranks 63 --payload recorded " + std::string(kJob)).rc, 2);
  EXPECT_EQ(PrismRun("--dry-run --ranks 63 --payload-dir " + dir.string() + " " + kJob).rc, 2);
  fs::remove_all(dir);
}

// A MoE job (world 64, tp 2, pp 2, ep 2): collect runs replica 0 and warns that the ep-1 classes will assume EP
// symmetry; --real-routing adds each replica-0 rank's expert-parallel peers and says why each rank runs.
TEST(CollectCli, RealRoutingRunsTheExpertParallelPeers) {
  const std::string moe = std::string(kJob) + " --expert-model-parallel-size 2 --num-experts 4 "
                          "--disable-gloo-process-groups";
  fs::path out = fs::temp_directory_path() / ("prism_collect_ep_" + std::to_string(getpid()));
  auto ranks_of = [](const nlohmann::json& j) {
    std::vector<int> ranks;
    for (const auto& x : j.at("real_ranks")) ranks.push_back(x.at("rank").get<int>());
    return ranks;
  };
  Result r = PrismRun("collect --dry-run --json --real-routing --out " + out.string() + " " + moe);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j.at("layout").at("ep"), 2);
  EXPECT_TRUE(j.at("real_routing").get<bool>());
  EXPECT_EQ(ranks_of(j), (std::vector<int>{0, 1, 2, 3, 32, 33, 34, 35}));
  EXPECT_EQ(j.at("real_ranks").at(0).at("why"), "replica 0");
  EXPECT_EQ(j.at("real_ranks").at(3).at("why"), "real_routing: expert-parallel peer of rank 1");
  EXPECT_EQ(j.at("env").at("PRISM_REAL_RANKS"), "0,1,2,3,32,33,34,35");
  for (const auto& w : j.at("warnings")) EXPECT_EQ(w.get<std::string>().find("EP symmetry"), std::string::npos) << w;

  Result plain = PrismRun("collect --dry-run --json --out " + out.string() + " " + moe);
  ASSERT_EQ(plain.rc, 0) << plain.out;
  auto jp = nlohmann::json::parse(plain.out.substr(plain.out.find('{')));
  EXPECT_FALSE(jp.at("real_routing").get<bool>());
  EXPECT_EQ(ranks_of(jp), (std::vector<int>{0, 1, 32, 33}));
  EXPECT_NE(jp.at("warnings").dump().find("EP symmetry assumed"), std::string::npos) << jp.at("warnings").dump();

  Result text = PrismRun("collect --dry-run --real-routing --out " + out.string() + " " + moe);
  ASSERT_EQ(text.rc, 0) << text.out;
  EXPECT_NE(text.out.find("real routing   on"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("rank 34: "), std::string::npos) << text.out;
}

}  // namespace
