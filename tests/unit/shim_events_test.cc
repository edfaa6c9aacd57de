// The rank's event file (include/prism/events.h) as libprism writes it: hello, comm (and its superseding line
// once members are known), op with arrival/release, iter from an iteration mark, mem, bye.
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "interpose/core/comm.h"
#include "interpose/core/config.h"
#include "interpose/core/event_log.h"
#include "interpose/core/iteration.h"
#include "interpose/core/memory.h"
#include "interpose/core/progress.h"
#include "interpose/core/recorded.h"
#include "interpose/core/runtime.h"
#include "interpose/core/streams.h"
#include "interpose/core/submit.h"
#include "shim_fake_gpu.h"

namespace prism::interpose {
namespace {

TEST(ShimEvents, FileHasEveryKindOfLine) {
  testing::FakeGpu gpu;
  auto dir = std::filesystem::temp_directory_path() / ("prism_events_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  Config c;
  c.rank = 3;
  c.world_size = 16;
  c.real_ranks = {3};
  c.fixed_dur_us = 500;
  c.out_dir = dir.string();
  c.errors = {"PRISM_GATE='x' is not wait, spin or none; using wait"};
  ScopedRuntime rt({.config = c, .gpu = &gpu});

  ncclUniqueId id;
  ASSERT_EQ(GetUniqueId(&id), ncclSuccess);
  InitArgs a;
  a.nranks = 4;
  a.rank = 1;
  a.ids = &id;
  Comm* comm = nullptr;
  BeginGroupScope({2, 3, 4, 5});
  ASSERT_EQ(CommInit(a, &comm), ncclSuccess);
  RegisterGroup("2", {2, 3, 4, 5}, "TENSOR_MODEL_PARALLEL_GROUP");
  std::vector<uint16_t> buf(128);
  OpCall call;
  call.op = payload::OpKind::kAllGather;
  call.comm = comm;
  call.count = 32;
  call.dtype = ncclBfloat16;
  call.send = buf.data();
  call.recv = buf.data();
  ASSERT_EQ(Submit(call), ncclSuccess);
  memory::RecordAlloc(reinterpret_cast<void*>(0x1000), 4096);
  IterationMark(nullptr, 12345);
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  usleep(300000);  // the writer flushes every 200 ms
  EventLogStop();

  std::ifstream in(EventLogPath());
  ASSERT_TRUE(in.good()) << EventLogPath();
  EXPECT_EQ(std::filesystem::path(EventLogPath()).filename(), "rank3.events.jsonl");
  std::map<std::string, std::vector<nlohmann::json>> by_type;
  std::string line;
  std::string first;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);  // every line is one JSON object
    if (first.empty()) first = j.at("type");
    by_type[j.at("type")].push_back(j);
  }
  EXPECT_EQ(first, "hello");
  EXPECT_EQ(by_type["hello"].at(0).at("rank"), 3);
  EXPECT_EQ(by_type["hello"].at(0).at("world_size"), 16);
  ASSERT_EQ(by_type["error"].size(), 1u);
  ASSERT_GE(by_type["comm"].size(), 1u);
  const nlohmann::json& cm = by_type["comm"].back();
  EXPECT_EQ(cm.at("members"), nlohmann::json({2, 3, 4, 5}));
  EXPECT_EQ(cm.at("name"), "2");
  EXPECT_EQ(cm.at("desc"), "TENSOR_MODEL_PARALLEL_GROUP");
  ASSERT_EQ(by_type["op"].size(), 1u);
  const nlohmann::json& op = by_type["op"][0];
  EXPECT_EQ(op.at("op"), "allgather");
  EXPECT_EQ(op.at("dtype"), "bf16");
  EXPECT_EQ(op.at("bytes"), 32 * 2 * 4);
  EXPECT_EQ(op.at("release_ns").get<uint64_t>() - op.at("arrival_ns").get<uint64_t>(), 500000u);
  EXPECT_EQ(op.at("model_dur_ns"), 500000);
  EXPECT_EQ(op.at("cost"), "fixed");
  EXPECT_FALSE(op.contains("gate_open_ns")) << "only with PRISM_GATE_OPEN_STAMPS=1";
  // Always: when the gate opened (GPU clock), at or after the release (on time here: within the thread's jitter).
  ASSERT_TRUE(op.contains("opened_ns"));
  EXPECT_GE(op.at("opened_ns").get<uint64_t>(), op.at("release_ns").get<uint64_t>());
  EXPECT_LT(op.at("opened_ns").get<uint64_t>(), op.at("release_ns").get<uint64_t>() + 100000000u);
  ASSERT_EQ(by_type["iter"].size(), 1u);
  EXPECT_EQ(by_type["iter"][0].at("torch_max_allocated"), 12345);
  EXPECT_EQ(by_type["iter"][0].at("clock"), "gpu");
  ASSERT_GE(by_type["mem"].size(), 1u);
  EXPECT_EQ(by_type["mem"].back().at("peak_bytes"), 4096);
  ASSERT_EQ(by_type["bye"].size(), 1u);
  // libprism's host time per unit, so that a run's cost per collective can be read from its file.
  const nlohmann::json& bye = by_type["bye"][0];
  ASSERT_TRUE(bye.contains("host_ns")) << bye.dump();
  EXPECT_GE(bye.at("host_ns").at("units").get<uint64_t>(), 1u);
  EXPECT_GT(bye.at("host_ns").at("p50").get<uint64_t>(), 0u);
  EXPECT_LE(bye.at("host_ns").at("p50").get<uint64_t>(), bye.at("host_ns").at("p90").get<uint64_t>());
  // libprism's own share (less the driver calls) is part of the whole
  EXPECT_LE(bye.at("host_ns").at("own_p50").get<uint64_t>(), bye.at("host_ns").at("p50").get<uint64_t>());
  EXPECT_GT(bye.at("host_ns").at("own_p50").get<uint64_t>(), 0u);
  // ... and where it went, by phase of the unit: with one sampled unit the phases add up to its own time (the
  // histogram's 25 ns bucket, and the last mark's clock read, apart).
  ASSERT_TRUE(bye.contains("host_phase_mean_ns")) << bye.dump();
  const nlohmann::json& ph = bye.at("host_phase_mean_ns");
  ASSERT_EQ(ph.at("sampled").get<uint64_t>(), 1u) << ph.dump();
  uint64_t phases = 0;
  for (const char* name : {"enter", "plan", "steps", "time", "gate", "describe", "push", "count"})
    phases += ph.at(name).get<uint64_t>();
  const uint64_t own = bye.at("host_ns").at("own_p50").get<uint64_t>();
  EXPECT_GE(phases + 25, own) << ph.dump();
  EXPECT_LE(phases, own + 5000) << ph.dump();
  ASSERT_TRUE(bye.contains("host_phase_driver_mean_ns")) << bye.dump();
  uint64_t driver = 0;
  for (const auto& [name, ns] : bye.at("host_phase_driver_mean_ns").items()) driver += ns.get<uint64_t>();
  EXPECT_EQ(driver, ph.at("driver").get<uint64_t>()) << "the driver time by phase adds up to the unit's";
  std::filesystem::remove_all(dir);
}

// PRISM_GATE_OPEN_STAMPS=1 (gate diagnosis): the stream stamps right after the gate, and the op line waits for that
// stamp and carries it with the GPU time the progress thread wrote the gate word.
TEST(ShimEvents, GateOpenStampsAreLoggedWithTheirUnit) {
  testing::FakeGpu gpu;
  auto dir = std::filesystem::temp_directory_path() / ("prism_events_open_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  Config c;
  c.rank = 0;
  c.world_size = 8;
  c.real_ranks = {0};
  c.fixed_dur_us = 200;
  c.out_dir = dir.string();
  c.gate_open_stamps = true;
  ScopedRuntime rt({.config = c, .gpu = &gpu});
  ncclUniqueId id;
  ASSERT_EQ(GetUniqueId(&id), ncclSuccess);
  InitArgs a;
  a.nranks = 8;
  a.rank = 0;
  a.ids = &id;
  Comm* comm = nullptr;
  ASSERT_EQ(CommInit(a, &comm), ncclSuccess);
  std::vector<float> buf(64);
  OpCall call;
  call.op = payload::OpKind::kAllReduce;
  call.comm = comm;
  call.count = 64;
  call.dtype = ncclFloat32;
  call.redop = ncclSum;
  call.send = buf.data();
  call.recv = buf.data();
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Submit(call), ncclSuccess);
  ASSERT_TRUE(ProgressDrain(5000000000ull)) << "units waiting for their open stamp count as not released";
  usleep(300000);
  EventLogStop();
  std::ifstream in(EventLogPath());
  std::string line;
  int ops = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("type") != "op") continue;
    ++ops;
    ASSERT_TRUE(j.contains("gate_open_ns")) << line;
    EXPECT_GT(j.at("gate_open_ns").get<uint64_t>(), 0u);
    // The written time is on the GPU clock, at or after the release target less the release latency.
    EXPECT_GE(j.at("gate_written_ns").get<uint64_t>() + 1000000, j.at("release_ns").get<uint64_t>()) << line;
    EXPECT_GE(j.at("opened_ns").get<uint64_t>(), j.at("gate_written_ns").get<uint64_t>()) << line;
  }
  EXPECT_EQ(ops, 3);
  std::filesystem::remove_all(dir);
}

// One real rank (`rank` of `nranks`) on a fake GPU (G: testing::FakeGpu or one derived from it), writing its event
// file into a fresh directory, with one communicator of the whole world.
struct RunOptions {
  int gate_toggle = 0;
  double fixed_dur_us = 10;
  bool gate_open_stamps = false;
};

template <typename G>
struct EventsRunOn {
  G gpu;
  std::filesystem::path dir;
  std::optional<ScopedRuntime> rt;
  Comm* comm = nullptr;
  EventsRunOn(const std::string& tag, int rank, int nranks, RunOptions o = {}) {
    dir = std::filesystem::temp_directory_path() / ("prism_events_" + tag + "_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    Config c;
    c.rank = rank;
    c.world_size = nranks;
    c.real_ranks = {rank};
    c.fixed_dur_us = o.fixed_dur_us;
    c.out_dir = dir.string();
    c.gate_toggle = o.gate_toggle;
    c.gate_open_stamps = o.gate_open_stamps;
    rt.emplace(Runtime::Parts{.config = c, .gpu = &gpu});
    ncclUniqueId id;
    InitArgs a;
    a.nranks = nranks;
    a.rank = rank;
    a.ids = &id;
    if (GetUniqueId(&id) != ncclSuccess || CommInit(a, &comm) != ncclSuccess) comm = nullptr;
  }
  ~EventsRunOn() {
    std::filesystem::remove_all(dir);
  }
  // Releases every unit and closes the event file; false when units were still held.
  bool Finish() {
    const bool drained = ProgressDrain(5000000000ull);
    usleep(300000);
    EventLogStop();
    return drained;
  }
  // An fp32 sum all-reduce of `buf` on `stream`.
  ncclResult_t AllReduce(std::vector<float>* buf, cudaStream_t stream) {
    OpCall call;
    call.op = payload::OpKind::kAllReduce;
    call.comm = comm;
    call.count = buf->size();
    call.send = buf->data();
    call.recv = buf->data();
    call.stream = stream;
    return Submit(call);
  }
};
using EventsRun = EventsRunOn<testing::FakeGpu>;

// The event file's lines of `type`, in file order.
std::vector<nlohmann::json> LinesOf(const std::string& type) {
  std::ifstream in(EventLogPath());
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("type") == type) out.push_back(std::move(j));
  }
  return out;
}

// A GPU whose arrival stamps are not in the arrival words (as event stamps are not): the progress thread must take
// arrivals, open stamps included, through Gpu::Arrival, and a cleared slot must read 0 until stamped again.
class EventStampGpu : public testing::FakeGpu {
 public:
  CUresult Stamp(CUstream, uint32_t slot) override {
    std::lock_guard<std::mutex> l(stamp_mu);
    stamps[slot % kGateSlots] = next_stamp += 1000;
    return CUDA_SUCCESS;
  }
  uint64_t Arrival(uint32_t slot) override {
    std::lock_guard<std::mutex> l(stamp_mu);
    auto it = stamps.find(slot % kGateSlots);
    return it == stamps.end() ? 0 : it->second;
  }
  void ClearArrival(uint32_t slot) override {
    std::lock_guard<std::mutex> l(stamp_mu);
    stamps.erase(slot % kGateSlots);
  }
  std::mutex stamp_mu;
  std::map<uint32_t, uint64_t> stamps;
  uint64_t next_stamp = 5000000000000ull;
};

TEST(ShimEvents, ArrivalsAreReadThroughTheGpuNotItsWords) {
  EventsRunOn<EventStampGpu> run("arrival", 0, 8, {.fixed_dur_us = 50, .gate_open_stamps = true});
  ASSERT_NE(run.comm, nullptr);
  std::vector<float> buf(64);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(run.AllReduce(&buf, nullptr), ncclSuccess);
  ASSERT_TRUE(run.Finish()) << "a unit waited for an arrival it could only see through Arrival()";
  EventStampGpu& gpu = run.gpu;
  for (uint64_t w : gpu.arrival) EXPECT_EQ(w, 0u);
  std::vector<uint64_t> arrivals;
  for (const nlohmann::json& j : LinesOf("op")) {
    arrivals.push_back(j.at("arrival_ns").get<uint64_t>());
    // Each unit takes two stamps (arrival, then its gate's opening), 1000 ns apart on this fake's clock.
    EXPECT_EQ(j.at("gate_open_ns").get<uint64_t>(), arrivals.back() + 1000) << j.dump();
    EXPECT_EQ(j.at("release_ns").get<uint64_t>(), arrivals.back() + 50000) << j.dump();
  }
  std::sort(arrivals.begin(), arrivals.end());  // lines are in release order; these were all due at once
  EXPECT_EQ(arrivals, (std::vector<uint64_t>{5000000001000ull, 5000000003000ull, 5000000005000ull}));
}

// Of a stream's units waiting for their arrival the progress thread reads the earliest only (and all of them every
// 64th pass): while 40 units' stamps on one stream have not landed, the first unit's slot is read many times more
// often than the last one's; once the stamps land every unit is released.
class CountingGpu : public EventStampGpu {
 public:
  CUresult Stamp(CUstream s, uint32_t slot) override {
    std::lock_guard<std::mutex> l(stamp_mu);
    held.push_back(slot % kGateSlots);
    return CUDA_SUCCESS;
  }
  uint64_t Arrival(uint32_t slot) override {
    {
      std::lock_guard<std::mutex> l(count_mu);
      ++reads[slot % kGateSlots];
    }
    return EventStampGpu::Arrival(slot);
  }
  void Land() {
    std::lock_guard<std::mutex> l(stamp_mu);
    for (uint32_t slot : held) stamps[slot] = next_stamp += 1000;
  }
  uint64_t ReadsOf(uint32_t slot) {
    std::lock_guard<std::mutex> l(count_mu);
    return reads[slot];
  }
  std::mutex count_mu;
  std::map<uint32_t, uint64_t> reads;
  std::vector<uint32_t> held;  // stamped slots, in order
};

TEST(ShimEvents, OnlyTheEarliestUnitOfAStreamIsReadForItsArrival) {
  EventsRunOn<CountingGpu> run("earliest", 0, 8);
  ASSERT_NE(run.comm, nullptr);
  CountingGpu& gpu = run.gpu;
  std::vector<float> buf(64);
  constexpr int kUnits = 40;
  for (int i = 0; i < kUnits; ++i) ASSERT_EQ(run.AllReduce(&buf, nullptr), ncclSuccess);
  uint32_t first = 0, last = 0;
  {
    std::lock_guard<std::mutex> l(gpu.stamp_mu);
    ASSERT_EQ(gpu.held.size(), static_cast<size_t>(kUnits));
    first = gpu.held.front();
    last = gpu.held.back();
  }
  for (int i = 0; i < 400 && gpu.ReadsOf(first) < 640; ++i) usleep(1000);  // a pass every 2 us or more
  ASSERT_GE(gpu.ReadsOf(first), 640u) << "the progress thread did not poll";
  EXPECT_LE(gpu.ReadsOf(last) * 8, gpu.ReadsOf(first))
      << "the last unit's slot was read " << gpu.ReadsOf(last) << " times, the first's " << gpu.ReadsOf(first);
  EXPECT_GE(gpu.ReadsOf(last), 1u) << "every 64th pass reads every unit";
  gpu.Land();
  EXPECT_TRUE(ProgressDrain(5000000000ull)) << "units behind the earliest were never read once it arrived";
}

// A unit released here at its own arrival (world 1: the cost model gives a one-member communicator 0) holds no gate:
// its op line still has the arrival, and its release is that arrival. One of a larger communicator is gated.
TEST(ShimEvents, AUnitOfDurationZeroReleasedHereHoldsNoGate) {
  {
    EventsRun run("nogate", 0, 1, {.fixed_dur_us = -1});
    ASSERT_NE(run.comm, nullptr);
    std::vector<float> buf(16);
    ASSERT_EQ(run.AllReduce(&buf, nullptr), ncclSuccess);
    EXPECT_EQ(run.gpu.gates.size(), 0u);
    ASSERT_TRUE(run.Finish());
    std::vector<nlohmann::json> ops = LinesOf("op");
    ASSERT_EQ(ops.size(), 1u);
    EXPECT_GT(ops[0].at("arrival_ns").get<uint64_t>(), 0u);
    EXPECT_EQ(ops[0].at("release_ns"), ops[0].at("arrival_ns"));
    EXPECT_FALSE(ops[0].contains("opened_ns")) << "no gate was opened";
  }
  EventsRun run("gate", 0, 4, {.fixed_dur_us = -1});
  ASSERT_NE(run.comm, nullptr);
  std::vector<float> buf(16);
  ASSERT_EQ(run.AllReduce(&buf, nullptr), ncclSuccess);
  EXPECT_EQ(run.gpu.gates.size(), 1u);
  ASSERT_TRUE(run.Finish());
}

// PRISM_GATE_TOGGLE=2: after iteration mark m the units are gated when (m / 2) is even, and before the first mark;
// the ungated ones still get their arrival stamp and their op line.
TEST(ShimEvents, GateToggleSwitchesGatesAtIterationMarks) {
  EventsRun run("gate_toggle", 0, 1, {.gate_toggle = 2});
  ASSERT_NE(run.comm, nullptr);
  std::vector<float> buf(16);
  std::vector<size_t> gates_after;
  ASSERT_EQ(run.AllReduce(&buf, nullptr), ncclSuccess);
  gates_after.push_back(run.gpu.gates.size());
  for (int m = 0; m < 5; ++m) {
    IterationMark(nullptr, 0);
    ASSERT_EQ(run.AllReduce(&buf, nullptr), ncclSuccess);
    gates_after.push_back(run.gpu.gates.size());
  }
  // Before mark 0: gated; after marks 0, 1: gated; after 2, 3: not; after 4: gated again.
  EXPECT_EQ(gates_after, (std::vector<size_t>{1, 2, 3, 3, 3, 4}));
  ASSERT_TRUE(run.Finish());
  EXPECT_EQ(LinesOf("op").size(), 6u);
}

// Cross-stream dependencies: a stream that waits (cudaStreamWaitEvent) for an event recorded on another stream after
// one of its units gets a "wait" line naming both units by their position on their stream (op lines' "sseq").
TEST(ShimEvents, StreamWaitingForAnotherStreamsUnitWritesAWaitLine) {
  EventsRun run("wait", 0, 2);
  ASSERT_NE(run.comm, nullptr);
  std::vector<float> buf(16);
  auto* compute = reinterpret_cast<cudaStream_t>(0x100);
  auto* p2p = reinterpret_cast<cudaStream_t>(0x200);
  auto* ev = reinterpret_cast<cudaEvent_t>(0x300);
  ASSERT_EQ(run.AllReduce(&buf, compute), ncclSuccess);  // compute: unit 0
  ASSERT_EQ(run.AllReduce(&buf, p2p), ncclSuccess);      // p2p: unit 0
  ASSERT_EQ(run.AllReduce(&buf, p2p), ncclSuccess);      // p2p: unit 1
  NoteEventRecord(ev, p2p);          // after p2p's unit 1
  NoteStreamWaitEvent(compute, ev);  // compute's unit 1 waits for it
  NoteStreamWaitEvent(compute, ev);  // the same point again: no second line
  NoteStreamWaitEvent(p2p, ev);      // its own stream: nothing
  auto* unknown = reinterpret_cast<cudaStream_t>(0x400);
  NoteEventRecord(ev, unknown);      // a stream without units: the event is forgotten
  NoteStreamWaitEvent(compute, ev);
  ASSERT_EQ(run.AllReduce(&buf, compute), ncclSuccess);
  ASSERT_TRUE(run.Finish());
  std::vector<nlohmann::json> waits = LinesOf("wait"), ops = LinesOf("op");
  ASSERT_EQ(ops.size(), 4u);
  std::map<std::pair<int, int>, int> sseq;  // (stream, sseq) -> count
  for (const auto& o : ops) ++sseq[{o.at("stream").get<int>(), o.at("sseq").get<int>()}];
  EXPECT_EQ(sseq, (std::map<std::pair<int, int>, int>{{{0, 0}, 1}, {{0, 1}, 1}, {{1, 0}, 1}, {{1, 1}, 1}}));
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_EQ(waits[0], nlohmann::json({{"type", "wait"}, {"stream", 0}, {"next", 1}, {"on", 1}, {"after", 1}}));
}

// Dependencies through a stream without units (torch's compute stream): the compute stream waits for the
// tensor-parallel stream's unit (work.wait()), an event recorded on it afterwards carries that point, and the
// pipeline stream that waits for the event depends on the tensor-parallel unit (a "wait" line on it), so the graph
// does not take the tensor-parallel wait for the pipeline stream's compute.
TEST(ShimEvents, WaitsPassThroughAStreamWithoutUnits) {
  EventsRun run("wait2", 0, 2);
  ASSERT_NE(run.comm, nullptr);
  std::vector<float> buf(16);
  auto* tp = reinterpret_cast<cudaStream_t>(0x1100);
  auto* pp = reinterpret_cast<cudaStream_t>(0x1200);
  auto* compute = reinterpret_cast<cudaStream_t>(0x1300);
  auto* tp_done = reinterpret_cast<cudaEvent_t>(0x1400);
  auto* fwd_done = reinterpret_cast<cudaEvent_t>(0x1500);
  ASSERT_EQ(run.AllReduce(&buf, pp), ncclSuccess);  // pp: unit 0 (stream index 0)
  ASSERT_EQ(run.AllReduce(&buf, tp), ncclSuccess);  // tp: unit 0 (stream index 1)
  ASSERT_EQ(run.AllReduce(&buf, tp), ncclSuccess);  // tp: unit 1
  NoteEventRecord(tp_done, tp);             // after tp's unit 1
  NoteStreamWaitEvent(compute, tp_done);    // compute waits for it: no line (compute has no units)
  NoteEventRecord(fwd_done, compute);       // carries tp:1
  NoteStreamWaitEvent(pp, fwd_done);        // pp's unit 1 depends on tp:1
  NoteStreamWaitEvent(pp, fwd_done);        // again: no second line
  NoteEventRecord(fwd_done, compute);       // still tp:1: pp waiting again logs nothing
  NoteStreamWaitEvent(pp, fwd_done);
  NoteStreamWaitEvent(tp, fwd_done);        // tp waiting for its own point: nothing
  ASSERT_EQ(run.AllReduce(&buf, pp), ncclSuccess);
  ASSERT_EQ(run.AllReduce(&buf, tp), ncclSuccess);  // tp: unit 2
  NoteEventRecord(tp_done, tp);             // after tp's unit 2
  NoteStreamWaitEvent(compute, tp_done);
  NoteEventRecord(fwd_done, compute);       // carries tp:2 and pp's nothing
  NoteStreamWaitEvent(pp, fwd_done);        // pp's unit 2 depends on tp:2
  ASSERT_EQ(run.AllReduce(&buf, pp), ncclSuccess);
  ASSERT_TRUE(run.Finish());
  std::vector<nlohmann::json> waits = LinesOf("wait");
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_EQ(waits[0], nlohmann::json({{"type", "wait"}, {"stream", 0}, {"next", 1}, {"on", 1}, {"after", 1}}));
  EXPECT_EQ(waits[1], nlohmann::json({{"type", "wait"}, {"stream", 0}, {"next", 2}, {"on", 1}, {"after", 2}}));
  // cudaEventDestroy forgets an event's points (torch creates events without end; the table must not grow).
  const size_t held = EventPointsHeld();
  NoteEventDestroy(tp_done);
  NoteEventDestroy(fwd_done);
  EXPECT_EQ(EventPointsHeld(), held - 2);
}

// A group's send to the next pipeline stage and receive from the previous one on a 4-rank pipeline communicator
// (Megatron's batch_isend_irecv) are one unit: its op line lists both operations ("ops") with their peers and sizes,
// which the unit's own fields cannot give. A group of more than 16 operations lists its first 16 and says so.
TEST(ShimEvents, GroupedSendAndReceiveListTheirOperations) {
  EventsRun run("ops", 1, 4);
  ASSERT_NE(run.comm, nullptr);
  Comm* comm = run.comm;
  std::vector<uint16_t> act(1024), grad(512);
  auto call = [&](payload::OpKind op, int peer, std::vector<uint16_t>* buf, size_t count) {
    OpCall x;
    x.op = op;
    x.comm = comm;
    x.count = count;
    x.dtype = ncclBfloat16;
    x.peer = peer;
    x.send = buf->data();
    x.recv = buf->data();
    x.redop = ncclSum;
    return Submit(x);
  };
  ASSERT_EQ(GroupStart(), ncclSuccess);
  ASSERT_EQ(call(payload::OpKind::kSend, 2, &act, act.size()), ncclSuccess);    // to the next stage
  ASSERT_EQ(call(payload::OpKind::kRecv, 0, &grad, grad.size()), ncclSuccess);  // from the previous stage
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  ASSERT_EQ(call(payload::OpKind::kSend, 2, &act, 8), ncclSuccess);  // alone: no list
  ASSERT_EQ(GroupStart(), ncclSuccess);
  for (int i = 0; i < 18; ++i) ASSERT_EQ(call(payload::OpKind::kAllReduce, -1, &grad, 4 + i), ncclSuccess);
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  ASSERT_TRUE(run.Finish());
  std::vector<nlohmann::json> ops = LinesOf("op");
  ASSERT_EQ(ops.size(), 3u);
  // Lines come in release order: by sequence number, the pair, the lone send, the long group.
  std::sort(ops.begin(), ops.end(), [](const nlohmann::json& x, const nlohmann::json& y) {
    return x.at("seq").get<int64_t>() < y.at("seq").get<int64_t>();
  });
  const nlohmann::json& u = ops[0];
  EXPECT_EQ(u.at("op"), "group");
  EXPECT_EQ(u.at("nops"), 2);
  EXPECT_EQ(u.at("peer"), -1);
  EXPECT_EQ(u.at("bytes"), 2 * (1024 + 512));
  ASSERT_TRUE(u.contains("ops")) << u.dump();
  EXPECT_FALSE(u.contains("ops_truncated"));
  const int cid = u.at("comm_id");
  const int64_t s = u.at("seq");
  EXPECT_EQ(u.at("ops"), nlohmann::json::parse(
                             "[{\"op\":\"send\",\"dtype\":\"bf16\",\"bytes\":2048,\"peer\":2,\"root\":-1,\"comm_id\":" +
                             std::to_string(cid) + ",\"seq\":" + std::to_string(s) +
                             "},{\"op\":\"recv\",\"dtype\":\"bf16\",\"bytes\":1024,\"peer\":0,\"root\":-1,"
                             "\"comm_id\":" + std::to_string(cid) + ",\"seq\":" + std::to_string(s + 1) + "}]"));
  EXPECT_EQ(ops[1].at("peer"), 2);
  EXPECT_FALSE(ops[1].contains("ops"));
  const nlohmann::json& big = ops[2];
  EXPECT_EQ(big.at("nops"), 18);
  ASSERT_EQ(big.at("ops").size(), 16u);
  EXPECT_EQ(big.at("ops_truncated"), 1);
  EXPECT_EQ(big.at("ops")[15].at("op"), "allreduce");
  EXPECT_EQ(big.at("ops")[15].at("bytes"), 2 * (4 + 15));
  EXPECT_EQ(big.at("ops")[15].at("seq"), s + 3 + 15);
}

// The bye line says what the recorded-payload policy did (here: collect recording one payload and leaving one out
// for --payload-max-bytes), so a replay that mostly fell back to mirror is visible in the event file.
TEST(ShimEvents, ByeLineCountsRecordedPayloads) {
  auto dir = std::filesystem::temp_directory_path() / ("prism_events_bye_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  Config c;
  c.rank = 0;
  c.world_size = 2;
  c.out_dir = dir.string();
  c.record_payloads = (dir / "rank0.bin").string();
  c.payload_max_bytes = 64;
  ScopedRuntime rt({.config = c});
  EventLogStart();
  std::vector<uint8_t> small(16, 1), big(128, 2);
  RecordPayload(0, 0, 1, 4, small.data(), small.size());
  RecordPayload(0, 1, 1, 4, big.data(), big.size());
  EventLogStop();
  std::vector<nlohmann::json> byes = LinesOf("bye");
  ASSERT_FALSE(byes.empty());
  const nlohmann::json& bye = byes.back();
  EXPECT_EQ(bye.at("recorded"), nlohmann::json({{"written", 1}, {"replayed", 0}, {"missed", 0}, {"mismatched", 0},
                                                {"over_limit", 1}}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace prism::interpose
