// libprism's communicator bookkeeping and operation engine on the CPU, with the GPU boundary faked
// (tests/unit/shim_fake_gpu.h): members, split/shrink, config and nonblocking semantics, argument checks, group
// units, the mirror p2p rule, PreMulSum, gates opened by the progress thread at arrival + duration.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <optional>

#include "common/ipc_io.h"
#include "interpose/core/comm.h"
#include "interpose/core/config.h"
#include "interpose/core/progress.h"
#include "interpose/core/redops.h"
#include "interpose/core/runtime.h"
#include "interpose/core/submit.h"
#include "interpose/core/unit_stats.h"
#include "shim_fake_gpu.h"

namespace prism::interpose {
namespace {

using payload::OpKind;
using payload::StepKind;

class ShimComm : public ::testing::Test {
 protected:
  void SetUp() override {
    Config c;
    c.rank = 5;
    c.world_size = 64;
    c.real_ranks = {5};
    c.fixed_dur_us = 0;
    c.gate = GateKind::kWait;
    rt_.emplace(Runtime::Parts{.config = c, .gpu = &gpu_});
  }
  void TearDown() override {
    ProgressDrain(5000000000ull);
    rt_.reset();
  }
  void SetFixedDur(double us) {
    Config c = Cfg();
    c.fixed_dur_us = us;
    (*rt_)->set_config(c);
  }

  // An fp32 sum all-reduce of `buf` in place on communicator `c`.
  static OpCall AllReduceOf(Comm* c, std::vector<float>* buf) {
    OpCall call;
    call.op = OpKind::kAllReduce;
    call.comm = c;
    call.count = buf->size();
    call.send = buf->data();
    call.recv = buf->data();
    return call;
  }

  Comm* Init(int nranks, int rank, const ncclUniqueId& id, const ncclConfig_t* cfg = nullptr,
             ncclResult_t expect = ncclSuccess) {
    InitArgs a;
    a.nranks = nranks;
    a.rank = rank;
    a.ids = &id;
    a.config = cfg;
    Comm* c = nullptr;
    EXPECT_EQ(CommInit(a, &c), expect);
    return c;
  }
  static ncclUniqueId Id() {
    ncclUniqueId id;
    GetUniqueId(&id);
    return id;
  }
  static ncclUniqueId VirtualId(const std::string& key) {
    std::string bytes = ipc::MakeVirtualNcclId(key, 0);
    ncclUniqueId id;
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
    return id;
  }

  testing::FakeGpu gpu_;
  std::optional<ScopedRuntime> rt_;
};

TEST_F(ShimComm, StoreKeyAndCommNameGiveTheGroupName) {
  EXPECT_EQ(GroupNameFromStoreKey("/default_pg/0//cuda//0"), "0");
  EXPECT_EQ(GroupNameFromStoreKey("/default_pg/0//3//cuda//0"), "3");
  EXPECT_EQ(GroupNameFromStoreKey("default_pg/0//12//cuda//1:5"), "12");
  EXPECT_EQ(GroupNameFromStoreKey("/other/3"), "");
  EXPECT_EQ(GroupNameFromCommName("TENSOR_MODEL_PARALLEL_GROUP:7"), "7");
  EXPECT_EQ(GroupNameFromCommName("7"), "7");
  EXPECT_EQ(StoreKeyFromVirtualId(VirtualId("/default_pg/0//4//cuda//0")), "/default_pg/0//4//cuda//0");
  EXPECT_EQ(StoreKeyFromVirtualId(Id()), "");
}

TEST_F(ShimComm, WorldSizedCommunicatorIsTheWorld) {
  Comm* c = Init(64, 5, Id());
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(c->members.size(), 64u);
  EXPECT_EQ(c->members[5], 5);
  EXPECT_EQ(c->real_members, 1);
  EXPECT_EQ(ToComm(reinterpret_cast<ncclComm_t>(c)), c);
}

TEST_F(ShimComm, MembersFromTheGroupNamedInAVirtualLeadersId) {
  RegisterGroup("3", {1, 5, 9, 13}, "TENSOR_MODEL_PARALLEL_GROUP");
  RegisterGroup("4", {4, 5, 6, 7}, "DATA_PARALLEL_GROUP");
  Comm* c = Init(4, 1, VirtualId("/default_pg/0//3//cuda//0"));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->members, (std::vector<int32_t>{1, 5, 9, 13}));
  EXPECT_EQ(c->name, "3");
  EXPECT_EQ(c->desc, "TENSOR_MODEL_PARALLEL_GROUP");
  EXPECT_EQ(c->GlobalRank(2), 9);
}

TEST_F(ShimComm, UniqueRegisteredMatchIsUsedAmbiguousIsNot) {
  RegisterGroup("1", {5, 6}, "PIPELINE");
  RegisterGroup("2", {0, 5, 10, 15}, "A");
  RegisterGroup("3", {1, 5, 11, 15}, "B");
  Comm* p = Init(2, 0, Id());
  EXPECT_EQ(p->members, (std::vector<int32_t>{5, 6}));
  Comm* q = Init(4, 1, Id());  // both "2" and "3" fit: unknown, no guess
  EXPECT_TRUE(q->members.empty());
  RegisterGroup("3", {1, 5, 11, 15}, "B");  // a late registration by name does not bind an unnamed comm
  EXPECT_TRUE(q->members.empty());
}

TEST_F(ShimComm, LateRegistrationFillsANamedCommunicator) {
  Comm* c = Init(4, 2, VirtualId("/default_pg/0//9//cuda//0"));
  EXPECT_TRUE(c->members.empty());
  RegisterGroup("9", {3, 4, 5, 6}, "CONTEXT_PARALLEL_GROUP");
  EXPECT_EQ(c->members, (std::vector<int32_t>{3, 4, 5, 6}));
}

TEST_F(ShimComm, SplitTakesMembersFromTheHookScope) {
  Comm* world = Init(64, 5, Id());
  ncclComm_t out = reinterpret_cast<ncclComm_t>(0x1);
  EXPECT_EQ(CommSplit(world, NCCL_SPLIT_NOCOLOR, 5, &out, nullptr), ncclSuccess);
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(CommSplit(world, 17, 5, &out, nullptr), ncclInvalidUsage) << "members cannot be known without the hook";
  BeginGroupScope({13, 5, 21, 29});
  ASSERT_EQ(CommSplit(world, 17, 5, &out, nullptr), ncclSuccess);
  RegisterGroup("6", {5, 13, 21, 29}, "EXPERT_MODEL_PARALLEL_GROUP");
  Comm* s = ToComm(out);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->nranks, 4);
  EXPECT_EQ(s->rank, 0);
  EXPECT_EQ(s->members, (std::vector<int32_t>{5, 13, 21, 29}));
  EXPECT_EQ(s->name, "6");
  EXPECT_NE(s->stable_id, world->stable_id);
}

TEST_F(ShimComm, ShrinkRenumbersRanks) {
  Comm* world = Init(64, 5, Id());
  int excl[] = {0, 3, 40};
  ncclComm_t out = nullptr;
  ASSERT_EQ(CommShrink(world, excl, 3, &out, nullptr, NCCL_SHRINK_DEFAULT), ncclSuccess);
  Comm* s = ToComm(out);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->nranks, 61);
  EXPECT_EQ(s->rank, 3);
  EXPECT_EQ(s->GlobalRank(3), 5);
  int me[] = {5};
  EXPECT_EQ(CommShrink(world, me, 1, &out, nullptr, 0), ncclInvalidArgument);
}

TEST_F(ShimComm, ConfigIsCheckedAndNonblockingReportsInProgressOnce) {
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  Init(64, 5, Id(), &bad, ncclInvalidArgument);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  Comm* c = Init(64, 5, Id(), &cfg, ncclInProgress);
  ASSERT_NE(c, nullptr);
  ncclResult_t st = ncclSuccess;
  EXPECT_EQ(CommGetAsyncError(c, &st), ncclSuccess);
  EXPECT_EQ(st, ncclInProgress);
  EXPECT_EQ(CommGetAsyncError(c, &st), ncclSuccess);
  EXPECT_EQ(st, ncclSuccess);
  EXPECT_EQ(CommFinalize(c), ncclInProgress);
  EXPECT_EQ(CommGetAsyncError(c, &st), ncclSuccess);
  EXPECT_EQ(st, ncclInProgress);
  EXPECT_EQ(CommFinalize(c), ncclInvalidUsage);
  EXPECT_EQ(CommDestroy(c), ncclSuccess);
  EXPECT_EQ(ToComm(reinterpret_cast<ncclComm_t>(c)), nullptr);
}

TEST_F(ShimComm, ArgumentsAreCheckedLikeNccl) {
  Comm* c = Init(8, 1, Id());
  float buf[4];
  OpCall call;
  call.op = OpKind::kAllReduce;
  call.comm = c;
  call.count = 4;
  call.send = buf;
  call.recv = buf;
  call.dtype = static_cast<ncclDataType_t>(12);
  EXPECT_EQ(Submit(call), ncclInvalidArgument);
  call.dtype = ncclFloat32;
  call.redop = static_cast<ncclRedOp_t>(9);
  EXPECT_EQ(Submit(call), ncclInvalidArgument);
  call.redop = ncclSum;
  call.recv = nullptr;
  EXPECT_EQ(Submit(call), ncclInvalidArgument);
  OpCall bc = call;
  bc.op = OpKind::kBroadcast;
  bc.recv = buf;
  bc.root = 8;
  EXPECT_EQ(Submit(bc), ncclInvalidArgument);
  OpCall send = call;
  send.op = OpKind::kSend;
  send.peer = -1;
  EXPECT_EQ(Submit(send), ncclInvalidArgument);
  EXPECT_EQ(GroupEnd(), ncclInvalidUsage);
  call.comm = nullptr;
  EXPECT_EQ(Submit(call), ncclInvalidArgument);
}

TEST_F(ShimComm, AllReduceSumPlansTheMirrorAndGatesUntilArrivalPlusDuration) {
  SetFixedDur(30000);  // 30 ms
  Comm* c = Init(8, 1, Id());
  std::vector<float> buf(1024);
  OpCall call = AllReduceOf(c, &buf);
  const uint64_t before = UnitsExecuted();
  ASSERT_EQ(Submit(call), ncclSuccess);
  EXPECT_EQ(UnitsExecuted(), before + 1);
  uint32_t slot, ticket;
  {
    std::lock_guard<std::mutex> l(gpu_.mu);
    ASSERT_EQ(gpu_.gates.size(), 1u);
    slot = gpu_.gates[0].slot;
    ticket = gpu_.gates[0].ticket;
    ASSERT_FALSE(gpu_.steps.empty());
    EXPECT_EQ(gpu_.steps[0].kind, StepKind::kScale);
    EXPECT_EQ(gpu_.steps[0].param, 8u) << "SUM over 8 mirrored members is 8 x input";
  }
  const uint64_t arrival = *gpu_.ArrivalWord(slot);
  ASSERT_NE(arrival, 0u);
  EXPECT_NE(*gpu_.GateWord(slot), ticket) << "the gate must stay closed until arrival + 30 ms";
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  EXPECT_EQ(*gpu_.GateWord(slot), ticket);
  EXPECT_GE(HostNowNs(), arrival + 30000000ull) << "opened before arrival + duration";
}

// A unit pushed while the progress thread is blocked wakes it: the unit is released at once, not at the thread's
// 100 ms timeout (which would hide a lost wake-up).
TEST_F(ShimComm, APushWakesABlockedProgressThread) {
  Comm* c = Init(8, 1, Id());
  std::vector<float> buf(64);
  OpCall call = AllReduceOf(c, &buf);
  ASSERT_EQ(Submit(call), ncclSuccess);
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  std::vector<uint64_t> drain_us;
  const uint64_t wakes = ProgressWakes();
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the thread has nothing to do: it blocks
    const uint64_t t0 = HostNowNs();
    ASSERT_EQ(Submit(call), ncclSuccess);
    ASSERT_TRUE(ProgressDrain(5000000000ull));
    drain_us.push_back((HostNowNs() - t0) / 1000);
  }
  EXPECT_GE(ProgressWakes(), wakes + 1);
  std::sort(drain_us.begin(), drain_us.end());
  EXPECT_LT(drain_us[2], 20000u) << "a pushed unit waited for the thread's timeout";
}

TEST_F(ShimComm, HostOverheadIsSampled) {
  ResetUnitStats();
  Comm* c = Init(8, 1, Id());
  std::vector<float> buf(16);
  OpCall call = AllReduceOf(c, &buf);
  for (int i = 0; i < 16; ++i) ASSERT_EQ(Submit(call), ncclSuccess);
  EXPECT_EQ(UnitsExecuted(), 16u);
  EXPECT_GT(HostOverheadQuantileNs(0.5), 0u);
}

TEST_F(ShimComm, GroupedSendRecvIsOneUnitAndTheRecvMirrorsTheSend) {
  Comm* c = Init(4, 1, Id());
  std::vector<float> a(256, 1.f), b(256, 0.f);
  const uint64_t before = UnitsExecuted();
  ASSERT_EQ(GroupStart(), ncclSuccess);
  OpCall recv;
  recv.op = OpKind::kRecv;
  recv.comm = c;
  recv.count = b.size();
  recv.recv = b.data();
  recv.peer = 2;
  ASSERT_EQ(Submit(recv), ncclSuccess);  // posted before the send: still sees it (one exchange)
  OpCall send = recv;
  send.op = OpKind::kSend;
  send.recv = nullptr;
  send.send = a.data();
  ASSERT_EQ(Submit(send), ncclSuccess);
  EXPECT_EQ(UnitsExecuted(), before) << "nothing runs before ncclGroupEnd";
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  EXPECT_EQ(UnitsExecuted(), before + 1);
  std::lock_guard<std::mutex> l(gpu_.mu);
  EXPECT_EQ(gpu_.gates.size(), 0u) << "duration 0 (PRISM_FIXED_DUR_US=0), released here: no gate";
  bool copied = false;
  for (size_t i = 0; i < gpu_.steps.size(); ++i) {
    const payload::Step& s = gpu_.steps[i];
    if (s.kind == StepKind::kCopy &&
        payload::StepAddr(gpu_.descs[i], s.src_buf, s.src_offset) == reinterpret_cast<uint64_t>(a.data()) &&
        payload::StepAddr(gpu_.descs[i], s.dst_buf, s.dst_offset) == reinterpret_cast<uint64_t>(b.data())) {
      copied = true;
    }
  }
  EXPECT_TRUE(copied) << "mirror: the receive gets this rank's own send of the same size";
}

// torch's all_to_all_single with uneven splits over a 1024-rank world: 1024 sends and 1024 receives in one group.
// Under mirror every receive must get this rank's own send to that peer (not a same-size send to another peer).
TEST_F(ShimComm, LargeGroupedAllToAllReceivesWhatItSends) {
  Comm* c = Init(64, 5, Id());
  const int n = c->nranks;
  std::vector<std::vector<float>> in(n), out(n);
  ASSERT_EQ(GroupStart(), ncclSuccess);
  for (int j = 0; j < n; ++j) {
    in[j].assign(1 + j % 3, static_cast<float>(j));
    out[j].assign(in[j].size(), -1.f);
    OpCall send;
    send.op = OpKind::kSend;
    send.comm = c;
    send.count = in[j].size();
    send.send = in[j].data();
    send.peer = j;
    ASSERT_EQ(Submit(send), ncclSuccess);
    OpCall recv = send;
    recv.op = OpKind::kRecv;
    recv.send = nullptr;
    recv.recv = out[j].data();
    ASSERT_EQ(Submit(recv), ncclSuccess);
  }
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  std::lock_guard<std::mutex> l(gpu_.mu);
  int matched = 0;
  for (size_t i = 0; i < gpu_.steps.size(); ++i) {
    const payload::Step& st = gpu_.steps[i];
    if (st.kind != StepKind::kCopy) continue;
    uint64_t src = payload::StepAddr(gpu_.descs[i], st.src_buf, st.src_offset);
    uint64_t dst = payload::StepAddr(gpu_.descs[i], st.dst_buf, st.dst_offset);
    for (int j = 0; j < n; ++j) {
      if (dst == reinterpret_cast<uint64_t>(out[j].data())) {
        EXPECT_EQ(src, reinterpret_cast<uint64_t>(in[j].data())) << "peer " << j;
        ++matched;
      }
    }
  }
  EXPECT_EQ(matched, n);
}

// Megatron's MoE all-to-all (uneven splits): a group whose receive from a virtual peer has no send of its size in the
// group must not take an older call's send from the history: torch's caching allocator has often reused that memory
// by then (stale bytes read as bf16 gave NaN gradients on a GPU run).
TEST_F(ShimComm, GroupedReceiveWithoutASameSizeSendInItsGroupIgnoresOlderSends) {
  Comm* c = Init(2, 0, Id());
  std::vector<float> x(3, 7.f);
  OpCall a;
  a.op = OpKind::kSend;
  a.comm = c;
  a.count = x.size();
  a.send = x.data();
  a.peer = 1;
  ASSERT_EQ(GroupStart(), ncclSuccess);
  ASSERT_EQ(Submit(a), ncclSuccess);
  ASSERT_EQ(GroupEnd(), ncclSuccess);

  std::vector<float> to_self(5, 1.f), to_peer(5, 2.f), from_self(5, -1.f), from_peer(3, -1.f);
  auto op = [&](OpKind kind, int peer, std::vector<float>& buf) {
    OpCall o;
    o.op = kind;
    o.comm = c;
    o.count = buf.size();
    if (kind == OpKind::kSend) o.send = buf.data();
    else o.recv = buf.data();
    o.peer = peer;
    return Submit(o);
  };
  ASSERT_EQ(GroupStart(), ncclSuccess);
  ASSERT_EQ(op(OpKind::kSend, 0, to_self), ncclSuccess);
  ASSERT_EQ(op(OpKind::kSend, 1, to_peer), ncclSuccess);
  ASSERT_EQ(op(OpKind::kRecv, 0, from_self), ncclSuccess);
  ASSERT_EQ(op(OpKind::kRecv, 1, from_peer), ncclSuccess);
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  std::lock_guard<std::mutex> l(gpu_.mu);
  bool self_copied = false;
  for (size_t i = 0; i < gpu_.steps.size(); ++i) {
    const payload::Step& st = gpu_.steps[i];
    if (st.kind != StepKind::kCopy) continue;
    const uint64_t src = payload::StepAddr(gpu_.descs[i], st.src_buf, st.src_offset);
    const uint64_t dst = payload::StepAddr(gpu_.descs[i], st.dst_buf, st.dst_offset);
    EXPECT_NE(src, reinterpret_cast<uint64_t>(x.data())) << "a receive copied the first group's send buffer";
    if (dst == reinterpret_cast<uint64_t>(from_self.data()))
      self_copied = src == reinterpret_cast<uint64_t>(to_self.data());
  }
  EXPECT_TRUE(self_copied) << "the receive from the rank itself gets its send to itself";
}

TEST_F(ShimComm, PreMulSumOperatorsAreTracked) {
  Comm* c = Init(8, 1, Id());
  float scalar = 0.125f;
  ncclRedOp_t op;
  ASSERT_EQ(RedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, c), ncclSuccess);
  EXPECT_GE(static_cast<int>(op), static_cast<int>(ncclNumOps));
  std::vector<float> buf(64);
  OpCall call = AllReduceOf(c, &buf);
  call.redop = op;
  ASSERT_EQ(Submit(call), ncclSuccess);
  call.dtype = ncclBfloat16;
  EXPECT_EQ(Submit(call), ncclInvalidArgument) << "a PreMulSum operator is bound to its data type";
  EXPECT_EQ(RedOpDestroy(op, c), ncclSuccess);
  EXPECT_EQ(RedOpDestroy(op, c), ncclInvalidArgument);
  EXPECT_EQ(RedOpDestroy(ncclSum, c), ncclInvalidArgument);
}

TEST_F(ShimComm, SimulateEndEstimatesWithoutRunning) {
  SetFixedDur(250);
  Comm* c = Init(8, 1, Id());
  std::vector<float> buf(64);
  OpCall call;
  call.op = OpKind::kAllGather;
  call.comm = c;
  call.count = 8;
  call.send = buf.data();
  call.recv = buf.data();
  const uint64_t before = UnitsExecuted();
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  ASSERT_EQ(GroupStart(), ncclSuccess);
  ASSERT_EQ(Submit(call), ncclSuccess);
  ASSERT_EQ(GroupSimulateEnd(&info), ncclSuccess);
  EXPECT_FLOAT_EQ(info.estimatedTime, 250.f);
  EXPECT_EQ(UnitsExecuted(), before);
  EXPECT_EQ(GroupDepth(), 0);
}

TEST(ShimConfig, ParsesAndReportsBadValues) {
  static const std::map<std::string, std::string>* env = nullptr;
  std::map<std::string, std::string> e = {{"RANK", "7"},           {"WORLD_SIZE", "1024"},
                                          {"PRISM_GATE", "spin"},  {"PRISM_FIXED_DUR_US", "100"},
                                          {"PRISM_REAL_RANKS", "0,7-9"}, {"PRISM_GPUS_PER_NODE", "x"}};
  env = &e;
  const EnvLookup lookup = [](const char* n) -> const char* {
        auto it = env->find(n);
        return it == env->end() ? nullptr : it->second.c_str();
      };
  Config c;
  LoadConfig(lookup, &c);
  EXPECT_EQ(c.rank, 7);
  EXPECT_EQ(c.world_size, 1024);
  EXPECT_EQ(c.gate, GateKind::kSpin);
  EXPECT_DOUBLE_EQ(c.fixed_dur_us, 100.0);
  EXPECT_EQ(c.real_ranks, (std::vector<int>{0, 7, 8, 9}));
  EXPECT_TRUE(c.IsReal(8));
  EXPECT_EQ(c.gpus_per_node, 0);
  ASSERT_EQ(c.errors.size(), 1u);
  EXPECT_NE(c.errors[0].find("PRISM_GPUS_PER_NODE"), std::string::npos);
  EXPECT_FALSE(c.arrival_by_event);
  e = {{"PRISM_ARRIVAL", "event"}};
  LoadConfig(lookup, &c);
  EXPECT_TRUE(c.arrival_by_event);
  EXPECT_TRUE(c.errors.empty());
  e = {{"PRISM_ARRIVAL", "kernels"}};
  LoadConfig(lookup, &c);
  EXPECT_FALSE(c.arrival_by_event);
  ASSERT_EQ(c.errors.size(), 1u);
  EXPECT_NE(c.errors[0].find("PRISM_ARRIVAL='kernels'"), std::string::npos) << c.errors[0];
  std::vector<int> r;
  EXPECT_FALSE(ParseRankList("3-1", &r));
  EXPECT_FALSE(ParseRankList("1,,2", &r));
}

TEST(ShimConfig, EverySettingIsDocumented) {
  std::ifstream in(std::string(PRISM_SOURCE_DIR) + "/docs/libprism.md");
  std::stringstream ss;
  ss << in.rdbuf();
  ASSERT_FALSE(ss.str().empty()) << "docs/libprism.md missing";
  for (int i = 0; i < kNumSettings; ++i) {
    EXPECT_NE(ss.str().find(kSettings[i].env), std::string::npos) << kSettings[i].env << " is not in docs/libprism.md";
  }
}

}  // namespace
}  // namespace prism::interpose
