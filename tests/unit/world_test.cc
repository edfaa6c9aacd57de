// The logical world: rank <-> coordinates and Megatron's groups, checked against layouts worked out by hand
// (and against the examples in the docstrings of megatron/core/parallel_state.py).
#include "model/world.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace prism::world {
namespace {

using Groups = std::vector<std::vector<int>>;

World MakeWorld(const std::string& spec, int world_size, int gpus_per_node = 8) {
  std::string err;
  auto l = ParseLayout(spec, &err);
  EXPECT_TRUE(l) << spec << ": " << err;
  EXPECT_TRUE(ResolveLayout(&*l, world_size, "", &err)) << spec << ": " << err;
  auto w = World::Make(*l, gpus_per_node, &err);
  EXPECT_TRUE(w) << err;
  return *w;
}

TEST(World, Tp2Pp2Dp4DefaultOrder) {
  World w = MakeWorld("tp=2,pp=2,dp=4", 16);
  EXPECT_EQ(w.size(), 16);
  EXPECT_EQ(w.GroupsOfKind("tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(w.GroupsOfKind("dp"), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(w.GroupsOfKind("pp"), (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(w.GroupsOfKind("mp"), (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(w.GroupsOfKind("dp-cp"), w.GroupsOfKind("dp"));  // cp = 1
  EXPECT_EQ(w.GroupsOfKind("cp").size(), 16u);               // singletons
  EXPECT_EQ(w.GroupsOfKind("embd").front(), (std::vector<int>{0, 8}));
  EXPECT_EQ(w.GroupsOfKind("pos-embd").front(), (std::vector<int>{0}));
  EXPECT_EQ(w.GroupsOfKind("tp-dp"), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}));
  // Expert grid with ep = 1, etp = tp: ep singletons, expert-tp == tp, expert-dp == dp.
  EXPECT_EQ(w.GroupsOfKind("etp"), w.GroupsOfKind("tp"));
  EXPECT_EQ(w.GroupsOfKind("edp"), w.GroupsOfKind("dp"));
  EXPECT_EQ(w.GroupsOfKind("ep").size(), 16u);

  Coords c = w.CoordsOf(13);  // 13 = tp 1 + dp 2 * 2 + pp 1 * 8
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.dp, 2);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(w.RankOf(1, 0, 2, 1), 13);
  EXPECT_EQ(w.RankOf(2, 0, 0, 0), -1);
  EXPECT_EQ(w.GroupOf("dp", 13), (std::vector<int>{9, 11, 13, 15}));
  EXPECT_EQ(w.GroupOf("embd", 13), (std::vector<int>{5, 13}));
  EXPECT_TRUE(w.GroupOf("pos-embd", 13).empty());  // last stage holds no position embedding
}

TEST(World, Tp2Pp2Dp4TpPpDpOrder) {
  World w = MakeWorld("tp=2,pp=2,dp=4,order=tp-cp-ep-pp-dp", 16);
  EXPECT_EQ(w.GroupsOfKind("tp").front(), (std::vector<int>{0, 1}));
  EXPECT_EQ(w.GroupsOfKind("pp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(w.GroupsOfKind("dp"), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(w.GroupsOfKind("mp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  Coords c = w.CoordsOf(13);  // 13 = tp 1 + pp 0 * 2 + dp 3 * 4
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.pp, 0);
  EXPECT_EQ(c.dp, 3);
}

// The example in initialize_model_parallel's docstring: 16 GPUs, tp 2, pp 4 -> dp 2.
TEST(World, MegatronDocstringExample) {
  World w = MakeWorld("tp=2,pp=4", 16);
  EXPECT_EQ(w.layout().dp, 2);
  EXPECT_EQ(w.GroupsOfKind("dp"),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(w.GroupsOfKind("tp"),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(w.GroupsOfKind("pp"), (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(w.GroupOf("embd", 12), (std::vector<int>{0, 12}));  // first and last stage
  EXPECT_TRUE(w.GroupOf("embd", 4).empty());                     // a middle stage
}

// generate_masked_orthogonal_rank_groups' docstring: sizes [tp 2, dp 3, pp 4], dp groups.
TEST(RankGrid, DocstringDpGroups) {
  std::string err;
  auto g = RankGrid::Make({{"tp", 2}, {"dp", 3}, {"pp", 4}}, "tp-dp-pp", &err);
  ASSERT_TRUE(g) << err;
  auto dp = g->Groups("dp");
  ASSERT_EQ(dp.size(), 8u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(dp[7], (std::vector<int>{19, 21, 23}));
  // Masked dims enumerate in grid order, whatever the token order.
  EXPECT_EQ(g->Groups("pp-tp"), g->Groups("tp-pp"));
  EXPECT_EQ(g->Groups("tp-pp")[0], (std::vector<int>{0, 1, 6, 7, 12, 13, 18, 19}));
  EXPECT_TRUE(g->Groups("xx").empty());
}

TEST(RankGrid, MissingDimensions) {
  std::string err;
  EXPECT_TRUE(RankGrid::Make({{"tp", 2}, {"cp", 1}}, "tp", &err));  // size-1 dims are appended
  EXPECT_FALSE(RankGrid::Make({{"tp", 2}, {"cp", 2}}, "tp", &err));
  EXPECT_NE(err.find("cp"), std::string::npos) << err;
  EXPECT_FALSE(RankGrid::Make({{"tp", 2}}, "tp-zz", &err));
}

TEST(World, ContextParallel) {
  // tp 2, cp 2, pp 2, dp 2 = 16. Default order: tp stride 1, cp stride 2, dp stride 4, pp stride 8.
  World w = MakeWorld("tp=2,cp=2,pp=2,dp=2", 16);
  EXPECT_EQ(w.GroupOf("cp", 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(w.GroupOf("dp", 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(w.GroupOf("dp-cp", 0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(w.GroupOf("tp-cp", 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(w.GroupOf("tp-dp-cp", 9), (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(w.GroupOf("tp-dp", 9), (std::vector<int>{8, 9, 12, 13}));
  EXPECT_EQ(w.GroupOf("mp", 3), (std::vector<int>{2, 3, 10, 11}));
  // Expert grid has cp = 1: with ep = 1, etp = tp, edp = 16 / (2 * 2) = 4 spans the dense cp x dp.
  EXPECT_EQ(w.layout().ExpertDp(), 4);
  EXPECT_EQ(w.GroupOf("edp", 0), (std::vector<int>{0, 2, 4, 6}));
}

TEST(World, ExpertParallel) {
  // world 16, tp 2, pp 2 -> dp 4; ep 2, etp 1 -> edp = 16 / (1 * 2 * 2) = 4.
  World w = MakeWorld("tp=2,pp=2,ep=2,etp=1", 16);
  EXPECT_EQ(w.layout().dp, 4);
  EXPECT_EQ(w.layout().ExpertDp(), 4);
  // Expert order tp-cp-ep-gtp_remat-dp-pp with etp 1: ep stride 1, dp stride 2, pp stride 8.
  EXPECT_EQ(w.GroupOf("ep", 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(w.GroupOf("ep", 6), (std::vector<int>{6, 7}));
  EXPECT_EQ(w.GroupOf("etp", 5), (std::vector<int>{5}));
  EXPECT_EQ(w.GroupOf("edp", 1), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(w.GroupOf("tp-ep", 1), (std::vector<int>{0, 1}));
  EXPECT_EQ(w.GroupOf("tp-ep-pp", 1), (std::vector<int>{0, 1, 8, 9}));
  Coords c = w.CoordsOf(11);  // expert: ep 1, edp 1, pp 1
  EXPECT_EQ(c.ep, 1);
  EXPECT_EQ(c.edp, 1);
  EXPECT_EQ(c.etp, 0);
  EXPECT_EQ(c.pp, 1);
  // Distributed optimizer instance group (one instance): all tp-ep-pp groups of one expert-dp sweep = world.
  auto dist = w.GroupsOfKind("dist-opt");
  ASSERT_EQ(dist.size(), 1u);
  EXPECT_EQ(dist[0].size(), 16u);

  // ep 4 with etp = tp = 2: edp = 16 / (2 * 4 * 2) = 1.
  World w2 = MakeWorld("tp=2,pp=2,ep=4", 16);
  EXPECT_EQ(w2.layout().ExpertDp(), 1);
  EXPECT_EQ(w2.GroupOf("ep", 0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(w2.GroupOf("tp-ep", 0), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(World, CreationOrderAndGloo) {
  World w = MakeWorld("tp=2,pp=2,dp=2", 8);
  std::vector<std::string> order;
  for (const Group& g : w.MegatronGroups())
    if (order.empty() || order.back() != g.desc) order.push_back(g.desc);
  // Runs of the same desc collapsed; the dp-cp and dp loops interleave their Gloo twins.
  std::vector<std::string> expect = {
      "GTP_WEIGHT_REMAT_GROUP",
      "DATA_PARALLEL_GROUP_WITH_CP", "DATA_PARALLEL_GROUP_WITH_CP_GLOO", "DATA_PARALLEL_GROUP_WITH_CP",
      "DATA_PARALLEL_GROUP_WITH_CP_GLOO", "DATA_PARALLEL_GROUP_WITH_CP", "DATA_PARALLEL_GROUP_WITH_CP_GLOO",
      "DATA_PARALLEL_GROUP_WITH_CP", "DATA_PARALLEL_GROUP_WITH_CP_GLOO",
      "DATA_PARALLEL_GROUP", "DATA_PARALLEL_GROUP_GLOO", "DATA_PARALLEL_GROUP", "DATA_PARALLEL_GROUP_GLOO",
      "DATA_PARALLEL_GROUP", "DATA_PARALLEL_GROUP_GLOO", "DATA_PARALLEL_GROUP", "DATA_PARALLEL_GROUP_GLOO",
      "CONTEXT_PARALLEL_GROUP", "MODEL_PARALLEL_GROUP", "TENSOR_MODEL_PARALLEL_GROUP",
      "PIPELINE_MODEL_PARALLEL_GROUP", "EMBEDDING_GROUP", "POSITION_EMBEDDING_GROUP",
      "PIPELINE_MODEL_PARALLEL_GROUP", "EMBEDDING_GROUP", "POSITION_EMBEDDING_GROUP",
      "PIPELINE_MODEL_PARALLEL_GROUP", "EMBEDDING_GROUP", "POSITION_EMBEDDING_GROUP",
      "PIPELINE_MODEL_PARALLEL_GROUP", "EMBEDDING_GROUP", "POSITION_EMBEDDING_GROUP",
      "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", "TENSOR_AND_DATA_PARALLEL_GROUP",
      "TENSOR_AND_CONTEXT_PARALLEL_GROUP", "EXPERT_GTP_WEIGHT_REMAT_GROUP", "EXPERT_MODEL_PARALLEL_GROUP",
      "EXPERT_TENSOR_PARALLEL_GROUP", "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP",
      "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP",
      "EXPERT_DATA_PARALLEL_GROUP", "EXPERT_DATA_PARALLEL_GROUP_GLOO", "EXPERT_DATA_PARALLEL_GROUP",
      "EXPERT_DATA_PARALLEL_GROUP_GLOO", "EXPERT_DATA_PARALLEL_GROUP", "EXPERT_DATA_PARALLEL_GROUP_GLOO",
      "EXPERT_DATA_PARALLEL_GROUP", "EXPERT_DATA_PARALLEL_GROUP_GLOO",
      "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP"};
  EXPECT_EQ(order, expect);
  // Count: 8 gtp + 4x2 dp-cp + 4x2 dp + 8 cp + 2 mp + 4 tp + 4x3 pp + 2 tp-dp-cp + 2 tp-dp + 4 tp-cp + 8 egtp
  //        + 8 ep + 4 etp + 4 tp-ep + 2 tp-ep-pp + 2 with-egtp + 4x2 edp + 1 dist-opt.
  EXPECT_EQ(w.MegatronGroups().size(), 8u + 8 + 8 + 8 + 2 + 4 + 12 + 2 + 2 + 4 + 8 + 8 + 4 + 4 + 2 + 2 + 8 + 1);

  std::string err;
  auto l = ParseLayout("tp=2,pp=2,dp=2,gloo=0", &err);
  ASSERT_TRUE(l && ResolveLayout(&*l, 8, "", &err)) << err;
  auto w2 = World::Make(*l, 8, &err);
  ASSERT_TRUE(w2);
  for (const Group& g : w2->MegatronGroups()) EXPECT_EQ(g.backend, "nccl") << g.desc;
  EXPECT_EQ(w2->MegatronGroups().size(), w.MegatronGroups().size() - 12);  // 4 dp-cp, 4 dp, 4 edp twins
}

TEST(World, DistributedOptimizerInstances) {
  // world 8, tp 1, pp 1 -> dp 8; two instances: dp-cp [0..7] split [0..3], [4..7].
  World w = MakeWorld("dist_opt=2,gloo=0", 8);
  EXPECT_EQ(w.GroupsOfKind("intra-dp-cp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // Expert dp [0..7] hierarchical [4, 2]: level 0 -> (l=2, s=4, u=1) -> [0,1,2,3], [4,5,6,7];
  // level 1 -> (l=1, s=2, u=4) -> [0,4], [1,5], [2,6], [3,7].
  EXPECT_EQ(w.GroupsOfKind("intra-edp"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(w.GroupsOfKind("inter-edp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(w.GroupsOfKind("dist-opt"), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

TEST(World, GtpRemat) {
  // tp 2, gtp 2 -> model size 4 per pp stage; world 8, pp 1 -> dp 2. Dense order tp-gtp_remat-cp-ep-dp-pp.
  World w = MakeWorld("tp=2,gtp=2,gloo=1", 8);
  EXPECT_EQ(w.layout().dp, 2);
  EXPECT_EQ(w.GroupOf("gtp", 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(w.GroupOf("dp", 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(w.GroupOf("mp", 0), (std::vector<int>{0, 1, 2, 3}));
  for (const Group& g : w.MegatronGroups()) EXPECT_EQ(g.backend, "nccl") << g.desc;  // Megatron drops Gloo
  EXPECT_EQ(w.GroupsOfKind("dist-opt").size(), 1u);
}

TEST(World, Placement) {
  World w = MakeWorld("tp=2,pp=2", 64, 8);
  EXPECT_EQ(w.nodes(), 8);
  EXPECT_EQ(w.NodeOf(63), 7);
  EXPECT_EQ(w.LocalRankOf(63), 7);
  EXPECT_EQ(w.NodeOf(8), 1);
  EXPECT_EQ(w.LocalRankOf(8), 0);
}

TEST(World, EveryKindPartitionsTheWorld) {
  for (std::string spec : {"tp=4,pp=2,cp=2", "tp=2,pp=4,ep=4,etp=1", "tp=2,pp=2,cp=2,ep=2,order=tp-cp-ep-pp-dp",
                           "tp=8,pp=4,ep=8,etp=2"}) {
    World w = MakeWorld(spec, 256);
    for (std::string kind : {"tp", "pp", "dp", "dp-cp", "cp", "mp", "ep", "etp", "edp", "tp-ep", "tp-ep-pp",
                             "tp-dp", "tp-dp-cp", "tp-cp"}) {
      std::vector<int> seen(256, 0);
      for (const auto& g : w.GroupsOfKind(kind))
        for (int r : g) ++seen[r];
      for (int r = 0; r < 256; ++r) ASSERT_EQ(seen[r], 1) << spec << " kind " << kind << " rank " << r;
    }
    // Coordinates round-trip through the dense grid.
    for (int r = 0; r < 256; ++r) {
      Coords c = w.CoordsOf(r);
      ASSERT_EQ(w.RankOf(c.tp, c.cp, c.dp, c.pp, c.gtp), r) << spec;
    }
  }
}

// Goldens recorded from Megatron-LM's own initialize_model_parallel (tests/data/launcher/megatron_groups_ref.py):
// every new_group call, in order, with its members.
TEST(World, MatchesMegatronGoldens) {
  for (std::string spec : {"tp=2,pp=2,dp=4", "tp=2,pp=2,dp=4,order=tp-cp-ep-pp-dp", "tp=2,cp=2,pp=2,ep=2,etp=1,gloo=0",
                           "tp=2,pp=2,dist_opt=2"}) {
    std::string name = spec;
    for (char& ch : name) ch = ch == ',' ? '_' : ch == '=' ? '-' : ch;
    std::string path = std::string(PRISM_SOURCE_DIR) + "/tests/data/launcher/megatron_groups_" + name + ".txt";
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    std::vector<std::string> want;
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) want.push_back(line);
    World w = MakeWorld(spec, 16);
    std::vector<std::string> got;
    for (const Group& g : w.MegatronGroups()) {
      std::ostringstream os;
      os << g.desc;
      for (int r : g.members) os << ' ' << r;
      got.push_back(os.str());
    }
    ASSERT_EQ(got.size(), want.size()) << spec;
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << spec << " group " << i;
  }
}

TEST(Layout, ParseAndSpecRoundTrip) {
  std::string err;
  auto l = ParseLayout("tp=8,pp=4,dp=32,cp=2,ep=4,etp=2,vpp=3,order=tp-cp-ep-pp-dp", &err);
  ASSERT_TRUE(l) << err;
  EXPECT_EQ(l->tp, 8);
  EXPECT_EQ(l->cp, 2);
  EXPECT_EQ(l->etp, 2);
  EXPECT_EQ(l->vpp, 3);
  EXPECT_EQ(l->order, "tp-cp-ep-pp-dp");
  auto back = ParseLayout(l->ToSpec(), &err);
  ASSERT_TRUE(back) << err;
  EXPECT_EQ(back->ToSpec(), l->ToSpec());
  EXPECT_EQ(ParseLayout("tp=2", &err)->dp, 0);
}

TEST(Layout, ParseErrorsNameTheProblem) {
  std::string err;
  EXPECT_FALSE(ParseLayout("tp=two", &err));
  EXPECT_NE(err.find("tp"), std::string::npos) << err;
  EXPECT_FALSE(ParseLayout("tp=2,xx=3", &err));
  EXPECT_NE(err.find("xx"), std::string::npos) << err;
  EXPECT_FALSE(ParseLayout("tp=2,order=tp-zz-dp", &err));
  EXPECT_NE(err.find("zz"), std::string::npos) << err;
  EXPECT_FALSE(ParseLayout("tp=2,tp=4", &err));
  EXPECT_FALSE(ParseLayout("tp", &err));
  EXPECT_FALSE(ParseLayout("", &err));
  EXPECT_FALSE(ParseLayout("pp=0", &err));
}

TEST(Layout, ResolveErrorsSayWhichSizesDisagree) {
  std::string err;
  Layout l = *ParseLayout("tp=2,pp=3", &err);
  EXPECT_FALSE(ResolveLayout(&l, 64, "8 nodes x 8 processes", &err));
  EXPECT_NE(err.find("64"), std::string::npos) << err;
  EXPECT_NE(err.find("8 nodes x 8 processes"), std::string::npos) << err;
  EXPECT_NE(err.find("tp(2) x pp(3)"), std::string::npos) << err;

  l = *ParseLayout("tp=8,pp=4,dp=32", &err);
  EXPECT_FALSE(ResolveLayout(&l, 512, "", &err));
  EXPECT_NE(err.find("dp(32) = 1024"), std::string::npos) << err;
  EXPECT_NE(err.find("512"), std::string::npos) << err;
  l = *ParseLayout("tp=8,pp=4,dp=32", &err);
  EXPECT_TRUE(ResolveLayout(&l, 1024, "", &err)) << err;

  l = *ParseLayout("tp=2,ep=3", &err);
  EXPECT_FALSE(ResolveLayout(&l, 16, "", &err));
  EXPECT_NE(err.find("ep(3)"), std::string::npos) << err;

  l = *ParseLayout("tp=2,vpp=2", &err);
  EXPECT_FALSE(ResolveLayout(&l, 16, "", &err));
  EXPECT_NE(err.find("pp"), std::string::npos) << err;

  // Not pp-last: expert dp must equal dp. tp 2, pp 2, world 16: dp 4; ep 2, etp 2 -> edp 2 != 4.
  l = *ParseLayout("tp=2,pp=2,ep=2,order=tp-cp-ep-pp-dp", &err);
  EXPECT_FALSE(ResolveLayout(&l, 16, "", &err));
  EXPECT_NE(err.find("expert data-parallel"), std::string::npos) << err;
}

TEST(Layout, FromMegatronArgs) {
  std::string err;
  bool found = false;
  auto l = LayoutFromMegatronArgs({"--num-layers", "2", "--tensor-model-parallel-size", "2",
                                   "--pipeline-model-parallel-size=4", "--context-parallel-size", "2",
                                   "--expert-model-parallel-size", "8", "--expert-tensor-parallel-size", "1",
                                   "--use-tp-pp-dp-mapping", "--disable-gloo-process-groups"},
                                  &err, &found);
  ASSERT_TRUE(l) << err;
  EXPECT_TRUE(found);
  EXPECT_EQ(l->tp, 2);
  EXPECT_EQ(l->pp, 4);
  EXPECT_EQ(l->cp, 2);
  EXPECT_EQ(l->ep, 8);
  EXPECT_EQ(l->etp, 1);
  EXPECT_EQ(l->dp, 0);
  EXPECT_EQ(l->order, "tp-cp-ep-pp-dp");
  EXPECT_FALSE(l->gloo);

  l = LayoutFromMegatronArgs({"--hidden-size", "256", "--bf16"}, &err, &found);
  ASSERT_TRUE(l);
  EXPECT_FALSE(found);
  EXPECT_EQ(l->tp, 1);
  EXPECT_EQ(l->order, kDefaultOrder);

  // Last one wins, as argparse.
  l = LayoutFromMegatronArgs({"--tensor-model-parallel-size", "2", "--tensor-model-parallel-size=4"}, &err);
  EXPECT_EQ(l->tp, 4);

  // Virtual pipeline: 24 layers / pp 4 = 6 per stage, 2 per virtual stage -> vpp 3.
  l = LayoutFromMegatronArgs({"--num-layers", "24", "--pipeline-model-parallel-size", "4",
                              "--num-layers-per-virtual-pipeline-stage", "2"},
                             &err);
  ASSERT_TRUE(l) << err;
  EXPECT_EQ(l->vpp, 3);
  l = LayoutFromMegatronArgs({"--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "5"},
                             &err);
  EXPECT_EQ(l->vpp, 5);
  EXPECT_FALSE(LayoutFromMegatronArgs(
      {"--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "2"}, &err));
  EXPECT_NE(err.find("--num-layers"), std::string::npos) << err;

  EXPECT_FALSE(LayoutFromMegatronArgs({"--tensor-model-parallel-size", "x"}, &err));
  EXPECT_NE(err.find("--tensor-model-parallel-size"), std::string::npos) << err;
  EXPECT_FALSE(LayoutFromMegatronArgs({"--tensor-model-parallel-size"}, &err));

  // GTP from weight shards.
  l = LayoutFromMegatronArgs({"--tensor-model-parallel-size", "2", "--tensor-parallel-num-weight-shards", "8"}, &err);
  ASSERT_TRUE(l) << err;
  EXPECT_EQ(l->gtp, 4);
  // Abbreviations are not Megatron flags (allow_abbrev=False): ignored.
  l = LayoutFromMegatronArgs({"--tensor-model-parallel", "2"}, &err);
  EXPECT_EQ(l->tp, 1);
}

}  // namespace
}  // namespace prism::world
