// GraphRelease: virtual ranks following a PrismTrace, fed through the ReleasePolicy interface (no sockets).
#include "coordinator/release/graph_release.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "replay/trace_io.h"

namespace prism::coord {
namespace {

using nlohmann::json;

constexpr uint64_t kT = 1'000'000'000'000ull;  // a wall-clock instant (ns)
constexpr uint64_t kUs = 1000;
constexpr uint32_t kAllReduce = 1, kSend = 103, kRecv = 104;

json Compute(double us, const char* name = "c") { return {{"kind", "compute"}, {"dur_us", us}, {"name", name}}; }
json AllReduce(const char* slot, double us) {
  return {{"kind", "coll"}, {"op", "allreduce"}, {"comm", slot}, {"bytes", 1024}, {"dtype", "f32"}, {"dur_us", us}};
}
json P2p(const char* kind, const char* slot, int peer, double us) {
  return {{"kind", kind}, {"comm", slot}, {"peer", peer}, {"bytes", 4096}, {"dtype", "bf16"}, {"dur_us", us}};
}
json Class(const char* name, json slots, json nodes) {
  return {{"name", name}, {"comm_slots", slots}, {"streams", json::array({{{"name", "main"}, {"nodes", nodes}}})}};
}
json Graph(int world, json comms, json classes, json rank_class) {
  return {{"magic", "PRISMTRACE"}, {"schema_version", 1}, {"world_size", world},
          {"comms", comms},        {"classes", classes},  {"rank_class", rank_class}};
}

std::unique_ptr<GraphRelease> Make(const json& j, std::vector<int> real) {
  trace::Trace t;
  std::string error;
  EXPECT_TRUE(replay::TraceFromJson(j, &t, &error)) << error;
  return std::make_unique<GraphRelease>(std::move(t), std::move(real));
}

Arrival Arrive(int rank, uint32_t comm_id, uint32_t op, uint64_t seq, uint64_t at, uint64_t model_dur = 0,
               int32_t peer = -1) {
  return Arrival{rank, ipc::OpArrive{comm_id, op, seq, 1024, at, model_dur, peer, 0}};
}

CommView View(uint32_t id, std::vector<int> members, std::vector<int> real) {
  return CommView{id, "k" + std::to_string(id), std::move(members), std::move(real)};
}

// 2 ranks, one allreduce per iteration after a compute of `c0` (rank 0) and `c1` (rank 1) microseconds.
json TwoRankAllReduce(double c0, double c1, double ar_us = 100) {
  return Graph(2, json::array({{{"id", 0}, {"ranks", {0, 1}}, {"desc", "dp"}}}),
               json::array({Class("r0", {"dp"}, json::array({Compute(c0), AllReduce("dp", ar_us)})),
                            Class("r1", {"dp"}, json::array({Compute(c1), AllReduce("dp", ar_us)}))}),
               json::array({{{"class", 0}, {"comms", {0}}}, {{"class", 1}, {"comms", {0}}}}));
}

TEST(GraphRelease, VirtualPeerWithLongerComputeHoldsTheAllReduce) {
  CommView dp = View(7, {0, 1}, {0});
  // Same compute on both: the real rank's arrival plus the recorded duration.
  auto same = Make(TwoRankAllReduce(1000, 1000), {0});
  Arrival a = Arrive(0, 7, kAllReduce, 0, kT);
  ReleaseDecision d = same->Decide(dp, 0, {&a, 1});
  EXPECT_EQ(d.release_ns, kT + 100 * kUs);
  // The virtual peer computes 500 us longer: it arrives 500 us after the real rank and decides the release.
  auto slow = Make(TwoRankAllReduce(1000, 1500), {0});
  d = slow->Decide(dp, 0, {&a, 1});
  EXPECT_EQ(d.release_ns, kT + 600 * kUs);
  EXPECT_EQ(d.last_rank, 1);
  EXPECT_EQ(slow->anchor_ns(), static_cast<int64_t>(kT - 1000 * kUs));
  EXPECT_EQ(slow->stats().decided, 1u);
}

// Two groups with the same members (Megatron with tp 1: the model-parallel group is the pipeline group): the graph
// numbers its communicators in first use order (here the model-parallel one first, though the pipeline's is used
// first in the stream), the job creates the pipeline group first. Each live communicator finds its graph twin by its
// description, so the pipeline all-reduce is released with the pipeline node's 300 us, not the other's 100 us.
TEST(GraphRelease, TwinsWithTheSameMembersAreToldApartByTheirDescription) {
  const json slots = {"pp", "mp"};
  const json nodes = json::array({Compute(1000), AllReduce("pp", 300), Compute(1000), AllReduce("mp", 100)});
  const json g = Graph(2,
                       json::array({{{"id", 0}, {"ranks", {0, 1}}, {"desc", "MODEL_PARALLEL_GROUP"}},
                                    {{"id", 1}, {"ranks", {0, 1}}, {"desc", "PIPELINE_MODEL_PARALLEL_GROUP"}}}),
                       json::array({Class("r0", slots, nodes), Class("r1", slots, nodes)}),
                       json::array({{{"class", 0}, {"comms", {1, 0}}}, {{"class", 1}, {"comms", {1, 0}}}}));
  auto gr = Make(g, {0});
  CommView pp = View(1, {0, 1}, {0});
  pp.desc = "PIPELINE_MODEL_PARALLEL_GROUP";
  CommView mp = View(2, {0, 1}, {0});
  mp.member_twin = 1;  // created second
  mp.desc = "MODEL_PARALLEL_GROUP";
  Arrival a = Arrive(0, 1, kAllReduce, 0, kT);
  ReleaseDecision d = gr->Decide(pp, 0, {&a, 1});
  EXPECT_EQ(d.release_ns, kT + 300 * kUs);
  Arrival b = Arrive(0, 2, kAllReduce, 0, kT + 1300 * kUs);
  d = gr->Decide(mp, 0, {&b, 1});
  EXPECT_EQ(d.release_ns, kT + 1400 * kUs);
  EXPECT_EQ(gr->stats().unmatched, 0u);
  // Without descriptions the creation order decides, as before: the first created takes the graph's first.
  auto plain = Make(g, {0});
  CommView first = View(1, {0, 1}, {0});
  d = plain->Decide(first, 0, {&a, 1});
  EXPECT_NE(d.release_ns, kT + 300 * kUs);
}

TEST(GraphRelease, RealRankArrivingLateDecidesAndTheGraphRepeats) {
  auto g = Make(TwoRankAllReduce(1000, 1500), {0});
  CommView dp = View(3, {0, 1}, {0});
  Arrival a = Arrive(0, 3, kAllReduce, 0, kT);
  EXPECT_EQ(g->Decide(dp, 0, {&a, 1}).release_ns, kT + 600 * kUs);
  // Second iteration (seq 1 = the graph's allreduce again): the virtual rank starts its compute at the release
  // (T + 600) and arrives at T + 2100; the real rank is slow and arrives at T + 5600.
  EXPECT_EQ(g->VirtualArrival(1, 1, 1), static_cast<int64_t>(kT + 2100 * kUs));
  a = Arrive(0, 3, kAllReduce, 1, kT + 5600 * kUs);
  ReleaseDecision d = g->Decide(dp, 1, {&a, 1});
  EXPECT_EQ(d.release_ns, kT + 5700 * kUs);
  EXPECT_EQ(d.last_rank, 0);
  // Third: the real rank is quick again (arrives 100 us after the release); the virtual one is 1500 us behind.
  a = Arrive(0, 3, kAllReduce, 2, kT + 5800 * kUs);
  d = g->Decide(dp, 2, {&a, 1});
  EXPECT_EQ(d.release_ns, kT + (5700 + 1500 + 100) * kUs);
  EXPECT_EQ(d.last_rank, 1);
}

TEST(GraphRelease, PipelineRecvWaitsForTheVirtualStagesForward) {
  json g = Graph(2, json::array({{{"id", 0}, {"ranks", {0, 1}}, {"desc", "pp"}}}),
                 json::array({Class("stage0", {"pp"}, json::array({Compute(2000, "fwd"), P2p("send", "pp", 1, 50)})),
                              Class("stage1", {"pp"},
                                    json::array({Compute(300, "embed"), P2p("recv", "pp", 0, 50),
                                                 Compute(1000, "fwd")}))}),
                 json::array({{{"class", 0}, {"comms", {0}}}, {{"class", 1}, {"comms", {0}}}}));
  auto p = Make(g, {1});
  CommView pp = View(2, {0, 1}, {1});
  Arrival a = Arrive(1, 2, kRecv, 0, kT, 0, 0);
  ReleaseDecision d = p->Decide(pp, 0, {&a, 1});
  // Graph time 0 = T - 300 us; stage 0 posts its send after 2000 us of forward: T + 1700; + 50 us transfer.
  EXPECT_EQ(d.release_ns, kT + 1750 * kUs);
  EXPECT_EQ(d.last_rank, 0);
}

// libprism sends a group's send and receive on one stream as one unit (ipc.h OpArrive::nops = 2, op 0 when they
// differ): both graph nodes map to it, and it completes when the later of the two does.
TEST(GraphRelease, FusedSendAndReceiveCompleteTogether) {
  json g = Graph(2, json::array({{{"id", 0}, {"ranks", {0, 1}}, {"desc", "pp"}}}),
                 json::array({Class("stage0", {"pp"},
                                    json::array({Compute(100, "fwd"), P2p("send", "pp", 1, 50), P2p("recv", "pp", 1, 50)})),
                              Class("stage1", {"pp"},
                                    json::array({Compute(900, "fwd"), P2p("recv", "pp", 0, 50), Compute(400, "bwd"),
                                                 P2p("send", "pp", 0, 50)}))}),
                 json::array({{{"class", 0}, {"comms", {0}}}, {{"class", 1}, {"comms", {0}}}}));
  auto p = Make(g, {0});
  CommView pp = View(2, {0, 1}, {0});
  Arrival a = Arrive(0, 2, 0, 0, kT, 0, 1);
  a.op.nops = 2;
  ReleaseDecision d = p->Decide(pp, 0, {&a, 1});
  // Graph time 0 = T - 100 us. Stage 1 receives at 900 us (T + 800, + 50), computes 400 us, sends at T + 1250: the
  // unit's receive completes at T + 1300.
  EXPECT_EQ(d.release_ns, kT + 1300 * kUs);
  EXPECT_EQ(d.last_rank, 1);
  EXPECT_EQ(p->stats().unmatched, 0u);
  EXPECT_EQ(p->stats().blocked, 0u);
  // The send alone (nops 1): only its own completion counts, stage 1's receive posted at T + 800, + 50.
  auto q = Make(g, {0});
  a.op.nops = 1;
  a.op.op = kSend;
  EXPECT_EQ(q->Decide(pp, 0, {&a, 1}).release_ns, kT + 850 * kUs);
}

TEST(GraphRelease, DurationFromTheShimWhenTheGraphHasNone) {
  auto g = Make(TwoRankAllReduce(1000, 1200, -1), {0});
  CommView dp = View(1, {0, 1}, {0});
  Arrival a = Arrive(0, 1, kAllReduce, 0, kT, 77 * kUs);
  EXPECT_EQ(g->Decide(dp, 0, {&a, 1}).release_ns, kT + (200 + 77) * kUs);
}

// 4 ranks, tp=2 pp=2: ranks 0,1 stage 0 (tp comm 0), ranks 2,3 stage 1 (tp comm 1); pp comms {0,2} and {1,3}.
// Only rank 0 is real. Stage 0: fwd 1000, tp allreduce 100, send 50, recv 50, tp allreduce 100.
// Stage 1: recv 50, fwd+bwd 2000, tp allreduce 100, send 50.
json FourRank() {
  json s0 = json::array({Compute(1000, "fwd"), AllReduce("tp", 100), P2p("send", "pp", 1, 50),
                         P2p("recv", "pp", 1, 50), AllReduce("tp", 100)});
  json s1 = json::array({P2p("recv", "pp", 0, 50), Compute(2000, "fwd+bwd"), AllReduce("tp", 100),
                         P2p("send", "pp", 0, 50)});
  json comms = json::array({{{"id", 0}, {"ranks", {0, 1}}},
                            {{"id", 1}, {"ranks", {2, 3}}},
                            {{"id", 2}, {"ranks", {0, 2}}},
                            {{"id", 3}, {"ranks", {1, 3}}}});
  return Graph(4, comms, json::array({Class("stage0", {"tp", "pp"}, s0), Class("stage1", {"tp", "pp"}, s1)}),
               json::array({{{"class", 0}, {"comms", {0, 2}}},
                            {{"class", 0}, {"comms", {0, 3}}},
                            {{"class", 1}, {"comms", {1, 2}}},
                            {{"class", 1}, {"comms", {1, 3}}}}));
}

TEST(GraphRelease, FourRanksOneRealPipelineAndTensorParallel) {
  auto g = Make(FourRank(), {0});
  CommView tp = View(11, {0, 1}, {0});
  CommView pp = View(12, {2, 0}, {0});  // member order differs from the graph's: matched by members
  Arrival a = Arrive(0, 11, kAllReduce, 0, kT);
  EXPECT_EQ(g->Decide(tp, 0, {&a, 1}).release_ns, kT + 100 * kUs);
  // Conservative: rank 2 waits in its recv for the real rank's send, not reported yet, so it has not reached its
  // allreduce (node 2); it did post its recv (node 0) at graph time 0.
  EXPECT_EQ(g->VirtualArrival(2, 0, 0), static_cast<int64_t>(kT - 1000 * kUs));
  EXPECT_FALSE(g->VirtualArrival(2, 0, 2).has_value());
  // The real send (seq 0 on pp): rank 2's recv was posted long ago, so the real arrival decides.
  a = Arrive(0, 12, kSend, 0, kT + 100 * kUs, 0, 1);
  ReleaseDecision d = g->Decide(pp, 0, {&a, 1});
  EXPECT_EQ(d.release_ns, kT + 150 * kUs);
  EXPECT_EQ(d.last_rank, 0);
  // Now stage 1 runs: 2000 us, its allreduce with rank 3 (fed by virtual rank 1's send at T+100 -> T+150), send.
  EXPECT_EQ(g->VirtualArrival(2, 0, 2), static_cast<int64_t>(kT + 2150 * kUs));
  a = Arrive(0, 12, kRecv, 1, kT + 160 * kUs, 0, 1);
  d = g->Decide(pp, 1, {&a, 1});
  EXPECT_EQ(d.release_ns, kT + 2300 * kUs);  // rank 2 sends at T+2250, +50
  EXPECT_EQ(d.last_rank, 2);
  // The last tp allreduce: virtual rank 1 got its gradient from rank 3 at T+2300 too; the real rank comes later.
  a = Arrive(0, 11, kAllReduce, 1, kT + 2400 * kUs);
  d = g->Decide(tp, 1, {&a, 1});
  EXPECT_EQ(d.release_ns, kT + 2500 * kUs);
  EXPECT_EQ(d.last_rank, 0);
  EXPECT_EQ(g->stats().decided, 4u);
  EXPECT_EQ(g->stats().blocked, 0u);
}

// Fill slices (SetLockstepSlots): on the tensor-parallel slot the real rank's collective completes at its own arrival
// plus the duration although its virtual peer arrives later; the virtual peer still waits for the real arrival and
// its own; the pipeline slot keeps the graph's rule; Predict says the same (floor 0).
TEST(GraphRelease, LockstepSlotsReleaseTheRealRankOnItsOwnArrival) {
  json g = Graph(2, json::array({{{"id", 0}, {"ranks", {0, 1}}, {"desc", "tp"}}}),
                 json::array({Class("r0", {"tp"}, json::array({Compute(1000), AllReduce("tp", 100)})),
                              Class("r1", {"tp"}, json::array({Compute(1500), AllReduce("tp", 100)}))}),
                 json::array({{{"class", 0}, {"comms", {0}}}, {{"class", 1}, {"comms", {0}}}}));
  CommView tp = View(7, {0, 1}, {0});
  for (bool lockstep : {false, true}) {
    auto r = Make(g, {0});
    if (lockstep) r->SetLockstepSlots({"tp"});
    Arrival a = Arrive(0, 7, kAllReduce, 0, kT);
    ReleaseDecision d = r->Decide(tp, 0, {&a, 1});
    EXPECT_EQ(d.release_ns, lockstep ? kT + 100 * kUs : kT + 600 * kUs) << "lockstep " << lockstep;
    // The virtual peer completed its allreduce at its own arrival (T + 500) + 100 either way: its next one is
    // posted 1500 us later.
    EXPECT_EQ(r->VirtualArrival(1, 1, 1), static_cast<int64_t>(kT + 2100 * kUs)) << "lockstep " << lockstep;
    std::optional<ReleasePolicy::Prerelease> p = r->Predict(tp, 1, 0);
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->floor_ns, lockstep ? 0u : kT + 2100 * kUs) << "lockstep " << lockstep;
    EXPECT_EQ(p->dur_ns, static_cast<int64_t>(100 * kUs));
    EXPECT_EQ(p->floor_rank, lockstep ? 0 : 1) << "who decides, as Decide names it";
    EXPECT_EQ(r->stats().lockstep, lockstep ? 1u : 0u);
  }
  // Two real members: both arrivals count, lockstep or not.
  auto both = Make(g, {0, 1});
  both->SetLockstepSlots({"tp"});
  CommView tp2 = View(7, {0, 1}, {0, 1});
  Arrival two[2] = {Arrive(0, 7, kAllReduce, 0, kT), Arrive(1, 7, kAllReduce, 0, kT + 300 * kUs)};
  ReleaseDecision d2 = both->Decide(tp2, 0, {two, 2});
  EXPECT_EQ(d2.release_ns, kT + 400 * kUs);
  EXPECT_EQ(d2.last_rank, 1);
  // The builder's second communicator over the group ("tp#2") is the same slot here.
  json g2 = g;
  for (auto& c : g2["classes"]) c["comm_slots"] = {"tp#2"};
  for (auto& c : g2["classes"])
    for (auto& n : c["streams"][0]["nodes"])
      if (n.contains("comm")) n["comm"] = "tp#2";
  auto second = Make(g2, {0});
  second->SetLockstepSlots({"tp"});
  Arrival a2 = Arrive(0, 7, kAllReduce, 0, kT);
  EXPECT_EQ(second->Decide(tp, 0, {&a2, 1}).release_ns, kT + 100 * kUs);
  // A slot not named keeps the rule.
  auto other = Make(g, {0});
  other->SetLockstepSlots({"pp"});
  Arrival a = Arrive(0, 7, kAllReduce, 0, kT);
  EXPECT_EQ(other->Decide(tp, 0, {&a, 1}).release_ns, kT + 600 * kUs);
}

TEST(GraphRelease, TwoRealRanksBothArrivalsCount) {
  auto g = Make(FourRank(), {0, 1});
  CommView tp = View(5, {0, 1}, {0, 1});
  Arrival a[2] = {Arrive(0, 5, kAllReduce, 0, kT), Arrive(1, 5, kAllReduce, 0, kT + 40 * kUs)};
  ReleaseDecision d = g->Decide(tp, 0, a);
  EXPECT_EQ(d.release_ns, kT + 140 * kUs);
  EXPECT_EQ(d.last_rank, 1);
}

TEST(GraphRelease, BlockedVirtualMemberFallsBackToKnownArrivals) {
  // Rank 2 (virtual) does a collective with real rank 1 first, then one with real rank 0. Rank 0 arriving first
  // cannot be answered from the graph: rank 2 waits on rank 1, which has not reported.
  json g = Graph(3, json::array({{{"id", 0}, {"ranks", {0, 2}}}, {{"id", 1}, {"ranks", {1, 2}}}}),
                 json::array({Class("a", {"x"}, json::array({Compute(10), AllReduce("x", 5)})),
                              Class("c", {"y", "x"}, json::array({AllReduce("y", 5), AllReduce("x", 5)}))}),
                 json::array({{{"class", 0}, {"comms", {0}}},
                              {{"class", 0}, {"comms", {1}}},
                              {{"class", 1}, {"comms", {1, 0}}}}));
  auto p = Make(g, {0, 1});
  CommView c02 = View(1, {0, 2}, {0});
  Arrival a = Arrive(0, 1, kAllReduce, 0, kT);
  ReleaseDecision d = p->Decide(c02, 0, {&a, 1});
  EXPECT_EQ(d.release_ns, kT + 5 * kUs);
  EXPECT_EQ(p->stats().blocked, 1u);
  // Rank 1's collective with rank 2 is then decided from the graph: rank 2 was there at graph time 0.
  CommView c12 = View(2, {1, 2}, {1});
  a = Arrive(1, 2, kAllReduce, 0, kT + 20 * kUs);
  EXPECT_EQ(p->Decide(c12, 0, {&a, 1}).release_ns, kT + 25 * kUs);
  EXPECT_EQ(p->stats().decided, 1u);
}

TEST(GraphRelease, UnknownCommunicatorOrOperationUsesTheDefault) {
  auto g = Make(TwoRankAllReduce(1000, 1500), {0});
  CommView other = View(9, {0}, {0});
  Arrival a = Arrive(0, 9, kAllReduce, 0, kT, 30 * kUs);
  EXPECT_EQ(g->Decide(other, 0, {&a, 1}).release_ns, kT + 30 * kUs);
  CommView dp = View(1, {0, 1}, {0});
  a = Arrive(0, 1, kSend, 0, kT, 30 * kUs);  // the graph has an allreduce here
  EXPECT_EQ(g->Decide(dp, 0, {&a, 1}).release_ns, kT + 30 * kUs);
  EXPECT_EQ(g->stats().unmatched, 2u);
}

std::string WriteGraph(const json& j, const std::string& name) {
  std::filesystem::path dir = std::filesystem::path(PRISM_BINARY_DIR) / "graph_release_test";
  std::filesystem::create_directories(dir);
  std::string path = (dir / name).string();
  std::ofstream(path) << j.dump();
  return path;
}

TEST(GraphRelease, LoadChecksTheFileAndTheWorld) {
  std::string path = WriteGraph(TwoRankAllReduce(1000, 1500), "two.prism.json");
  std::string error;
  EXPECT_NE(GraphRelease::Load(path, 2, {0}, &error), nullptr) << error;
  EXPECT_EQ(GraphRelease::Load(path, 4, {0}, &error), nullptr);
  EXPECT_NE(error.find("world size 2"), std::string::npos) << error;
  EXPECT_EQ(GraphRelease::Load(path + ".missing", 2, {0}, &error), nullptr);
}

TEST(GraphRelease, PrismRunCoordinatorTakesTheGraph) {
  const char* run = std::getenv("PRISM_RUN");
  if (!run) GTEST_SKIP() << "PRISM_RUN not set";
  std::string good = WriteGraph(TwoRankAllReduce(1000, 1500), "cli.prism.json");
  std::string out = std::string(PRISM_BINARY_DIR) + "/graph_release_test/out";
  std::string cmd = std::string(run) + " coordinator --ranks 0 --out " + out;
  std::string base = cmd + " --world-size 2 --graph ";
  // A graph of another world is bad input (exit 2) before anything starts.
  int rc = std::system((cmd + " --world-size 4 --graph " + good + " > /dev/null 2>&1").c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  rc = std::system((base + good + ".missing > /dev/null 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  // A good one: the coordinator starts, says the graph drives its virtual ranks, and stops on SIGINT.
  std::string log = out + ".log";
  rc = std::system(("timeout --preserve-status -s INT 2 " + base + good + " > " + log + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 0);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("virtual ranks follow graph"), std::string::npos) << text;
}

}  // namespace
}  // namespace prism::coord
