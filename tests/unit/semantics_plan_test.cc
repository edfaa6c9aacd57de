// The planner's contract with the shim: argument validation, the shape of plans, the kernel table, the P2P send
// history and the group rule (sends of a group first, then its recvs), random determinism.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "nccl_patch/semantics.h"

namespace prism::payload {
namespace {

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

OpDesc AllReduce(const void* send, void* recv, uint64_t count, int n) {
  OpDesc d;
  d.op = OpKind::kAllReduce;
  d.dtype = DataType::kFloat32;
  d.redop = RedOp::kSum;
  d.nranks = n;
  d.rank = 0;
  d.count = count;
  d.send_addr = Addr(send);
  d.recv_addr = Addr(recv);
  return d;
}

TEST(SemanticsPlan, RejectsBadArguments) {
  float in[4] = {1, 2, 3, 4};
  float out[4] = {};
  StepList steps;
  const OpDesc good = AllReduce(in, out, 4, 8);
  ASSERT_EQ(Plan(good, &steps), Status::kOk);
  ASSERT_EQ(steps.size, 1u);

  auto expect_invalid = [&](OpDesc d, const char* what) {
    StepList s;
    s.size = 3;
    EXPECT_EQ(Plan(d, &s), Status::kInvalidArgument) << what;
    EXPECT_EQ(s.size, 0u) << what;
  };
  OpDesc d = good;
  d.dtype = static_cast<DataType>(12);
  expect_invalid(d, "dtype 12");
  d = good;
  d.dtype = static_cast<DataType>(-1);
  expect_invalid(d, "dtype -1");
  d = good;
  d.op = OpKind::kInvalid;
  expect_invalid(d, "op invalid");
  d = good;
  d.policy = Policy::kInvalid;
  expect_invalid(d, "policy invalid");
  d = good;
  d.nranks = 0;
  expect_invalid(d, "nranks 0");
  d = good;
  d.rank = 8;
  expect_invalid(d, "rank == nranks");
  d = good;
  d.redop = static_cast<RedOp>(6);
  expect_invalid(d, "redop 6");
  d = good;
  d.recv_addr = 0;
  expect_invalid(d, "null recv");
  d = good;
  d.send_addr = 0;
  expect_invalid(d, "null send");
  d = good;
  d.count = uint64_t{1} << 62;
  expect_invalid(d, "byte size overflows");
  d = good;
  d.op = OpKind::kBroadcast;
  d.root = 8;
  expect_invalid(d, "root out of range");
  d = good;
  d.op = OpKind::kRecv;
  d.peer = -1;
  expect_invalid(d, "peer out of range");
  d = good;
  d.op = OpKind::kAllGather;
  d.count = (uint64_t{1} << 62) / 8;  // fits alone, not times nranks * 4 bytes
  expect_invalid(d, "all-gather output overflows");
  EXPECT_EQ(Plan(good, nullptr), Status::kInvalidArgument);
}

TEST(SemanticsPlan, RecordedIsUnsupportedAndEmptyCountIsNothing) {
  float in[1] = {1};
  float out[1] = {};
  OpDesc d = AllReduce(in, out, 1, 4);
  d.policy = Policy::kRecorded;
  StepList steps;
  EXPECT_EQ(Plan(d, &steps), Status::kUnsupported);
  EXPECT_EQ(steps.size, 0u);
  d.policy = Policy::kMirror;
  d.count = 0;
  EXPECT_EQ(Plan(d, &steps), Status::kOk);
  EXPECT_EQ(steps.size, 0u);
}

TEST(SemanticsPlan, NullBuffersWhereNcclAllowsThem) {
  float in[2] = {1, 2};
  StepList steps;
  // Reduce: recvbuff may be NULL except on the root.
  OpDesc d = AllReduce(in, nullptr, 2, 4);
  d.op = OpKind::kReduce;
  d.rank = 1;
  d.root = 0;
  EXPECT_EQ(Plan(d, &steps), Status::kOk);
  EXPECT_EQ(steps.size, 0u);
  // Broadcast on a non-root with sendbuff NULL: recvbuff keeps its contents under mirror.
  float out[2] = {7, 8};
  d = AllReduce(nullptr, out, 2, 4);
  d.op = OpKind::kBroadcast;
  d.rank = 2;
  d.root = 0;
  EXPECT_EQ(Plan(d, &steps), Status::kOk);
  EXPECT_EQ(steps.size, 0u);
  // Send: nothing to write.
  d = AllReduce(in, nullptr, 2, 4);
  d.op = OpKind::kSend;
  d.peer = 3;
  EXPECT_EQ(Plan(d, &steps), Status::kOk);
  EXPECT_EQ(steps.size, 0u);
}

TEST(SemanticsPlan, ShapesOfCommonPlans) {
  std::vector<float> in(8 * 5, 1.0f);
  std::vector<float> out(8 * 5, 0.0f);
  StepList s;

  OpDesc d = AllReduce(in.data(), out.data(), 5, 8);
  ASSERT_EQ(Plan(d, &s), Status::kOk);
  ASSERT_EQ(s.size, 1u);
  EXPECT_EQ(s.steps[0].kind, StepKind::kScale);
  EXPECT_EQ(s.steps[0].param, 8u);
  EXPECT_EQ(s.steps[0].count, 5u);
  EXPECT_EQ(s.steps[0].dtype, DataType::kFloat32);

  d.redop = RedOp::kAvg;  // out of place: a copy; in place: nothing
  ASSERT_EQ(Plan(d, &s), Status::kOk);
  ASSERT_EQ(s.size, 1u);
  EXPECT_EQ(s.steps[0].kind, StepKind::kCopy);
  EXPECT_EQ(s.steps[0].bytes, 20u);
  d.recv_addr = d.send_addr;
  ASSERT_EQ(Plan(d, &s), Status::kOk);
  EXPECT_EQ(s.size, 0u);

  d = AllReduce(in.data(), out.data(), 5, 8);
  d.redop = RedOp::kPreMulSum;
  d.premul_scalar_addr = Addr(&in[0]);  // ncclScalarDevice: read when the step runs
  ASSERT_EQ(Plan(d, &s), Status::kOk);
  ASSERT_EQ(s.size, 2u);
  EXPECT_EQ(s.steps[0].kind, StepKind::kMulScalar);
  EXPECT_EQ(s.steps[0].scalar_addr, Addr(&in[0]));
  EXPECT_EQ(s.steps[1].kind, StepKind::kScale);
  EXPECT_EQ(s.steps[1].src_buf, BufferId::kRecv);  // scales what step 0 wrote

  // All-gather out of place: one tile; in place: two tiles around the own chunk.
  d = AllReduce(in.data(), out.data(), 5, 8);
  d.op = OpKind::kAllGather;
  d.rank = 3;
  ASSERT_EQ(Plan(d, &s), Status::kOk);
  ASSERT_EQ(s.size, 1u);
  EXPECT_EQ(s.steps[0].kind, StepKind::kTile);
  EXPECT_EQ(s.steps[0].bytes, 8u * 20u);
  EXPECT_EQ(s.steps[0].tile_bytes, 20u);
  d.send_addr = Addr(out.data() + 3 * 5);
  ASSERT_EQ(Plan(d, &s), Status::kOk);
  ASSERT_EQ(s.size, 2u);
  EXPECT_EQ(s.steps[0].dst_offset, 0u);
  EXPECT_EQ(s.steps[0].bytes, 3u * 20u);
  EXPECT_EQ(s.steps[1].dst_offset, 4u * 20u);
  EXPECT_EQ(s.steps[1].bytes, 4u * 20u);

  // Zeros: all-to-all keeps the own chunk, zero-fills the rest.
  d = AllReduce(in.data(), out.data(), 5, 8);
  d.op = OpKind::kAllToAll;
  d.rank = 2;
  d.policy = Policy::kZeros;
  ASSERT_EQ(Plan(d, &s), Status::kOk);
  ASSERT_EQ(s.size, 3u);
  EXPECT_EQ(s.steps[0].kind, StepKind::kCopy);
  EXPECT_EQ(s.steps[1].kind, StepKind::kFillZero);
  EXPECT_EQ(s.steps[2].kind, StepKind::kFillZero);
}

TEST(SemanticsPlan, DeviceScalarIsReadWhenTheStepRuns) {
  float in[3] = {1, 2, -4};
  float out[3] = {};
  float scalar = 0.25f;
  OpDesc d = AllReduce(in, out, 3, 4);
  d.redop = RedOp::kPreMulSum;
  d.premul_scalar_bits = 0;  // ignored: the address wins
  d.premul_scalar_addr = Addr(&scalar);
  ASSERT_EQ(RunCpu(d), Status::kOk);
  EXPECT_EQ(out[0], 1.0f);   // 4 x 0.25 x 1
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(out[2], -4.0f);
  scalar = 2.0f;  // changed after planning: the executor reads it now
  ASSERT_EQ(RunCpu(d), Status::kOk);
  EXPECT_EQ(out[0], 8.0f);
}

TEST(SemanticsPlan, KernelTableAndLaunchShape) {
  EXPECT_STREQ(KernelName(StepKind::kScale), "prism_payload_scale");
  EXPECT_STREQ(KernelName(StepKind::kPower), "prism_payload_power");
  EXPECT_STREQ(KernelName(StepKind::kMulScalar), "prism_payload_mul_scalar");
  EXPECT_STREQ(KernelName(StepKind::kTile), "prism_payload_tile");
  EXPECT_STREQ(KernelName(StepKind::kFillRandom), "prism_payload_fill_random");
  EXPECT_STREQ(KernelName(StepKind::kCopy), "prism_payload_copy");
  EXPECT_STREQ(KernelName(StepKind::kFillZero), "prism_payload_fill_zero");
  EXPECT_EQ(KernelName(StepKind::kNoop), nullptr);
  EXPECT_EQ(PayloadBlocks(0), 1u);
  EXPECT_EQ(PayloadBlocks(257), 2u);
  EXPECT_EQ(PayloadBlocks(uint64_t{1} << 40), kPayloadMaxBlocks);
}

TEST(SemanticsPlan, PolicyNames) {
  for (Policy p : {Policy::kMirror, Policy::kZeros, Policy::kRandom, Policy::kRecorded}) {
    EXPECT_EQ(ParsePolicy(PolicyName(p)), p);
  }
  EXPECT_EQ(ParsePolicy("Mirror"), Policy::kInvalid);
  EXPECT_EQ(ParsePolicy(""), Policy::kInvalid);
  EXPECT_EQ(ParsePolicy(nullptr), Policy::kInvalid);
  EXPECT_STREQ(DataTypeName(DataType::kFloat8e5m2), "float8e5m2");
  EXPECT_STREQ(OpKindName(OpKind::kReduceScatter), "reducescatter");
  EXPECT_STREQ(RedOpName(RedOp::kPreMulSum), "premulsum");
  EXPECT_STREQ(StatusName(Status::kUnsupported), "unsupported");
}

TEST(SemanticsPlan, RandomIsDeterministicPerSeedCommSeq) {
  auto fill = [](uint64_t seed, uint64_t comm, uint64_t seq, DataType t) {
    std::vector<uint8_t> in(64 * 8), out(64 * 8, 0xEE);
    OpDesc d = AllReduce(in.data(), out.data(), 64, 16);
    d.dtype = t;
    d.policy = Policy::kRandom;
    d.seed = seed;
    d.comm_id = comm;
    d.seq = seq;
    EXPECT_EQ(RunCpu(d), Status::kOk);
    out.resize(64 * DataTypeSize(t));
    return out;
  };
  for (int t = 0; t < kNumDataTypes; ++t) {
    const DataType dt = static_cast<DataType>(t);
    EXPECT_EQ(fill(1, 2, 3, dt), fill(1, 2, 3, dt)) << DataTypeName(dt);
    EXPECT_NE(fill(1, 2, 3, dt), fill(1, 2, 4, dt)) << DataTypeName(dt);
    EXPECT_NE(fill(1, 2, 3, dt), fill(1, 5, 3, dt)) << DataTypeName(dt);
    EXPECT_NE(fill(1, 2, 3, dt), fill(9, 2, 3, dt)) << DataTypeName(dt);
  }
}

// ---- P2P ------------------------------------------------------------------------------------------------------

TEST(SemanticsP2p, HistoryPrefersSamePeerThenMostRecentOfTheSize) {
  P2pSendHistory h;
  uint64_t addr = 99;
  EXPECT_FALSE(h.Find(1, 64, &addr));
  EXPECT_EQ(addr, 0u);
  ASSERT_TRUE(h.RecordSend(1, 64, 0x1000));
  ASSERT_TRUE(h.Find(1, 64, &addr));
  EXPECT_EQ(addr, 0x1000u);
  ASSERT_TRUE(h.Find(2, 64, &addr));  // any peer, same size
  EXPECT_EQ(addr, 0x1000u);
  EXPECT_FALSE(h.Find(1, 32, &addr));  // size must match exactly
  ASSERT_TRUE(h.RecordSend(2, 64, 0x2000));
  ASSERT_TRUE(h.Find(1, 64, &addr));
  EXPECT_EQ(addr, 0x1000u);  // own send to peer 1 wins
  ASSERT_TRUE(h.Find(3, 64, &addr));
  EXPECT_EQ(addr, 0x2000u);  // most recent of the size
  ASSERT_TRUE(h.RecordSend(1, 64, 0x3000));
  ASSERT_TRUE(h.Find(1, 64, &addr));
  EXPECT_EQ(addr, 0x3000u);  // newer send to the same peer replaces the older

  // Freed memory is forgotten, and the any-peer entry pointing there too; the send to peer 2 stays.
  h.InvalidateRange(0x3000 + 63, 16);  // overlaps the last byte
  EXPECT_FALSE(h.Find(1, 64, &addr));
  EXPECT_EQ(addr, 0u);
  ASSERT_TRUE(h.Find(2, 64, &addr));
  EXPECT_EQ(addr, 0x2000u);
  h.InvalidateRange(0x2040, 16);  // just past it: no overlap
  ASSERT_TRUE(h.Find(2, 64, &addr));
  h.InvalidateRange(0x0, 0x10000);
  EXPECT_FALSE(h.Find(1, 64, &addr));
  EXPECT_FALSE(h.Find(2, 64, &addr));
}

TEST(SemanticsP2p, ManyPeersInOneGroupKeepTheirOwnSends) {
  // An all-to-all written as a group of sends and recvs over 1024 peers with distinct sizes per peer.
  P2pSendHistory h;
  for (int p = 0; p < 1024; ++p) ASSERT_TRUE(h.RecordSend(p, 4096 + 16 * static_cast<uint64_t>(p), 0x100000 + p));
  int hits = 0;
  for (int p = 0; p < 1024; ++p) {
    uint64_t addr = 0;
    if (h.Find(p, 4096 + 16 * static_cast<uint64_t>(p), &addr) && addr == 0x100000u + static_cast<uint64_t>(p)) ++hits;
  }
  // A direct-mapped cache of 4096 slots: collisions may evict a few; nearly all must survive.
  EXPECT_GT(hits, 900);
}

// The group rule the shim applies at ncclGroupEnd: record every send of the group, then plan every recv.
TEST(SemanticsP2p, GroupRecvSeesSendPostedAfterIt) {
  const std::vector<float> payload = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
  std::vector<float> recv(5, -1.0f);
  struct Posted {
    OpKind op;
    int peer;
    const float* send;
    float* recv;
  };
  // Posting order inside the group: recv first, then the send.
  const std::vector<Posted> group = {{OpKind::kRecv, 1, nullptr, recv.data()},
                                     {OpKind::kSend, 1, payload.data(), nullptr}};
  P2pSendHistory h;
  for (const Posted& p : group) {
    if (p.op == OpKind::kSend) h.RecordSend(p.peer, 5 * sizeof(float), Addr(p.send));
  }
  for (const Posted& p : group) {
    if (p.op != OpKind::kRecv) continue;
    OpDesc d;
    d.op = OpKind::kRecv;
    d.nranks = 4;
    d.rank = 0;
    d.peer = p.peer;
    d.count = 5;
    d.recv_addr = Addr(p.recv);
    h.Find(p.peer, 5 * sizeof(float), &d.mirror_send_addr);
    ASSERT_EQ(RunCpu(d), Status::kOk);
  }
  EXPECT_EQ(recv, payload);
}

TEST(SemanticsP2p, RecvWithoutMatchingSendIsSeededRandom) {
  std::vector<float> sent = {1, 2, 3, 4};
  P2pSendHistory h;
  h.RecordSend(1, 4 * sizeof(float), Addr(sent.data()));  // 16 bytes

  auto recv = [&](uint64_t count, uint64_t seq, Policy policy) {
    std::vector<float> out(count, 123.0f);
    OpDesc d;
    d.op = OpKind::kRecv;
    d.policy = policy;
    d.nranks = 2;
    d.rank = 0;
    d.peer = 1;
    d.count = count;
    d.recv_addr = Addr(out.data());
    d.seed = 5;
    d.comm_id = 6;
    d.seq = seq;
    h.Find(1, count * sizeof(float), &d.mirror_send_addr);
    EXPECT_EQ(RunCpu(d), Status::kOk);
    return out;
  };
  EXPECT_EQ(recv(4, 1, Policy::kMirror), sent);              // same size: the send
  const std::vector<float> a = recv(3, 1, Policy::kMirror);  // other size: random
  EXPECT_EQ(a, recv(3, 1, Policy::kMirror));
  EXPECT_NE(a, recv(3, 2, Policy::kMirror));
  for (float v : a) {
    EXPECT_GE(v, -1.0f);
    EXPECT_LT(v, 1.0f);
  }
  EXPECT_EQ(recv(4, 1, Policy::kZeros), std::vector<float>(4, 0.0f));  // zeros ignores the send
  EXPECT_NE(recv(4, 1, Policy::kRandom), sent);
}

}  // namespace
}  // namespace prism::payload
