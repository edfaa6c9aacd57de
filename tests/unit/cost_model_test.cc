// Cost model: alpha-beta answers computed by hand, NCCL 2.28.9 model facts and choices, NCCL_ALGO/NCCL_PROTO.
#include "replay/cost_model.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace prism::replay {
namespace {

using trace::CollOp;
using trace::DType;

Topology Load(const std::string& name) {
  Topology t;
  std::string err;
  EXPECT_TRUE(LoadTopology(name, &t, &err)) << err;
  return t;
}

CostModel Model(const std::string& topo, const std::string& algo = "", const std::string& proto = "") {
  CostModel m;
  CostModelOptions o;
  o.nccl_algo = algo;
  o.nccl_proto = proto;
  std::string err;
  EXPECT_TRUE(m.Init(Load(topo), o, &err)) << err;
  return m;
}

std::vector<int32_t> Ranks(int first, int n, int stride = 1) {
  std::vector<int32_t> r(n);
  for (int i = 0; i < n; ++i) r[i] = first + i * stride;
  return r;
}

CommCost Coll(const CostModel& m, const std::vector<int32_t>& ranks, CollOp op, uint64_t bytes,
              DType dt = DType::kBF16) {
  return m.Collective(m.Tune(m.Shape(ranks.data(), ranks.size())), op, bytes, dt);
}

// ---- alpha-beta, topology alpha-beta-simple: intra 1 us / 100 GB/s, inter 10 us / 10 GB/s.
// 1 GB/s = 1e3 bytes/us, so S bytes take S / 1e5 us inside a node and S / 1e4 us across nodes.

TEST(AlphaBeta, RingAllReduceInsideANode) {
  CostModel m = Model("alpha-beta-simple");
  // 2(n-1) alpha + 2(n-1)/n S/beta = 14 * 1 + 1.75 * 80 = 154 us.
  CommCost c = Coll(m, Ranks(0, 8), CollOp::kAllReduce, 8'000'000);
  EXPECT_EQ(c.method, CostMethod::kAlphaBeta);
  EXPECT_STREQ(c.Label(), "alpha-beta");
  EXPECT_NEAR(c.time_us, 154.0, 1e-9);
}

TEST(AlphaBeta, RingAllReduceAcrossNodes) {
  CostModel m = Model("alpha-beta-simple");
  // 16 ranks on 2 nodes use the inter-node link: 30 * 10 + 2 * 15/16 * 1600 = 300 + 3000 = 3300 us.
  EXPECT_NEAR(Coll(m, Ranks(0, 16), CollOp::kAllReduce, 16'000'000).time_us, 3300.0, 1e-9);
}

TEST(AlphaBeta, AllGatherAndReduceScatter) {
  CostModel m = Model("alpha-beta-simple");
  // (n-1) alpha + (n-1)/n S/beta = 7 + 7/8 * 80 = 77 us (S = whole output / whole input).
  EXPECT_NEAR(Coll(m, Ranks(0, 8), CollOp::kAllGather, 8'000'000).time_us, 77.0, 1e-9);
  EXPECT_NEAR(Coll(m, Ranks(0, 8), CollOp::kReduceScatter, 8'000'000).time_us, 77.0, 1e-9);
  // Four ranks, one per node (stride 8): 3 * 10 + 3/4 * 400 = 330 us.
  EXPECT_NEAR(Coll(m, Ranks(0, 4, 8), CollOp::kAllGather, 4'000'000).time_us, 330.0, 1e-9);
}

TEST(AlphaBeta, BroadcastAndReduce) {
  CostModel m = Model("alpha-beta-simple");
  // (n-1) alpha + S/beta = 7 + 80 = 87 us.
  EXPECT_NEAR(Coll(m, Ranks(0, 8), CollOp::kBroadcast, 8'000'000).time_us, 87.0, 1e-9);
  EXPECT_NEAR(Coll(m, Ranks(0, 8), CollOp::kReduce, 8'000'000).time_us, 87.0, 1e-9);
}

TEST(AlphaBeta, AllToAll) {
  CostModel m = Model("alpha-beta-simple");
  // 16 ranks on 2 nodes: 15 * 10 + 15/16 * 1600 = 150 + 1500 = 1650 us.
  EXPECT_NEAR(Coll(m, Ranks(0, 16), CollOp::kAllToAll, 16'000'000).time_us, 1650.0, 1e-9);
  // Inside a node: 7 * 1 + 7/8 * 80 = 77 us.
  EXPECT_NEAR(Coll(m, Ranks(0, 8), CollOp::kAllToAll, 8'000'000).time_us, 77.0, 1e-9);
}

TEST(AlphaBeta, SendRecv) {
  CostModel m = Model("alpha-beta-simple");
  // alpha + S/beta: same node 1 + 10 = 11 us; ranks 0 and 8 sit on nodes 0 and 1: 10 + 100 = 110 us.
  EXPECT_NEAR(m.SendRecv(1'000'000, 0, 7).time_us, 11.0, 1e-9);
  EXPECT_NEAR(m.SendRecv(1'000'000, 0, 8).time_us, 110.0, 1e-9);
  EXPECT_EQ(m.SendRecv(1'000'000, 3, 3).time_us, 0.0);
}

TEST(AlphaBeta, SingleRankCommunicatorIsFree) {
  CostModel m = Model("alpha-beta-simple");
  EXPECT_EQ(Coll(m, Ranks(5, 1), CollOp::kAllReduce, 1 << 30).time_us, 0.0);
}

TEST(AlphaBeta, ModelOverrideOnAnNcclTopology) {
  Topology t = Load("h100-8x400g");
  CostModel m;
  CostModelOptions o;
  o.model = CostModelKind::kAlphaBeta;
  std::string err;
  ASSERT_TRUE(m.Init(t, o, &err)) << err;
  // The preset's alpha-beta intra link: 2 us, 360 GB/s: 14 * 2 + 1.75 * 3.6e6 / 3.6e5 = 28 + 17.5.
  EXPECT_NEAR(Coll(m, Ranks(0, 8), CollOp::kAllReduce, 3'600'000).time_us, 45.5, 1e-9);
}

// ---- Communicator shapes and placement.

TEST(Shape, NodesAndLocalRanksFollowPlacement) {
  CostModel m = Model("h100-8x400g");
  auto s = m.Shape(Ranks(0, 8).data(), 8);
  EXPECT_EQ(s.nranks, 8);
  EXPECT_EQ(s.nnodes, 1);
  EXPECT_EQ(s.local_ranks, 8);
  auto r = Ranks(3, 64, 8);  // one GPU per node: a data-parallel group under tp=8
  s = m.Shape(r.data(), r.size());
  EXPECT_EQ(s.nnodes, 64);
  EXPECT_EQ(s.local_ranks, 1);
  std::vector<int32_t> uneven = {0, 1, 2, 8};
  s = m.Shape(uneven.data(), uneven.size());
  EXPECT_EQ(s.nnodes, 2);
  EXPECT_EQ(s.local_ranks, 3);

  Topology t = Load("h100-8x400g");
  t.rank_node = {0, 1, 0, 1};  // explicit placement wins over r / gpus_per_node
  CostModel p;
  std::string err;
  ASSERT_TRUE(p.Init(t, {}, &err));
  std::vector<int32_t> pair = {0, 2};
  EXPECT_EQ(p.Shape(pair.data(), 2).nnodes, 1);
  pair = {0, 1};
  EXPECT_EQ(p.Shape(pair.data(), 2).nnodes, 2);
}

// ---- NCCL model: numbers straight from NCCL 2.28.9's tuning.cc formulas.

TEST(NcclModel, EightH100RingSimpleAllReduceMatchesTheFormula) {
  CostModel m = Model("h100-8x400g");
  CommTuning t = m.Tune(CommShape{8, 1, 8});
  // Channel search: 12 channels x 30 GB/s (6 x 60 found, duplicated), bus bandwidth 360 GB/s.
  EXPECT_EQ(t.ring.channels, 12);
  EXPECT_FLOAT_EQ(t.ring.bw_intra, 30.0f);
  // Latency: baseLat 8.4 + 2(n-1) = 14 steps x NVLink hwLat 3.4 = 56 us.
  EXPECT_NEAR(t.latency_us[static_cast<int>(NcclFunc::kAllReduce)][1][2], 56.0, 1e-4);
  // Bandwidth: 360 x n / nsteps = 360 x 8 / 14.
  EXPECT_NEAR(t.bandwidth_GBps[static_cast<int>(NcclFunc::kAllReduce)][1][2], 360.0 * 8 / 14, 1e-3);
  double expect = 56.0 + (1 << 30) / (1000.0 * 360.0 * 8 / 14);
  EXPECT_NEAR(m.NcclTime(t, NcclFunc::kAllReduce, NcclAlgo::kRing, NcclProto::kSimple, 1 << 30, DType::kBF16), expect,
              1e-3 * expect);
  // Ring LL: bandwidth x 1/2 capped at llMaxBw (141 GB/s on one Hopper node), latency 6.6 + 14 x 0.6.
  EXPECT_NEAR(t.latency_us[4][1][0], 6.6 + 14 * 0.6, 1e-4);
  EXPECT_NEAR(t.bandwidth_GBps[4][1][0], 141.0 * 8 / 14, 1e-3);
}

TEST(NcclModel, SmallMessagesUseLLLargeUseSimple) {
  CostModel m = Model("h100-8x400g");
  for (auto ranks : {Ranks(0, 8), Ranks(0, 16), Ranks(0, 64, 8), Ranks(0, 1024)}) {
    CommCost small = Coll(m, ranks, CollOp::kAllReduce, 1024);
    CommCost large = Coll(m, ranks, CollOp::kAllReduce, 1ull << 30);
    EXPECT_EQ(small.method, CostMethod::kNccl);
    EXPECT_EQ(small.proto, NcclProto::kLL) << ranks.size() << " ranks: " << small.Label();
    EXPECT_EQ(large.proto, NcclProto::kSimple) << ranks.size() << " ranks: " << large.Label();
    EXPECT_LT(small.time_us, large.time_us);
  }
  // All-gather on one node: LL, then Ring/Simple for big buffers.
  EXPECT_EQ(Coll(m, Ranks(0, 8), CollOp::kAllGather, 4096).proto, NcclProto::kLL);
  CommCost ag = Coll(m, Ranks(0, 8), CollOp::kAllGather, 1ull << 30);
  EXPECT_STREQ(ag.Label(), "Ring/Simple");
}

TEST(NcclModel, AlgorithmChoicesFollowTopology) {
  CostModel m = Model("h100-8x400g");
  // One NVSwitch node, big all-reduce: NVLink SHARP (NVLS) beats the ring (~470 GB/s bus bandwidth).
  CommCost c = Coll(m, Ranks(0, 8), CollOp::kAllReduce, 1ull << 30);
  EXPECT_STREQ(c.Label(), "NVLS/Simple");
  double busbw = (1ull << 30) / c.time_us / 1e3 * BusBwFactor(CollOp::kAllReduce, 8);
  EXPECT_GT(busbw, 400);
  EXPECT_LT(busbw, 500);
  // NVLS has no fp8 reduction: the ring takes over.
  EXPECT_EQ(Coll(m, Ranks(0, 8), CollOp::kAllReduce, 1ull << 30, DType::kF8E4M3).algo, NcclAlgo::kRing);
  // Across nodes without CollNet, plain NVLS is off; NVLSTree carries big all-reduces, trees the medium ones.
  EXPECT_STREQ(Coll(m, Ranks(0, 1024), CollOp::kAllReduce, 1ull << 30).Label(), "NVLSTree/Simple");
  EXPECT_EQ(Coll(m, Ranks(0, 1024), CollOp::kAllReduce, 1 << 20).algo, NcclAlgo::kTree);
  // One GPU per node: PAT for small all-gathers (NCCL enables it only there), the ring for big ones.
  EXPECT_STREQ(Coll(m, Ranks(0, 64, 8), CollOp::kAllGather, 1 << 20).Label(), "PAT/Simple");
  EXPECT_STREQ(Coll(m, Ranks(0, 64, 8), CollOp::kReduceScatter, 1ull << 30).Label(), "Ring/Simple");
  // A100 (no NVLS) keeps to Ring/Tree.
  CostModel a = Model("a100-8x200g");
  NcclAlgo big = Coll(a, Ranks(0, 8), CollOp::kAllReduce, 1ull << 30).algo;
  EXPECT_TRUE(big == NcclAlgo::kRing || big == NcclAlgo::kTree);
}

TEST(NcclModel, TimeGrowsWithSizeAndShrinksWithBandwidth) {
  CostModel m = Model("h100-8x400g");
  auto ranks = Ranks(0, 64, 8);
  double prev = 0;
  for (uint64_t b = 64; b <= (1ull << 32); b <<= 2) {
    double t = Coll(m, ranks, CollOp::kAllReduce, b).time_us;
    EXPECT_GT(t, prev) << b;
    prev = t;
  }
  Topology slow = Load("h100-8x400g");
  ScaleNetworkBandwidth(&slow, 0.5);
  CostModel s;
  std::string err;
  ASSERT_TRUE(s.Init(slow, {}, &err));
  EXPECT_GT(Coll(s, ranks, CollOp::kAllReduce, 1ull << 30).time_us,
            1.5 * Coll(m, ranks, CollOp::kAllReduce, 1ull << 30).time_us);
  // Inside a node nothing crosses the network.
  EXPECT_DOUBLE_EQ(Coll(s, Ranks(0, 8), CollOp::kAllReduce, 1ull << 30).time_us,
                   Coll(m, Ranks(0, 8), CollOp::kAllReduce, 1ull << 30).time_us);
}

TEST(NcclModel, NcclAlgoAndProtoAreHonoured) {
  auto ranks = Ranks(0, 8);
  CommCost c = Coll(Model("h100-8x400g", "", "Simple"), ranks, CollOp::kAllReduce, 1024);
  EXPECT_EQ(c.proto, NcclProto::kSimple);
  c = Coll(Model("h100-8x400g", "Ring"), ranks, CollOp::kAllReduce, 1ull << 30);
  EXPECT_STREQ(c.Label(), "Ring/Simple");
  c = Coll(Model("h100-8x400g", "^NVLS"), ranks, CollOp::kAllReduce, 1ull << 30);
  EXPECT_NE(c.algo, NcclAlgo::kNvls);
  c = Coll(Model("h100-8x400g", "", "^LL"), ranks, CollOp::kAllReduce, 1024);
  EXPECT_NE(c.proto, NcclProto::kLL);
  // Per-function prefixes (NCCL 2.28 grammar): only the all-reduce is restricted.
  CostModel pm = Model("h100-8x400g", "allreduce:tree");
  EXPECT_EQ(Coll(pm, ranks, CollOp::kAllReduce, 1ull << 30).algo, NcclAlgo::kTree);
  EXPECT_EQ(Coll(pm, ranks, CollOp::kAllGather, 1ull << 30).algo, NcclAlgo::kRing);
  // Nothing left for all-gather (Tree does not do all-gather): NCCL would fail; flagged, Ring/Simple assumed.
  CommCost none = Coll(Model("h100-8x400g", "Tree"), ranks, CollOp::kAllGather, 1 << 20);
  EXPECT_TRUE(none.fallback);
  EXPECT_STREQ(none.Label(), "Ring/Simple");
  EXPECT_GT(none.time_us, 0);
}

TEST(NcclModel, BadNcclAlgoIsAnError) {
  CostModel m;
  CostModelOptions o;
  o.nccl_algo = "Rnig";
  std::string err;
  EXPECT_FALSE(m.Init(Load("h100-8x400g"), o, &err));
  EXPECT_NE(err.find("Rnig"), std::string::npos) << err;
  o.nccl_algo = "";
  o.nccl_proto = "simple;LL";  // entries after the first need a prefix
  EXPECT_FALSE(m.Init(Load("h100-8x400g"), o, &err));
  o.nccl_proto = "gather:LL";
  EXPECT_FALSE(m.Init(Load("h100-8x400g"), o, &err));
  EXPECT_NE(err.find("gather"), std::string::npos) << err;
}

TEST(NcclModel, SendRecvAndAllToAllUseTheP2PLinks) {
  CostModel m = Model("h100-8x400g");
  // p2p links of the preset: 6 us + S / 300 GB/s inside a node, 12 us + S / 48 GB/s across.
  EXPECT_NEAR(m.SendRecv(3'000'000, 0, 1).time_us, 6.0 + 10.0, 1e-9);
  EXPECT_NEAR(m.SendRecv(4'800'000, 0, 8).time_us, 12.0 + 100.0, 1e-9);
  EXPECT_EQ(m.SendRecv(1, 0, 1).method, CostMethod::kP2P);
  // All-to-all over 16 ranks on 2 nodes, S = 16 MB: 1 MB to each peer; 8 remote MB at 48 GB/s dominate.
  CommCost a = Coll(m, Ranks(0, 16), CollOp::kAllToAll, 16'000'000);
  EXPECT_STREQ(a.Label(), "p2p");
  EXPECT_NEAR(a.time_us, 12.0 + 8'000'000 / 48e3, 1e-6);
}

TEST(NcclModel, BusBwFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(BusBwFactor(CollOp::kAllReduce, 8), 14.0 / 8);
  EXPECT_DOUBLE_EQ(BusBwFactor(CollOp::kAllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(BusBwFactor(CollOp::kReduceScatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(BusBwFactor(CollOp::kAllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(BusBwFactor(CollOp::kBroadcast, 8), 1.0);
}

}  // namespace
}  // namespace prism::replay
