// Synthetic Megatron-style graphs: structure (classes, communicators, bindings), the 1F1B order, interleaving,
// tensor/expert parallel collectives, and that every variant validates and replays to the end.
#include "replay/synth.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "replay/engine.h"
#include "replay/trace_io.h"
#include "replay/trace_validate.h"

namespace prism::replay {
namespace {

using trace::CollOp;
using trace::NodeKind;

trace::Trace Make(const SynthOptions& o) {
  trace::Trace t;
  std::string err;
  EXPECT_TRUE(Synthesize(o, &t, &err)) << err;
  return t;
}

SimResult Replay(const trace::Trace& t) {
  Topology topo;
  std::string err;
  EXPECT_TRUE(LoadTopology("h100-8x400g", &topo, &err));
  CostModel m;
  EXPECT_TRUE(m.Init(topo, {}, &err));
  return Simulate(t, m);
}

const trace::Stream* StreamNamed(const trace::RoleClass& c, const std::string& name) {
  for (const auto& s : c.streams) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// "F" / "B" per forward/backward compute node, in stream order.
std::string ComputeOrder(const trace::RoleClass& c) {
  std::string s;
  for (const auto& n : StreamNamed(c, "compute")->nodes) {
    if (n.kind != NodeKind::kCompute) continue;
    if (n.name.rfind("fwd", 0) == 0) s += 'F';
    if (n.name.rfind("bwd", 0) == 0) s += 'B';
  }
  return s;
}

TEST(Synth, LayoutClassesAndCommunicators) {
  SynthOptions o;
  o.tp = 2;
  o.pp = 4;
  o.dp = 3;
  o.microbatches = 8;
  trace::Trace t = Make(o);
  EXPECT_EQ(t.world_size, 24);
  EXPECT_EQ(t.classes.size(), 8u);  // one per (tp, pp) position: data-parallel deduplication
  // Pipeline groups: tp * dp = 6 of size 4; data-parallel groups: tp * pp = 8 of size 3; no tp comms by default.
  int pp = 0, dp = 0;
  for (const auto& c : t.comms) {
    if (c.desc == "PIPELINE_MODEL_PARALLEL") {
      ++pp;
      EXPECT_EQ(c.ranks.size(), 4u);
    } else if (c.desc == "DATA_PARALLEL") {
      ++dp;
      EXPECT_EQ(c.ranks.size(), 3u);
    } else {
      ADD_FAILURE() << "unexpected comm " << c.desc;
    }
  }
  EXPECT_EQ(pp, 6);
  EXPECT_EQ(dp, 8);
  // Rank = tp + 2 * (dp + 3 * pp) (order tp-cp-ep-dp-pp); class = pp * tp_size + tp.
  for (int r = 0; r < 24; ++r) {
    int ti = r % 2, si = r / 6;
    EXPECT_EQ(t.ranks[r].cls, static_cast<uint32_t>(si * 2 + ti)) << r;
    const auto& cls = t.classes[t.ranks[r].cls];
    for (size_t s = 0; s < cls.comm_slots.size(); ++s) {
      const auto& comm = t.comms[t.ranks[r].comms[s]];
      EXPECT_NE(std::find(comm.ranks.begin(), comm.ranks.end(), r), comm.ranks.end()) << r;
      if (cls.comm_slots[s] == "pp") {
        EXPECT_EQ(comm.ranks[si], r) << "pipeline comm lists stages in order";
      }
    }
  }
  std::vector<std::string> errors = ValidateTrace(t);
  EXPECT_TRUE(errors.empty()) << errors.front();
}

TEST(Synth, OneFOneBOrder) {
  SynthOptions o;
  o.pp = 4;
  o.microbatches = 6;
  trace::Trace t = Make(o);
  // Stage 0 warms up with pp-1 = 3 forwards; the last stage alternates from the start.
  EXPECT_EQ(ComputeOrder(t.classes[0]), "FFFFBFBFBBBB");
  EXPECT_EQ(ComputeOrder(t.classes[1]), "FFFBFBFBFBBB");
  EXPECT_EQ(ComputeOrder(t.classes[3]), "FBFBFBFBFBFB");
  // Stage 0 only sends activations and receives gradients; the last stage the reverse.
  EXPECT_EQ(StreamNamed(t.classes[0], "pp_recv_prev"), nullptr);
  EXPECT_EQ(StreamNamed(t.classes[0], "pp_send_next")->nodes.size(), 6u);
  EXPECT_EQ(StreamNamed(t.classes[0], "pp_recv_next")->nodes.size(), 6u);
  EXPECT_EQ(StreamNamed(t.classes[3], "pp_send_next"), nullptr);
  EXPECT_EQ(StreamNamed(t.classes[3], "pp_recv_prev")->nodes.size(), 6u);
}

TEST(Synth, PipelineTimeFollowsTheBubbleFormula) {
  SynthOptions o;
  o.pp = 4;
  o.microbatches = 8;
  o.fwd_us = 1000;
  o.bwd_us = 2000;
  o.optimizer_us = 0;
  o.act_bytes = 1024;  // messages of ~6 us: the bubble dominates
  trace::Trace t = Make(o);
  SimResult r = Replay(t);
  ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
  // (m + p - 1) * (f + b) plus the messages on the critical path.
  double ideal = (8 + 3) * 3000e-6;
  EXPECT_GT(r.iteration_time_s, ideal);
  EXPECT_LT(r.iteration_time_s, ideal * 1.01);
  // Real activations (32 MiB at 300 GB/s, ~118 us each) add about 2 (m + p - 1) transfers.
  o.act_bytes = 0;
  SimResult big = Replay(Make(o));
  EXPECT_GT(big.iteration_time_s, ideal + 2 * 11 * 100e-6);
  EXPECT_LT(big.iteration_time_s, ideal + 2 * 11 * 130e-6);
}

TEST(Synth, InterleavedScheduleRunsAndShrinksTheBubble) {
  for (int pp : {2, 4}) {
    for (int m : {pp, 2 * pp, 4 * pp}) {
      SynthOptions o;
      o.pp = pp;
      o.microbatches = m;
      o.layers = 8 * pp;
      o.optimizer_us = 0;
      SimResult plain = Replay(Make(o));
      o.vpp = 2;
      trace::Trace t = Make(o);
      std::vector<std::string> errors = ValidateTrace(t);
      ASSERT_TRUE(errors.empty()) << "pp=" << pp << " m=" << m << ": " << errors.front();
      SimResult inter = Replay(t);
      ASSERT_EQ(inter.status, SimResult::Status::kOk) << "pp=" << pp << " m=" << m << ": " << inter.error;
      EXPECT_LT(inter.iteration_time_s, plain.iteration_time_s) << "pp=" << pp << " m=" << m;
    }
  }
}

TEST(Synth, TensorAndExpertParallelCollectives) {
  SynthOptions o;
  o.tp = 2;
  o.pp = 2;
  o.dp = 4;
  o.ep = 2;
  o.layers = 4;
  o.microbatches = 2;
  o.tp_comm = true;
  trace::Trace t = Make(o);
  std::vector<std::string> errors = ValidateTrace(t);
  ASSERT_TRUE(errors.empty()) << errors.front();
  std::map<CollOp, int> ops;
  for (const auto& n : StreamNamed(t.classes[0], "compute")->nodes) {
    if (n.kind == NodeKind::kColl) ops[n.op]++;
  }
  // Per layer and microbatch: sequence parallel all-gather + reduce-scatter twice each way, two all-to-alls each
  // way; 2 layers per stage, 2 microbatches.
  EXPECT_EQ(ops[CollOp::kAllGather], 2 * 2 * 2 * 2);
  EXPECT_EQ(ops[CollOp::kReduceScatter], 2 * 2 * 2 * 2);
  EXPECT_EQ(ops[CollOp::kAllToAll], 2 * 2 * 2 * 2);
  std::set<std::string> descs;
  for (const auto& c : t.comms) descs.insert(c.desc);
  EXPECT_TRUE(descs.count("TENSOR_MODEL_PARALLEL"));
  EXPECT_TRUE(descs.count("EXPERT_MODEL_PARALLEL"));
  EXPECT_TRUE(descs.count("EXPERT_DATA_PARALLEL"));
  SimResult r = Replay(t);
  ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
  o.sequence_parallel = false;
  o.ep = 1;
  t = Make(o);
  int ar = 0;
  for (const auto& n : StreamNamed(t.classes[0], "compute")->nodes) ar += n.kind == NodeKind::kColl && n.op == CollOp::kAllReduce;
  EXPECT_EQ(ar, 2 * 2 * 2 * 2);
  EXPECT_EQ(Replay(t).status, SimResult::Status::kOk);
}

TEST(Synth, DataParallelGradientsOverlapTheLastBackward) {
  SynthOptions o;
  o.pp = 2;
  o.dp = 4;
  o.microbatches = 4;
  o.dp_buckets = 3;
  trace::Trace t = Make(o);
  const trace::Stream* dp = StreamNamed(t.classes[0], "dp");
  ASSERT_NE(dp, nullptr);
  int rs = 0, ag = 0;
  for (const auto& n : dp->nodes) {
    rs += n.op == CollOp::kReduceScatter;
    ag += n.op == CollOp::kAllGather;
    EXPECT_EQ(n.bytes % (4 * 2), 0u) << "divisible among the data-parallel ranks";
  }
  EXPECT_EQ(rs, 3);
  EXPECT_EQ(ag, 3);
  // The first bucket starts during the last backward (split in 3 parts), before it ends.
  const auto& compute = StreamNamed(t.classes[0], "compute")->nodes;
  uint32_t first_after = dp->nodes[0].after.at(0);
  auto it = std::find_if(compute.begin(), compute.end(), [&](const auto& n) { return n.id == first_after; });
  ASSERT_NE(it, compute.end());
  EXPECT_NE(it->name.find("part0"), std::string::npos) << it->name;
  SimResult with = Replay(t);
  o.overlap_grad_reduce = false;
  SimResult without = Replay(Make(o));
  ASSERT_EQ(with.status, SimResult::Status::kOk);
  EXPECT_LE(with.iteration_time_s, without.iteration_time_s);
  o.distributed_optimizer = false;
  t = Make(o);
  for (const auto& n : StreamNamed(t.classes[0], "dp")->nodes) EXPECT_EQ(n.op, CollOp::kAllReduce);
}

TEST(Synth, SeveralIterationsAreTagged) {
  SynthOptions o;
  o.pp = 2;
  o.dp = 2;
  o.microbatches = 2;
  o.iterations = 3;
  trace::Trace t = Make(o);
  SimResult r = Replay(t);
  ASSERT_EQ(r.status, SimResult::Status::kOk) << r.error;
  ASSERT_EQ(r.iteration_times_s.size(), 3u);
  // Steady state: the second and third iterations take the same time.
  EXPECT_NEAR(r.iteration_times_s[1], r.iteration_times_s[2], 1e-9);
}

TEST(Synth, BadOptionsNameTheOption) {
  struct Case {
    SynthOptions o;
    const char* expect;
  };
  std::vector<Case> cases(5);
  cases[0].o.tp = 0;
  cases[0].expect = "--tp";
  cases[1].o.dp = 6;
  cases[1].o.ep = 4;
  cases[1].expect = "--ep";
  cases[2].o.pp = 4;
  cases[2].o.vpp = 2;
  cases[2].o.microbatches = 6;
  cases[2].expect = "--microbatches";
  cases[3].o.pp = 3;
  cases[3].o.layers = 10;
  cases[3].expect = "--layers";
  cases[4].o.vpp = 2;
  cases[4].expect = "--vpp";
  for (const Case& c : cases) {
    trace::Trace t;
    std::string err;
    EXPECT_FALSE(Synthesize(c.o, &t, &err)) << c.expect;
    EXPECT_NE(err.find(c.expect), std::string::npos) << err;
  }
}

TEST(Synth, RoundTripsThroughBothFileFormats) {
  SynthOptions o;
  o.tp = 2;
  o.pp = 2;
  o.dp = 2;
  o.microbatches = 4;
  trace::Trace t = Make(o);
  SimResult want = Replay(t);
  for (const char* ext : {".prism", ".prism.json"}) {
    std::string path = testing::TempDir() + "/synth_roundtrip" + ext;
    std::string err;
    ASSERT_TRUE(WriteTrace(t, path, &err)) << err;
    trace::Trace back;
    ASSERT_TRUE(ReadTrace(path, &back, &err)) << err;
    SimResult got = Replay(back);
    EXPECT_DOUBLE_EQ(got.iteration_time_s, want.iteration_time_s) << ext;
    EXPECT_EQ(got.events, want.events) << ext;
    std::remove(path.c_str());
  }
}

}  // namespace
}  // namespace prism::replay
