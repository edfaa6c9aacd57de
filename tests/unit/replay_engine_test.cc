// Replay engine on small hand-made graphs whose answers are computed by hand (alpha-beta-simple topology:
// 1 us + S / 100 GB/s inside a node, 10 us + S / 10 GB/s across nodes).
#include "replay/engine.h"

#include <gtest/gtest.h>

#include "replay/trace_validate.h"

namespace prism::replay {
namespace {

using trace::CollOp;
using trace::DType;
using trace::Node;
using trace::NodeKind;

// Builds a trace with one class per rank (no deduplication: every rank spelled out).
class G {
 public:
  explicit G(int world) {
    t.world_size = world;
    t.layout.dp = world;
    t.classes.resize(world);
    t.ranks.resize(world);
    for (int r = 0; r < world; ++r) {
      t.classes[r].name = "r" + std::to_string(r);
      t.ranks[r].cls = r;
    }
  }
  // A communicator bound to slot `slot` on each member.
  uint32_t Comm(const std::vector<int32_t>& ranks, const std::string& desc) {
    trace::Comm c;
    c.id = static_cast<uint32_t>(t.comms.size()) + 100;  // ids need not be indices
    c.ranks = ranks;
    c.desc = desc;
    for (int32_t r : ranks) {
      t.classes[r].comm_slots.push_back(desc);
      t.ranks[r].comms.push_back(c.id);
    }
    t.comms.push_back(c);
    return c.id;
  }
  Node& Add(int rank, int stream, Node n) {
    auto& c = t.classes[rank];
    while (c.streams.size() <= static_cast<size_t>(stream)) c.streams.push_back({"s" + std::to_string(c.streams.size()), {}});
    n.id = next_id_[rank]++;
    c.streams[stream].nodes.push_back(n);
    return c.streams[stream].nodes.back();
  }
  uint32_t Compute(int rank, int stream, double us, std::vector<uint32_t> after = {}, uint32_t iter = 0) {
    Node n;
    n.kind = NodeKind::kCompute;
    n.dur_us = us;
    n.after = std::move(after);
    n.iter = iter;
    n.name = "c" + std::to_string(next_id_[rank]);
    return Add(rank, stream, n).id;
  }
  uint32_t Slot(int rank, const std::string& desc) {
    auto& s = t.classes[rank].comm_slots;
    return static_cast<uint32_t>(std::find(s.begin(), s.end(), desc) - s.begin());
  }
  uint32_t Coll(int rank, int stream, const std::string& comm, CollOp op, uint64_t bytes, double rec_us = -1,
                uint32_t iter = 0) {
    Node n;
    n.kind = NodeKind::kColl;
    n.op = op;
    n.comm_slot = Slot(rank, comm);
    n.bytes = bytes;
    n.dtype = DType::kBF16;
    n.dur_us = rec_us;
    n.iter = iter;
    n.name = std::string(trace::ToString(op));
    return Add(rank, stream, n).id;
  }
  uint32_t P2P(int rank, int stream, const std::string& comm, bool send, int peer, uint64_t bytes,
               std::vector<uint32_t> after = {}) {
    Node n;
    n.kind = send ? NodeKind::kSend : NodeKind::kRecv;
    n.comm_slot = Slot(rank, comm);
    n.peer = peer;
    n.bytes = bytes;
    n.dtype = DType::kBF16;
    n.after = std::move(after);
    n.name = send ? "send" : "recv";
    return Add(rank, stream, n).id;
  }
  trace::Trace t;

 private:
  std::map<int, uint32_t> next_id_;
};

CostModel AlphaBeta() {
  Topology topo;
  std::string err;
  EXPECT_TRUE(LoadTopology("alpha-beta-simple", &topo, &err)) << err;
  CostModel m;
  EXPECT_TRUE(m.Init(topo, {}, &err)) << err;
  return m;
}

double Wait(const RankResult& r, const std::string& desc) {
  for (const auto& [d, s] : r.wait_by_comm) {
    if (d == desc) return s;
  }
  return -1;
}

TEST(Engine, ComputeOnlyIterationIsTheSlowestRank) {
  G g(2);
  g.Compute(0, 0, 10);
  g.Compute(0, 0, 20);
  g.Compute(1, 0, 5);
  CostModel m = AlphaBeta();
  SimResult r = Simulate(g.t, m);
  ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
  EXPECT_NEAR(r.iteration_time_s, 30e-6, 1e-12);
  EXPECT_NEAR(r.ranks[0].iteration_time_s, 30e-6, 1e-12);
  EXPECT_NEAR(r.ranks[1].iteration_time_s, 5e-6, 1e-12);
  EXPECT_EQ(r.events, 3u);
  EXPECT_NEAR(r.critical_path.compute_s, 30e-6, 1e-12);
  ASSERT_EQ(r.critical_path.ranks.size(), 1u);
  EXPECT_EQ(r.critical_path.ranks[0], 0);
}

TEST(Engine, CollectiveCompletesAtLastArrivalPlusDuration) {
  G g(2);
  g.Comm({0, 1}, "TP");
  g.Compute(0, 0, 10);
  g.Coll(0, 0, "TP", CollOp::kAllReduce, 8'000'000);
  g.Compute(1, 0, 30);
  g.Coll(1, 0, "TP", CollOp::kAllReduce, 8'000'000);
  ASSERT_TRUE(ValidateTrace(g.t).empty());
  CostModel m = AlphaBeta();
  SimResult r = Simulate(g.t, m);
  ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
  // All-reduce of 8 MB between two ranks of a node: 2 * 1 us + 2 * 1/2 * 80 us = 82 us, from t = 30 us.
  EXPECT_NEAR(r.makespan_s, 112e-6, 1e-12);
  EXPECT_NEAR(Wait(r.ranks[0], "TP"), 20e-6, 1e-12);
  EXPECT_NEAR(Wait(r.ranks[1], "TP"), 0.0, 1e-12);
  ASSERT_FALSE(r.ranks[0].waited_on.empty());
  EXPECT_EQ(r.ranks[0].waited_on[0].rank, 1);
  ASSERT_EQ(r.comms.size(), 1u);
  EXPECT_EQ(r.comms[0].id, 100u);
  EXPECT_EQ(r.comms[0].calls, 1u);
  EXPECT_NEAR(r.comms[0].time_s, 82e-6, 1e-12);
  EXPECT_EQ(r.comms[0].algorithm, "alpha-beta");
  // The critical path runs through rank 1's compute (the last arriver), then the all-reduce.
  EXPECT_NEAR(r.critical_path.length_s, 112e-6, 1e-12);
  EXPECT_NEAR(r.critical_path.compute_s, 30e-6, 1e-12);
  EXPECT_NEAR(r.critical_path.comm_s, 82e-6, 1e-12);
  EXPECT_NE(std::find(r.critical_path.ranks.begin(), r.critical_path.ranks.end(), 1), r.critical_path.ranks.end());
}

TEST(Engine, WhoWasWaitedForOnATieIsTheLowerRank) {
  // Ranks 1 and 2 reach the all-reduce together at 10 us, rank 0 at 5 us. Rank 2 gets there first in the walk
  // (its send completes the p2p pair and it runs on), so only the tie rule makes rank 1 the one waited for.
  G g(3);
  g.Comm({0, 1, 2}, "DP");
  g.Comm({1, 2}, "PP");
  g.Compute(0, 0, 5);
  g.Coll(0, 0, "DP", CollOp::kAllReduce, 1024);
  g.t.classes[1].streams.resize(1);
  uint32_t recv = g.P2P(1, 0, "PP", false, 1, 1024);
  g.Compute(1, 0, 8);
  g.Coll(1, 0, "DP", CollOp::kAllReduce, 1024);
  uint32_t send = g.P2P(2, 0, "PP", true, 0, 1024);
  g.Compute(2, 0, 8);
  g.Coll(2, 0, "DP", CollOp::kAllReduce, 1024);
  g.t.classes[1].streams[0].nodes[recv].dur_us = 2.0;  // recorded: the pair takes exactly 2 us
  g.t.classes[2].streams[0].nodes[send].dur_us = 2.0;
  ASSERT_TRUE(ValidateTrace(g.t).empty());
  CostModel m = AlphaBeta();
  SimResult r = Simulate(g.t, m);
  ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
  EXPECT_NEAR(r.ranks[1].end_s, r.ranks[2].end_s, 0);
  ASSERT_EQ(r.ranks[0].waited_on.size(), 1u);
  EXPECT_EQ(r.ranks[0].waited_on[0].rank, 1);
  EXPECT_NEAR(r.ranks[0].waited_on[0].seconds, 5e-6, 1e-12);
}

TEST(Engine, RecordedDurationWinsUnlessDisabled) {
  G g(2);
  g.Comm({0, 1}, "TP");
  g.Coll(0, 0, "TP", CollOp::kAllReduce, 8'000'000, 500);
  g.Coll(1, 0, "TP", CollOp::kAllReduce, 8'000'000, 300);  // members disagree: the longest recording counts
  CostModel m = AlphaBeta();
  SimResult r = Simulate(g.t, m);
  ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
  EXPECT_NEAR(r.makespan_s, 500e-6, 1e-12);
  EXPECT_EQ(r.comms[0].algorithm, "recorded");
  EngineOptions o;
  o.use_recorded = false;
  r = Simulate(g.t, m, o);
  EXPECT_NEAR(r.makespan_s, 82e-6, 1e-12);
}

TEST(Engine, AfterEdgesHoldAStreamUntilTheOtherFinishes) {
  G g(1);
  uint32_t a = g.Compute(0, 0, 10);
  g.Compute(0, 0, 1);            // stream 0 ends at 11
  g.Compute(0, 1, 5, {a});       // stream 1 starts after A: ends at 15
  g.Compute(0, 1, 2);            // 17
  CostModel m = AlphaBeta();
  SimResult r = Simulate(g.t, m);
  ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
  EXPECT_NEAR(r.makespan_s, 17e-6, 1e-12);
  EXPECT_EQ(r.critical_path.nodes, 3u);  // A, then the two nodes of stream 1
}

TEST(Engine, SendRecvCompletesWhenBothSidesArePosted) {
  G g(2);
  g.Comm({0, 1}, "PP");
  uint32_t c = g.Compute(0, 0, 10);
  g.P2P(0, 1, "PP", true, 1, 1'000'000, {c});  // posted at 10
  uint32_t rv = g.P2P(1, 1, "PP", false, 0, 1'000'000);  // posted at 0
  g.Compute(1, 0, 5, {rv});
  ASSERT_TRUE(ValidateTrace(g.t).empty());
  CostModel m = AlphaBeta();
  SimResult r = Simulate(g.t, m);
  ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
  // 1 MB inside a node: 1 + 10 = 11 us from t = 10; then 5 us of compute.
  EXPECT_NEAR(r.makespan_s, 26e-6, 1e-12);
  EXPECT_NEAR(Wait(r.ranks[1], "PP"), 10e-6, 1e-12);
  EXPECT_EQ(r.ranks[1].waited_on[0].rank, 0);
  EXPECT_EQ(r.comms[0].calls, 1u);
}

TEST(Engine, P2PAcrossNodesUsesTheInterNodeLink) {
  G g(16);
  std::vector<int32_t> all;
  for (int i = 0; i < 16; ++i) all.push_back(i);
  g.Comm(all, "W");
  g.P2P(0, 0, "W", true, 9, 1'000'000);
  g.P2P(9, 0, "W", false, 0, 1'000'000);
  CostModel m = AlphaBeta();
  SimResult r = Simulate(g.t, m);
  ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
  EXPECT_NEAR(r.makespan_s, 110e-6, 1e-12);  // 10 us + 1 MB / 10 GB/s
}

TEST(Engine, P2PCycleIsADeadlockWithAWaitForChain) {
  G g(2);
  g.Comm({0, 1}, "PP");
  // Both ranks receive first: neither send is ever posted.
  g.P2P(0, 0, "PP", false, 1, 1024);
  g.P2P(0, 0, "PP", true, 1, 1024);
  g.P2P(1, 0, "PP", false, 0, 1024);
  g.P2P(1, 0, "PP", true, 0, 1024);
  ASSERT_TRUE(ValidateTrace(g.t).empty()) << "a legal graph that cannot finish";
  CostModel m = AlphaBeta();
  SimResult r = Simulate(g.t, m);
  EXPECT_EQ(r.status, SimResult::Status::kDeadlock);
  EXPECT_NE(r.error.find("2 of 2 ranks"), std::string::npos) << r.error;
  ASSERT_GE(r.wait_chain.size(), 3u);
  EXPECT_NE(r.wait_chain[0].find("rank 0"), std::string::npos) << r.wait_chain[0];
  EXPECT_NE(r.wait_chain[0].find("recv from rank 1"), std::string::npos) << r.wait_chain[0];
  EXPECT_NE(r.wait_chain[1].find("rank 1"), std::string::npos) << r.wait_chain[1];
  EXPECT_NE(r.wait_chain.back().find("cycle"), std::string::npos) << r.wait_chain.back();
}

// Two ranks that each send before they receive (pipeline stages exchanging activations and gradients).
G SendFirstPair(int world, int a, int b, uint64_t bytes) {
  G g(world);
  std::vector<int32_t> all;
  for (int i = 0; i < world; ++i) all.push_back(i);
  g.Comm(all, "PP");
  g.P2P(a, 0, "PP", true, b, bytes);
  g.P2P(a, 0, "PP", false, b, bytes);
  g.P2P(b, 0, "PP", true, a, bytes);
  g.P2P(b, 0, "PP", false, a, bytes);
  return g;
}

EngineOptions Sends(trace::SendCompletion c) {
  EngineOptions o;
  o.send_completion = c;
  return o;
}

TEST(Engine, SendBeforeReceiveDeadlocksOnlyWhenSendsRendezvous) {
  using SC = trace::SendCompletion;
  CostModel m = AlphaBeta();
  G g = SendFirstPair(2, 0, 1, 1'000'000);
  ASSERT_TRUE(ValidateTrace(g.t).empty());
  SimResult r = Simulate(g.t, m);  // the default for a PrismTrace: rendezvous
  ASSERT_EQ(r.status, SimResult::Status::kDeadlock);
  EXPECT_NE(r.wait_chain[0].find("send to rank 1"), std::string::npos) << r.wait_chain[0];
  EXPECT_NE(r.wait_chain.back().find("cycle"), std::string::npos) << r.wait_chain.back();
  // Eager (ASTRA-sim): each send completes after its transfer, 1 us + 1 MB / 100 GB/s = 11 us; each receive
  // finds its data there when it is posted at 11 us.
  for (SC c : {SC::kEager, SC::kNccl}) {
    r = Simulate(g.t, m, Sends(c));
    ASSERT_EQ(r.status, SimResult::Status::kOk) << trace::ToString(c) << ": " << r.error;
    EXPECT_NEAR(r.makespan_s, 11e-6, 1e-12) << trace::ToString(c);
    EXPECT_NEAR(Wait(r.ranks[0], "PP"), 0.0, 1e-15);
    EXPECT_EQ(r.comms[0].calls, 2u);
    EXPECT_NEAR(r.comms[0].time_s, 22e-6, 1e-12);
  }
  // The graph can say it too; the option wins over the graph.
  g.t.send_completion = SC::kEager;
  EXPECT_EQ(Simulate(g.t, m).status, SimResult::Status::kOk);
  EXPECT_EQ(Simulate(g.t, m, Sends(SC::kRendezvous)).status, SimResult::Status::kDeadlock);
}

TEST(Engine, NcclSendsCompleteWithoutTheReceiveUpToTheP2PBuffer) {
  using SC = trace::SendCompletion;
  CostModel m = AlphaBeta();
  CommShape node, two_nodes;
  two_nodes.nnodes = 2;
  EXPECT_EQ(m.SendBufferBytes(node), 4u << 20);       // 8 steps x 512 KiB (NVLink chunk)
  EXPECT_EQ(m.SendBufferBytes(two_nodes), 1u << 20);  // 8 steps x 128 KiB (net chunk)
  struct Case {
    int world, a, b;
    uint64_t bytes;
    bool finishes;
  };
  // Ranks 0 and 1 share a node (world 8); 0 and 9 do not (world 16, 8 GPUs per node).
  for (const Case& c : {Case{8, 0, 1, 4u << 20, true}, Case{8, 0, 1, (4u << 20) + 1, false},
                        Case{16, 0, 9, 1u << 20, true}, Case{16, 0, 9, (1u << 20) + 1, false}}) {
    G g = SendFirstPair(c.world, c.a, c.b, c.bytes);
    SimResult r = Simulate(g.t, m, Sends(SC::kNccl));
    EXPECT_EQ(r.status, c.finishes ? SimResult::Status::kOk : SimResult::Status::kDeadlock)
        << c.world << " ranks, " << c.bytes << " bytes: " << r.error;
    EXPECT_EQ(Simulate(g.t, m, Sends(SC::kEager)).status, SimResult::Status::kOk);
  }
}

TEST(Engine, EagerSendFinishesOnItsOwnAndTheReceiveWhenItsDataIsThere) {
  using SC = trace::SendCompletion;
  CostModel m = AlphaBeta();
  // Receive posted early (0 us), send at 10 us: the receive ends when the data arrives (21 us), then 5 us.
  {
    G g(2);
    g.Comm({0, 1}, "PP");
    uint32_t c = g.Compute(0, 0, 10);
    g.P2P(0, 1, "PP", true, 1, 1'000'000, {c});
    uint32_t rv = g.P2P(1, 1, "PP", false, 0, 1'000'000);
    g.Compute(1, 0, 5, {rv});
    SimResult r = Simulate(g.t, m, Sends(SC::kEager));
    ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
    EXPECT_NEAR(r.makespan_s, 26e-6, 1e-12);
    EXPECT_NEAR(r.ranks[0].end_s, 21e-6, 1e-12);
    EXPECT_NEAR(Wait(r.ranks[1], "PP"), 10e-6, 1e-12);  // for the sender to post
    EXPECT_EQ(r.ranks[1].waited_on[0].rank, 0);
    // The path: rank 0's compute, the transfer, rank 1's compute.
    EXPECT_NEAR(r.critical_path.length_s, 26e-6, 1e-12);
    EXPECT_NEAR(r.critical_path.compute_s, 15e-6, 1e-12);
    EXPECT_NEAR(r.critical_path.comm_s, 11e-6, 1e-12);
    EXPECT_EQ(r.critical_path.ranks, (std::vector<int32_t>{0, 1}));
  }
  // Receive posted late (50 us): the sender is done at 21 us (rendezvous: 61 us), the receive at once.
  {
    G g(2);
    g.Comm({0, 1}, "PP");
    uint32_t c = g.Compute(0, 0, 10);
    g.P2P(0, 1, "PP", true, 1, 1'000'000, {c});
    uint32_t late = g.Compute(1, 0, 50);
    g.P2P(1, 1, "PP", false, 0, 1'000'000, {late});
    SimResult r = Simulate(g.t, m, Sends(SC::kEager));
    ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
    EXPECT_NEAR(r.ranks[0].end_s, 21e-6, 1e-12);
    EXPECT_NEAR(r.ranks[1].end_s, 50e-6, 1e-12);
    EXPECT_NEAR(Wait(r.ranks[0], "PP"), 0.0, 1e-15);
    EXPECT_NEAR(Wait(r.ranks[1], "PP"), 0.0, 1e-15);
    EXPECT_NEAR(r.critical_path.compute_s, 50e-6, 1e-12);
    EXPECT_EQ(r.critical_path.ranks, (std::vector<int32_t>{1}));
    r = Simulate(g.t, m, Sends(SC::kRendezvous));
    ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
    EXPECT_NEAR(r.ranks[0].end_s, 61e-6, 1e-12);
    EXPECT_NEAR(Wait(r.ranks[0], "PP"), 40e-6, 1e-12);
  }
}

TEST(Engine, EagerSendsStillReportGenuineDeadlocksAndLostMessages) {
  using SC = trace::SendCompletion;
  CostModel m = AlphaBeta();
  // Both ranks receive first: a deadlock whatever sends do.
  G g(2);
  g.Comm({0, 1}, "PP");
  g.P2P(0, 0, "PP", false, 1, 1024);
  g.P2P(0, 0, "PP", true, 1, 1024);
  g.P2P(1, 0, "PP", false, 0, 1024);
  g.P2P(1, 0, "PP", true, 0, 1024);
  SimResult r = Simulate(g.t, m, Sends(SC::kEager));
  ASSERT_EQ(r.status, SimResult::Status::kDeadlock);
  EXPECT_NE(r.error.find("2 of 2 ranks"), std::string::npos) << r.error;
  EXPECT_NE(r.wait_chain[0].find("recv from rank 1"), std::string::npos) << r.wait_chain[0];
  EXPECT_NE(r.wait_chain.back().find("cycle"), std::string::npos) << r.wait_chain.back();
  // A send nobody receives (the validator refuses such a graph; the engine must not call it a result).
  G lost(2);
  lost.Comm({0, 1}, "PP");
  lost.P2P(0, 0, "PP", true, 1, 1024);
  lost.Compute(1, 0, 5);
  EXPECT_FALSE(ValidateTrace(lost.t).empty());
  r = Simulate(lost.t, m, Sends(SC::kEager));
  EXPECT_EQ(r.status, SimResult::Status::kMismatch);
  EXPECT_NE(r.error.find("rank 0 stream 's0' node 0 'send': send to rank 1 (message #0 on comm 100 (PP)) is never "
                         "matched"),
            std::string::npos)
      << r.error;
}

TEST(Engine, CollectivesInOppositeOrderOnTwoCommunicatorsDeadlock) {
  G g(2);
  g.Comm({0, 1}, "A");
  g.Comm({0, 1}, "B");
  g.Coll(0, 0, "A", CollOp::kAllReduce, 1024);
  g.Coll(0, 0, "B", CollOp::kAllReduce, 1024);
  g.Coll(1, 0, "B", CollOp::kAllReduce, 1024);
  g.Coll(1, 0, "A", CollOp::kAllReduce, 1024);
  ASSERT_TRUE(ValidateTrace(g.t).empty()) << "each communicator on its own is consistent";
  CostModel m = AlphaBeta();
  SimResult r = Simulate(g.t, m);
  EXPECT_EQ(r.status, SimResult::Status::kDeadlock);
  ASSERT_EQ(r.wait_chain.size(), 3u);
  EXPECT_NE(r.wait_chain[0].find("allreduce #0 on comm 100 (A) for rank 1"), std::string::npos) << r.wait_chain[0];
  EXPECT_NE(r.wait_chain[1].find("allreduce #0 on comm 101 (B) for rank 0"), std::string::npos) << r.wait_chain[1];
  EXPECT_NE(r.wait_chain[2].find("cycle of 2"), std::string::npos) << r.wait_chain[2];
}

TEST(Engine, CollectiveSomeMemberNeverReachesIsNamed) {
  G g(3);
  g.Comm({0, 1, 2}, "DP");
  for (int r = 0; r < 3; ++r) g.Coll(r, 0, "DP", CollOp::kAllReduce, 1024);
  g.Coll(0, 0, "DP", CollOp::kAllReduce, 1024);  // rank 0 issues a second one, 1 and 2 do not
  g.Coll(1, 0, "DP", CollOp::kAllReduce, 1024);
  EXPECT_FALSE(ValidateTrace(g.t).empty()) << "the validator catches this one; the engine must too";
  CostModel m = AlphaBeta();
  SimResult r = Simulate(g.t, m);
  EXPECT_EQ(r.status, SimResult::Status::kDeadlock);
  ASSERT_FALSE(r.wait_chain.empty());
  std::string all;
  for (auto& l : r.wait_chain) all += l + "\n";
  EXPECT_NE(all.find("rank 2"), std::string::npos) << all;
  EXPECT_NE(all.find("issues only 1"), std::string::npos) << all;
}

TEST(Engine, MismatchedCollectivesStopTheReplay) {
  G g(2);
  g.Comm({0, 1}, "TP");
  g.Coll(0, 0, "TP", CollOp::kAllReduce, 1024);
  g.Coll(1, 0, "TP", CollOp::kAllGather, 2048);
  CostModel m = AlphaBeta();
  SimResult r = Simulate(g.t, m);
  EXPECT_EQ(r.status, SimResult::Status::kMismatch);
  EXPECT_NE(r.error.find("allreduce"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("allgather"), std::string::npos) << r.error;
}

TEST(Engine, StructuralErrorsAreReportedNotCrashes) {
  {
    G g(2);
    g.Compute(0, 0, 1, {77});  // dangling after
    g.Compute(1, 0, 1);
    CostModel m = AlphaBeta();
    SimResult r = Simulate(g.t, m);
    EXPECT_EQ(r.status, SimResult::Status::kBadGraph);
    EXPECT_NE(r.error.find("77"), std::string::npos) << r.error;
  }
  {
    G g(2);
    g.Comm({0, 1}, "TP");
    g.Coll(0, 0, "TP", CollOp::kAllReduce, 8);
    g.Coll(1, 0, "TP", CollOp::kAllReduce, 8);
    g.t.ranks[1].comms[0] = 999;  // unknown comm
    CostModel m = AlphaBeta();
    SimResult r = Simulate(g.t, m);
    EXPECT_EQ(r.status, SimResult::Status::kBadGraph);
    EXPECT_NE(r.error.find("999"), std::string::npos) << r.error;
  }
  {
    G g(2);
    g.t.ranks.pop_back();
    CostModel m = AlphaBeta();
    EXPECT_EQ(Simulate(g.t, m).status, SimResult::Status::kBadGraph);
  }
}

TEST(Engine, StragglerDoublesAKnownPath) {
  G g(2);
  g.Comm({0, 1}, "DP");
  for (int r = 0; r < 2; ++r) {
    g.Compute(r, 0, 100);
    g.Compute(r, 0, 100);
    g.Coll(r, 0, "DP", CollOp::kAllReduce, 8'000'000);  // 82 us
  }
  CostModel m = AlphaBeta();
  SimResult base = Simulate(g.t, m);
  ASSERT_EQ(base.status, SimResult::Status::kOk);
  EXPECT_NEAR(base.iteration_time_s, 282e-6, 1e-12);
  EngineOptions o;
  o.compute_scale = {{1, 2.0}};
  SimResult slow = Simulate(g.t, m, o);
  ASSERT_EQ(slow.status, SimResult::Status::kOk);
  // Rank 1's 200 us of compute doubles; rank 0 waits for it.
  EXPECT_NEAR(slow.iteration_time_s, 482e-6, 1e-12);
  EXPECT_NEAR(Wait(slow.ranks[0], "DP"), 200e-6, 1e-12);
  EXPECT_EQ(slow.critical_path.ranks.front(), 1);
  EXPECT_NEAR(slow.critical_path.compute_s, 400e-6, 1e-12);
  // A single compute-bound rank: the whole iteration doubles.
  G one(1);
  one.Compute(0, 0, 100);
  one.Compute(0, 0, 50);
  o.compute_scale = {{0, 2.0}};
  EXPECT_NEAR(Simulate(one.t, m, o).iteration_time_s, 2 * Simulate(one.t, m).iteration_time_s, 1e-12);
}

TEST(Engine, IterationTimeIsTheMedianOfPerIterationMaxima) {
  G g(2);
  // Rank 0: iterations of 10, 30, 20 us; rank 1: 15, 5, 5 us.
  g.Compute(0, 0, 10, {}, 0);
  g.Compute(0, 0, 30, {}, 1);
  g.Compute(0, 0, 20, {}, 2);
  g.Compute(1, 0, 15, {}, 0);
  g.Compute(1, 0, 5, {}, 1);
  g.Compute(1, 0, 5, {}, 2);
  CostModel m = AlphaBeta();
  SimResult r = Simulate(g.t, m);
  ASSERT_EQ(r.status, SimResult::Status::kOk);
  ASSERT_EQ(r.iteration_times_s.size(), 3u);
  EXPECT_NEAR(r.iteration_times_s[0], 15e-6, 1e-12);
  EXPECT_NEAR(r.iteration_times_s[1], 30e-6, 1e-12);
  EXPECT_NEAR(r.iteration_times_s[2], 20e-6, 1e-12);
  EXPECT_NEAR(r.iteration_time_s, 20e-6, 1e-12);
  EXPECT_NEAR(r.ranks[0].iteration_time_s, 20e-6, 1e-12);
  EXPECT_NEAR(r.ranks[1].iteration_time_s, 5e-6, 1e-12);
}

TEST(Engine, BandwidthWhatIfRescalesRecordedDurations) {
  // Two ranks on different nodes; the all-reduce was recorded at 1000 us.
  G g(16);
  g.Comm({0, 8}, "DP");
  g.Coll(0, 0, "DP", CollOp::kAllReduce, 10'000'000, 1000);
  g.Coll(8, 0, "DP", CollOp::kAllReduce, 10'000'000, 1000);
  CostModel base = AlphaBeta();
  Topology slow_topo = base.topology();
  ScaleNetworkBandwidth(&slow_topo, 0.5);
  CostModel slow;
  std::string err;
  ASSERT_TRUE(slow.Init(slow_topo, {}, &err));
  EngineOptions o;
  o.baseline_model = &base;
  SimResult r = Simulate(g.t, slow, o);
  ASSERT_EQ(r.status, SimResult::Status::kOk);
  // Model: 2 * 10 + 10 MB / 10 GB/s = 1020 us at baseline, 20 + 2000 = 2020 us at half bandwidth.
  EXPECT_NEAR(r.makespan_s, 1000e-6 * 2020.0 / 1020.0, 1e-12);
}

TEST(Engine, ChromeTraceHasEveryNodeOfTheTracedRanks) {
  G g(2);
  g.Comm({0, 1}, "TP");
  g.Compute(0, 0, 10);
  g.Coll(0, 0, "TP", CollOp::kAllReduce, 1024);
  g.Compute(1, 0, 10);
  g.Coll(1, 0, "TP", CollOp::kAllReduce, 1024);
  CostModel m = AlphaBeta();
  Simulator sim(g.t, m);
  ASSERT_EQ(sim.Run().status, SimResult::Status::kOk);
  nlohmann::json j = sim.ChromeTrace({1});
  int complete = 0;
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["pid"], 1);
    if (e["ph"] == "X") {
      ++complete;
      EXPECT_GE(e["dur"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(complete, 2);
}

}  // namespace
}  // namespace prism::replay
