// Long wait gates get a precise tail: prism_gate_tail after cuStreamWaitValue32, its GPU-clock target written by the
// progress thread (the release time) before it opens the wait kTailEarlyNs early. Short ones do not.
#include <nccl.h>

#include <vector>

#include <gtest/gtest.h>

#include "interpose/core/comm.h"
#include "interpose/core/config.h"
#include "interpose/core/engine.h"
#include "interpose/core/progress.h"
#include "shim_fake_gpu.h"

namespace prism::interpose {
namespace {

Comm* MakeComm(double fixed_us) {
  Config c;
  c.rank = 0;
  c.world_size = 8;
  c.fixed_dur_us = fixed_us;
  SetConfigForTest(c);
  ResetCommsForTest();
  ncclUniqueId id;
  GetUniqueId(&id);
  InitArgs a;
  a.nranks = 8;
  a.rank = 0;
  a.ids = &id;
  Comm* comm = nullptr;
  EXPECT_EQ(CommInit(a, &comm), ncclSuccess);
  return comm;
}

ncclResult_t AllReduce(Comm* comm, std::vector<float>* buf) {
  OpCall call;
  call.op = payload::OpKind::kAllReduce;
  call.comm = comm;
  call.count = buf->size();
  call.send = buf->data();
  call.recv = buf->data();
  return Submit(call);
}

TEST(ShimGateTail, LongGateGetsATailWhoseTargetIsTheRelease) {
  testing::FakeGpu gpu;
  SetGpuForTest(&gpu);
  Comm* comm = MakeComm(2000);  // 2 ms >= kTailMinDurNs
  std::vector<float> buf(16, 1.0f);
  const uint64_t before = HostNowNs();
  ASSERT_EQ(AllReduce(comm, &buf), ncclSuccess);
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  const uint64_t after = HostNowNs();
  ASSERT_EQ(gpu.tails.size(), 1u);
  ASSERT_EQ(gpu.gates.size(), 1u);
  EXPECT_EQ(gpu.tails[0], gpu.gates[0].slot);
  const uint64_t target = gpu.target[gpu.tails[0] % kGateSlots];
  const uint64_t arrival = gpu.arrival[gpu.tails[0] % kGateSlots];
  EXPECT_EQ(target, arrival + 2000000) << "the tail waits for the release on the GPU clock";
  // The host opened the wait about kTailEarlyNs early, not at the release: the drain returned before
  // arrival + 2 ms - (kTailEarlyNs - slack) could not have happened later than the release itself.
  EXPECT_GE(after - before, 2000000u - kTailEarlyNs);
  SetGpuForTest(nullptr);
}

TEST(ShimGateTail, ShortGateHasNoTail) {
  testing::FakeGpu gpu;
  SetGpuForTest(&gpu);
  Comm* comm = MakeComm(100);
  std::vector<float> buf(16, 1.0f);
  ASSERT_EQ(AllReduce(comm, &buf), ncclSuccess);
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  EXPECT_TRUE(gpu.tails.empty());
  EXPECT_EQ(gpu.gates.size(), 1u);
  SetGpuForTest(nullptr);
}

}  // namespace
}  // namespace prism::interpose
