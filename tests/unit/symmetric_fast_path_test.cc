// The symmetric fast path (src/replay/symmetric.h): on data-parallel symmetric graphs its result equals the full
// replay's field by field (synthesized tp/pp/dp/ep, vpp, dp-allreduce, several iterations, recorded durations
// with a what-if); graphs or what-ifs that break a condition are refused with a reason that names the cause,
// and then the full replay runs; and the real binary (via $PRISM_RUN) says which path ran.
#include "replay/symmetric.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "replay/engine.h"
#include "replay/synth.h"
#include "replay/trace_validate.h"

namespace prism::replay {
namespace {

using trace::CollOp;
using trace::NodeKind;

trace::Trace Make(const SynthOptions& o) {
  trace::Trace t;
  std::string err;
  EXPECT_TRUE(Synthesize(o, &t, &err)) << err;
  EXPECT_TRUE(ValidateTrace(t).empty());
  return t;
}

CostModel Model(const std::string& topology = "h100-8x400g", CostModelKind kind = CostModelKind::kInvalid,
                double bw_scale = 1.0) {
  Topology topo;
  std::string err;
  EXPECT_TRUE(LoadTopology(topology, &topo, &err)) << err;
  if (bw_scale != 1.0) ScaleNetworkBandwidth(&topo, bw_scale);
  CostModelOptions mo;
  mo.model = kind;
  CostModel m;
  EXPECT_TRUE(m.Init(topo, mo, &err)) << err;
  return m;
}

// Every field of the two results, exactly: the fast path computes the same sums in the same order.
void ExpectSameResult(const SimResult& full, const SimResult& fast) {
  ASSERT_EQ(full.status, fast.status) << fast.error;
  EXPECT_EQ(full.error, fast.error);
  EXPECT_EQ(full.makespan_s, fast.makespan_s);
  EXPECT_EQ(full.iteration_time_s, fast.iteration_time_s);
  EXPECT_EQ(full.iteration_ids, fast.iteration_ids);
  EXPECT_EQ(full.iteration_times_s, fast.iteration_times_s);
  EXPECT_EQ(full.events, fast.events);
  EXPECT_EQ(full.warnings, fast.warnings);
  ASSERT_EQ(full.ranks.size(), fast.ranks.size());
  for (size_t r = 0; r < full.ranks.size(); ++r) {
    const RankResult& a = full.ranks[r];
    const RankResult& b = fast.ranks[r];
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(a.rank, b.rank);
    EXPECT_EQ(a.iteration_time_s, b.iteration_time_s);
    EXPECT_EQ(a.iteration_times_s, b.iteration_times_s);
    EXPECT_EQ(a.end_s, b.end_s);
    EXPECT_EQ(a.compute_s, b.compute_s);
    EXPECT_EQ(a.wait_by_comm, b.wait_by_comm);
    ASSERT_EQ(a.waited_on.size(), b.waited_on.size());
    for (size_t i = 0; i < a.waited_on.size(); ++i) {
      EXPECT_EQ(a.waited_on[i].rank, b.waited_on[i].rank);
      EXPECT_EQ(a.waited_on[i].seconds, b.waited_on[i].seconds);
    }
    if (testing::Test::HasFailure()) return;  // one rank's differences are enough to read
  }
  ASSERT_EQ(full.comms.size(), fast.comms.size());
  for (size_t c = 0; c < full.comms.size(); ++c) {
    const CommResult& a = full.comms[c];
    const CommResult& b = fast.comms[c];
    SCOPED_TRACE("comm " + std::to_string(a.id) + " " + a.desc);
    EXPECT_EQ(a.id, b.id);
    EXPECT_EQ(a.desc, b.desc);
    EXPECT_EQ(a.nranks, b.nranks);
    EXPECT_EQ(a.nnodes, b.nnodes);
    EXPECT_EQ(a.calls, b.calls);
    EXPECT_EQ(a.bytes, b.bytes);
    EXPECT_EQ(a.time_s, b.time_s);
    EXPECT_EQ(a.wait_s, b.wait_s);
    EXPECT_EQ(a.algorithm, b.algorithm);
    EXPECT_EQ(a.algorithms, b.algorithms);
    if (testing::Test::HasFailure()) return;
  }
  const CriticalPath& a = full.critical_path;
  const CriticalPath& b = fast.critical_path;
  EXPECT_EQ(a.length_s, b.length_s);
  EXPECT_EQ(a.compute_s, b.compute_s);
  EXPECT_EQ(a.comm_s, b.comm_s);
  EXPECT_EQ(a.ranks, b.ranks);
  EXPECT_EQ(a.nodes, b.nodes);
  ASSERT_EQ(a.segments.size(), b.segments.size());
  for (size_t i = 0; i < a.segments.size(); ++i) {
    EXPECT_EQ(a.segments[i].rank, b.segments[i].rank);
    EXPECT_EQ(a.segments[i].stream, b.segments[i].stream);
    EXPECT_EQ(a.segments[i].first_node, b.segments[i].first_node);
    EXPECT_EQ(a.segments[i].last_node, b.segments[i].last_node);
    EXPECT_EQ(a.segments[i].start_s, b.segments[i].start_s);
    EXPECT_EQ(a.segments[i].end_s, b.segments[i].end_s);
  }
}

struct Both {
  SimResult full, fast;
  nlohmann::json full_trace, fast_trace;
};

// Replays the graph twice, without and with the fast path; traces of ranks spread over the replicas.
Both RunBoth(const trace::Trace& t, const CostModel& m, EngineOptions eo = {}) {
  Both b;
  std::vector<int32_t> traced = {0, t.world_size / 2 + 1, t.world_size - 1};
  eo.symmetric = false;
  Simulator full(t, m, eo);
  b.full = full.Run();
  b.full_trace = full.ChromeTrace(traced);
  eo.symmetric = true;
  Simulator fast(t, m, eo);
  b.fast = fast.Run();
  b.fast_trace = fast.ChromeTrace(traced);
  EXPECT_FALSE(b.full.symmetric);
  EXPECT_EQ(b.full.simulated_events, b.full.events);
  return b;
}

void ExpectFastAndEqual(const trace::Trace& t, const CostModel& m, EngineOptions eo = {}) {
  Both b = RunBoth(t, m, eo);
  ASSERT_EQ(b.full.status, SimResult::Status::kOk) << b.full.error;
  EXPECT_TRUE(b.fast.symmetric) << b.fast.symmetric_refused;
  EXPECT_EQ(b.fast.symmetric_refused, "");
  EXPECT_EQ(b.fast.replicas, t.layout.dp);
  EXPECT_EQ(b.fast.simulated_events * t.layout.dp, b.full.events);
  ExpectSameResult(b.full, b.fast);
  EXPECT_EQ(b.full_trace, b.fast_trace);
}

SynthOptions Layout(int tp, int pp, int dp, int mb) {
  SynthOptions o;
  o.tp = tp;
  o.pp = pp;
  o.dp = dp;
  o.microbatches = mb;
  o.layers = 4 * pp;
  return o;
}

TEST(SymmetricFastPath, EqualsTheFullReplayOnTpPpDp) {
  ExpectFastAndEqual(Make(Layout(2, 4, 4, 8)), Model());
  ExpectFastAndEqual(Make(Layout(8, 2, 4, 4)), Model());  // tp=8: every stage of a replica on its own node
  ExpectFastAndEqual(Make(Layout(1, 1, 8, 2)), Model());  // pure data parallelism: replicas of one rank
}

TEST(SymmetricFastPath, EqualsTheFullReplayWithEagerAndNcclSends) {
  // Pipeline sends completing without their receive (the graph's send_completion, or the option) fold too.
  trace::Trace t = Make(Layout(2, 4, 4, 8));
  t.send_completion = trace::SendCompletion::kEager;
  ExpectFastAndEqual(t, Model());
  EngineOptions eo;
  eo.send_completion = trace::SendCompletion::kNccl;
  ExpectFastAndEqual(t, Model(), eo);
}

TEST(SymmetricFastPath, EqualsTheFullReplayWithTensorParallelCollectives) {
  SynthOptions o = Layout(4, 2, 4, 4);
  o.tp_comm = true;
  ExpectFastAndEqual(Make(o), Model());
  o.sequence_parallel = false;
  ExpectFastAndEqual(Make(o), Model("h100-8x400g", CostModelKind::kAlphaBeta));
}

TEST(SymmetricFastPath, EqualsTheFullReplayWithExpertParallelism) {
  // Expert-parallel and expert-data-parallel groups span replicas at one position.
  SynthOptions o = Layout(2, 2, 8, 4);
  o.ep = 4;
  trace::Trace t = Make(o);
  bool has_ep = false;
  for (const auto& c : t.comms) has_ep = has_ep || c.desc == "EXPERT_MODEL_PARALLEL";
  ASSERT_TRUE(has_ep);
  ExpectFastAndEqual(t, Model());
}

TEST(SymmetricFastPath, EqualsTheFullReplayWithInterleavingAndAllReduce) {
  SynthOptions o = Layout(2, 4, 2, 8);
  o.vpp = 2;
  ExpectFastAndEqual(Make(o), Model());
  SynthOptions a = Layout(2, 2, 4, 4);
  a.distributed_optimizer = false;  // --dp-allreduce
  a.iterations = 3;
  ExpectFastAndEqual(Make(a), Model());
  a.overlap_grad_reduce = false;
  ExpectFastAndEqual(Make(a), Model());
}

TEST(SymmetricFastPath, EqualsTheFullReplayWithRecordedDurationsAndBandwidthWhatIf) {
  trace::Trace t = Make(Layout(2, 2, 4, 4));
  for (auto& c : t.classes) {
    for (auto& s : c.streams) {
      for (auto& n : s.nodes) {
        if (n.kind == NodeKind::kColl || n.kind == NodeKind::kSend || n.kind == NodeKind::kRecv) n.dur_us = 123.0;
      }
    }
  }
  CostModel base = Model();
  CostModel slow = Model("h100-8x400g", CostModelKind::kInvalid, 0.25);
  EngineOptions eo;
  eo.baseline_model = &base;  // recorded durations scaled by model(slow) / model(base)
  ExpectFastAndEqual(t, slow, eo);
}

TEST(SymmetricFastPath, AStragglerOnEveryReplicaOfAPositionKeepsItSymmetric) {
  trace::Trace t = Make(Layout(2, 2, 4, 4));
  ReplicaFold f;
  std::string why;
  ASSERT_TRUE(FoldReplicas(t, Model(), nullptr, {}, &f, &why)) << why;
  EngineOptions eo;
  for (int32_t d = 0; d < f.replicas; ++d) eo.compute_scale.emplace_back(f.rank_of[d * f.positions + 1], 1.5);
  ExpectFastAndEqual(t, Model(), eo);
}

TEST(SymmetricFastPath, FoldMapsRanksByLayout) {
  trace::Trace t = Make(Layout(2, 3, 4, 3));  // rank = tp + 2 (dp + 4 pp)
  ReplicaFold f;
  std::string why;
  ASSERT_TRUE(FoldReplicas(t, Model(), nullptr, {}, &f, &why)) << why;
  EXPECT_EQ(f.replicas, 4);
  EXPECT_EQ(f.positions, 6);
  EXPECT_EQ(f.replica.world_size, 6);
  // Replica 1, position (tp 1, stage 2): rank 1 + 2 (1 + 4 * 2).
  EXPECT_EQ(f.rank_of[1 * 6 + 5], 19);
  EXPECT_EQ(f.position_of[19], 5);
  EXPECT_EQ(f.replica_of[19], 1);
  // Positions are in rank order in every replica.
  for (int32_t d = 0; d < 4; ++d) {
    for (int32_t p = 1; p < 6; ++p) EXPECT_LT(f.rank_of[d * 6 + p - 1], f.rank_of[d * 6 + p]);
  }
  // Each DATA_PARALLEL group shrinks to its replica-0 member; its shape stays the whole group's.
  for (size_t k = 0; k < f.replica.comms.size(); ++k) {
    if (f.replica.comms[k].desc == "DATA_PARALLEL") {
      EXPECT_EQ(f.replica.comms[k].ranks.size(), 1u);
      EXPECT_EQ(f.placement_comm[k].size(), 4u);
    }
  }
}

// ---- Refusals: the reason names the cause, and the full replay's answer comes back. ----

void ExpectRefusedAndEqual(const trace::Trace& t, const CostModel& m, const std::string& reason, EngineOptions eo = {}) {
  Both b = RunBoth(t, m, eo);
  EXPECT_FALSE(b.fast.symmetric);
  EXPECT_NE(b.fast.symmetric_refused.find(reason), std::string::npos) << b.fast.symmetric_refused;
  EXPECT_EQ(b.fast.replicas, 1);
  ExpectSameResult(b.full, b.fast);
  EXPECT_EQ(b.full_trace, b.fast_trace);
}

TEST(SymmetricFastPath, RefusesAStragglerWhatIf) {
  trace::Trace t = Make(Layout(2, 2, 4, 4));
  EngineOptions eo;
  eo.compute_scale = {{5, 1.5}};
  ExpectRefusedAndEqual(t, Model(), "singles out rank 5", eo);
}

TEST(SymmetricFastPath, RefusesAReplicaRunningADifferentClass) {
  trace::Trace t = Make(Layout(2, 2, 4, 4));
  // Rank 6 (tp 0, replica 3, stage 0) gets a copy of its class with one longer compute.
  trace::RoleClass c = t.classes[t.ranks[6].cls];
  c.name += "-slow";
  for (auto& n : c.streams[0].nodes) {
    if (n.kind == NodeKind::kCompute) {
      n.dur_us *= 3;
      break;
    }
  }
  t.classes.push_back(c);
  t.ranks[6].cls = static_cast<uint32_t>(t.classes.size() - 1);
  ASSERT_TRUE(ValidateTrace(t).empty());
  ExpectRefusedAndEqual(t, Model(), "rank 6 (replica 3) runs class 'tp0-pp0-slow'");
  // The refusal mattered: the edited replica's ranks now differ from replica 0's.
  SimResult r = Simulate(t, Model());
  EXPECT_NE(r.ranks[6].compute_s, r.ranks[0].compute_s);
  EXPECT_NE(r.ranks[6].wait_by_comm, r.ranks[0].wait_by_comm);
}

TEST(SymmetricFastPath, RefusesAReplicaWhoseCommunicatorListsMembersInAnotherOrder) {
  SynthOptions o = Layout(4, 1, 2, 2);
  o.tp_comm = true;
  trace::Trace t = Make(o);
  // Replica 1's tensor-parallel group: ranks 4..7, listed with two members swapped.
  for (auto& c : t.comms) {
    if (c.desc == "TENSOR_MODEL_PARALLEL" && c.ranks.front() == 4) std::swap(c.ranks[1], c.ranks[2]);
  }
  ASSERT_TRUE(ValidateTrace(t).empty());
  ExpectRefusedAndEqual(t, Model(), "not counterparts");
}

TEST(SymmetricFastPath, RefusesPlacementThatDiffersBetweenReplicas) {
  // tp=2 dp=3 on 8-GPU nodes: replica 0's pipeline group sits on nodes {0, 0, 1}, replica 1's on {0, 1, 1}.
  trace::Trace t = Make(Layout(2, 3, 3, 4));
  ExpectRefusedAndEqual(t, Model(), "placement on nodes");
  // The refusal mattered: replica 1's stage-0 rank sends to another node, replica 0's does not.
  SimResult r = Simulate(t, Model());
  EXPECT_NE(r.ranks[0].wait_by_comm, r.ranks[2].wait_by_comm);
}

TEST(SymmetricFastPath, RefusesACommunicatorAcrossReplicasAndPositions) {
  trace::Trace t = Make(Layout(2, 2, 2, 2));
  // A world barrier at the end of every rank's compute stream.
  trace::Comm world;
  world.id = 1000;
  world.desc = "WORLD";
  for (int32_t r = 0; r < t.world_size; ++r) world.ranks.push_back(r);
  t.comms.push_back(world);
  for (auto& c : t.classes) {
    c.comm_slots.push_back("world");
    trace::Node n;
    n.kind = NodeKind::kColl;
    n.op = CollOp::kBarrier;
    n.comm_slot = static_cast<uint32_t>(c.comm_slots.size() - 1);
    n.dtype = trace::DType::kU8;
    n.id = 100000;
    c.streams[0].nodes.push_back(n);
  }
  for (auto& b : t.ranks) b.comms.push_back(1000);
  ASSERT_TRUE(ValidateTrace(t).empty());
  ExpectRefusedAndEqual(t, Model(), "comm 1000 (WORLD) spans replicas and joins ranks of different positions");
}

TEST(SymmetricFastPath, RefusesOneReplica) {
  ExpectRefusedAndEqual(Make(Layout(2, 2, 1, 2)), Model(), "one data-parallel replica");
}

TEST(SymmetricFastPath, AGraphThatCannotFinishGetsTheFullDiagnosis) {
  // Two replicas of a two-stage pipeline whose stages both receive first.
  trace::Trace t;
  t.world_size = 4;
  t.layout.pp = 2;
  t.layout.dp = 2;  // rank = dp + 2 pp
  for (int s = 0; s < 2; ++s) {
    trace::RoleClass c;
    c.name = "stage" + std::to_string(s);
    c.comm_slots = {"pp"};
    trace::Stream st;
    st.name = "pp";
    for (int i = 0; i < 2; ++i) {
      trace::Node n;
      n.id = i;
      n.kind = i == 0 ? NodeKind::kRecv : NodeKind::kSend;
      n.comm_slot = 0;
      n.peer = 1 - s;
      n.bytes = 1024;
      n.dtype = trace::DType::kBF16;
      st.nodes.push_back(n);
    }
    c.streams.push_back(st);
    t.classes.push_back(c);
  }
  t.comms = {{0, {0, 2}, "PIPELINE_MODEL_PARALLEL"}, {1, {1, 3}, "PIPELINE_MODEL_PARALLEL"}};
  t.ranks = {{0, {0}}, {0, {1}}, {1, {0}}, {1, {1}}};
  Both b = RunBoth(t, Model());
  EXPECT_EQ(b.full.status, SimResult::Status::kDeadlock);
  EXPECT_FALSE(b.fast.symmetric);
  EXPECT_NE(b.fast.symmetric_refused.find("replica 0 did not finish"), std::string::npos) << b.fast.symmetric_refused;
  EXPECT_EQ(b.fast.status, SimResult::Status::kDeadlock);
  EXPECT_EQ(b.fast.error, b.full.error);  // "... 4 of 4 ranks are stuck": every rank, not one replica's
  EXPECT_EQ(b.fast.wait_chain, b.full.wait_chain);
}

// ---- The real binary. ----

std::string Bin() {
  const char* p = std::getenv("PRISM_RUN");
  return p ? p : std::string(PRISM_BINARY_DIR) + "/bin/prism-run";
}

int RunCli(const std::string& args, std::string* out) {
  FILE* f = popen((Bin() + " " + args + " 2>&1").c_str(), "r");
  if (!f) return -1;
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

nlohmann::json Load(const std::filesystem::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f, nullptr, false);
}

TEST(SymmetricFastPathCli, SaysWhichPathRanAndGivesTheSameReport) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(testing::TempDir()) / ("prism_symmetric_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string g = (dir / "g.prism").string(), out;
  ASSERT_EQ(RunCli("synth --tp 2 --pp 4 --dp 4 --microbatches 8 --layers 8 -o " + g, &out), 0) << out;
  const std::string what_ifs = " --what-if bw-scale=0.5 --what-if straggler=3:2 --trace-ranks 0,9,31";
  ASSERT_EQ(RunCli("simulate " + g + " --out " + (dir / "fast").string() + what_ifs, &out), 0) << out;
  EXPECT_NE(out.find("replay           symmetric fast path: 4 identical data-parallel replicas: replica 0 (8 ranks)"),
            std::string::npos) << out;
  EXPECT_NE(out.find("standing for"), std::string::npos) << out;
  EXPECT_NE(out.find("full replay (fast path refused: a what-if singles out rank 3"), std::string::npos) << out;
  std::string full_out;
  ASSERT_EQ(RunCli("simulate " + g + " --no-symmetric --out " + (dir / "full").string() + what_ifs, &full_out), 0) << full_out;
  EXPECT_NE(full_out.find("replay           full: --no-symmetric"), std::string::npos) << full_out;
  ASSERT_EQ(RunCli("simulate " + g + " --full --quiet --out " + (dir / "full2").string(), &out), 0) << out;
  EXPECT_EQ(Load(dir / "full2" / "report.json")["replay"]["path"], "full");

  nlohmann::json a = Load(dir / "fast" / "report.json"), b = Load(dir / "full" / "report.json");
  ASSERT_FALSE(a.is_discarded());
  ASSERT_FALSE(b.is_discarded());
  EXPECT_EQ(a["replay"]["path"], "symmetric");
  EXPECT_EQ(a["replay"]["replicas"], 4);
  EXPECT_EQ(a["replay"]["ranks_replayed"], 8);
  EXPECT_EQ(b["replay"]["path"], "full");
  EXPECT_EQ(a["what_if"][0]["replay"]["path"], "symmetric");
  EXPECT_EQ(a["what_if"][1]["replay"]["path"], "full");
  // Everything but timings and the path itself is identical, what-ifs included.
  for (const char* k : {"wall_s", "simulate_s", "events_per_s", "load_s", "replay", "trace", "graph"}) {
    a.erase(k);
    b.erase(k);
  }
  for (auto* j : {&a, &b}) {
    for (auto& w : (*j)["what_if"]) w.erase("replay");
  }
  EXPECT_EQ(a, b);
  EXPECT_EQ(Load(dir / "fast" / "trace.json"), Load(dir / "full" / "trace.json"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace prism::replay
