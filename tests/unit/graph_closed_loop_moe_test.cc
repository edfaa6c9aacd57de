// A real rank of an expert-parallel job in closed loop with GraphRelease, without a GPU: libprism's engine (GPU
// boundary faked, its arrival stamps on a clock the test sets) is real rank 0 of an ep 2 MoE job, the coordinator
// runs GraphRelease over the graph `graph build` makes from the job's event files, ranks 1-3 are virtual. The MoE
// all-to-all is torch's grouped send/recv: each unit holds a send to and a receive from the rank itself, a local copy
// that the graph leaves out and libprism does not number; one unit holds only that copy. Every release must be the
// one the graph gives (hand-computed below, and the node-level closed loop's end), which holds only when the rank's
// n-th numbered operation on the ep communicator is the graph's n-th node there (docs/collect.md, "--real-routing").
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "analysis/observed_trace.h"
#include "coordinator/coordinator.h"
#include "support/graph_closed_loop.h"
#include "coordinator/release/graph_release.h"
#include "model/world.h"
#include "interpose/core/comm.h"
#include "interpose/core/config.h"
#include "interpose/core/coord_client.h"
#include "interpose/core/progress.h"
#include "interpose/core/runtime.h"
#include "interpose/core/submit.h"
#include "shim_fake_gpu.h"

namespace prism {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t kUs = 1000;
constexpr int kIterations = 3;
constexpr int64_t kUnitUs = 100;  // every all-to-all unit and the copy-only unit; the all-reduce takes kArUs
constexpr int64_t kArUs = 50;
constexpr int kEp = 0, kDp = 1;   // communicator ids in the event files

// Each rank's compute (us): before the dispatch, between dispatch and combine (around the unit of only the copy to
// itself, kUnitUs long), after the combine. Rank 1 is slower: rank 0 waits for it at every all-to-all.
struct Timing {
  int64_t before_dispatch, before_copy, after_copy, after_combine;
};
constexpr Timing kTiming[2] = {{1000, 400, 500, 300}, {1500, 900, 1000, 300}};

// Bytes rank `from` sends rank `to` in the dispatch (the combine sends them back).
uint64_t Split(int from, int to) { return 1024u * static_cast<uint64_t>(1 + from + 2 * to); }

// The event file of rank `r` (0 or 1) as libprism writes it: the copy to itself listed with "seq": -1.
analysis::RankEventLog EventLog(int r) {
  std::vector<std::string> lines;
  lines.push_back(json{{"type", "hello"}, {"v", 1}, {"rank", r}, {"world_size", 4}, {"pid", 100 + r}, {"host", "h"},
                       {"gpu", r}, {"t_ns", 0}}
                      .dump());
  lines.push_back(json{{"type", "comm"}, {"comm_id", kEp}, {"key", "ep"}, {"desc", "EXPERT_MODEL_PARALLEL_GROUP"},
                       {"name", "ep0"}, {"nranks", 2}, {"rank", r}, {"members", {0, 1}}}
                      .dump());
  lines.push_back(json{{"type", "comm"}, {"comm_id", kDp}, {"key", "dp"}, {"desc", "DATA_PARALLEL_GROUP"},
                       {"name", "dp"}, {"nranks", 4}, {"rank", r}, {"members", {0, 1, 2, 3}}}
                      .dump());
  int64_t t = 1'000'000'000, seq[2] = {0, 0}, sseq = 0;
  auto unit = [&](int comm, const std::string& op, int64_t dur_us, const json& ops, uint64_t bytes, int nops) {
    // The unit's sequence: its first numbered operation's, -1 for a unit of only the copy.
    int64_t first = -1;
    for (const json& o : ops)
      if (o.at("seq").get<int64_t>() >= 0 && first < 0) first = o.at("seq").get<int64_t>();
    json j = {{"type", "op"},      {"comm_id", comm}, {"seq", ops.empty() ? seq[comm]++ : first}, {"op", op},
              {"dtype", "bf16"},   {"bytes", bytes},  {"peer", -1},  {"arrival_ns", t},
              {"release_ns", t + dur_us * kUs},       {"model_dur_ns", dur_us * kUs},  {"wait_on_rank", -1},
              {"nops", nops},      {"root", -1},      {"stream", 1}, {"sseq", sseq++}};
    if (!ops.empty()) j["ops"] = ops;
    lines.push_back(j.dump());
    t += dur_us * kUs;
  };
  auto entry = [&](const std::string& op, uint64_t bytes, int peer) {
    const bool self = peer == r;
    return json{{"op", op},     {"dtype", "bf16"}, {"bytes", bytes},
                {"peer", peer}, {"root", -1},      {"comm_id", kEp}, {"seq", self ? -1 : seq[kEp]++}};
  };
  // torch's order: a send and a receive per member in turn, the rank itself included.
  auto all_to_all = [&](bool combine) {
    json ops = json::array();
    uint64_t total = 0;
    for (int q = 0; q < 2; ++q) {
      const uint64_t out = combine ? Split(q, r) : Split(r, q), in = combine ? Split(r, q) : Split(q, r);
      ops.push_back(entry("send", out, q));
      ops.push_back(entry("recv", in, q));
      total += out + in;
    }
    unit(kEp, "group", kUnitUs, ops, total, 4);
  };
  auto mark = [&](int it) {
    lines.push_back(json{{"type", "iter"}, {"iteration", it}, {"t_ns", t}, {"dur_ns", 0}, {"peak_bytes", 1}}.dump());
  };
  // Why a mark first: the graph keeps the compute before an iteration's first operation only after a mark.
  mark(0);
  const Timing& tm = kTiming[r];
  for (int it = 1; it <= kIterations; ++it) {
    t += tm.before_dispatch * kUs;
    all_to_all(false);
    t += tm.before_copy * kUs;
    unit(kEp, "group", kUnitUs, json::array({entry("send", Split(r, r), r), entry("recv", Split(r, r), r)}),
         2 * Split(r, r), 2);
    t += tm.after_copy * kUs;
    all_to_all(true);
    t += tm.after_combine * kUs;
    unit(kDp, "allreduce", kArUs, json::array(), 4096, 1);
    mark(it);
  }
  analysis::RankEventLog log;
  log.rank = r;
  int64_t n = 0;
  for (const std::string& l : lines) analysis::FeedEventLine(&log, l, ++n);
  return log;
}

// GraphRelease, with every decision kept: (comm, seq, nops of the arrival, release).
class Recorder : public coord::ReleasePolicy {
 public:
  explicit Recorder(coord::GraphRelease* g) : g_(g) {}
  coord::ReleaseDecision Decide(const coord::CommView& comm, uint64_t seq,
                                std::span<const coord::Arrival> arrivals) override {
    coord::ReleaseDecision d = g_->Decide(comm, seq, arrivals);
    std::lock_guard<std::mutex> l(mu_);
    decisions_.push_back({comm.members.size() == 2 ? kEp : kDp, seq, arrivals.empty() ? 0 : arrivals[0].op.nops,
                          d.release_ns});
    return d;
  }
  bool Idle(int64_t budget_ns, const std::function<bool()>& stop) override { return g_->Idle(budget_ns, stop); }
  std::optional<Prerelease> Predict(const coord::CommView& comm, uint64_t seq, int rank) override {
    return g_->Predict(comm, seq, rank);
  }
  uint64_t PredictEpoch() const override { return g_->PredictEpoch(); }

  struct Decision {
    int comm;
    uint64_t seq;
    uint32_t nops;
    uint64_t release_ns;
  };
  size_t size() {
    std::lock_guard<std::mutex> l(mu_);
    return decisions_.size();
  }
  // The k-th decision, waiting up to 5 s for it.
  std::optional<Decision> Wait(size_t k) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < end) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (decisions_.size() > k) return decisions_[k];
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return std::nullopt;
  }

 private:
  coord::GraphRelease* g_;
  std::mutex mu_;
  std::vector<Decision> decisions_;
};

// The fake GPU stamps arrivals with the test's clock: the rank reaches each unit when the test says.
class ClockGpu : public interpose::testing::FakeGpu {
 public:
  CUresult Stamp(CUstream, uint32_t slot) override {
    arrival[slot % interpose::kGateSlots] = now.load();
    return CUDA_SUCCESS;
  }
  std::atomic<uint64_t> now{0};
};

TEST(GraphClosedLoopMoe, RealRankWhoseUnitsHoldCopiesToItselfIsReleasedAsTheGraphSays) {
  std::string err;
  auto layout = world::ParseLayout("ep=2", &err);
  ASSERT_TRUE(layout) << err;
  ASSERT_TRUE(world::ResolveLayout(&*layout, 4, "test", &err)) << err;
  auto w = world::World::Make(*layout, 8, &err);
  ASSERT_TRUE(w) << err;
  ASSERT_EQ(w->GroupOf("ep", 0), (std::vector<int>{0, 1}));
  // What `collect --real-routing` writes for this job: ranks 0 and 1, one of each expert-parallel class.
  auto g = analysis::BuildObservedTrace({EventLog(0), EventLog(1)}, *w, {}, &err);
  ASSERT_TRUE(g) << err;
  trace::Trace t = g->trace;
  // Why recorded durations: the decisions then follow the graph alone (not the shim's cost model).
  for (auto& c : t.classes)
    for (auto& s : c.streams)
      for (auto& n : s.nodes)
        if (n.kind != trace::NodeKind::kCompute) n.dur_us = n.kind == trace::NodeKind::kColl ? kArUs : kUnitUs;

  coord::GraphRelease gr(t, {0});
  Recorder rec(&gr);
  const fs::path out = fs::path(::testing::TempDir()) / ("closed-loop-moe-" + std::to_string(::getpid()));
  fs::remove_all(out);
  fs::create_directories(out);
  coord::CoordinatorOptions o;
  o.world_size = 4;
  o.real_ranks = {0};
  o.out_dir = out.string();
  o.passthrough = false;
  o.hang_timeout_s = 0;
  o.release_policy = &rec;
  auto coordinator = coord::Coordinator::Start(o, &err);
  ASSERT_TRUE(coordinator) << err;
  coordinator->RegisterGroup("ep0", {0, 1}, "EXPERT_MODEL_PARALLEL_GROUP");

  ClockGpu gpu;
  interpose::Config c;
  c.rank = 0;
  c.world_size = 4;
  c.real_ranks = {0};
  c.graph = "graph.prism";  // every communicator through the coordinator, which replays the graph
  c.fixed_dur_us = kUnitUs;  // the unit of only the copy is released locally, kUnitUs after its arrival
  c.coord_socket = coordinator->endpoints().socket_path;
  interpose::ScopedRuntime rt({.config = c, .gpu = &gpu});
  interpose::RegisterGroup("ep0", {0, 1}, "EXPERT_MODEL_PARALLEL_GROUP");
  auto init = [](int nranks) {
    ncclUniqueId id;
    interpose::GetUniqueId(&id);
    interpose::InitArgs a;
    a.nranks = nranks;
    a.rank = 0;
    a.ids = &id;
    interpose::Comm* comm = nullptr;
    EXPECT_EQ(interpose::CommInit(a, &comm), ncclSuccess);
    return comm;
  };
  interpose::Comm* ep = init(2);
  interpose::Comm* dp = init(4);
  ASSERT_TRUE(ep && dp);
  ASSERT_EQ(ep->members, (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(ep->use_coordinator && dp->use_coordinator);

  std::vector<std::vector<uint16_t>> bufs;
  auto p2p = [&](payload::OpKind kind, int peer, uint64_t bytes) {
    bufs.emplace_back(bytes / 2);
    interpose::OpCall op;
    op.op = kind;
    op.comm = ep;
    op.dtype = ncclBfloat16;
    op.count = bytes / 2;
    op.peer = peer;
    if (kind == payload::OpKind::kSend) op.send = bufs.back().data();
    else op.recv = bufs.back().data();
    return interpose::Submit(op);
  };
  auto all_to_all = [&](bool combine) {
    EXPECT_EQ(interpose::GroupStart(), ncclSuccess);
    for (int q = 0; q < 2; ++q) {
      EXPECT_EQ(p2p(payload::OpKind::kSend, q, combine ? Split(q, 0) : Split(0, q)), ncclSuccess);
      EXPECT_EQ(p2p(payload::OpKind::kRecv, q, combine ? Split(0, q) : Split(q, 0)), ncclSuccess);
    }
    EXPECT_EQ(interpose::GroupEnd(), ncclSuccess);
  };
  bufs.reserve(1024);
  std::vector<uint16_t> grads(2048);
  size_t decided = 0;
  // The rank runs its own compute (kTiming[0]) from each release it got: arrivals on the test's clock.
  auto release = [&](uint64_t arrival) -> int64_t {
    EXPECT_TRUE(interpose::ProgressDrain(5000000000ull));
    std::optional<Recorder::Decision> d = rec.Wait(decided++);
    if (!d) {
      ADD_FAILURE() << "no decision " << decided - 1;
      return static_cast<int64_t>(arrival);
    }
    return static_cast<int64_t>(d->release_ns);
  };
  const Timing& tm = kTiming[0];
  std::vector<int64_t> releases_us;  // after graph time 0 (coord::kClosedLoopT0)
  int64_t now = coord::kClosedLoopT0 + tm.before_dispatch * kUs;
  for (int it = 0; it < kIterations; ++it) {
    gpu.now = static_cast<uint64_t>(now);
    all_to_all(false);
    now = release(gpu.now);
    releases_us.push_back((now - coord::kClosedLoopT0) / kUs);
    now += tm.before_copy * kUs;
    gpu.now = static_cast<uint64_t>(now);
    EXPECT_EQ(interpose::GroupStart(), ncclSuccess);
    EXPECT_EQ(p2p(payload::OpKind::kSend, 0, Split(0, 0)), ncclSuccess);
    EXPECT_EQ(p2p(payload::OpKind::kRecv, 0, Split(0, 0)), ncclSuccess);
    EXPECT_EQ(interpose::GroupEnd(), ncclSuccess);
    EXPECT_TRUE(interpose::ProgressDrain(5000000000ull));
    now += (kUnitUs + tm.after_copy) * kUs;  // released locally at its arrival plus its duration
    gpu.now = static_cast<uint64_t>(now);
    all_to_all(true);
    now = release(gpu.now);
    releases_us.push_back((now - coord::kClosedLoopT0) / kUs);
    now += tm.after_combine * kUs;
    gpu.now = static_cast<uint64_t>(now);
    interpose::OpCall ar;
    ar.op = payload::OpKind::kAllReduce;
    ar.comm = dp;
    ar.dtype = ncclBfloat16;
    ar.count = grads.size();
    ar.send = grads.data();
    ar.recv = grads.data();
    EXPECT_EQ(interpose::Submit(ar), ncclSuccess);
    now = release(gpu.now);
    releases_us.push_back((now - coord::kClosedLoopT0) / kUs);
    now += tm.before_dispatch * kUs;
  }
  // Graph time (us): rank 0 reaches the dispatch at 1000, virtual rank 1 at 1500: both done at 1600. The combine:
  // rank 0 at 1600 + 1000, rank 1 at 1600 + 2000 = 3600: done at 3700. The all-reduce: all four at 3700 + 300,
  // done at 4050; the next iteration starts there.
  EXPECT_EQ(releases_us, (std::vector<int64_t>{1600, 3700, 4050, 5650, 7750, 8100, 9700, 11800, 12150}));
  // The rank's arrivals as the coordinator got them: each all-to-all counts its two peer operations from the first
  // one's sequence, the copy-only unit none.
  std::vector<std::tuple<int, uint64_t, uint32_t>> seen;
  for (size_t k = 0; k < decided; ++k)
    if (auto d = rec.Wait(k)) seen.emplace_back(d->comm, d->seq, d->nops);
  EXPECT_EQ(seen, (std::vector<std::tuple<int, uint64_t, uint32_t>>{{kEp, 0, 2}, {kEp, 2, 2}, {kDp, 0, 1},
                                                                     {kEp, 4, 2}, {kEp, 6, 2}, {kDp, 1, 1},
                                                                     {kEp, 8, 2}, {kEp, 10, 2}, {kDp, 2, 1}}));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(rec.size(), decided) << "more decisions than the units the rank waited for";
  coord::GraphRelease::Stats st = gr.stats();
  EXPECT_EQ(st.unmatched, 0u);
  EXPECT_EQ(st.blocked, 0u);
  EXPECT_EQ(st.decided, 9u);
  // The node-level closed loop (graph_closed_loop.h: every node of the rank's class numbered in the graph's order)
  // ends where the rank does.
  coord::ClosedLoopOptions lo;
  coord::LoopResult loop = coord::ClosedLoop(t, 0, lo);
  EXPECT_EQ(loop.end_ns, 12150 * kUs);
  EXPECT_EQ(loop.stats.unmatched, 0u);

  coordinator->Stop();
  fs::remove_all(out);
}

}  // namespace
}  // namespace prism
