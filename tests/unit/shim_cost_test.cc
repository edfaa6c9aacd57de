// libprism's per-operation duration (src/interpose/core/cost.h): the per-thread memo of OperationCost answers as the
// model does, per communicator, also for a communicator built where a destroyed one lived.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <vector>

#include "interpose/core/config.h"
#include "interpose/core/cost.h"
#include "interpose/core/runtime.h"

namespace prism::interpose {
namespace {

using payload::DataType;
using payload::OpKind;

class ShimCost : public ::testing::Test {
 protected:
  void SetUp() override {
    Config c;
    c.rank = 5;
    c.world_size = 1024;
    c.fixed_dur_us = -1;  // the cost model
    rt_.emplace(Runtime::Parts{.config = c});
  }
  void TearDown() override { rt_.reset(); }
  std::optional<ScopedRuntime> rt_;
};

TEST_F(ShimCost, RepeatedOperationsCostWhatTheModelSaysPerCommunicator) {
  const std::vector<uint64_t> sizes = {1024, 1 << 20, 64ull << 20};
  auto small = MakeCommCost({}, 8);
  auto large = MakeCommCost({}, 1024);
  std::vector<uint64_t> first_small, first_large;
  for (uint64_t b : sizes) {
    first_small.push_back(OperationCost(small.get(), OpKind::kAllReduce, b, DataType::kBfloat16, -1, -1).dur_ns);
    first_large.push_back(OperationCost(large.get(), OpKind::kAllReduce, b, DataType::kBfloat16, -1, -1).dur_ns);
  }
  // Communicators of 8 and 1024 ranks take different times for the largest all-reduce.
  EXPECT_NE(first_small.back(), first_large.back());
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_EQ(OperationCost(small.get(), OpKind::kAllReduce, sizes[i], DataType::kBfloat16, -1, -1).dur_ns,
                first_small[i]);
      EXPECT_EQ(OperationCost(large.get(), OpKind::kAllReduce, sizes[i], DataType::kBfloat16, -1, -1).dur_ns,
                first_large[i]);
    }
  }
  // The same size under another operation kind is another entry.
  const uint64_t ag = OperationCost(large.get(), OpKind::kAllGather, sizes.back(), DataType::kBfloat16, -1, -1).dur_ns;
  auto fresh = MakeCommCost({}, 1024);
  EXPECT_EQ(OperationCost(large.get(), OpKind::kAllGather, sizes.back(), DataType::kBfloat16, -1, -1).dur_ns, ag);
  EXPECT_EQ(OperationCost(fresh.get(), OpKind::kAllGather, sizes.back(), DataType::kBfloat16, -1, -1).dur_ns, ag);
}

TEST_F(ShimCost, ACommunicatorBuiltWhereAnotherLivedIsNotAnsweredWithItsCosts) {
  const uint64_t bytes = 64ull << 20;
  auto reference = MakeCommCost({}, 1024);
  const uint64_t want = OperationCost(reference.get(), OpKind::kAllReduce, bytes, DataType::kFloat32, -1, -1).dur_ns;
  // Build and drop communicators of 8 ranks, each followed by one of 1024 (the allocator tends to hand the freed
  // block back): the new one's cost must be its own, not the 8-rank entry a memo keyed on the address would hold.
  for (int i = 0; i < 8; ++i) {
    auto eight = MakeCommCost({}, 8);
    const uint64_t small = OperationCost(eight.get(), OpKind::kAllReduce, bytes, DataType::kFloat32, -1, -1).dur_ns;
    ASSERT_NE(small, want);
    eight.reset();
    auto next = MakeCommCost({}, 1024);
    EXPECT_EQ(OperationCost(next.get(), OpKind::kAllReduce, bytes, DataType::kFloat32, -1, -1).dur_ns, want);
  }
}

// The memo answers a repeated operation without the model, and keeps kinds and data types apart.
TEST_F(ShimCost, ARepeatedOperationIsEvaluatedOnce) {
  auto comm = MakeCommCost({}, 64);
  const uint64_t bytes = 8 << 20;
  const uint64_t bf16 = OperationCost(comm.get(), OpKind::kAllReduce, bytes, DataType::kBfloat16, -1, -1).dur_ns;
  const uint64_t before = CostModelEvaluations();
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(OperationCost(comm.get(), OpKind::kAllReduce, bytes, DataType::kBfloat16, -1, -1).dur_ns, bf16);
  EXPECT_EQ(CostModelEvaluations(), before) << "a repeated operation was evaluated again";
  // Another data type or kind of the same size is an entry of its own, evaluated once.
  OperationCost(comm.get(), OpKind::kAllReduce, bytes, DataType::kFloat32, -1, -1);
  OperationCost(comm.get(), OpKind::kReduceScatter, bytes, DataType::kBfloat16, -1, -1);
  EXPECT_EQ(CostModelEvaluations(), before + 2);
  EXPECT_EQ(OperationCost(comm.get(), OpKind::kAllReduce, bytes, DataType::kBfloat16, -1, -1).dur_ns, bf16);
}

TEST_F(ShimCost, SendCostsDependOnThePeer) {
  auto comm = MakeCommCost({}, 1024);
  // Same node (neighbour) against another node: the memo keeps the peer apart.
  const uint64_t near = OperationCost(comm.get(), OpKind::kSend, 16 << 20, DataType::kBfloat16, 0, 1).dur_ns;
  const uint64_t far = OperationCost(comm.get(), OpKind::kSend, 16 << 20, DataType::kBfloat16, 0, 512).dur_ns;
  EXPECT_NE(near, far);
  EXPECT_EQ(OperationCost(comm.get(), OpKind::kSend, 16 << 20, DataType::kBfloat16, 0, 1).dur_ns, near);
  EXPECT_EQ(OperationCost(comm.get(), OpKind::kSend, 16 << 20, DataType::kBfloat16, 0, 512).dur_ns, far);
}

}  // namespace
}  // namespace prism::interpose
