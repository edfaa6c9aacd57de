// `prism-run status` rendering (coordinator/status/status_view.h) from hand-made documents: real ranks per
// communicator, virtual ranks grouped by the communicators they share with real ranks, Megatron names from the
// layout, and the hang diagnosis; and the detector's positions as status.json holds them.
#include <gtest/gtest.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "coordinator/hang/hang_detector.h"
#include "coordinator/status/status_view.h"

namespace prism::coord {
namespace {

using json = nlohmann::json;
constexpr uint64_t kSec = 1'000'000'000ull;

TEST(RankListText, RunsAndStrides) {
  EXPECT_EQ(RankListText({}), "");
  EXPECT_EQ(RankListText({3}), "3");
  EXPECT_EQ(RankListText({0, 1, 2, 3, 5, 7}), "0-3,5,7");
  EXPECT_EQ(RankListText({7, 3, 11, 15}), "3,7..15 (step 4)");
  EXPECT_EQ(RankListText({0, 2, 3, 4, 9}), "0,2-4,9");
}

// World 16, tp 2 (layout "tp=2"): real ranks 1 and 9 share the data-parallel group {1,3,5,...,15}.
TEST(StatusView, RealPositionsAndVirtualGroups) {
  HangDetector d(60);
  std::vector<int> world(16), dp;
  for (int i = 0; i < 16; ++i) world[static_cast<size_t>(i)] = i;
  for (int i = 1; i < 16; i += 2) dp.push_back(i);
  std::vector<bool> world_real(16, false), dp_real(8, false);
  world_real[1] = world_real[9] = true;
  dp_real[0] = dp_real[4] = true;
  d.AddComm(1, "default_pg", world, world_real, "0", "default_pg");
  d.AddComm(2, "group 3", dp, dp_real, "3", "");
  ipc::OpRecord rec{};
  rec.comm_id = 2;
  rec.seq = 6;
  rec.op = 1;
  rec.bytes = 1 << 20;
  rec.dtype = 3;  // bf16
  d.Record(1, rec, 10 * kSec);
  d.Record(9, rec, 10 * kSec);
  ipc::OpArrive a{};
  a.comm_id = 2;
  a.seq = 7;
  a.op = 1;
  a.bytes = 1 << 20;
  a.peer = -1;
  d.Arrive(1, a, 11 * kSec);

  json st = {{"t_ns", 20 * kSec}, {"world_size", 16}, {"real_ranks", {1, 9}}, {"virtual_ranks", 14},
             {"payload", "mirror"}, {"graph", ""}, {"releases", 7}};
  st["ranks"] = json::array({{{"rank", 1}, {"state", "connected"}, {"pid", 11}, {"ops_recorded", 7},
                              {"waiting", {{"comm", 2}, {"seq", 7}, {"waiting_for", {9}}}}},
                             {{"rank", 9}, {"state", "connected"}, {"pid", 19}, {"ops_recorded", 7}}});
  AddPositions(d, &st);
  ASSERT_EQ(st["communicators"].size(), 2u);
  EXPECT_EQ(st["communicators"][1]["real"], json::array({1, 9}));
  ASSERT_EQ(st["positions"].size(), 2u);
  EXPECT_EQ(st["positions"][0]["comms"][0]["done"]["seq"], 6);
  EXPECT_EQ(st["positions"][0]["comms"][0]["done"]["dtype"], "bf16");
  EXPECT_EQ(st["positions"][0]["comms"][0]["pending"]["seq"], 7);
  EXPECT_FALSE(st["positions"][1]["comms"][0].contains("pending"));

  StatusDocs docs;
  docs.info = {{"run_id", "r1"}, {"pid", 5}, {"host", "h"}, {"world_size", 16}, {"real_ranks", {1, 9}},
               {"store_host", "127.0.0.1"}, {"store_port", 29500}, {"socket", "/s"}, {"layout", "tp=2"}};
  docs.status = st;
  docs.where = "/out";
  docs.alive = "running";
  StatusViewOptions vo;
  vo.now_ns = 21 * kSec;
  std::string text = RenderStatus(docs, vo);
  // The data-parallel group is named from the layout (Megatron's DATA_PARALLEL_GROUP has exactly these members).
  EXPECT_NE(text.find("comm 2 (group 3, DATA_PARALLEL_GROUP_WITH_CP|DATA_PARALLEL_GROUP|"), std::string::npos) << text;
  EXPECT_NE(text.find("8 ranks 1,3..15 (step 2), real 1,9"), std::string::npos) << text;
  EXPECT_NE(text.find("done seq 6 all_reduce 1 MiB bf16 (11.0 s ago); WAITING at seq 7 all_reduce 1 MiB for 10.0 s "
                      "on ranks 9"),
            std::string::npos)
      << text;
  // Virtual ranks: the odd ones (in the DP group with 1 and 9) and the even ones (only in the world).
  EXPECT_NE(text.find("0,2..14 (step 2) (8 ranks):"), std::string::npos) << text;
  EXPECT_NE(text.find("3,5,7,11,13,15 (6 ranks):"), std::string::npos) << text;
  EXPECT_NE(text.find("as real ranks 1,9, done seq 6 all_reduce 1 MiB bf16, waiting at seq 7"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("HANG"), std::string::npos) << text;

  HangDiagnosis diag = d.Diagnose(80 * kSec);
  docs.hang = json::parse(diag.ToJson());
  text = RenderStatus(docs, vo);
  EXPECT_NE(text.find("HANG diagnosed"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 waits 69 s at comm 2 (group 3) seq 7 (all_reduce 1 MiB) for rank 9"), std::string::npos)
      << text;
}

TEST(StatusView, NoStatusYet) {
  StatusDocs docs;
  docs.where = "h:1";
  docs.alive = "running";
  std::string text = RenderStatus(docs, StatusViewOptions{});
  EXPECT_NE(text.find("no status yet"), std::string::npos) << text;
}

}  // namespace
}  // namespace prism::coord
