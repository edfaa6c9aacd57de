// GraphRelease in closed loop: one rank of a real Megatron-LM graph (tests/data/graph/megatron_w64_collect, world 64,
// tp 2, pp 2) plays the real rank (its own compute durations, its streams in GPU-time order, every communication
// released by GraphRelease as the coordinator would), every other rank virtual. With exact durations the real rank
// must finish where the replay engine says it does (`prism-run simulate` of the same graph): the CPU form of fill's
// acceptance test (docs/fill.md), with no GPU and no timing noise.
#include "coordinator/graph_release.h"

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

constexpr int64_t kT0 = 1'000'000'000'000;  // graph time 0 on the "wall clock" (ns)

uint32_t IpcOp(const trace::Node& n) {
  if (n.kind == trace::NodeKind::kColl) return static_cast<uint32_t>(n.op);
  return 100 + static_cast<uint32_t>(n.kind);
}

struct LoopResult {
  int64_t end_ns = 0;                // when the real rank's last node finished, relative to kT0
  std::vector<int64_t> rep_end_ns;   // per repetition: when its last node finished, relative to kT0
  std::vector<uint64_t> decisions;   // every release GraphRelease decided, in order
  GraphRelease::Stats stats;
};

// The iteration repetitions start from (GraphRelease's rule): the second when the graph starts at iteration 0.
uint32_t SteadyIter(const trace::Trace& t) {
  std::set<uint32_t> iters;
  for (const auto& c : t.classes)
    for (const auto& s : c.streams)
      for (const auto& n : s.nodes) iters.insert(n.iter);
  if (iters.size() >= 2 && *iters.begin() == 0) return *std::next(iters.begin());
  return iters.empty() ? 0 : *iters.begin();
}

// Plays `real` through `reps` repetitions of its class against GraphRelease, as the live rank would: communication
// nodes take what GraphRelease decides; their per-communicator sequence is their issue order (node id order within
// the slot), as libprism counts them; repetitions after the first skip the set-up iteration (the job does not
// repeat it).
LoopResult ClosedLoop(const trace::Trace& t, int real, uint32_t reps,
                      const std::vector<std::pair<int32_t, double>>& stragglers = {}, bool idle = false) {
  GraphRelease gr(t, {real});
  std::string err;
  EXPECT_TRUE(gr.SetStragglers(stragglers, &err)) << err;
  const trace::RoleClass& rc = t.classes[t.ranks[real].cls];
  const uint32_t steady = SteadyIter(t);
  std::map<uint32_t, uint32_t> iter_of;
  std::map<uint32_t, std::vector<uint32_t>> slot_ids;
  for (const auto& s : rc.streams)
    for (const auto& n : s.nodes) {
      iter_of[n.id] = n.iter;
      if (n.kind != trace::NodeKind::kCompute) slot_ids[n.comm_slot].push_back(n.id);
    }
  std::map<uint32_t, uint64_t> seq_in_slot, slot_start;
  for (auto& [slot, ids] : slot_ids) {
    std::sort(ids.begin(), ids.end());
    uint64_t start = ids.size();
    for (size_t k = 0; k < ids.size(); ++k) {
      seq_in_slot[ids[k]] = k;
      if (start == ids.size() && iter_of[ids[k]] >= steady) start = k;
    }
    slot_start[slot] = start == ids.size() ? 0 : start;
  }
  // The coordinator's view of each communicator: members, and how many with the same members came before it.
  std::vector<CommView> views(rc.comm_slots.size());
  for (uint32_t s = 0; s < rc.comm_slots.size(); ++s) {
    const uint32_t cid = t.ranks[real].comms[s];
    for (size_t g = 0; g < t.comms.size(); ++g) {
      if (t.comms[g].id != cid) continue;
      views[s] = CommView{s + 1, "slot" + std::to_string(s), {t.comms[g].ranks.begin(), t.comms[g].ranks.end()}, {real}};
      std::vector<int32_t> mine = t.comms[g].ranks;
      std::sort(mine.begin(), mine.end());
      for (size_t o = 0; o < g; ++o) {
        std::vector<int32_t> other = t.comms[o].ranks;
        std::sort(other.begin(), other.end());
        if (other == mine) ++views[s].member_twin;
      }
    }
  }
  struct Cursor {
    uint32_t rep = 0, idx = 0, first_steady = 0;
    int64_t free = kT0;
  };
  std::vector<Cursor> cur(rc.streams.size());
  for (size_t s = 0; s < rc.streams.size(); ++s) {
    const auto& nodes = rc.streams[s].nodes;
    uint32_t k = 0;
    while (k < nodes.size() && nodes[k].iter < steady) ++k;
    cur[s].first_steady = k < nodes.size() ? k : 0;
  }
  std::map<std::pair<uint32_t, uint32_t>, int64_t> finish;  // (rep, node id) -> ns
  LoopResult out;
  out.rep_end_ns.assign(reps, 0);
  for (;;) {
    int best = -1;
    int64_t best_start = 0;
    for (size_t s = 0; s < rc.streams.size(); ++s) {
      const auto& nodes = rc.streams[s].nodes;
      if (nodes.empty() || cur[s].rep >= reps) continue;
      const trace::Node& n = nodes[cur[s].idx];
      int64_t start = cur[s].free;
      bool ready = true;
      for (uint32_t a : n.after) {
        if (cur[s].rep > 0 && iter_of[a] < steady) continue;
        auto it = finish.find({cur[s].rep, a});
        if (it == finish.end()) {
          ready = false;
          break;
        }
        start = std::max(start, it->second);
      }
      if (ready && (best < 0 || start < best_start)) {
        best = static_cast<int>(s);
        best_start = start;
      }
    }
    if (best < 0) break;
    Cursor& c = cur[static_cast<size_t>(best)];
    const auto& nodes = rc.streams[static_cast<size_t>(best)].nodes;
    const trace::Node& n = nodes[c.idx];
    int64_t end = best_start;
    if (n.kind == trace::NodeKind::kCompute) {
      end += static_cast<int64_t>(n.dur_us * 1000.0);
    } else {
      const uint64_t k = slot_ids[n.comm_slot].size(), start = slot_start[n.comm_slot];
      const uint64_t seq = c.rep == 0 ? seq_in_slot[n.id] : k + (c.rep - 1) * (k - start) + (seq_in_slot[n.id] - start);
      Arrival a{real, ipc::OpArrive{views[n.comm_slot].comm_id, IpcOp(n), seq, n.bytes,
                                    static_cast<uint64_t>(best_start), 0, n.peer, 0}};
      ReleaseDecision d = gr.Decide(views[n.comm_slot], seq, {&a, 1});
      end = std::max(best_start, static_cast<int64_t>(d.release_ns));
      out.decisions.push_back(d.release_ns);
      // The coordinator's event loop calls Idle while the real rank computes (here: until nothing is left).
      if (idle)
        while (gr.Idle(1'000'000'000)) {
        }
    }
    finish[{c.rep, n.id}] = end;
    if (std::getenv("CLOSED_LOOP_DEBUG"))
      std::printf("LOOP %d rep %u node %u %s start %.3f end %.3f\n", best, c.rep, n.id,
                  std::string(trace::ToString(n.kind)).c_str(), (best_start - kT0) / 1e6, (end - kT0) / 1e6);
    out.rep_end_ns[c.rep] = std::max(out.rep_end_ns[c.rep], end - kT0);
    out.end_ns = std::max(out.end_ns, end - kT0);
    c.free = end;
    if (++c.idx == nodes.size()) {
      c.idx = c.first_steady;
      ++c.rep;
    }
  }
  out.stats = gr.stats();
  return out;
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
// made without it, and the decisions after the first repetition must find the virtual ranks already there (before
// Idle, the decision at each repetition's start advanced every virtual rank through a whole repetition: 17-25 ms per
// decision on the 4-stage Megatron graph of the 2026-11-30 GPU run, counted by the graph builder as compute).
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

}  // namespace
}  // namespace prism::coord
