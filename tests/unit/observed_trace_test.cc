// The observed PrismTrace built from real ranks' event files (src/analysis/observed_trace.h): synthetic event
// files of a tp=2 pp=2 Megatron-style job (tensor-parallel broadcast and all-reduces, pipeline send/recv between
// the stages, a data-parallel all-reduce, iteration marks), world 8 and 64; classes, bindings, compute gaps,
// iterations, fused units, every refusal; and `prism-run graph build` + `prism-run simulate` on the result.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <sys/wait.h>
#include <tuple>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/world.h"
#include "analysis/observed_trace.h"
#include "prism/report.h"
#include "replay/trace_io.h"
#include "replay/trace_validate.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using prism::analysis::BuildObservedTrace;
using prism::analysis::ObservedTrace;
using prism::analysis::ObservedTraceOptions;
using prism::analysis::RankEventLog;
using prism::trace::NodeKind;

constexpr int64_t kBase = 1700000000000000000;  // Unix-epoch ns, as the GPU's %globaltimer gives
constexpr int64_t kUs = 1000;

// What the synthetic job looks like.
struct JobOptions {
  int world = 8;
  int iterations = 3;
  bool stream_field = true;   // op lines carry "stream"
  bool root_field = true;     // broadcasts carry "root"
  bool members = true;        // comm lines list their members (else null: resolved from the description)
  int fused = 0;              // 0: stage 0's send act / recv grad are two units; 1: one fused unit, no
                              // detail; 2: one fused unit with "ops"
  uint64_t act_bytes = 4 << 20;
  uint64_t grad_bytes = 4 << 20;
  bool waits = false;         // op lines carry "sseq"; stage 1's compute stream waits for its activation receive
  bool passthrough = false;   // op lines carry "passthrough":1 (prism-run record)
  int64_t skew_us = 0;        // odd tensor-parallel ranks run this much later
  bool recv_first = false;    // stage 1 receives its activations before the iteration's broadcast (which waits for it)
  int64_t tp_late_us = 0;     // tensor-parallel all-reduces' gates open this much after their release (the stream
                              // runs on from there: the coordinator's decision came late)
  bool opened_field = false;  // op lines carry "opened_ns"
  bool pp_allreduce = false;  // each iteration ends with an all-reduce on the pipeline group, on the main stream
                              // (Megatron's loss and grad-norm reductions), beside its sends on the pipeline stream
};

// Measured durations of the synthetic timeline (microseconds).
constexpr int64_t kBcastUs = 10, kFwdUs = 1000, kTpUs = 100, kSendUs = 200, kRecvGradUs = 1500, kBwdUs = 2000,
                  kDpUs = 800, kOptUs = 500;

class RankWriter {
 public:
  RankWriter(int rank, const JobOptions& o) : rank_(rank), o_(o) {
    lines_.push_back(json{{"type", "hello"}, {"v", 1}, {"rank", rank}, {"world_size", o.world}, {"pid", 100 + rank},
                          {"host", "h"}, {"gpu", 0}, {"t_ns", kBase}}
                         .dump());
  }
  void Comm(int id, const std::string& desc, const std::vector<int>& members, int my_rank) {
    json j = {{"type", "comm"}, {"comm_id", id},      {"key", "key" + std::to_string(id)}, {"desc", desc},
              {"name", ""},     {"nranks", members.size()}, {"rank", my_rank}};
    j["members"] = o_.members ? json(members) : json(nullptr);
    lines_.push_back(j.dump());
  }
  // One unit on `stream` taking `dur_us` from the cursor.
  json Op(int comm, const std::string& op, const std::string& dtype, uint64_t bytes, int peer, int stream,
          int64_t dur_us, int nops = 1) {
    json j = {{"type", "op"},      {"comm_id", comm}, {"seq", seq_[comm]}, {"op", op},
              {"dtype", dtype},    {"bytes", bytes},  {"peer", peer},       {"arrival_ns", t_},
              {"release_ns", t_ + dur_us * kUs}, {"model_dur_ns", dur_us * kUs}, {"wait_on_rank", -1},
              {"nops", nops}};
    if (o_.stream_field) j["stream"] = stream;
    if (o_.waits) j["sseq"] = sseq_[stream]++;
    if (o_.passthrough) j["passthrough"] = 1;
    const int64_t late = comm == 0 && op == "allreduce" ? o_.tp_late_us * kUs : 0;
    if (o_.opened_field) j["opened_ns"] = t_ + dur_us * kUs + late;
    seq_[comm] += nops;
    t_ += dur_us * kUs + late;
    return j;
  }
  void Emit(const json& j) { lines_.push_back(j.dump()); }
  void Compute(int64_t us) { t_ += us * kUs; }
  void Mark(int it) {
    lines_.push_back(json{{"type", "iter"}, {"iteration", it}, {"t_ns", t_}, {"dur_ns", 0}, {"peak_bytes", 1}}.dump());
  }
  void Raw(const std::string& line) { lines_.push_back(line); }
  int64_t now() const { return t_; }
  int64_t next_sseq(int stream) { return sseq_[stream]; }
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  int rank_;
  JobOptions o_;
  std::vector<std::string> lines_;
  std::map<int, int64_t> seq_;
  std::map<int, int64_t> sseq_;
  int64_t t_ = kBase + 5000 * kUs;
};

// Megatron's default order tp-cp-ep-dp-pp: rank = tp + 2 * (dp + D * pp).
RankWriter MakeRank(int rank, const JobOptions& o) {
  const int d_size = o.world / 4;
  const int tp = rank % 2, dp = (rank / 2) % d_size, pp = rank / (2 * d_size);
  RankWriter w(rank, o);
  if (tp == 1) w.Compute(o.skew_us);
  const int base = pp * 2 * d_size + dp * 2;
  w.Comm(0, "TENSOR_MODEL_PARALLEL_GROUP", {base, base + 1}, tp);
  w.Comm(1, "PIPELINE_MODEL_PARALLEL_GROUP", {tp + 2 * dp, tp + 2 * dp + 2 * d_size}, pp);
  std::vector<int> dp_members;
  for (int j = 0; j < d_size; ++j) dp_members.push_back(tp + 2 * j + 2 * d_size * pp);
  w.Comm(2, "DATA_PARALLEL_GROUP", dp_members, dp);
  for (int it = 0; it < o.iterations; ++it) {
    if (pp == 1 && o.recv_first) {
      json r = w.Op(1, "recv", "bf16", o.act_bytes, 0, 1, kSendUs);
      w.Emit(r);
      if (o.waits) w.Emit(json{{"type", "wait"}, {"stream", 0}, {"next", w.next_sseq(0)}, {"on", 1}, {"after", r["sseq"]}});
    }
    json b = w.Op(0, "broadcast", "i64", 64, -1, 0, kBcastUs);
    if (o.root_field) b["root"] = 0;
    w.Emit(b);
    if (pp == 1 && !o.recv_first) {
      if (o.waits && it > 0) {  // torch's NCCL stream waits for the compute stream's point before the receive
        w.Emit(json{{"type", "wait"}, {"stream", 1}, {"next", w.next_sseq(1)}, {"on", 0}, {"after", b["sseq"]}});
      }
      json r = w.Op(1, "recv", "bf16", o.act_bytes, 0, 1, kSendUs);
      w.Emit(r);
      if (o.waits) {  // torch's work.wait(): the compute stream waits for the receive before the forward
        w.Emit(json{{"type", "wait"}, {"stream", 0}, {"next", w.next_sseq(0)}, {"on", 1}, {"after", r["sseq"]}});
      }
    }
    w.Compute(kFwdUs);
    w.Emit(w.Op(0, "allreduce", "bf16", 1 << 20, -1, 0, kTpUs));
    w.Compute(kFwdUs);
    if (pp == 0) {
      if (o.fused == 0) {
        w.Emit(w.Op(1, "send", "bf16", o.act_bytes, 1, 1, kSendUs));
        w.Emit(w.Op(1, "recv", "bf16", o.grad_bytes, 1, 1, kRecvGradUs));
      } else {
        json f = w.Op(1, "group", "bf16", o.act_bytes + o.grad_bytes, -1, 1, kSendUs + kRecvGradUs, 2);
        if (o.fused == 2) {
          int64_t s = f["seq"].get<int64_t>();
          f["ops"] = json::array({{{"op", "send"}, {"peer", 1}, {"bytes", o.act_bytes}, {"dtype", "bf16"},
                                   {"comm_id", 1}, {"seq", s}},
                                  {{"op", "recv"}, {"peer", 1}, {"bytes", o.grad_bytes}, {"dtype", "bf16"},
                                   {"comm_id", 1}, {"seq", s + 1}}});
        }
        w.Emit(f);
      }
    }
    w.Compute(kBwdUs);
    w.Emit(w.Op(0, "allreduce", "bf16", 1 << 20, -1, 0, kTpUs));
    if (pp == 1) w.Emit(w.Op(1, "send", "bf16", o.grad_bytes, 0, 1, kSendUs));
    w.Emit(w.Op(2, "allreduce", "f32", 8 << 20, -1, 2, kDpUs));
    if (o.pp_allreduce) w.Emit(w.Op(1, "allreduce", "f32", 8, -1, 0, kBcastUs));
    w.Compute(kOptUs);
    w.Mark(it);
  }
  return w;
}

std::vector<int> ReplicaZero(int world) { return {0, 1, world / 2, world / 2 + 1}; }

std::vector<RankEventLog> Logs(const JobOptions& o, const std::vector<int>& ranks) {
  std::vector<RankEventLog> logs;
  for (int r : ranks) {
    RankWriter w = MakeRank(r, o);
    RankEventLog log;
    log.rank = r;
    int64_t n = 0;
    for (const std::string& l : w.lines()) prism::analysis::FeedEventLine(&log, l, ++n);
    logs.push_back(std::move(log));
  }
  return logs;
}

prism::world::World MakeWorld(int world) {
  std::string err;
  auto l = prism::world::ParseLayout("tp=2,pp=2", &err);
  EXPECT_TRUE(l) << err;
  EXPECT_TRUE(prism::world::ResolveLayout(&*l, world, "test", &err)) << err;
  auto w = prism::world::World::Make(*l, 8, &err);
  EXPECT_TRUE(w) << err;
  return *w;
}

std::optional<ObservedTrace> Build(const JobOptions& o, const std::vector<int>& ranks, std::string* err,
                                   ObservedTraceOptions opts = {}) {
  prism::world::World w = MakeWorld(o.world);
  return BuildObservedTrace(Logs(o, ranks), w, opts, err);
}

const prism::trace::Comm& BoundComm(const prism::trace::Trace& t, int rank, const std::string& slot) {
  const auto& b = t.ranks[rank];
  const auto& cls = t.classes[b.cls];
  for (size_t s = 0; s < cls.comm_slots.size(); ++s)
    if (cls.comm_slots[s] == slot) return t.comms[b.comms[s]];
  ADD_FAILURE() << "rank " << rank << " has no slot " << slot;
  static prism::trace::Comm none;
  return none;
}

const prism::trace::Stream* StreamNamed(const prism::trace::RoleClass& c, const std::string& name) {
  for (const auto& s : c.streams)
    if (s.name == name) return &s;
  return nullptr;
}

bool HasWarning(const ObservedTrace& g, const std::string& part) {
  for (const std::string& w : g.warnings)
    if (w.find(part) != std::string::npos) return true;
  return false;
}

TEST(ObservedTrace, World8Tp2Pp2ClassesBindingsAndNodes) {
  JobOptions o;
  std::string err;
  ObservedTraceOptions opts;
  opts.skip_iterations = 1;
  auto g = Build(o, ReplicaZero(8), &err, opts);
  ASSERT_TRUE(g) << err;
  const prism::trace::Trace& t = g->trace;
  EXPECT_TRUE(prism::replay::ValidateTrace(t).empty());
  EXPECT_EQ(t.world_size, 8);
  EXPECT_EQ(t.layout.tp, 2);
  EXPECT_EQ(t.layout.pp, 2);
  EXPECT_EQ(t.layout.dp, 2);
  ASSERT_EQ(t.classes.size(), 4u);
  EXPECT_EQ(g->class_ranks, (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(t.classes[0].name, "tp0-pp0");
  EXPECT_EQ(t.classes[3].name, "tp1-pp1");
  // Data-parallel replicas share a class; their communicators are their own groups.
  ASSERT_EQ(t.ranks.size(), 8u);
  EXPECT_EQ(t.ranks[2].cls, t.ranks[0].cls);
  EXPECT_EQ(t.ranks[7].cls, t.ranks[5].cls);
  EXPECT_NE(t.ranks[1].cls, t.ranks[0].cls);
  EXPECT_EQ(t.classes[0].comm_slots, (std::vector<std::string>{"tp", "pp", "dp"}));
  EXPECT_EQ(BoundComm(t, 2, "tp").ranks, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(BoundComm(t, 2, "pp").ranks, (std::vector<int32_t>{2, 6}));
  EXPECT_EQ(BoundComm(t, 2, "dp").ranks, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(BoundComm(t, 7, "pp").ranks, (std::vector<int32_t>{3, 7}));
  EXPECT_EQ(BoundComm(t, 2, "tp").desc, "TENSOR_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(t.comms.size(), 4u + 4u + 4u);  // tp, pp and dp groups, 4 each
  EXPECT_EQ(g->first_iteration, 1);
  EXPECT_EQ(g->last_iteration, 2);
  EXPECT_GT(g->dropped_ops, 0u);  // iteration 0

  // Stage 0's tensor-parallel stream: iteration 1 begins at mark 0: fwd, allreduce, fwd + send + recv + bwd,
  // allreduce, dp allreduce + optimizer up to mark 1.
  const prism::trace::Stream* s0 = StreamNamed(t.classes[0], "stream0");
  ASSERT_NE(s0, nullptr);
  ASSERT_GE(s0->nodes.size(), 7u);
  const auto& n = s0->nodes;
  EXPECT_EQ(n[0].kind, NodeKind::kColl);  // the broadcast arrives exactly at mark 0: no gap
  EXPECT_EQ(n[0].op, prism::trace::CollOp::kBroadcast);
  EXPECT_EQ(n[0].root, 0);
  EXPECT_EQ(n[0].iter, 1u);
  EXPECT_EQ(n[1].kind, NodeKind::kCompute);
  EXPECT_DOUBLE_EQ(n[1].dur_us, kFwdUs);
  EXPECT_EQ(n[2].op, prism::trace::CollOp::kAllReduce);
  EXPECT_EQ(n[2].bytes, 1u << 20);
  EXPECT_EQ(n[2].dtype, prism::trace::DType::kBF16);
  EXPECT_LT(n[2].dur_us, 0);  // communication: left to the cost model
  EXPECT_EQ(n[3].kind, NodeKind::kCompute);
  EXPECT_DOUBLE_EQ(n[3].dur_us, kFwdUs + kSendUs + kRecvGradUs + kBwdUs);
  EXPECT_EQ(n[5].kind, NodeKind::kCompute);
  EXPECT_DOUBLE_EQ(n[5].dur_us, kDpUs + kOptUs);  // up to the end of iteration 1
  EXPECT_EQ(n[5].iter, 1u);
  EXPECT_EQ(n[6].iter, 2u);
  // Pipeline stream of stage 0: send to stage 1 then receive from it, in communicator ranks.
  const prism::trace::Stream* s1 = StreamNamed(t.classes[0], "stream1");
  ASSERT_NE(s1, nullptr);
  int sends = 0, recvs = 0;
  for (const auto& x : s1->nodes) {
    if (x.kind == NodeKind::kSend) ++sends;
    if (x.kind == NodeKind::kRecv) ++recvs;
    if (x.kind != NodeKind::kCompute) {
      EXPECT_EQ(x.peer, 1);
    }
  }
  EXPECT_EQ(sends, 2);
  EXPECT_EQ(recvs, 2);
  EXPECT_EQ(t.classes[0].streams.size(), 3u);
}

TEST(ObservedTrace, World64CoversEveryRankFromOneReplica) {
  JobOptions o;
  o.world = 64;
  std::string err;
  auto g = Build(o, ReplicaZero(64), &err);
  ASSERT_TRUE(g) << err;
  const prism::trace::Trace& t = g->trace;
  EXPECT_EQ(t.world_size, 64);
  EXPECT_EQ(t.layout.dp, 16);
  ASSERT_EQ(t.classes.size(), 4u);
  EXPECT_EQ(t.ranks[63].cls, t.ranks[33].cls);
  EXPECT_EQ(t.ranks[30].cls, t.ranks[0].cls);
  EXPECT_EQ(t.comms.size(), 32u + 32u + 4u);
  EXPECT_EQ(BoundComm(t, 63, "pp").ranks, (std::vector<int32_t>{31, 63}));
  EXPECT_EQ(BoundComm(t, 63, "dp").ranks.size(), 16u);
  EXPECT_EQ(BoundComm(t, 63, "dp").ranks.front(), 33);
  EXPECT_EQ(g->first_iteration, 0);
  EXPECT_EQ(g->last_iteration, 2);
  EXPECT_EQ(g->dropped_ops, 0u);
  EXPECT_TRUE(prism::replay::ValidateTrace(t).empty());
}

TEST(ObservedTrace, MissingClassesNameTheirCoordinates) {
  JobOptions o;
  std::string err;
  EXPECT_FALSE(Build(o, {0, 1}, &err));
  EXPECT_NE(err.find("do not cover every class"), std::string::npos) << err;
  EXPECT_NE(err.find("tp=0 pp=1 (ranks 4, 6)"), std::string::npos) << err;
  EXPECT_NE(err.find("tp=1 pp=1"), std::string::npos) << err;
  EXPECT_EQ(err.find("tp=0 pp=0"), std::string::npos) << err;
  EXPECT_NE(err.find("Real ranks with events: 0, 1"), std::string::npos) << err;
}

TEST(ObservedTrace, ExtraReplicaRanksAreNotUsed) {
  JobOptions o;
  std::string err;
  auto g = Build(o, {0, 1, 2, 4, 5}, &err);
  ASSERT_TRUE(g) << err;
  EXPECT_EQ(g->unused_ranks, std::vector<int>{2});
  EXPECT_TRUE(HasWarning(*g, "ranks 2 share their class"));
}

TEST(ObservedTrace, WithoutStreamFieldOneStreamOrOnePerCommunicator) {
  JobOptions o;
  o.stream_field = false;
  std::string err;
  auto one = Build(o, ReplicaZero(8), &err);
  ASSERT_TRUE(one) << err;
  for (const auto& c : one->trace.classes) {
    ASSERT_EQ(c.streams.size(), 1u);
    EXPECT_EQ(c.streams[0].name, "stream");
  }
  ObservedTraceOptions per;
  per.stream_fallback = prism::analysis::StreamFallback::kPerComm;
  auto pc = Build(o, ReplicaZero(8), &err, per);
  ASSERT_TRUE(pc) << err;
  std::vector<std::string> names;
  for (const auto& s : pc->trace.classes[0].streams) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"tp", "pp", "dp"}));
}

// A pipeline group's sends and receives on the pipeline stream and its all-reduces on the main stream: the slot's
// node ids follow the communicator's sequence (GraphRelease and the replay map the rank's n-th operation on a
// communicator to the slot's n-th node by id). Found on the H200: in the MoE default run the pipeline slot held its
// all-reduces first by id, so every send and receive of a real rank matched the wrong node.
TEST(ObservedTrace, ASlotOnSeveralStreamsIsNumberedInCommunicatorOrderPointToPointIncluded) {
  JobOptions o;
  o.pp_allreduce = true;
  std::string err;
  auto g = Build(o, ReplicaZero(8), &err);
  ASSERT_TRUE(g) << err;
  for (int rank : {0, 4}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto& cls = g->trace.classes[g->trace.ranks[rank].cls];
    const auto slot = std::find(cls.comm_slots.begin(), cls.comm_slots.end(), "pp") - cls.comm_slots.begin();
    ASSERT_LT(static_cast<size_t>(slot), cls.comm_slots.size());
    std::vector<std::pair<uint32_t, std::string>> nodes;  // (id, name "seq N")
    std::set<size_t> streams;
    for (size_t si = 0; si < cls.streams.size(); ++si)
      for (const auto& n : cls.streams[si].nodes)
        if (n.kind != NodeKind::kCompute && n.comm_slot == static_cast<uint32_t>(slot)) {
          nodes.emplace_back(n.id, n.name);
          streams.insert(si);
        }
    EXPECT_EQ(streams.size(), 2u);
    std::sort(nodes.begin(), nodes.end());
    ASSERT_EQ(nodes.size(), 9u);  // per iteration: send and receive (or receive and send) and the all-reduce
    for (size_t k = 0; k < nodes.size(); ++k) EXPECT_EQ(nodes[k].second, "seq " + std::to_string(k)) << k;
  }
  std::vector<std::string> problems = prism::replay::ValidateTrace(g->trace);
  EXPECT_TRUE(problems.empty()) << problems.front();
}

// "wait" lines (cudaStreamWaitEvent on another stream's unit) become `after` edges, and the time the stream waited
// leaves the compute node: stage 1's forward gap on the compute stream is 1000 us of compute after a 200 us receive
// on the pipeline stream, not 1200 us of compute.
TEST(ObservedTrace, CrossStreamWaitsBecomeEdgesAndLeaveCompute) {
  for (bool waits : {false, true}) {
    SCOPED_TRACE(waits ? "with wait lines" : "without");
    JobOptions o;
    o.waits = waits;
    std::string err;
    auto g = Build(o, ReplicaZero(8), &err);
    ASSERT_TRUE(g) << err;
    const auto& cls = g->trace.classes[g->trace.ranks[4].cls];
    const prism::trace::Stream* main = StreamNamed(cls, "stream0");
    const prism::trace::Stream* pp = StreamNamed(cls, "stream1");
    ASSERT_TRUE(main && pp);
    // The first receive on the pipeline stream, and the compute node before the first tensor-parallel all-reduce.
    uint32_t recv = UINT32_MAX;
    for (const auto& n : pp->nodes)
      if (n.kind == NodeKind::kRecv && recv == UINT32_MAX) recv = n.id;
    const prism::trace::Node* gap = nullptr;
    for (size_t i = 1; i < main->nodes.size(); ++i) {
      if (main->nodes[i].kind == NodeKind::kColl && main->nodes[i].op == prism::trace::CollOp::kAllReduce) {
        gap = &main->nodes[i - 1];
        break;
      }
    }
    ASSERT_NE(gap, nullptr);
    ASSERT_EQ(gap->kind, NodeKind::kCompute);
    const bool has_edge = std::find(gap->after.begin(), gap->after.end(), recv) != gap->after.end();
    EXPECT_EQ(has_edge, waits);
    EXPECT_DOUBLE_EQ(gap->dur_us, waits ? kFwdUs : kFwdUs + kSendUs);
    EXPECT_EQ(g->wait_edges > 0, waits);
    std::vector<std::string> problems = prism::replay::ValidateTrace(g->trace);
    EXPECT_TRUE(problems.empty()) << problems.front();
  }
}

// A side stream's gap from its last unit of one iteration to its first of the next crosses the iteration mark: the
// builder cuts it there into two compute nodes (the data-parallel all-reduce and optimizer step before the mark, the
// broadcast after it). Stage 1's pipeline stream waits for the broadcast before its receive, so neither piece is
// compute of that stream; before, only the piece after the mark lost the wait and 1.3 ms per iteration were replayed
// as the pipeline stream's compute (the medium fill's 2.5 s iterations, docs/fill.md).
TEST(ObservedTrace, AWaitEmptiesEveryPieceOfAGapThatCrossesAnIterationMark) {
  for (bool waits : {false, true}) {
    SCOPED_TRACE(waits ? "with wait lines" : "without");
    JobOptions o;
    o.waits = waits;
    std::string err;
    auto g = Build(o, ReplicaZero(8), &err);
    ASSERT_TRUE(g) << err;
    const auto& cls = g->trace.classes[g->trace.ranks[4].cls];
    const prism::trace::Stream* pp = StreamNamed(cls, "stream1");
    ASSERT_NE(pp, nullptr);
    // Compute between the send of iteration 0 and the receive of iteration 1.
    double gap_us = 0;
    int pieces = 0;
    bool after_send = false;
    for (const auto& n : pp->nodes) {
      if (n.kind == NodeKind::kSend) after_send = true;
      if (n.kind == NodeKind::kRecv && after_send) break;
      if (after_send && n.kind == NodeKind::kCompute) {
        gap_us += n.dur_us;
        ++pieces;
      }
    }
    EXPECT_EQ(pieces, 2);
    EXPECT_DOUBLE_EQ(gap_us, waits ? 0.0 : double(kDpUs + kOptUs + kBcastUs));
    std::vector<std::string> problems = prism::replay::ValidateTrace(g->trace);
    EXPECT_TRUE(problems.empty()) << problems.front();
  }
}

// The stream the iteration mark is stamped on (the iter line's "stream"; 0 in these files, which do not say) did the
// work before its mark in order: a wait that ended after the mark (stage 1's broadcast waits for the activation
// receive that now opens the iteration) empties only the piece after the mark. The piece before it (the end of the
// backward pass, the send, the data-parallel all-reduce and the optimizer step as this stream saw them) stays.
TEST(ObservedTrace, AWaitAfterTheStreamsOwnMarkKeepsTheWorkBeforeIt) {
  JobOptions o;
  o.waits = true;
  o.recv_first = true;
  std::string err;
  auto g = Build(o, ReplicaZero(8), &err);
  ASSERT_TRUE(g) << err;
  const auto& cls = g->trace.classes[g->trace.ranks[4].cls];
  const prism::trace::Stream* main = StreamNamed(cls, "stream0");
  ASSERT_NE(main, nullptr);
  // The compute nodes between iteration 0's last tensor-parallel all-reduce and iteration 1's broadcast.
  std::vector<const prism::trace::Node*> gap;
  int allreduces = 0;
  for (const auto& n : main->nodes) {
    if (n.kind == NodeKind::kColl && n.op == prism::trace::CollOp::kAllReduce) ++allreduces;
    if (allreduces < 2) continue;
    if (n.kind == NodeKind::kColl && n.op == prism::trace::CollOp::kBroadcast) {
      // The broadcast itself waits for the receive (its gap after the mark is empty).
      EXPECT_FALSE(n.after.empty());
      break;
    }
    if (n.kind == NodeKind::kCompute) gap.push_back(&n);
  }
  ASSERT_EQ(gap.size(), 2u);
  EXPECT_DOUBLE_EQ(gap[0]->dur_us, double(kSendUs + kDpUs + kOptUs)) << "the work before the stream's own mark";
  EXPECT_DOUBLE_EQ(gap[1]->dur_us, 0.0) << "the wait for the receive after the mark";
  std::vector<std::string> problems = prism::replay::ValidateTrace(g->trace);
  EXPECT_TRUE(problems.empty()) << problems.front();
}

// prism-run record: every member of a collective ran for real and logged its GPU stamps; the node's duration is from
// the last member's arrival to the first release (the early member's wait for the late one is not transfer time).
TEST(ObservedTrace, PassthroughOperationsGiveMeasuredCommunicationTimes) {
  JobOptions o;
  o.passthrough = true;
  o.skew_us = 30;
  std::string err;
  auto g = Build(o, ReplicaZero(8), &err);
  ASSERT_TRUE(g) << err;
  EXPECT_GT(g->recorded_comm, 0u);
  const auto& cls = g->trace.classes[g->trace.ranks[0].cls];
  int checked = 0;
  for (const auto& s : cls.streams)
    for (const auto& n : s.nodes)
      if (n.kind == NodeKind::kColl && n.op == prism::trace::CollOp::kAllReduce && cls.comm_slots[n.comm_slot] == "tp") {
        EXPECT_DOUBLE_EQ(n.dur_us, kTpUs - 30) << "tensor-parallel all-reduce";
        ++checked;
      }
  EXPECT_GT(checked, 0);
  // Without the passthrough mark, communication is left to the cost model.
  o.passthrough = false;
  auto h = Build(o, ReplicaZero(8), &err);
  ASSERT_TRUE(h) << err;
  EXPECT_EQ(h->recorded_comm, 0u);
}

// A gate that opened 5 ms after its decided release (the coordinator's decision latency under --graph): with the op
// lines' opened_ns the unit ends when its gate opened, so the compute after it stays what the GPU computed and the
// latency is counted per rank and iteration; files without the field keep the old result (the 5 ms in the compute).
TEST(ObservedTrace, GateOpenedAfterItsReleaseIsNotCompute) {
  constexpr int64_t kLateUs = 5000;
  std::string err;
  ObservedTraceOptions opts;
  opts.skip_iterations = 1;
  for (bool field : {true, false}) {
    SCOPED_TRACE(field ? "opened_ns" : "no opened_ns");
    JobOptions o;
    o.tp_late_us = kLateUs;
    o.opened_field = field;
    auto g = Build(o, ReplicaZero(8), &err, opts);
    ASSERT_TRUE(g) << err;
    EXPECT_TRUE(prism::replay::ValidateTrace(g->trace).empty());
    const prism::trace::Stream* s0 = StreamNamed(g->trace.classes[0], "stream0");
    ASSERT_NE(s0, nullptr);
    ASSERT_GE(s0->nodes.size(), 7u);
    const auto& n = s0->nodes;
    ASSERT_EQ(n[2].op, prism::trace::CollOp::kAllReduce);
    ASSERT_EQ(n[3].kind, NodeKind::kCompute);
    ASSERT_EQ(n[4].op, prism::trace::CollOp::kAllReduce);
    ASSERT_EQ(n[5].kind, NodeKind::kCompute);
    const double extra = field ? 0 : kLateUs;
    EXPECT_DOUBLE_EQ(n[1].dur_us, kFwdUs);  // before the first late gate: unchanged either way
    EXPECT_DOUBLE_EQ(n[3].dur_us, kFwdUs + kSendUs + kRecvGradUs + kBwdUs + extra);
    EXPECT_DOUBLE_EQ(n[5].dur_us, kDpUs + kOptUs + extra);
    if (field) {
      // Two late all-reduces per iteration on every rank whose nodes were used; iterations 1 and 2 kept.
      ASSERT_EQ(g->coordinator_latency_ns.size(), 4u);
      for (const auto& [rank, iters] : g->coordinator_latency_ns) {
        EXPECT_EQ(iters, (std::map<int64_t, int64_t>{{1, 2 * kLateUs * kUs}, {2, 2 * kLateUs * kUs}})) << rank;
      }
    } else {
      EXPECT_TRUE(g->coordinator_latency_ns.empty());
    }
  }
}

TEST(ObservedTrace, FusedSendRecvWithoutDetailIsSplitEvenly) {
  JobOptions o;
  o.fused = 1;
  std::string err;
  auto g = Build(o, ReplicaZero(8), &err);
  ASSERT_TRUE(g) << err;
  EXPECT_TRUE(HasWarning(*g, "half of the unit's bytes"));
  const auto& c = g->trace.classes[0];
  const prism::trace::Stream* send = StreamNamed(c, "stream1.pp.send1");
  const prism::trace::Stream* recv = StreamNamed(c, "stream1.pp.recv1");
  ASSERT_NE(send, nullptr);
  ASSERT_NE(recv, nullptr);
  ASSERT_EQ(send->nodes.size(), 3u);
  EXPECT_EQ(send->nodes[0].bytes, 4u << 20);
  // Fork and join: both halves start after the pipeline stream's previous node; its next node waits for both.
  const prism::trace::Stream* s1 = StreamNamed(c, "stream1");
  ASSERT_NE(s1, nullptr);
  EXPECT_EQ(send->nodes[1].after, recv->nodes[1].after);
  bool joined = false;
  for (const auto& x : s1->nodes)
    if (x.after.size() == 2 && x.after[0] == send->nodes[0].id && x.after[1] == recv->nodes[0].id) joined = true;
  EXPECT_TRUE(joined);
}

TEST(ObservedTrace, FusedUnitWithDetailKeepsEachSize) {
  JobOptions o;
  o.fused = 2;
  o.grad_bytes = 2 << 20;
  std::string err;
  auto g = Build(o, ReplicaZero(8), &err);
  ASSERT_TRUE(g) << err;
  EXPECT_FALSE(HasWarning(*g, "half"));
  const prism::trace::Stream* recv = StreamNamed(g->trace.classes[0], "stream1.pp.recv1");
  ASSERT_NE(recv, nullptr);
  EXPECT_EQ(recv->nodes[0].bytes, 2u << 20);
  // Without the detail the halves would disagree with stage 1's sizes: refused by validation.
  o.fused = 1;
  EXPECT_FALSE(Build(o, ReplicaZero(8), &err));
  EXPECT_NE(err.find("does not validate"), std::string::npos) << err;
}

TEST(ObservedTrace, FusedUnitOnLargerCommunicatorNeedsDetail) {
  JobOptions o;
  auto logs = Logs(o, ReplicaZero(8));
  // A fused exchange on the 2-member dp group is fine; on a 4-member one it cannot be split.
  logs[0].comms[7] = prism::analysis::ObservedComm{7, "k7", "MODEL_PARALLEL_GROUP", "", 4, 0, {0, 1, 4, 5}};
  prism::analysis::ObservedOp op;
  op.comm_id = 7;
  op.seq = 0;
  op.op = "group";
  op.dtype = "bf16";
  op.bytes = 1024;
  op.nops = 2;
  op.arrival_ns = logs[0].ops[0].arrival_ns + 1;
  op.release_ns = op.arrival_ns + 10;
  op.stream = 3;
  op.line = 99;
  logs[0].ops.push_back(op);
  std::string err;
  EXPECT_FALSE(BuildObservedTrace(logs, MakeWorld(8), {}, &err));
  EXPECT_NE(err.find("line 99"), std::string::npos) << err;
  EXPECT_NE(err.find("\"ops\""), std::string::npos) << err;
}

// A pp=4 pipeline (world 4) whose middle stages fuse the send to one neighbour and the receive from the other into
// one unit on the 4-rank pipeline communicator (Megatron's batch_isend_irecv), forward and backward. Activations
// and gradients between stage k and k+1 are k+1 MiB, so the two operations of a unit differ in peer and size.
std::vector<RankEventLog> PipelineLogs(bool detail) {
  auto boundary = [](int k) { return static_cast<uint64_t>(k + 1) << 20; };  // bytes between stage k and k+1
  std::vector<RankEventLog> logs;
  for (int r = 0; r < 4; ++r) {
    JobOptions o;
    o.world = 4;
    RankWriter w(r, o);
    w.Comm(0, "PIPELINE_MODEL_PARALLEL_GROUP", {0, 1, 2, 3}, r);
    auto fused = [&](int send_peer, uint64_t send_bytes, int recv_peer, uint64_t recv_bytes) {
      json f = w.Op(0, "group", "bf16", send_bytes + recv_bytes, -1, 1, kSendUs, 2);
      if (detail) {
        const int64_t s = f["seq"].get<int64_t>();
        f["ops"] = json::array({{{"op", "send"}, {"dtype", "bf16"}, {"bytes", send_bytes}, {"peer", send_peer},
                                 {"root", -1}, {"comm_id", 0}, {"seq", s}},
                                {{"op", "recv"}, {"dtype", "bf16"}, {"bytes", recv_bytes}, {"peer", recv_peer},
                                 {"root", -1}, {"comm_id", 0}, {"seq", s + 1}}});
      }
      w.Emit(f);
    };
    for (int it = 0; it < 3; ++it) {
      if (r == 0) w.Emit(w.Op(0, "send", "bf16", boundary(0), 1, 1, kSendUs));
      else if (r == 3) w.Emit(w.Op(0, "recv", "bf16", boundary(2), 2, 1, kSendUs));
      else fused(r + 1, boundary(r), r - 1, boundary(r - 1));  // activations: on to the next, from the previous
      w.Compute(kFwdUs);
      if (r == 3) w.Emit(w.Op(0, "send", "bf16", boundary(2), 2, 1, kSendUs));
      else if (r == 0) w.Emit(w.Op(0, "recv", "bf16", boundary(0), 1, 1, kSendUs));
      else fused(r - 1, boundary(r - 1), r + 1, boundary(r));  // gradients: back to the previous, from the next
      w.Compute(kBwdUs);
      w.Mark(it);
    }
    RankEventLog log;
    log.rank = r;
    int64_t n = 0;
    for (const std::string& l : w.lines()) prism::analysis::FeedEventLine(&log, l, ++n);
    logs.push_back(std::move(log));
  }
  return logs;
}

TEST(ObservedTrace, FusedPipelineUnitOnFourStagesBuildsFromItsOperations) {
  std::string err;
  auto l = prism::world::ParseLayout("pp=4", &err);
  ASSERT_TRUE(l) << err;
  ASSERT_TRUE(prism::world::ResolveLayout(&*l, 4, "test", &err)) << err;
  auto world = prism::world::World::Make(*l, 8, &err);
  ASSERT_TRUE(world) << err;
  // Without the list (libprism before "ops"): refused, as `prism-run collect` of Megatron pp=4 was.
  EXPECT_FALSE(BuildObservedTrace(PipelineLogs(false), *world, {}, &err));
  EXPECT_NE(err.find("a fused unit of 2 sends and receives on a communicator of 4 ranks"), std::string::npos) << err;
  auto g = BuildObservedTrace(PipelineLogs(true), *world, {}, &err);
  ASSERT_TRUE(g) << err;
  const prism::trace::Trace& t = g->trace;
  EXPECT_TRUE(prism::replay::ValidateTrace(t).empty());
  ASSERT_EQ(t.classes.size(), 4u);
  EXPECT_FALSE(HasWarning(*g, "half"));
  // Per stage: (kind, peer in pipeline ranks, bytes) of every point-to-point node, over the three iterations.
  using P2p = std::tuple<NodeKind, int, uint64_t>;
  auto p2p = [&](int rank) {
    std::multiset<P2p> out;
    for (const auto& s : t.classes[t.ranks[rank].cls].streams)
      for (const auto& n : s.nodes)
        if (n.kind == NodeKind::kSend || n.kind == NodeKind::kRecv) out.insert({n.kind, n.peer, n.bytes});
    return out;
  };
  auto times3 = [](std::initializer_list<P2p> l) {
    std::multiset<P2p> out;
    for (int i = 0; i < 3; ++i) out.insert(l.begin(), l.end());
    return out;
  };
  constexpr uint64_t kMiB = 1 << 20;
  EXPECT_EQ(p2p(1), times3({{NodeKind::kSend, 2, 2 * kMiB}, {NodeKind::kRecv, 0, kMiB},
                            {NodeKind::kSend, 0, kMiB}, {NodeKind::kRecv, 2, 2 * kMiB}}));
  EXPECT_EQ(p2p(2), times3({{NodeKind::kSend, 3, 3 * kMiB}, {NodeKind::kRecv, 1, 2 * kMiB},
                            {NodeKind::kSend, 1, 2 * kMiB}, {NodeKind::kRecv, 3, 3 * kMiB}}));
  EXPECT_EQ(p2p(0), times3({{NodeKind::kSend, 1, kMiB}, {NodeKind::kRecv, 1, kMiB}}));
  // The fused units' operations run side by side on helper streams of the pipeline stream, one per channel (peer,
  // direction), one node per iteration each.
  const auto& c1 = t.classes[t.ranks[1].cls];
  for (const char* name : {"stream1.pp.send2", "stream1.pp.recv0", "stream1.pp.send0", "stream1.pp.recv2"}) {
    const prism::trace::Stream* h = StreamNamed(c1, name);
    ASSERT_NE(h, nullptr) << name;
    EXPECT_EQ(h->nodes.size(), 3u) << name;
  }
}

TEST(ObservedTrace, MembersFromDescriptionAndRootAssumed) {
  JobOptions o;
  o.members = false;
  o.root_field = false;
  std::string err;
  auto g = Build(o, ReplicaZero(8), &err);
  ASSERT_TRUE(g) << err;
  EXPECT_TRUE(HasWarning(*g, "root 0 assumed"));
  EXPECT_EQ(BoundComm(g->trace, 6, "pp").ranks, (std::vector<int32_t>{2, 6}));
}

TEST(ObservedTrace, OtherCommunicatorsMoveToEachReplica) {
  JobOptions o;
  auto logs = Logs(o, ReplicaZero(8));
  // A communicator of ranks 0 and 5 that is no Megatron group, with one all-reduce in the first iteration on each.
  for (auto& log : logs) {
    if (log.rank != 0 && log.rank != 5) continue;
    log.comms[9] = prism::analysis::ObservedComm{9, "custom", "my_pair", "", 2, log.rank == 0 ? 0 : 1, {0, 5}};
    prism::analysis::ObservedOp op;
    op.comm_id = 9;
    op.seq = 0;
    op.op = "allreduce";
    op.dtype = "f32";
    op.bytes = 4096;
    op.arrival_ns = log.ops[0].arrival_ns + 1;
    op.release_ns = op.arrival_ns + 5;
    op.stream = 4;
    log.ops.push_back(op);
  }
  std::string err;
  auto g = BuildObservedTrace(logs, MakeWorld(8), {}, &err);
  ASSERT_TRUE(g) << err;
  EXPECT_EQ(BoundComm(g->trace, 2, "my_pair").ranks, (std::vector<int32_t>{2, 7}));
  EXPECT_EQ(BoundComm(g->trace, 7, "my_pair").ranks, (std::vector<int32_t>{2, 7}));
  EXPECT_EQ(BoundComm(g->trace, 7, "my_pair").desc, "my_pair");
  // Without description or name (a split whose key is rank-local): named after its members, alike on both ranks.
  for (auto& log : logs)
    if (log.comms.count(9)) {
      log.comms[9].desc.clear();
      log.comms[9].key = "split:" + std::to_string(log.rank);
    }
  g = BuildObservedTrace(logs, MakeWorld(8), {}, &err);
  ASSERT_TRUE(g) << err;
  const auto& slots = g->trace.classes[0].comm_slots;
  ASSERT_EQ(slots.size(), 4u);
  EXPECT_EQ(slots[3].rfind("comm-", 0), 0u) << slots[3];
  EXPECT_EQ(g->trace.classes[3].comm_slots.back(), slots[3]);
}

TEST(ObservedTrace, SlotsFollowDescriptionsAndTheWorld) {
  JobOptions o;
  auto logs = Logs(o, ReplicaZero(8));
  // On every real rank: the world communicator and the embedding group (same members as the pipeline group at
  // pp = 2, told apart by its description), one all-reduce each.
  for (auto& log : logs) {
    const int pp = log.rank / 4, tp = log.rank % 2;
    log.comms[10] = prism::analysis::ObservedComm{10, "w", "default_pg", "0", 8, log.rank, {0, 1, 2, 3, 4, 5, 6, 7}};
    log.comms[11] = prism::analysis::ObservedComm{11, "e", "EMBEDDING_GROUP", "", 2, pp, {tp, tp + 4}};
    for (int c : {10, 11}) {
      prism::analysis::ObservedOp op;
      op.comm_id = c;
      op.seq = 0;
      op.op = "allreduce";
      op.dtype = "f32";
      op.bytes = 4;
      op.arrival_ns = log.ops[0].arrival_ns + c;
      op.release_ns = op.arrival_ns + 1;
      op.stream = c;
      log.ops.push_back(op);
    }
  }
  std::string err;
  auto g = BuildObservedTrace(logs, MakeWorld(8), {}, &err);
  ASSERT_TRUE(g) << err;
  EXPECT_EQ(BoundComm(g->trace, 6, "world").ranks.size(), 8u);
  EXPECT_EQ(BoundComm(g->trace, 6, "world").desc, "default_pg");
  EXPECT_EQ(BoundComm(g->trace, 6, "embd").ranks, (std::vector<int32_t>{2, 6}));
  EXPECT_EQ(BoundComm(g->trace, 6, "embd").desc, "EMBEDDING_GROUP");
  EXPECT_NE(BoundComm(g->trace, 6, "embd").id, BoundComm(g->trace, 6, "pp").id);
}

TEST(ObservedTrace, PointToPointAcrossReplicasCannotShareAClass) {
  JobOptions o;
  auto logs = Logs(o, ReplicaZero(8));
  prism::analysis::ObservedOp op;
  op.comm_id = 2;  // the dp group [0, 2]: rank 0 sends to communicator rank 1
  op.seq = 3;
  op.op = "send";
  op.dtype = "u8";
  op.bytes = 16;
  op.peer = 1;
  op.arrival_ns = logs[0].ops[0].arrival_ns + 1;
  op.release_ns = op.arrival_ns + 1;
  op.stream = 5;
  logs[0].ops.push_back(op);
  std::string err;
  EXPECT_FALSE(BuildObservedTrace(logs, MakeWorld(8), {}, &err));
  EXPECT_NE(err.find("one class cannot hold both"), std::string::npos) << err;
}

TEST(ObservedTrace, KeepsOnlyIterationsEveryRankCompleted) {
  JobOptions o;
  auto logs = Logs(o, ReplicaZero(8));
  // Rank 5 died during iteration 2: its last mark is 1 and it logged part of iteration 2.
  auto& l5 = logs[3];
  ASSERT_EQ(l5.rank, 5);
  l5.marks.pop_back();
  // Rank 0 has operations after its last mark (a fourth iteration that never ended).
  prism::analysis::ObservedOp late = logs[0].ops.back();
  late.arrival_ns = logs[0].marks.back().t_ns + 10;
  late.release_ns = late.arrival_ns + 10;
  late.seq += 100;
  logs[0].ops.push_back(late);
  std::string err;
  auto g = BuildObservedTrace(logs, MakeWorld(8), {}, &err);
  ASSERT_TRUE(g) << err;
  EXPECT_EQ(g->first_iteration, 0);
  EXPECT_EQ(g->last_iteration, 1);
  EXPECT_GT(g->dropped_ops, 0u);
  EXPECT_TRUE(HasWarning(*g, "left out"));
  ObservedTraceOptions skip;
  skip.skip_iterations = 2;
  EXPECT_FALSE(BuildObservedTrace(logs, MakeWorld(8), skip, &err));
  EXPECT_NE(err.find("no complete iteration"), std::string::npos) << err;
}

TEST(ObservedTrace, MalformedLinesAndUnknownTypesAreSkipped) {
  RankEventLog log;
  log.rank = 0;
  prism::analysis::FeedEventLine(&log, "{not json", 1);
  prism::analysis::FeedEventLine(&log, R"({"type":"future","x":1})", 2);
  prism::analysis::FeedEventLine(&log, R"({"type":"op","comm_id":0})", 3);
  prism::analysis::FeedEventLine(&log, "   ", 4);
  EXPECT_EQ(log.malformed, 2);
  EXPECT_NE(log.first_malformed.find("line 1"), std::string::npos);
  EXPECT_TRUE(log.ops.empty());
}

TEST(ObservedTrace, WorldSizeMismatchIsAnError) {
  JobOptions o;
  auto logs = Logs(o, ReplicaZero(8));
  std::string err;
  EXPECT_FALSE(BuildObservedTrace(logs, MakeWorld(16), {}, &err));
  EXPECT_NE(err.find("world size 8"), std::string::npos) << err;
}

// ---- prism-run graph build + simulate, as a user runs them ----

struct CliResult {
  int rc = -1;
  std::string out;
};

CliResult RunCli(const std::string& args) {
  const char* bin = std::getenv("PRISM_RUN");
  std::string cmd = std::string(bin ? bin : PRISM_BINARY_DIR "/bin/prism-run") + " " + args + " 2>&1";
  CliResult r;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  int status = pclose(f);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return r;
}

class GraphCli : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("prism_graph_" + std::to_string(::getpid()) + "_" +
                                           testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }
  // An emulate-style output directory: event files of one replica and report.json with the layout.
  void WriteRun(const JobOptions& o, bool report) {
    for (int r : ReplicaZero(o.world)) {
      std::ofstream f(P("rank" + std::to_string(r) + ".events.jsonl"));
      RankWriter w = MakeRank(r, o);
      for (const std::string& l : w.lines()) f << l << "\n";
      f << R"({"type":"op","comm_id":0,"seq":99)";  // a line still being written: ignored
    }
    if (report) {
      json rep = {{"world_size", o.world},
                  {"gpus_per_node", 8},
                  {"layout", {{"tp", 2}, {"pp", 2}, {"spec", "tp=2,pp=2,dp=" + std::to_string(o.world / 4)}}}};
      std::ofstream(P("report.json")) << rep.dump();
    }
  }
  static json Load(const std::string& path) {
    std::ifstream f(path);
    return json::parse(f, nullptr, false);
  }
  fs::path dir_;
};

TEST_F(GraphCli, BuildThenSimulateWorld8) {
  JobOptions o;
  WriteRun(o, /*report=*/true);
  CliResult b = RunCli("graph build " + P("") + " --out " + P("g.prism") + " --skip-iterations 1");
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("world 8 ranks"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("iterations 1..2"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("class tp1-pp1"), std::string::npos) << b.out;
  prism::trace::Trace t;
  std::string err;
  ASSERT_TRUE(prism::replay::ReadTrace(P("g.prism"), &t, &err)) << err;
  EXPECT_EQ(t.classes.size(), 4u);

  CliResult s = RunCli("simulate " + P("g.prism") + " --out " + P("sim") + " --quiet");
  ASSERT_EQ(s.rc, 0) << s.out;
  json j = Load(P("sim/report.json"));
  ASSERT_TRUE(j.is_object()) << s.out;
  namespace rk = prism::report;
  EXPECT_EQ(j[std::string(rk::kWorldSize)], 8);
  EXPECT_EQ(j[std::string(rk::kIterations)], 2);
  EXPECT_EQ(j[std::string(rk::kRanks)].size(), 8u);
  // Stage 0 measured 7.21 ms per iteration (broadcast, 2 forward halves, 2 tp all-reduces, send, receive,
  // backward, dp all-reduce, optimizer); the replay has every compute gap of every stream but its own model of
  // communication and no cross-stream edges: it must land in the same range, not on it.
  const double measured =
      (kBcastUs + 2 * kFwdUs + kTpUs + kSendUs + kRecvGradUs + kBwdUs + kTpUs + kDpUs + kOptUs) * 1e-6;
  double it = j[std::string(rk::kIterationTime)].get<double>();
  EXPECT_GT(it, 0.5 * measured);
  EXPECT_LT(it, 2.0 * measured);
}

TEST_F(GraphCli, BuildThenSimulateWorld64WithoutReport) {
  JobOptions o;
  o.world = 64;
  WriteRun(o, /*report=*/false);
  // No report.json: the world size comes from the hello lines, the layout from --layout.
  CliResult b = RunCli("graph build " + P("") + " --layout tp=2,pp=2 --quiet");
  ASSERT_EQ(b.rc, 0) << b.out;
  ASSERT_TRUE(fs::exists(P("observed.prism")));
  CliResult s = RunCli("simulate " + P("observed.prism") + " --out " + P("sim"));
  ASSERT_EQ(s.rc, 0) << s.out;
  EXPECT_NE(s.out.find("world 64 ranks, 4 classes"), std::string::npos) << s.out;
  json j = Load(P("sim/report.json"));
  EXPECT_EQ(j[std::string(prism::report::kIterations)], 3);
  EXPECT_GT(j[std::string(prism::report::kIterationTime)].get<double>(), 0.0);
}

// What emulate calls when the job ends.
TEST_F(GraphCli, EmulateWritesTheObservedTraceOnlyWhenCovered) {
  JobOptions o;
  WriteRun(o, /*report=*/false);
  prism::world::World w = MakeWorld(8);
  std::string line = prism::analysis::WriteObservedTrace(P(""), w, {0});
  EXPECT_NE(line.find("not written: the real ranks cover 1 of 4 classes"), std::string::npos) << line;
  EXPECT_FALSE(fs::exists(P("observed.prism")));
  line = prism::analysis::WriteObservedTrace(P(""), w, {5, 4, 1, 0});
  EXPECT_EQ(line.rfind("observed graph " + P("observed.prism") + ": 4 classes", 0), 0u) << line;
  prism::trace::Trace t;
  std::string err;
  EXPECT_TRUE(prism::replay::ReadTrace(P("observed.prism"), &t, &err)) << err;
  // A build that fails says so in one line.
  fs::remove(P("rank5.events.jsonl"));
  line = prism::analysis::WriteObservedTrace(P(""), w, {0, 1, 4, 5});
  EXPECT_NE(line.find("not written: "), std::string::npos) << line;
  EXPECT_NE(line.find("rank5.events.jsonl: cannot open"), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
}

TEST_F(GraphCli, MissingClassesExitTwoAndWriteNothing) {
  JobOptions o;
  WriteRun(o, /*report=*/true);
  CliResult b = RunCli("graph build " + P("") + " --ranks 0,1 --out " + P("g.prism"));
  EXPECT_EQ(b.rc, 2) << b.out;
  EXPECT_NE(b.out.find("missing coordinates: tp=0 pp=1"), std::string::npos) << b.out;
  EXPECT_FALSE(fs::exists(P("g.prism")));
  CliResult none = RunCli("graph build " + P("nothing-here"));
  EXPECT_EQ(none.rc, 2) << none.out;
}

}  // namespace

// Real event files of a timing fill (tests/data/graph/megatron_w64_medium_fill: the fidelity suite's medium GPT,
// world 64, tp 2 pp 2, 2 micro-batches; each rank's file from its slice of `prism-run fill` on an H200, the
// collect's report.json). Rank 0 ran 145 ms per iteration under mirror on that machine. The builder once replayed
// the side streams' waits across the iteration mark as their compute, and this graph simulated 2.65 s per
// iteration; a 2-stage 1F1B of 2 micro-batches takes about 1.5x the micro-batches' work.
TEST_F(GraphCli, RealFillEventsReplayAtThePipelinesPaceNotAtTheirWaits) {
  const fs::path data = fs::path(PRISM_SOURCE_DIR) / "tests/data/graph/megatron_w64_medium_fill";
  for (const auto& f : fs::directory_iterator(data)) fs::copy_file(f.path(), dir_ / f.path().filename());
  CliResult b = RunCli("graph build " + P("") + " --out " + P("g.prism"));
  ASSERT_EQ(b.rc, 0) << b.out;
  CliResult s = RunCli("simulate " + P("g.prism") + " --out " + P("sim") + " --quiet");
  ASSERT_EQ(s.rc, 0) << s.out;
  json j = Load(P("sim/report.json"));
  const double it = j[std::string(prism::report::kIterationTime)].get<double>();
  EXPECT_GT(it, 0.145) << "faster than the rank alone under mirror";
  EXPECT_LT(it, 0.145 * 2.0) << "the side streams' waits are back as compute";
  // The last iteration too: after a side stream's last unit nothing follows to take its wait out.
  const auto& its = j["iteration_times_s"];
  ASSERT_EQ(its.size(), 10u);
  EXPECT_LT(its.back().get<double>(), 1.5 * it) << j.dump();
}

// Real event files: Megatron-LM world 64 (tp 2, pp 2) under `prism-run collect` on an H200 (ranks 0, 1, 32, 33
// real), trimmed to 3 iterations (tests/data/graph/megatron_w64_collect). torch put the tensor-parallel
// communicator's forward all-reduces on one stream and its backward ones on another: the graph must still build
// (sequenced by node id) and replay.
TEST_F(GraphCli, RealMegatronCollectBuildsAndSimulates) {
  const fs::path data = fs::path(PRISM_SOURCE_DIR) / "tests/data/graph/megatron_w64_collect";
  for (const auto& f : fs::directory_iterator(data)) fs::copy_file(f.path(), dir_ / f.path().filename());
  CliResult b = RunCli("graph build " + P("") + " --out " + P("g.prism") + " --skip-iterations 1");
  ASSERT_EQ(b.rc, 0) << b.out;
  prism::trace::Trace t;
  std::string err;
  ASSERT_TRUE(prism::replay::ReadTrace(P("g.prism"), &t, &err)) << err;
  EXPECT_EQ(t.world_size, 64);
  EXPECT_EQ(t.classes.size(), 4u);
  // Some class issues one slot's collectives on two streams (the case the format now allows).
  bool multi = false;
  for (const auto& c : t.classes) {
    std::map<uint32_t, std::set<size_t>> streams;
    for (size_t si = 0; si < c.streams.size(); ++si)
      for (const auto& n : c.streams[si].nodes)
        if (n.kind == prism::trace::NodeKind::kColl) streams[n.comm_slot].insert(si);
    for (const auto& [slot, ss] : streams) multi = multi || ss.size() > 1;
  }
  EXPECT_TRUE(multi) << "the recorded job used one communicator on two streams";
  CliResult s = RunCli("simulate " + P("g.prism") + " --out " + P("sim") + " --quiet");
  ASSERT_EQ(s.rc, 0) << s.out;
  json j = Load(P("sim/report.json"));
  const double it = j[std::string(prism::report::kIterationTime)].get<double>();
  // The collect run measured 0.235-0.240 s per iteration (its gaps include the host exchange). The full 10-iteration
  // files replay at 0.242 s; on this 3-iteration trim the replay of the one kept iteration includes the pipeline's
  // fill (0.316 s when written): same range, not the same number.
  EXPECT_GT(it, 0.2396 * 0.5);
  EXPECT_LT(it, 0.2396 * 2.0);
}

// ---- expert parallelism: classes of ep coordinates without a real rank (collect without --real-routing) ----

namespace {

prism::world::World MakeEpWorld(const std::string& spec, int world) {
  std::string err;
  auto l = prism::world::ParseLayout(spec, &err);
  EXPECT_TRUE(l) << err;
  EXPECT_TRUE(prism::world::ResolveLayout(&*l, world, "test", &err)) << err;
  auto w = prism::world::World::Make(*l, 8, &err);
  EXPECT_TRUE(w) << err;
  return *w;
}

// One MoE all-to-all per iteration on the rank's EXPERT_MODEL_PARALLEL_GROUP, just after the iteration's first
// operation, its size telling the ep coordinates apart (1000 x (ep + 1) bytes).
void AddEpAllToAll(std::vector<RankEventLog>* logs, const prism::world::World& w) {
  for (auto& log : *logs) {
    const std::vector<int> members = w.GroupOf("ep", log.rank);
    const int me = static_cast<int>(std::find(members.begin(), members.end(), log.rank) - members.begin());
    log.comms[7] = prism::analysis::ObservedComm{
        7, "ep", "EXPERT_MODEL_PARALLEL_GROUP", "", static_cast<int>(members.size()), me, members};
    std::vector<prism::analysis::ObservedOp> first;
    for (const auto& op : log.ops)
      if (op.comm_id == 0 && op.op == "broadcast") first.push_back(op);
    int64_t seq = 0;
    for (const auto& b : first) {
      prism::analysis::ObservedOp op;
      op.comm_id = 7;
      op.seq = seq++;
      op.op = "alltoall";
      op.dtype = "bf16";
      op.bytes = 1000u * static_cast<uint64_t>(w.CoordsOf(log.rank).ep + 1);
      op.arrival_ns = b.release_ns + 1;
      op.release_ns = op.arrival_ns + 5;
      op.stream = 6;
      log.ops.push_back(op);
    }
  }
}

uint64_t FirstAllToAllBytes(const prism::trace::RoleClass& c) {
  for (const auto& s : c.streams)
    for (const auto& n : s.nodes)
      if (n.kind == NodeKind::kColl && n.op == prism::trace::CollOp::kAllToAll) return n.bytes;
  return 0;
}

}  // namespace

// World 64, tp 2 pp 2 ep 2: replica 0 (ranks 0, 1, 32, 33) holds ep 0 only. The four ep-1 classes repeat the nodes of
// the ep-0 rank with their other coordinates, with a warning; each of their ranks binds its own communicators.
TEST(ObservedTrace, ExpertClassesWithoutARealRankMirrorTheirEpZeroRank) {
  JobOptions o;
  o.world = 64;
  const prism::world::World w = MakeEpWorld("tp=2,pp=2,ep=2", 64);
  auto logs = Logs(o, ReplicaZero(64));
  AddEpAllToAll(&logs, w);
  std::string err;
  auto g = BuildObservedTrace(logs, w, {}, &err);
  ASSERT_TRUE(g) << err;
  const prism::trace::Trace& t = g->trace;
  EXPECT_TRUE(prism::replay::ValidateTrace(t).empty());
  ASSERT_EQ(t.classes.size(), 8u);
  EXPECT_EQ(g->mirrored_classes.size(), 4u);
  EXPECT_TRUE(HasWarning(*g, "EP symmetry assumed")) << (g->warnings.empty() ? "" : g->warnings.front());
  EXPECT_TRUE(HasWarning(*g, "--real-routing"));
  // Rank 2 (tp 0, pp 0, ep 1, dense dp 1) and rank 6 (ep 1, expert dp 1): one class, its own, from rank 0.
  const uint32_t c2 = t.ranks[2].cls;
  EXPECT_EQ(t.ranks[6].cls, c2);
  EXPECT_NE(c2, t.ranks[0].cls);
  EXPECT_EQ(t.classes[c2].name, "tp0-pp0-ep1");
  EXPECT_EQ(g->class_ranks[c2], 0);
  EXPECT_TRUE(std::find(g->mirrored_classes.begin(), g->mirrored_classes.end(), c2) != g->mirrored_classes.end());
  EXPECT_EQ(t.classes[c2].comm_slots, t.classes[t.ranks[0].cls].comm_slots);
  EXPECT_EQ(FirstAllToAllBytes(t.classes[c2]), 1000u);  // rank 0's routing, mirrored
  // Their own groups, not rank 0's: expert-parallel, tensor-, pipeline- and data-parallel.
  EXPECT_EQ(BoundComm(t, 2, "ep").ranks, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(BoundComm(t, 6, "ep").ranks, (std::vector<int32_t>{4, 6}));
  EXPECT_EQ(BoundComm(t, 6, "ep").desc, "EXPERT_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(BoundComm(t, 6, "tp").ranks, (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(BoundComm(t, 34, "pp").ranks, (std::vector<int32_t>{2, 34}));
  EXPECT_EQ(BoundComm(t, 34, "ep").ranks, (std::vector<int32_t>{32, 34}));
  EXPECT_EQ(BoundComm(t, 2, "dp").ranks.front(), 0);
  for (int r = 0; r < 64; ++r) {
    std::vector<int32_t> want;
    for (int m : w.GroupOf("ep", r)) want.push_back(m);
    EXPECT_EQ(BoundComm(t, r, "ep").ranks, want) << "rank " << r;
  }

  // Off: a class with no rank of its own is missing, as before.
  ObservedTraceOptions strict;
  strict.mirror_expert_classes = false;
  EXPECT_FALSE(BuildObservedTrace(logs, w, strict, &err));
  EXPECT_NE(err.find("do not cover every class"), std::string::npos) << err;
  EXPECT_NE(err.find("ep=1"), std::string::npos) << err;
  // Another coordinate missing (pipeline stage 1): no stand-in, the same error with mirroring on.
  std::vector<RankEventLog> stage0(logs.begin(), logs.begin() + 2);
  EXPECT_FALSE(BuildObservedTrace(stage0, w, {}, &err));
  EXPECT_NE(err.find("tp=0 pp=1 ep=0"), std::string::npos) << err;
  size_t mirrored = 0;
  EXPECT_FALSE(prism::analysis::CoversEveryClass(w, ReplicaZero(64)));
  EXPECT_TRUE(prism::analysis::CoversEveryClassOrEpStandIn(w, ReplicaZero(64), &mirrored));
  EXPECT_EQ(mirrored, 4u);
  EXPECT_FALSE(prism::analysis::CoversEveryClassOrEpStandIn(w, {0, 1}));
}

// With the expert-parallel peers' events too (collect --real-routing: ranks 0-3 and 32-35) every class is its own.
TEST(ObservedTrace, ExpertParallelPeersGiveEveryClassItsOwnNodes) {
  JobOptions o;
  o.world = 64;
  const prism::world::World w = MakeEpWorld("tp=2,pp=2,ep=2", 64);
  auto logs = Logs(o, {0, 1, 2, 3, 32, 33, 34, 35});
  AddEpAllToAll(&logs, w);
  std::string err;
  auto g = BuildObservedTrace(logs, w, {}, &err);
  ASSERT_TRUE(g) << err;
  const prism::trace::Trace& t = g->trace;
  EXPECT_TRUE(prism::replay::ValidateTrace(t).empty());
  ASSERT_EQ(t.classes.size(), 8u);
  EXPECT_TRUE(g->mirrored_classes.empty());
  EXPECT_FALSE(HasWarning(*g, "EP symmetry"));
  EXPECT_EQ(g->class_ranks, (std::vector<int>{0, 1, 2, 3, 32, 33, 34, 35}));
  EXPECT_TRUE(g->unused_ranks.empty());
  const uint32_t c2 = t.ranks[6].cls;
  EXPECT_EQ(g->class_ranks[c2], 2);
  EXPECT_EQ(FirstAllToAllBytes(t.classes[c2]), 2000u);  // rank 2's own routing
  EXPECT_EQ(FirstAllToAllBytes(t.classes[t.ranks[4].cls]), 1000u);
  EXPECT_EQ(BoundComm(t, 6, "ep").ranks, (std::vector<int32_t>{4, 6}));
  EXPECT_EQ(BoundComm(t, 63, "ep").ranks, (std::vector<int32_t>{61, 63}));
}

// World 8, tp 1, ep 4: replica 0 is rank 0 alone; ranks 1-3 stand for the other expert-parallel classes.
TEST(ObservedTrace, World8Ep4FromRankZeroOrFromItsExpertGroup) {
  // The tp 2 pp 2 writer is not this layout: each rank's log written here.
  const prism::world::World w = MakeEpWorld("ep=4", 8);
  auto rank_log = [&](int r) {
    RankEventLog log;
    log.rank = r;
    const int ep = r % 4, edp = r / 4;
    std::vector<int> ep_members = {4 * edp, 4 * edp + 1, 4 * edp + 2, 4 * edp + 3};
    log.comms[0] = prism::analysis::ObservedComm{0, "e", "EXPERT_MODEL_PARALLEL_GROUP", "", 4, ep, ep_members};
    log.comms[1] = prism::analysis::ObservedComm{1, "x", "EXPERT_DATA_PARALLEL_GROUP", "", 2, edp, {ep, ep + 4}};
    log.comms[2] = prism::analysis::ObservedComm{2, "d", "DATA_PARALLEL_GROUP", "", 8, r, {0, 1, 2, 3, 4, 5, 6, 7}};
    int64_t t = kBase;
    for (int it = 0; it < 2; ++it) {
      int64_t seq = it;
      for (int c : {0, 1, 2}) {
        prism::analysis::ObservedOp op;
        op.comm_id = c;
        op.seq = seq;
        op.op = c == 0 ? "alltoall" : "allreduce";
        op.dtype = "bf16";
        op.bytes = c == 0 ? 1000u * static_cast<uint64_t>(ep + 1) : 4096u;
        op.arrival_ns = t += 100 * kUs;
        op.release_ns = t += 10 * kUs;
        op.stream = 0;
        log.ops.push_back(op);
      }
      log.marks.push_back({it, t += 50 * kUs, 0});
    }
    return log;
  };
  std::string err;
  auto g = BuildObservedTrace(std::vector<RankEventLog>{rank_log(0)}, w, {}, &err);
  ASSERT_TRUE(g) << err;
  EXPECT_TRUE(prism::replay::ValidateTrace(g->trace).empty());
  ASSERT_EQ(g->trace.classes.size(), 4u);
  EXPECT_EQ(g->class_ranks, (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(g->mirrored_classes, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(g->trace.classes[3].name, "ep3");
  EXPECT_EQ(BoundComm(g->trace, 7, "ep").ranks, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(BoundComm(g->trace, 7, "edp").ranks, (std::vector<int32_t>{3, 7}));
  EXPECT_EQ(BoundComm(g->trace, 1, "edp").ranks, (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(FirstAllToAllBytes(g->trace.classes[3]), 1000u);

  std::vector<RankEventLog> peers;
  for (int r : {0, 1, 2, 3}) peers.push_back(rank_log(r));
  g = BuildObservedTrace(peers, w, {}, &err);
  ASSERT_TRUE(g) << err;
  EXPECT_TRUE(g->mirrored_classes.empty());
  EXPECT_EQ(g->class_ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(FirstAllToAllBytes(g->trace.classes[3]), 4000u);
  EXPECT_EQ(BoundComm(g->trace, 7, "ep").ranks, (std::vector<int32_t>{4, 5, 6, 7}));
}

// The test below, with the copies to the rank itself numbered (files before libprism left them unnumbered) or not;
// *nodes: the graph's.
void MoeGroupedAllToAllSkipsTheCopies(bool numbered, size_t* nodes) {
  const prism::world::World w = MakeEpWorld("pp=2,ep=2", 16);
  JobOptions o;
  o.world = 16;
  auto split = [](int from, int to) { return 1024u * static_cast<uint64_t>(1 + from + 2 * to); };  // bytes
  std::vector<RankEventLog> logs;
  for (int r : {0, 1, 8, 9}) {
    const std::vector<int> members = w.GroupOf("ep", r);
    const int me = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
    RankWriter wr(r, o);
    wr.Comm(7, "EXPERT_MODEL_PARALLEL_GROUP", members, me);
    auto sub = [](const std::string& op, uint64_t bytes, int peer, int64_t seq) {
      return json{{"op", op}, {"dtype", "bf16"}, {"bytes", bytes}, {"peer", peer}, {"root", -1}, {"comm_id", 7},
                  {"seq", seq}};
    };
    const int n = static_cast<int>(members.size());
    for (int it = 0; it < 3; ++it) {
      wr.Compute(kFwdUs);
      // Dispatch: a send to every member, then a receive from every member (torch's order).
      uint64_t total = 0;
      for (int m : members) total += split(r, m) + split(m, r);
      json d = wr.Op(7, "group", "bf16", total, -1, 1, kSendUs, numbered ? 2 * n : 2 * (n - 1));
      d["nops"] = 2 * n;
      int64_t s = d["seq"].get<int64_t>();
      d["ops"] = json::array();
      auto seq = [&](int k) { return k == me && !numbered ? int64_t{-1} : s++; };
      for (int k = 0; k < n; ++k) d["ops"].push_back(sub("send", split(r, members[k]), k, seq(k)));
      for (int k = 0; k < n; ++k) d["ops"].push_back(sub("recv", split(members[k], r), k, seq(k)));
      wr.Emit(d);
      wr.Compute(kFwdUs);
      // Every token stayed on the rank: only the self pair.
      json l = wr.Op(7, "group", "bf16", 8192, -1, 1, kSendUs, numbered ? 2 : 0);
      l["nops"] = 2;
      const int64_t ls = numbered ? l["seq"].get<int64_t>() : -1;
      if (!numbered) l["seq"] = -1;
      l["ops"] = json::array({sub("send", 4096, me, ls), sub("recv", 4096, me, numbered ? ls + 1 : -1)});
      wr.Emit(l);
      wr.Compute(kBwdUs);
      wr.Emit(wr.Op(7, "allreduce", "bf16", 4096, -1, 1, kTpUs));
      wr.Mark(it);
    }
    RankEventLog log;
    log.rank = r;
    int64_t line_no = 0;
    for (const std::string& line : wr.lines()) prism::analysis::FeedEventLine(&log, line, ++line_no);
    EXPECT_EQ(log.malformed, 0) << log.first_malformed;
    logs.push_back(std::move(log));
  }
  std::string err;
  auto g = BuildObservedTrace(logs, w, {}, &err);
  ASSERT_TRUE(g) << err;
  const prism::trace::Trace& t = g->trace;
  const std::vector<std::string> errors = prism::replay::ValidateTrace(t);
  EXPECT_TRUE(errors.empty()) << errors.size() << " errors, the first: " << errors.front();
  EXPECT_FALSE(HasWarning(*g, "sequence numbers jump")) << "the self operations still count in the sequence";
  *nodes = g->nodes;
  for (int r : {0, 1, 8, 9}) {
    const auto& cls = t.classes[t.ranks[r].cls];
    int sends = 0, recvs = 0;
    for (const auto& s : cls.streams) {
      for (const auto& n : s.nodes) {
        if (n.kind != NodeKind::kSend && n.kind != NodeKind::kRecv) continue;
        const auto& ranks = t.comms[t.ranks[r].comms[n.comm_slot]].ranks;
        const int me = static_cast<int>(std::find(ranks.begin(), ranks.end(), r) - ranks.begin());
        EXPECT_NE(n.peer, me) << "rank " << r << " node " << n.id << ": a send or receive to the rank itself";
        const int other = ranks[n.peer];
        EXPECT_EQ(n.bytes, n.kind == NodeKind::kSend ? split(r, other) : split(other, r)) << "rank " << r;
        (n.kind == NodeKind::kSend ? sends : recvs)++;
      }
    }
    EXPECT_EQ(sends, 3) << "rank " << r << ": one send to the other member per iteration";
    EXPECT_EQ(recvs, 3) << "rank " << r;
  }
}

// collect --real-routing of Megatron's tiny MoE GPT (world 16, pp 2, ep 2: ranks 0, 1, 8, 9). The alltoall token
// dispatcher's all_to_all_single with uneven splits reaches NCCL as one group of sends and receives on the
// expert-parallel communicator, including a send to and a receive from the rank itself (a local copy, no
// communication); a unit can also be nothing but that pair. The graph has no self-peer node and validates. libprism
// writes the pair with "seq": -1 (it does not number them; a unit of only the pair has seq -1); files written before
// that number them like any operation: both build the same graph, and neither warns about a gap in the sequence.
TEST(ObservedTrace, MoeGroupedAllToAllSkipsTheRanksSendAndReceiveToItself) {
  size_t nodes[2] = {0, 0};
  for (bool numbered : {false, true}) {
    SCOPED_TRACE(numbered ? "copies numbered (files before)" : "copies unnumbered (seq -1)");
    MoeGroupedAllToAllSkipsTheCopies(numbered, &nodes[numbered]);
  }
  EXPECT_EQ(nodes[0], nodes[1]);
  EXPECT_GT(nodes[0], 0u);
}

// collect WITHOUT --real-routing of the same job shape (world 16, pp 2, ep 2): ranks 0 and 8 (replica 0, ep 0) run
// for real, ranks 1 and 9 (ep 1) run virtual under the mirror policy, and the classes pp0-ep1 and pp1-ep1 borrow the
// ep-0 rank of their stage. The alltoall dispatcher's grouped sends and receives on the expert-parallel communicator
// have uneven splits; under mirror every virtual peer routes like the real rank, so the real rank (position 0) sends
// s[q] to each q and receives s[0] (its own split to itself) from every peer in the dispatch, and in the combine (the
// reverse all-to-all) sends s[0] to every peer and receives s[q] from q. The borrowed class (position 1) sends s[q]
// and receives s[1] in the dispatch, sends s[1] and receives s[q] in the combine, never to itself. Two more units
// route every token to the rank itself: without the zero-size send (torch with NCCL < 2.14 skips it) and with it
// (NCCL >= 2.14: a 0-byte send and receive). A pipeline send/recv between the stages stays as recorded. Both with the
// copies to the rank itself unnumbered ("seq": -1, libprism) and numbered (files before).
void MoeBorrowedExpertClasses(bool numbered) {
  const prism::world::World w = MakeEpWorld("pp=2,ep=2", 16);
  JobOptions o;
  o.world = 16;
  // The real rank's split to ep position q on stage `st` (bytes).
  auto split = [](int st, int q) { return 1024u * static_cast<uint64_t>(1 + 3 * q + st); };
  auto sub = [](const std::string& op, uint64_t bytes, int peer, int comm, int64_t seq) {
    return json{{"op", op}, {"dtype", "bf16"}, {"bytes", bytes}, {"peer", peer}, {"root", -1}, {"comm_id", comm},
                {"seq", seq}};
  };
  std::vector<RankEventLog> logs;
  for (int r : {0, 8}) {
    const int st = r / 8;
    const std::vector<int> members = w.GroupOf("ep", r);
    ASSERT_EQ(members, (std::vector<int>{r, r + 1}));
    RankWriter wr(r, o);
    wr.Comm(7, "EXPERT_MODEL_PARALLEL_GROUP", members, 0);
    wr.Comm(1, "PIPELINE_MODEL_PARALLEL_GROUP", {r % 8, r % 8 + 8}, st);
    // One grouped unit on the ep communicator: sends (peer, bytes), then receives (peer, bytes).
    auto group = [&](const std::vector<std::pair<int, uint64_t>>& sends,
                     const std::vector<std::pair<int, uint64_t>>& recvs) {
      uint64_t total = 0;
      for (const auto* v : {&sends, &recvs})
        for (const auto& [q, b] : *v) total += b;
      int counted = 0;  // the operations that take a sequence number (position 0 is the rank itself)
      for (const auto* v : {&sends, &recvs})
        for (const auto& [q, b] : *v) counted += numbered || q != 0 ? 1 : 0;
      json g = wr.Op(7, "group", "bf16", total, -1, 1, kSendUs, counted);
      g["nops"] = sends.size() + recvs.size();
      int64_t s = g["seq"].get<int64_t>();
      auto seq = [&](int q) { return numbered || q != 0 ? s++ : int64_t{-1}; };
      g["ops"] = json::array();
      for (const auto& [q, b] : sends) g["ops"].push_back(sub("send", b, q, 7, seq(q)));
      for (const auto& [q, b] : recvs) g["ops"].push_back(sub("recv", b, q, 7, seq(q)));
      wr.Emit(g);
    };
    for (int it = 0; it < 3; ++it) {
      if (st == 1) wr.Emit(wr.Op(1, "recv", "bf16", 65536, 0, 1, kSendUs));
      wr.Compute(kFwdUs);
      group({{0, split(st, 0)}, {1, split(st, 1)}}, {{0, split(st, 0)}, {1, split(st, 0)}});  // dispatch
      wr.Compute(kFwdUs);
      group({{0, split(st, 0)}, {1, split(st, 0)}}, {{0, split(st, 0)}, {1, split(st, 1)}});  // combine
      wr.Compute(kFwdUs);
      group({{0, 4096}}, {{0, 4096}, {1, 4096}});                 // every token stays: no zero-size send
      group({{0, 4096}, {1, 0}}, {{0, 4096}, {1, 4096}});         // the same with the 0-byte send
      if (st == 0) wr.Emit(wr.Op(1, "send", "bf16", 65536, 1, 1, kSendUs));
      wr.Compute(kBwdUs);
      wr.Emit(wr.Op(7, "allreduce", "bf16", 4096, -1, 1, kTpUs));
      wr.Mark(it);
    }
    RankEventLog log;
    log.rank = r;
    int64_t n = 0;
    for (const std::string& line : wr.lines()) prism::analysis::FeedEventLine(&log, line, ++n);
    logs.push_back(std::move(log));
  }
  std::string err;
  auto g = BuildObservedTrace(logs, w, {}, &err);
  ASSERT_TRUE(g) << err;
  const prism::trace::Trace& t = g->trace;
  ASSERT_EQ(t.classes.size(), 4u);
  EXPECT_EQ(g->mirrored_classes.size(), 2u);
  EXPECT_TRUE(HasWarning(*g, "EP symmetry assumed"));
  const std::vector<std::string> errors = prism::replay::ValidateTrace(t);
  EXPECT_TRUE(errors.empty()) << errors.size() << " errors, the first: " << errors.front();
  // Per rank: its ep-communicator sends and receives in node order, (send?, peer, bytes).
  using P2p = std::tuple<bool, int, uint64_t>;
  for (int r = 0; r < 16; ++r) {
    const int st = r / 8, p = r % 2;
    const auto& cls = t.classes[t.ranks[r].cls];
    EXPECT_EQ(g->class_ranks[t.ranks[r].cls], 8 * st) << "rank " << r;
    std::map<uint32_t, P2p> by_id;
    for (const auto& s : cls.streams) {
      for (const auto& n : s.nodes) {
        if (n.kind != NodeKind::kSend && n.kind != NodeKind::kRecv) continue;
        if (cls.comm_slots[n.comm_slot] != "ep") continue;
        EXPECT_NE(n.peer, p) << "rank " << r << " node " << n.id << ": a send or receive to the rank itself";
        by_id[n.id] = {n.kind == NodeKind::kSend, n.peer, n.bytes};
      }
    }
    std::vector<P2p> got;
    for (const auto& [id, x] : by_id) got.push_back(x);
    std::vector<P2p> want;
    const int q = 1 - p;  // the other member
    const uint64_t sq = split(st, q), sp = split(st, p), s0 = split(st, 0);
    for (int it = 0; it < 3; ++it) {
      // dispatch: send s[q] to q, receive s[p] from q; combine: send s[p], receive s[q]
      std::vector<P2p> one = {{true, q, sq}, {false, q, sp}, {true, q, sp}, {false, q, sq}};
      if (p == 0) {
        // The real rank as recorded: receives s[0] in the dispatch, sends s[0] in the combine; the local-only units
        // receive from the virtual peer.
        one = {{true, q, sq}, {false, q, s0}, {true, q, s0}, {false, q, sq}, {false, q, 4096}, {true, q, 0},
               {false, q, 4096}};
      } else {
        // Borrowed: the local-only units send to the real rank what it receives; no zero-size receive where the
        // real rank sent nothing to this position, a 0-byte one where it sent 0 bytes.
        one.insert(one.end(), {{true, q, 4096}, {true, q, 4096}, {false, q, 0}});
      }
      want.insert(want.end(), one.begin(), one.end());
    }
    EXPECT_EQ(got, want) << "rank " << r;
  }
  // Ranks of a borrowed class bind their own expert-parallel and pipeline groups.
  EXPECT_EQ(BoundComm(t, 9, "ep").ranks, (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(BoundComm(t, 9, "pp").ranks, (std::vector<int32_t>{1, 9}));
  EXPECT_FALSE(HasWarning(*g, "sequence numbers jump"));
}

TEST(ObservedTrace, MoeGroupedAllToAllOfBorrowedExpertClassesUnderMirror) {
  for (bool numbered : {false, true}) {
    SCOPED_TRACE(numbered ? "copies numbered (files before)" : "copies unnumbered (seq -1)");
    MoeBorrowedExpertClasses(numbered);
  }
}

// A send or receive to a peer, or a collective, without a sequence number is refused: only a copy to the rank
// itself has none ("seq": -1).
TEST(ObservedTrace, OnlyACopyToItselfMayLackASequenceNumber) {
  const prism::world::World w = MakeEpWorld("ep=2", 2);
  JobOptions o;
  o.world = 2;
  for (const char* bad : {"peer", "collective"}) {
    SCOPED_TRACE(bad);
    std::vector<RankEventLog> logs;
    for (int r : {0, 1}) {
      RankWriter wr(r, o);
      wr.Comm(7, "EXPERT_MODEL_PARALLEL_GROUP", {0, 1}, r);
      wr.Compute(kFwdUs);
      json op = std::string(bad) == "peer" ? wr.Op(7, "send", "bf16", 4096, 1 - r, 1, kSendUs)
                                           : wr.Op(7, "allreduce", "bf16", 4096, -1, 1, kSendUs);
      if (r == 0) op["seq"] = -1;
      wr.Emit(op);
      wr.Mark(0);
      RankEventLog log;
      log.rank = r;
      int64_t n = 0;
      for (const std::string& line : wr.lines()) prism::analysis::FeedEventLine(&log, line, ++n);
      EXPECT_EQ(log.malformed, 0) << log.first_malformed;
      logs.push_back(std::move(log));
    }
    std::string err;
    EXPECT_FALSE(BuildObservedTrace(logs, w, {}, &err));
    EXPECT_NE(err.find("without a sequence number"), std::string::npos) << err;
  }
}

// What collect writes when the run ends (launch.cc calls it), and `prism-run graph build` on the same files: replica
// 0 of an ep 2 job gives a graph, and the line and the warning say what was assumed.
TEST_F(GraphCli, ReplicaZeroOfAnExpertParallelJobWritesTheGraphAndSaysSo) {
  JobOptions o;
  o.world = 64;
  WriteRun(o, /*report=*/false);
  const prism::world::World w = MakeEpWorld("tp=2,pp=2,ep=2", 64);
  std::string line = prism::analysis::WriteObservedTrace(P(""), w, ReplicaZero(64));
  EXPECT_EQ(line.rfind("observed graph " + P("observed.prism") + ": 8 classes", 0), 0u) << line;
  EXPECT_NE(line.find("4 expert-parallel class(es)"), std::string::npos) << line;
  EXPECT_NE(line.find("--real-routing"), std::string::npos) << line;
  prism::trace::Trace t;
  std::string err;
  ASSERT_TRUE(prism::replay::ReadTrace(P("observed.prism"), &t, &err)) << err;
  EXPECT_EQ(t.classes.size(), 8u);
  EXPECT_EQ(t.layout.ep, 2);
  CliResult b = RunCli("graph build " + P("") + " --layout tp=2,pp=2,ep=2 --out " + P("g.prism"));
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("EP symmetry assumed"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("class tp0-pp0-ep1"), std::string::npos) << b.out;
  CliResult s = RunCli("simulate " + P("g.prism") + " --out " + P("sim") + " --quiet");
  EXPECT_EQ(s.rc, 0) << s.out;
}
