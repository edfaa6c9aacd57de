// Exchange: outputs of real members computed from real inputs (nccl_patch/exchange.h), against hand-computed
// references.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "nccl_patch/exchange.h"

namespace prism::payload {
namespace {

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
template <typename T>
std::vector<T> As(const std::vector<uint8_t>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

ExchangeOp Op(OpKind k, DataType t, int n, uint64_t count, RedOp r = RedOp::kSum, int root = 0) {
  ExchangeOp op;
  op.op = k;
  op.dtype = t;
  op.nranks = n;
  op.count = count;
  op.redop = r;
  op.root = root;
  return op;
}

TEST(Exchange, AllReduceAllRealIsTheTrueSum) {
  auto a = Bytes<float>({1, 2, 3}), b = Bytes<float>({10, 20, 30});
  std::vector<uint8_t> out;
  ASSERT_EQ(ExchangeOutput(Op(OpKind::kAllReduce, DataType::kFloat32, 2, 3), {a.data(), b.data()}, 1, &out),
            ExchangeResult::kData);
  EXPECT_EQ(As<float>(out), (std::vector<float>{11, 22, 33}));
}

TEST(Exchange, VirtualMembersStandInRoundRobinOverRealOnes) {
  // Members 0 and 2 real, 1 and 3 virtual: virtual #0 (member 1) takes q0 = member 0, virtual #1 takes member 2.
  auto a = Bytes<int32_t>({1}), b = Bytes<int32_t>({100});
  std::vector<uint8_t> out0, out2;
  auto op = Op(OpKind::kAllReduce, DataType::kInt32, 4, 1);
  ASSERT_EQ(ExchangeOutput(op, {a.data(), nullptr, b.data(), nullptr}, 0, &out0), ExchangeResult::kData);
  ASSERT_EQ(ExchangeOutput(op, {a.data(), nullptr, b.data(), nullptr}, 2, &out2), ExchangeResult::kData);
  EXPECT_EQ(As<int32_t>(out0)[0], 202);
  EXPECT_EQ(out0, out2);  // every real member sees the same result
}

TEST(Exchange, AvgMaxMinProdAndIntegerAvgTruncates) {
  auto a = Bytes<float>({1, -4}), b = Bytes<float>({3, 8});
  std::vector<uint8_t> out;
  ExchangeOutput(Op(OpKind::kAllReduce, DataType::kFloat32, 2, 2, RedOp::kAvg), {a.data(), b.data()}, 0, &out);
  EXPECT_EQ(As<float>(out), (std::vector<float>{2, 2}));
  ExchangeOutput(Op(OpKind::kAllReduce, DataType::kFloat32, 2, 2, RedOp::kMax), {a.data(), b.data()}, 0, &out);
  EXPECT_EQ(As<float>(out), (std::vector<float>{3, 8}));
  ExchangeOutput(Op(OpKind::kAllReduce, DataType::kFloat32, 2, 2, RedOp::kMin), {a.data(), b.data()}, 0, &out);
  EXPECT_EQ(As<float>(out), (std::vector<float>{1, -4}));
  ExchangeOutput(Op(OpKind::kAllReduce, DataType::kFloat32, 2, 2, RedOp::kProd), {a.data(), b.data()}, 0, &out);
  EXPECT_EQ(As<float>(out), (std::vector<float>{3, -32}));
  auto i = Bytes<int64_t>({-7}), j = Bytes<int64_t>({0});
  ExchangeOutput(Op(OpKind::kAllReduce, DataType::kInt64, 2, 1, RedOp::kAvg), {i.data(), j.data()}, 0, &out);
  EXPECT_EQ(As<int64_t>(out)[0], -3);  // -7 / 2 truncates toward zero
}

TEST(Exchange, Bf16RoundsOnceAfterADoubleSum) {
  // bf16 1.0 = 0x3F80; 2^-8 = 0x3B80. 1 + 2^-8 + 2^-8 = 1 + 2^-7: representable (7 mantissa bits) only when summed
  // in wider precision before rounding (pairwise bf16 rounding would lose both halves).
  std::vector<uint16_t> one{0x3F80}, tiny{0x3B80};
  auto a = Bytes(one), b = Bytes(tiny), c = Bytes(tiny);
  std::vector<uint8_t> out;
  ASSERT_EQ(ExchangeOutput(Op(OpKind::kAllReduce, DataType::kBfloat16, 3, 1), {a.data(), b.data(), c.data()}, 0, &out),
            ExchangeResult::kData);
  EXPECT_EQ(As<uint16_t>(out)[0], 0x3F81);
}

TEST(Exchange, PreMulSumScalesEachInput) {
  auto a = Bytes<float>({2}), b = Bytes<float>({4});
  auto op = Op(OpKind::kAllReduce, DataType::kFloat32, 2, 1, RedOp::kPreMulSum);
  float half = 0.5f;
  std::memcpy(&op.premul_scalar_bits, &half, sizeof(half));
  std::vector<uint8_t> out;
  ExchangeOutput(op, {a.data(), b.data()}, 0, &out);
  EXPECT_EQ(As<float>(out)[0], 3.0f);
}

TEST(Exchange, BroadcastFromRealRootAndLocalForVirtualRoot) {
  auto root = Bytes<int64_t>({5, 6});
  std::vector<uint8_t> out;
  auto op = Op(OpKind::kBroadcast, DataType::kInt64, 4, 2, RedOp::kSum, 0);
  EXPECT_EQ(ExchangeInputBytes(op, 0), 16u);
  EXPECT_EQ(ExchangeInputBytes(op, 1), 0u);
  // A real non-root member sends no bytes; a non-null pointer marks it real.
  const uint8_t dummy = 0;
  ASSERT_EQ(ExchangeOutput(op, {root.data(), &dummy, nullptr, nullptr}, 1, &out), ExchangeResult::kData);
  EXPECT_EQ(As<int64_t>(out), (std::vector<int64_t>{5, 6}));
  // Root 3 virtual: receivers keep the local rule.
  op.root = 3;
  EXPECT_EQ(ExchangeOutput(op, {root.data(), root.data(), nullptr, nullptr}, 1, &out), ExchangeResult::kLocal);
}

TEST(Exchange, AllGatherReduceScatterAllToAllBlocks) {
  auto a = Bytes<int32_t>({1, 2}), b = Bytes<int32_t>({3, 4});
  std::vector<uint8_t> out;
  ExchangeOutput(Op(OpKind::kAllGather, DataType::kInt32, 2, 2), {a.data(), b.data()}, 0, &out);
  EXPECT_EQ(As<int32_t>(out), (std::vector<int32_t>{1, 2, 3, 4}));
  ExchangeOutput(Op(OpKind::kReduceScatter, DataType::kInt32, 2, 1), {a.data(), b.data()}, 1, &out);
  EXPECT_EQ(As<int32_t>(out), (std::vector<int32_t>{6}));
  ExchangeOutput(Op(OpKind::kAllToAll, DataType::kInt32, 2, 1), {a.data(), b.data()}, 0, &out);
  EXPECT_EQ(As<int32_t>(out), (std::vector<int32_t>{1, 3}));
  ExchangeOutput(Op(OpKind::kAllToAll, DataType::kInt32, 2, 1), {a.data(), b.data()}, 1, &out);
  EXPECT_EQ(As<int32_t>(out), (std::vector<int32_t>{2, 4}));
}

TEST(Exchange, ReduceAndGatherOnlyTheRootReceives) {
  auto a = Bytes<int32_t>({1}), b = Bytes<int32_t>({2});
  std::vector<uint8_t> out;
  auto op = Op(OpKind::kReduce, DataType::kInt32, 2, 1, RedOp::kSum, 1);
  EXPECT_EQ(ExchangeOutput(op, {a.data(), b.data()}, 0, &out), ExchangeResult::kNothing);
  EXPECT_EQ(ExchangeOutput(op, {a.data(), b.data()}, 1, &out), ExchangeResult::kData);
  EXPECT_EQ(As<int32_t>(out)[0], 3);
}

TEST(Exchange, RejectsBadArguments) {
  auto a = Bytes<int32_t>({1});
  std::vector<uint8_t> out;
  EXPECT_EQ(ExchangeOutput(Op(OpKind::kSend, DataType::kInt32, 1, 1), {a.data()}, 0, &out), ExchangeResult::kInvalid);
  EXPECT_EQ(ExchangeOutput(Op(OpKind::kAllReduce, DataType::kInt32, 2, 1), {a.data()}, 0, &out),
            ExchangeResult::kInvalid);
  EXPECT_EQ(ExchangeOutput(Op(OpKind::kAllReduce, DataType::kInt32, 2, 1), {nullptr, nullptr}, 0, &out),
            ExchangeResult::kInvalid);
}

}  // namespace
}  // namespace prism::payload
