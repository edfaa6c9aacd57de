// GraphRelease in closed loop: one rank of a real Megatron-LM graph (tests/data/graph/megatron_w64_collect, world 64,
// tp 2, pp 2) plays the real rank (its own compute durations, its streams in GPU-time order, every communication
// released by GraphRelease as the coordinator would), every other rank virtual. With exact durations the real rank
// must finish where the replay engine says it does (`prism-run simulate` of the same graph): the CPU form of fill's
// acceptance test (docs/fill.md), with no GPU and no timing noise.
#include "support/graph_closed_loop.h"
#include "coordinator/release/graph_release.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "replay/cost_model.h"
#include "replay/engine.h"
#include "replay/topology.h"
#include "replay/trace_io.h"

namespace prism::coord {
namespace {

namespace fs = std::filesystem;

LoopResult ClosedLoop(const trace::Trace& t, int real, uint32_t reps,
                      const std::vector<std::pair<int32_t, double>>& stragglers = {}, bool idle = false) {
  ClosedLoopOptions o;
  o.reps = reps;
  o.stragglers = stragglers;
  o.idle = idle;
  LoopResult r = ClosedLoop(t, real, o);
  EXPECT_TRUE(r.error.empty()) << r.error;
  return r;
}

class GraphClosedLoop : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("closed-loop-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const fs::path data = fs::path(PRISM_SOURCE_DIR) / "tests/data/graph/megatron_w64_collect";
    for (const auto& f : fs::directory_iterator(data)) fs::copy_file(f.path(), dir_ / f.path().filename());
    test_util::CliRun b = test_util::RunPrism("graph build " + dir_.string() + " --out " + (dir_ / "g.prism").string() +
                                              " --skip-iterations 1");
    if (b.rc == -1) GTEST_SKIP() << "PRISM_RUN not set";
    // The same events with the set-up iteration kept (fill's bare graph keeps it: the graph starts where the job
    // does).
    test_util::CliRun b0 = test_util::RunPrism("graph build " + dir_.string() + " --out " +
                                               (dir_ / "g0.prism").string());
    ASSERT_EQ(b0.rc, 0) << b0.out;
    if (b.rc == -1) GTEST_SKIP() << "PRISM_RUN not set";
    ASSERT_EQ(b.rc, 0) << b.out;
    std::string err;
    ASSERT_TRUE(replay::ReadTrace((dir_ / "g.prism").string(), &t_, &err)) << err;
    ASSERT_TRUE(replay::ReadTrace((dir_ / "g0.prism").string(), &t0_, &err)) << err;
    // Why recorded durations everywhere: GraphRelease and the engine must time every operation alike (a bare
    // graph's comm nodes have none; the engine would ask its cost model, the coordinator the shim's estimate).
    for (auto& c : t_.classes)
      for (auto& s : c.streams)
        for (auto& n : s.nodes)
          if (n.kind != trace::NodeKind::kCompute && n.dur_us < 0) n.dur_us = 20.0;
    for (auto& c : t0_.classes)
      for (auto& s : c.streams)
        for (auto& n : s.nodes)
          if (n.kind != trace::NodeKind::kCompute && n.dur_us < 0) n.dur_us = 20.0;
  }
  void TearDown() override { fs::remove_all(dir_); }

  double SimulatedEndNs(int rank, const std::vector<std::pair<int32_t, double>>& stragglers = {}) {
    replay::CostModel model;
    std::string err;
    EXPECT_TRUE(model.Init(replay::Topology{}, replay::CostModelOptions{}, &err)) << err;
    replay::EngineOptions eo;
    eo.compute_scale = stragglers;
    replay::Simulator sim(t_, model, eo);
    replay::SimResult r = sim.Run();
    if (const char* d = std::getenv("CLOSED_LOOP_DEBUG")) {
      std::ofstream(std::string(d) + "/sim" + std::to_string(rank) + ".json") << sim.ChromeTrace({rank}).dump();
    }
    EXPECT_EQ(r.status, replay::SimResult::Status::kOk) << r.error;
    for (const auto& rr : r.ranks)
      if (rr.rank == rank) return rr.end_s * 1e9;
    return -1;
  }

  fs::path dir_;
  trace::Trace t_;   // the kept steady iteration(s)
  trace::Trace t0_;  // every iteration, the set-up one included
};

// Ranks 0 and 33: the first and the last pipeline stage (ranks 32, 33 are stage 1 of replica 0).
TEST_F(GraphClosedLoop, RealRankFinishesWhereTheReplayEngineSays) {
  for (int real : {0, 33}) {
    SCOPED_TRACE("real rank " + std::to_string(real));
    const double sim = SimulatedEndNs(real);
    ASSERT_GT(sim, 0);
    LoopResult loop = ClosedLoop(t_, real, 1);
    EXPECT_EQ(loop.stats.blocked, 0u) << "a virtual member was blocked on the real rank's later operation";
    EXPECT_EQ(loop.stats.unmatched, 0u);
    std::printf("real rank %d: closed loop %.3f ms, simulate %.3f ms\n", real, loop.end_ns / 1e6, sim / 1e6);
    EXPECT_NEAR(static_cast<double>(loop.end_ns), sim, 0.02 * sim)
        << "closed loop " << loop.end_ns / 1e6 << " ms, simulate " << sim / 1e6 << " ms";
  }
}

// A filled graph leaves communication to the cost model (no recorded durations). The operations no real rank takes
// part in (stage 1's tensor-parallel all-reduces when rank 0 is the only real rank) must cost what simulate's model
// says, not 0; the real rank's own carry the same model's duration, as a shim on that topology sends.
// CLOSED_LOOP_GRAPH=FILE runs it on another graph (e.g. a GPU run's filled.prism).
TEST_F(GraphClosedLoop, CommunicationWithoutRecordedDurationsIsPricedAsSimulatePricesIt) {
  trace::Trace raw;
  std::string err;
  const char* other = std::getenv("CLOSED_LOOP_GRAPH");
  ASSERT_TRUE(replay::ReadTrace(other ? other : (dir_ / "g.prism").string(), &raw, &err)) << err;
  replay::Topology topo;
  ASSERT_TRUE(replay::LoadTopology(replay::kDefaultTopology, &topo, &err)) << err;
  replay::CostModel model;
  ASSERT_TRUE(model.Init(topo, replay::CostModelOptions{}, &err)) << err;
  replay::Simulator sim(raw, model, replay::EngineOptions{});
  replay::SimResult r = sim.Run();
  ASSERT_EQ(r.status, replay::SimResult::Status::kOk) << r.error;
  for (int real : {0, 33}) {
    SCOPED_TRACE("real rank " + std::to_string(real));
    double end = -1;
    for (const auto& rr : r.ranks)
      if (rr.rank == real) end = rr.end_s * 1e9;
    ASSERT_GT(end, 0);
    ClosedLoopOptions o;
    o.topology = replay::kDefaultTopology;
    LoopResult priced = ClosedLoop(raw, real, o);
    ASSERT_TRUE(priced.error.empty()) << priced.error;
    EXPECT_GT(priced.stats.modelled, 0u);
    EXPECT_EQ(priced.stats.no_duration, 0u);
    EXPECT_EQ(priced.stats.unmatched, 0u);
    // Without a model the virtual-only operations took 0: the rank finished early.
    LoopResult unpriced = ClosedLoop(raw, real, ClosedLoopOptions{});
    std::printf("real rank %d: closed loop %.3f ms (without a model %.3f ms), simulate %.3f ms\n", real,
                priced.end_ns / 1e6, unpriced.end_ns / 1e6, end / 1e6);
    EXPECT_NEAR(static_cast<double>(priced.end_ns), end, 1e-4 * end);
    EXPECT_GT(unpriced.stats.no_duration, 0u);
    EXPECT_LT(unpriced.end_ns, priced.end_ns);
  }
}

// Issue 8's straggler what-if in emulation: a virtual rank 14 % slower (the paper's thermal throttling) moves the
// real rank the way `simulate --what-if straggler=R:1.14` says. Rank 32 is rank 0's pipeline peer (stage 1 of the
// same replica): it must slow rank 0 down. Rank 33 (rank 32's tensor-parallel partner), rank 2 (a data-parallel
// peer of rank 0) and rank 35 (another replica's stage 1): in this graph simulate says they leave rank 0 as it was
// (their compute has slack at 1.14x), and the closed loop must agree either way.
TEST_F(GraphClosedLoop, VirtualStragglerMovesTheRealRankAsSimulateSays) {
  const double base = SimulatedEndNs(0);
  for (int slow : {32, 33, 2, 35}) {
    SCOPED_TRACE("straggler rank " + std::to_string(slow));
    const std::vector<std::pair<int32_t, double>> what_if = {{slow, 1.14}};
    const double sim = SimulatedEndNs(0, what_if);
    LoopResult loop = ClosedLoop(t_, 0, 1, what_if);
    EXPECT_EQ(loop.stats.blocked, 0u);
    EXPECT_EQ(loop.stats.unmatched, 0u);
    std::printf("straggler %d x1.14: rank 0 closed loop %.3f ms, simulate %.3f ms (no straggler %.3f ms)\n", slow,
                loop.end_ns / 1e6, sim / 1e6, base / 1e6);
    if (slow == 32) EXPECT_GT(sim, base * 1.01) << "the what-if should slow rank 0 down";
    EXPECT_NEAR(static_cast<double>(loop.end_ns), sim, 0.01 * sim);
  }
  GraphRelease gr(t_, {0});
  std::string err;
  EXPECT_FALSE(gr.SetStragglers({{0, 1.14}}, &err)) << "rank 0 is real";
  EXPECT_NE(err.find("runs for real"), std::string::npos) << err;
  EXPECT_FALSE(gr.SetStragglers({{64, 1.14}}, &err));
  EXPECT_FALSE(gr.SetStragglers({{3, 0.0}}, &err));
}

// A live run longer than the collected one: the graph repeats, from its steady iterations (the job does not repeat
// its set-up operations). Every repetition stays mapped, and repetitions after the first take the same time.
TEST_F(GraphClosedLoop, LongerRunRepeatsTheSteadyIterations) {
  for (int real : {0, 33}) {
    SCOPED_TRACE("real rank " + std::to_string(real));
    LoopResult loop = ClosedLoop(t0_, real, 4);
    EXPECT_EQ(loop.stats.blocked, 0u);
    EXPECT_EQ(loop.stats.unmatched, 0u);
    ASSERT_EQ(loop.rep_end_ns.size(), 4u);
    const double r2 = static_cast<double>(loop.rep_end_ns[2] - loop.rep_end_ns[1]);
    const double r3 = static_cast<double>(loop.rep_end_ns[3] - loop.rep_end_ns[2]);
    std::printf("real rank %d: repetitions end at %.3f %.3f %.3f %.3f ms\n", real, loop.rep_end_ns[0] / 1e6,
                loop.rep_end_ns[1] / 1e6, loop.rep_end_ns[2] / 1e6, loop.rep_end_ns[3] / 1e6);
    EXPECT_GT(r2, 0);
    EXPECT_NEAR(r3, r2, 0.02 * r2);
  }
}

// The coordinator's idle time advances the virtual ranks ahead (GraphRelease::Idle): every decision must be the one
// made without it, and the decisions after the first repetition must find the virtual ranks already there (without
// Idle, the decision at each repetition's start advances every virtual rank through a whole repetition: on the GPU,
// 17-25 ms per decision on the 4-stage Megatron graph filled on the H200, which the graph builder counts as compute;
// docs/coordinator.md).
TEST_F(GraphClosedLoop, IdleWorkAheadLeavesEveryDecisionAsItWas) {
  for (int real : {0, 33}) {
    SCOPED_TRACE("real rank " + std::to_string(real));
    LoopResult plain = ClosedLoop(t0_, real, 4);
    LoopResult ahead = ClosedLoop(t0_, real, 4, {}, /*idle=*/true);
    EXPECT_EQ(plain.stats.blocked, 0u);
    EXPECT_EQ(ahead.stats.blocked, 0u);
    ASSERT_FALSE(plain.decisions.empty());
    EXPECT_EQ(ahead.decisions, plain.decisions);
    EXPECT_EQ(ahead.end_ns, plain.end_ns);
    EXPECT_EQ(plain.stats.idle_steps, 0u);
    EXPECT_GT(plain.stats.decide_steps, 0u);
    EXPECT_GT(ahead.stats.idle_steps, 0u);
    std::printf("real rank %d: %zu decisions; virtual rank steps inside decisions %llu without Idle, %llu with "
                "(%llu in Idle)\n",
                real, plain.decisions.size(), static_cast<unsigned long long>(plain.stats.decide_steps),
                static_cast<unsigned long long>(ahead.stats.decide_steps),
                static_cast<unsigned long long>(ahead.stats.idle_steps));
    // Only the first decisions (before Idle ever ran: the anchor) advance virtual ranks inside a decision.
    EXPECT_LT(ahead.stats.decide_steps * 10, plain.stats.decide_steps);
  }
}

// Prereleases (ipc::OpPrerelease): before the real rank reaches an operation whose other members are all virtual,
// GraphRelease::Predict gives the latest virtual arrival and the duration; libprism releases at max(arrival, floor)
// + duration with no round trip. Every such rule must give the release Decide gives once the arrival comes, with and
// without the idle work ahead and with a virtual straggler, and asking must not change any decision.
TEST_F(GraphClosedLoop, EveryPredictedReleaseIsTheDecisionAndPredictingChangesNone) {
  for (int real : {0, 33}) {
    for (bool idle : {false, true}) {
      for (double f : {1.0, 1.14}) {
        SCOPED_TRACE("real rank " + std::to_string(real) + (idle ? " with Idle" : "") + " straggler x" +
                     std::to_string(f));
        ClosedLoopOptions o;
        o.reps = 4;
        o.idle = idle;
        if (f != 1.0) o.stragglers = {{real == 0 ? 32 : 1, f}};
        LoopResult plain = ClosedLoop(t0_, real, o);
        o.predict = true;
        LoopResult pred = ClosedLoop(t0_, real, o);
        ASSERT_TRUE(pred.error.empty()) << pred.error;
        ASSERT_FALSE(plain.decisions.empty());
        EXPECT_EQ(pred.decisions, plain.decisions);
        EXPECT_EQ(pred.end_ns, plain.end_ns);
        EXPECT_EQ(pred.mispredicted, 0u);
        // Most operations of a one-real-rank world have only virtual partners ahead of time: those blocked on the
        // real rank's own later operations are the exception.
        EXPECT_GT(pred.predicted * 2, pred.decisions.size());
        std::printf("real rank %d%s x%.2f: %llu of %zu decisions predicted\n", real, idle ? " idle" : "", f,
                    static_cast<unsigned long long>(pred.predicted), pred.decisions.size());
      }
    }
  }
}

// Replica symmetry (GraphRelease::SetReplicaSymmetry): the data-parallel replicas without a real rank or a straggler
// take part through one representative replica; every decision and the end are those of replaying every rank, with a
// virtual straggler too (its replica stays whole).
TEST_F(GraphClosedLoop, OneReplicaStandsForTheOthersWithoutChangingADecision) {
  for (int real : {0, 33}) {
    for (bool straggler : {false, true}) {
      SCOPED_TRACE("real rank " + std::to_string(real) + (straggler ? " with a straggler in replica 2" : ""));
      ClosedLoopOptions o;
      o.reps = 4;
      o.idle = true;
      if (straggler) o.stragglers = {{4, 1.14}};  // tp 0, dp 2, pp 0: replica 2
      o.symmetry = false;
      LoopResult every = ClosedLoop(t0_, real, o);
      o.symmetry = true;
      LoopResult one = ClosedLoop(t0_, real, o);
      ASSERT_TRUE(one.error.empty()) << one.error;
      EXPECT_EQ(every.aliased_ranks, 0);
      // 16 replicas of 4 ranks: the real rank's and the representative stay, so do the straggler's.
      EXPECT_EQ(one.aliased_ranks, straggler ? 52 : 56);
      ASSERT_FALSE(every.decisions.empty());
      EXPECT_EQ(one.decisions, every.decisions);
      EXPECT_EQ(one.end_ns, every.end_ns);
      EXPECT_LT(one.stats.idle_steps * 4, every.stats.idle_steps);
    }
  }
}

// The same on a synthetic graph of another shape (`prism-run synth`: the distributed optimizer's reduce-scatter and
// all-gather across replicas, per-layer tensor-parallel collectives, 1F1B over 4 stages).
TEST(GraphClosedLoopSynth, OneReplicaStandsForTheOthersWithoutChangingADecision) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("closed-loop-synth-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string g = (dir / "s.prism").string();
  test_util::CliRun b = test_util::RunPrism("synth -o " + g + " --tp 2 --pp 4 --dp 6 --iterations 2 --layers 4 "
                                            "--hidden 1024 --seq-len 1024 --tp-comm");
  if (b.rc == -1) GTEST_SKIP() << "PRISM_RUN not set";
  ASSERT_EQ(b.rc, 0) << b.out;
  trace::Trace t;
  std::string err;
  ASSERT_TRUE(replay::ReadTrace(g, &t, &err)) << err;
  for (int real : {0, 7}) {
    SCOPED_TRACE("real rank " + std::to_string(real));
    ClosedLoopOptions o;
    o.reps = 3;
    o.idle = true;
    o.symmetry = false;
    LoopResult every = ClosedLoop(t, real, o);
    o.symmetry = true;
    LoopResult one = ClosedLoop(t, real, o);
    EXPECT_EQ(one.aliased_ranks, 4 * 8);  // 6 replicas of 8 ranks: all but the real rank's and the representative
    ASSERT_FALSE(every.decisions.empty());
    EXPECT_EQ(one.decisions, every.decisions);
    EXPECT_EQ(one.end_ns, every.end_ns);
  }
  fs::remove_all(dir);
}

// Ahead of time, as the coordinator sends them (after each decision and the idle work), on the graph filled on the
// H200 (tests/data/graph/megatron_w64_fill): nearly every operation is prereleased before the rank arrives (on the
// GPU, 88 % were used: the rest came after a compute gap shorter than the coordinator's turn, or were a
// communicator's first operation); none differs from its decision; the decisions stay as they were.
TEST(GraphClosedLoopFilled, PrereleasesSentAheadAreKnownBeforeAlmostEveryArrival) {
  trace::Trace t;
  std::string err;
  ASSERT_TRUE(replay::ReadTrace(std::string(PRISM_SOURCE_DIR) + "/tests/data/graph/megatron_w64_fill/filled.prism",
                                &t, &err))
      << err;
  for (int real : {0, 32}) {
    SCOPED_TRACE("real rank " + std::to_string(real));
    ClosedLoopOptions o;
    o.reps = 4;
    o.idle = true;
    LoopResult plain = ClosedLoop(t, real, o);
    o.predict_ahead = true;
    LoopResult ahead = ClosedLoop(t, real, o);
    ASSERT_FALSE(plain.decisions.empty());
    EXPECT_EQ(ahead.decisions, plain.decisions);
    EXPECT_EQ(ahead.end_ns, plain.end_ns);
    EXPECT_EQ(ahead.mispredicted, 0u);
    EXPECT_EQ(ahead.prereleased + ahead.not_prereleased.size(), ahead.decisions.size());
    std::printf("real rank %d: %llu of %zu decisions prereleased before the arrival\n", real,
                static_cast<unsigned long long>(ahead.prereleased), ahead.decisions.size());
    for (const std::string& w : ahead.not_prereleased) std::printf("  not: %s\n", w.c_str());
    EXPECT_GT(ahead.prereleased * 100, ahead.decisions.size() * 95);
  }
}

}  // namespace
}  // namespace prism::coord
