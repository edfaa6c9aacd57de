// Recorded payloads: a file written through RecordPayload (collect) is replayed by FindRecorded and by the engine
// under PRISM_PAYLOAD=recorded for operations whose other members are virtual.
#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "interpose/core/comm.h"
#include "interpose/core/config.h"
#include "interpose/core/progress.h"
#include "interpose/core/recorded.h"
#include "interpose/core/runtime.h"
#include "interpose/core/submit.h"
#include "shim_fake_gpu.h"

namespace prism::interpose {
namespace {

std::string TmpPath(const char* what) { return "/tmp/prism_rec_" + std::to_string(getpid()) + "_" + what; }

TEST(Recorded, WriteThenFindByCommAndSequence) {
  std::optional<ScopedRuntime> rt;
  const std::string path = TmpPath("a.bin");
  Config c;
  c.record_payloads = path;
  rt.emplace(Runtime::Parts{.config = c});
  std::vector<int64_t> flags{1, 1, 0};
  RecordPayload(3, 17, static_cast<uint16_t>(payload::OpKind::kBroadcast), 4, flags.data(), 24);
  std::vector<float> act(8, 2.5f);
  RecordPayload(5, 2, static_cast<uint16_t>(payload::OpKind::kRecv), 7, act.data(), 32);
  EXPECT_EQ(GetRecordedStats().written, 2u);

  Config r;
  r.payload = "recorded";
  r.payload_file = path;
  rt.emplace(Runtime::Parts{.config = r});
  const void* p = FindRecorded(3, 17, static_cast<uint16_t>(payload::OpKind::kBroadcast), 4, 24);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(std::memcmp(p, flags.data(), 24), 0);
  const void* q = FindRecorded(5, 2, static_cast<uint16_t>(payload::OpKind::kRecv), 7, 32);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(std::memcmp(q, act.data(), 32), 0);
  // Wrong size, op, or an operation never recorded: no data (the caller applies mirror).
  EXPECT_EQ(FindRecorded(3, 17, static_cast<uint16_t>(payload::OpKind::kBroadcast), 4, 16), nullptr);
  EXPECT_EQ(FindRecorded(3, 17, static_cast<uint16_t>(payload::OpKind::kAllReduce), 4, 24), nullptr);
  EXPECT_EQ(FindRecorded(3, 18, static_cast<uint16_t>(payload::OpKind::kBroadcast), 4, 24), nullptr);
  RecordedStats st = GetRecordedStats();
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.mismatches, 2u);
  rt.reset();
  std::remove(path.c_str());
}

// PRISM_PAYLOAD_MAX_BYTES (default 4 MiB): a larger payload is not recorded, and one recorded without the limit is
// not replayed (mirror), so an emulated collective never copies megabytes from the file inside the operation; 0 lifts
// the limit.
TEST(Recorded, PayloadsOverTheLimitAreNeitherRecordedNorReplayed) {
  std::optional<ScopedRuntime> rt;
  const std::string path = TmpPath("limit.bin");
  std::vector<uint8_t> small(64, 7), big(4096, 9);
  Config c;
  c.record_payloads = path;
  c.payload_max_bytes = 1024;
  rt.emplace(Runtime::Parts{.config = c});
  RecordPayload(1, 0, static_cast<uint16_t>(payload::OpKind::kBroadcast), 4, small.data(), small.size());
  RecordPayload(1, 1, static_cast<uint16_t>(payload::OpKind::kAllReduce), 4, big.data(), big.size());
  EXPECT_EQ(GetRecordedStats().written, 1u);
  EXPECT_EQ(GetRecordedStats().over_limit, 1u);
  // Without a limit the big one is recorded too ...
  c.payload_max_bytes = 0;
  rt.emplace(Runtime::Parts{.config = c});
  RecordPayload(1, 0, static_cast<uint16_t>(payload::OpKind::kBroadcast), 4, small.data(), small.size());
  RecordPayload(1, 1, static_cast<uint16_t>(payload::OpKind::kAllReduce), 4, big.data(), big.size());
  EXPECT_EQ(GetRecordedStats().written, 2u);
  // ... and replayed only where the replaying rank's limit allows it.
  Config r;
  r.payload = "recorded";
  r.payload_file = path;
  r.payload_max_bytes = 1024;
  rt.emplace(Runtime::Parts{.config = r});
  EXPECT_NE(FindRecorded(1, 0, static_cast<uint16_t>(payload::OpKind::kBroadcast), 4, small.size()), nullptr);
  EXPECT_EQ(FindRecorded(1, 1, static_cast<uint16_t>(payload::OpKind::kAllReduce), 4, big.size()), nullptr);
  EXPECT_EQ(GetRecordedStats().over_limit, 1u);
  r.payload_max_bytes = 0;
  rt.emplace(Runtime::Parts{.config = r});
  const void* p = FindRecorded(1, 1, static_cast<uint16_t>(payload::OpKind::kAllReduce), 4, big.size());
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(std::memcmp(p, big.data(), big.size()), 0);
  // The environment variable sets it.
  Config e;
  LoadConfig([](const char* k) -> const char* {
    return std::string(k) == "PRISM_PAYLOAD_MAX_BYTES" ? "65536" : nullptr;
  }, &e);
  EXPECT_EQ(e.payload_max_bytes, 65536u);
  Config d;
  LoadConfig([](const char*) -> const char* { return nullptr; }, &d);
  EXPECT_EQ(d.payload_max_bytes, 4u << 20);
  rt.reset();
  std::remove(path.c_str());
}

TEST(Recorded, EngineReplaysABroadcastFromAVirtualRoot) {
  std::optional<ScopedRuntime> rt;
  const std::string path = TmpPath("b.bin");
  testing::FakeGpu gpu;
  // Record: the broadcast at sequence 0 of the first communicator carried {1, 1, 0}.
  Config w;
  w.record_payloads = path;
  rt.emplace(Runtime::Parts{.config = w, .gpu = &gpu});
  std::vector<int64_t> flags{1, 1, 0};
  RecordPayload(0, 0, static_cast<uint16_t>(payload::OpKind::kBroadcast), static_cast<uint8_t>(ncclInt64),
                flags.data(), 24);
  rt.reset();

  Config c;
  c.rank = 63;
  c.world_size = 64;
  c.payload = "recorded";
  c.payload_file = path;
  c.fixed_dur_us = 1;
  rt.emplace(Runtime::Parts{.config = c, .gpu = &gpu});
  ncclUniqueId id;
  GetUniqueId(&id);
  InitArgs a;
  a.nranks = 64;
  a.rank = 63;
  a.ids = &id;
  Comm* comm = nullptr;
  ASSERT_EQ(CommInit(a, &comm), ncclSuccess);
  std::vector<int64_t> buf(3, 0);
  OpCall call;
  call.op = payload::OpKind::kBroadcast;
  call.dtype = ncclInt64;
  call.comm = comm;
  call.count = 3;
  call.root = 0;
  call.send = buf.data();
  call.recv = buf.data();
  ASSERT_EQ(Submit(call), ncclSuccess);
  EXPECT_EQ(buf, flags) << "the recorded broadcast, where mirror would leave the buffer as it was";
  // The next broadcast was never recorded: mirror (buffer untouched).
  std::vector<int64_t> other(3, 5);
  call.send = other.data();
  call.recv = other.data();
  ASSERT_EQ(Submit(call), ncclSuccess);
  EXPECT_EQ(other, (std::vector<int64_t>(3, 5)));
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  rt.reset();
  std::remove(path.c_str());
}

// The expert-parallel all-to-all under --payload recorded: the receive from a virtual peer replays collect's record of
// it, named by (communicator, sequence) with the copy to itself unnumbered on both sides; the receive from itself
// copies this rank's own send (live data), never a record.
TEST(Recorded, EngineReplaysTheAllToAllsPeerReceiveAndCopiesTheOneFromItself) {
  std::optional<ScopedRuntime> rt;
  const std::string path = TmpPath("c.bin");
  testing::FakeGpu gpu;
  // collect recorded the receive from peer 1: its send to peer 1 is sequence 0, the receive sequence 1.
  Config w;
  w.record_payloads = path;
  rt.emplace(Runtime::Parts{.config = w, .gpu = &gpu});
  std::vector<float> recorded(4, 42.f);
  RecordPayload(0, 1, static_cast<uint16_t>(payload::OpKind::kRecv), static_cast<uint8_t>(ncclFloat32),
                recorded.data(), 16);
  rt.reset();

  Config c;
  c.rank = 0;
  c.world_size = 2;
  c.payload = "recorded";
  c.payload_file = path;
  c.fixed_dur_us = 1;
  rt.emplace(Runtime::Parts{.config = c, .gpu = &gpu});
  ncclUniqueId id;
  GetUniqueId(&id);
  InitArgs a;
  a.nranks = 2;
  a.rank = 0;
  a.ids = &id;
  Comm* comm = nullptr;
  ASSERT_EQ(CommInit(a, &comm), ncclSuccess);
  std::vector<float> to_self(4, 1.f), to_peer(4, 2.f), from_self(4, -1.f), from_peer(4, -1.f);
  auto op = [&](payload::OpKind kind, int peer, std::vector<float>& buf) {
    OpCall o;
    o.op = kind;
    o.comm = comm;
    o.count = buf.size();
    o.peer = peer;
    if (kind == payload::OpKind::kSend) o.send = buf.data();
    else o.recv = buf.data();
    return Submit(o);
  };
  ASSERT_EQ(GroupStart(), ncclSuccess);
  ASSERT_EQ(op(payload::OpKind::kSend, 0, to_self), ncclSuccess);
  ASSERT_EQ(op(payload::OpKind::kRecv, 0, from_self), ncclSuccess);
  ASSERT_EQ(op(payload::OpKind::kSend, 1, to_peer), ncclSuccess);
  ASSERT_EQ(op(payload::OpKind::kRecv, 1, from_peer), ncclSuccess);
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  EXPECT_EQ(from_peer, recorded) << "the receive from the virtual peer is sequence 1, collect's record";
  bool self_copied = false;
  {
    std::lock_guard<std::mutex> l(gpu.mu);
    for (const auto& cp : gpu.copies)
      EXPECT_NE(cp.dst, reinterpret_cast<uint64_t>(from_self.data())) << "a record went into the copy to itself";
    for (size_t i = 0; i < gpu.steps.size(); ++i) {
      const payload::Step& st = gpu.steps[i];
      if (st.kind == payload::StepKind::kCopy &&
          payload::StepAddr(gpu.descs[i], st.dst_buf, st.dst_offset) == reinterpret_cast<uint64_t>(from_self.data()))
        self_copied = payload::StepAddr(gpu.descs[i], st.src_buf, st.src_offset) ==
                      reinterpret_cast<uint64_t>(to_self.data());
    }
  }
  EXPECT_TRUE(self_copied) << "the receive from itself copies its own send";
  EXPECT_EQ(GetRecordedStats().hits, 1u);
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  rt.reset();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace prism::interpose
