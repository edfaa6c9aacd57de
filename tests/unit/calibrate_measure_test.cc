// The parts of the measurer that need no GPU (src/calibrate/measure.h): message sizes, rounding, communicator
// sizes, size parsing, where NCCL is looked for, and a clear failure where there is no driver.
#include <gtest/gtest.h>

#include <sstream>

#include "calibrate/measure.h"

namespace {

using namespace prism::calibrate;

TEST(CalibrateMeasure, SizeLadderGoesByStepAndEndsAtMax) {
  std::vector<uint64_t> s = SizeLadder(8, 256ull << 20, 4);
  ASSERT_EQ(s.size(), 14u);  // 8, 32, ..., 128 MiB, then 256 MiB
  EXPECT_EQ(s.front(), 8u);
  EXPECT_EQ(s[1], 32u);
  EXPECT_EQ(s[12], 128ull << 20);
  EXPECT_EQ(s.back(), 256ull << 20);
  EXPECT_EQ(SizeLadder(8, 8, 4), std::vector<uint64_t>{8});
  EXPECT_EQ(SizeLadder(1024, 4096, 2), (std::vector<uint64_t>{1024, 2048, 4096}));
  EXPECT_TRUE(SizeLadder(16, 8, 4).empty());
  EXPECT_TRUE(SizeLadder(8, 64, 1).empty());
  EXPECT_EQ(SizeLadder(1, ~0ull, 1024).back(), ~0ull);  // no overflow
}

TEST(CalibrateMeasure, RoundBytesKeepsWholeElementsPerRank) {
  EXPECT_EQ(RoundBytes(MeasuredOp::kAllReduce, 8, 8, 4), 8u);
  EXPECT_EQ(RoundBytes(MeasuredOp::kAllReduce, 2, 8, 4), 4u);  // at least one element
  EXPECT_EQ(RoundBytes(MeasuredOp::kAllGather, 8, 8, 4), 32u);  // one element per rank
  EXPECT_EQ(RoundBytes(MeasuredOp::kReduceScatter, 100, 2, 4), 96u);
  EXPECT_EQ(RoundBytes(MeasuredOp::kAllToAll, 256ull << 20, 8, 4), 256ull << 20);
  EXPECT_EQ(RoundBytes(MeasuredOp::kSendRecv, 10, 2, 4), 8u);
}

TEST(CalibrateMeasure, DefaultCommSizes) {
  EXPECT_EQ(DefaultCommSizes(2), std::vector<int>{2});
  EXPECT_EQ(DefaultCommSizes(8), (std::vector<int>{2, 4, 8}));
  EXPECT_EQ(DefaultCommSizes(6), (std::vector<int>{2, 4, 6}));
  EXPECT_TRUE(DefaultCommSizes(1).empty());
}

TEST(CalibrateMeasure, ParseByteSize) {
  uint64_t v = 0;
  std::string err;
  ASSERT_TRUE(ParseByteSize("8", &v, &err));
  EXPECT_EQ(v, 8u);
  ASSERT_TRUE(ParseByteSize("64K", &v, &err));
  EXPECT_EQ(v, 65536u);
  ASSERT_TRUE(ParseByteSize("256MiB", &v, &err));
  EXPECT_EQ(v, 256ull << 20);
  ASSERT_TRUE(ParseByteSize("1g", &v, &err));
  EXPECT_EQ(v, 1ull << 30);
  for (const char* bad : {"", "M", "12X", "-4", "0", "1.5M", "99999999999999G"}) {
    EXPECT_FALSE(ParseByteSize(bad, &v, &err)) << bad;
  }
}

TEST(CalibrateMeasure, NcclCandidates) {
  EXPECT_EQ(NcclCandidates("/opt/x/libnccl.so.2"), std::vector<std::string>{"/opt/x/libnccl.so.2"});
  std::vector<std::string> c = NcclCandidates("");
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(c[0], "libnccl.so.2");
  for (size_t i = 1; i < c.size(); ++i) EXPECT_NE(c[i].find("/lib/libnccl.so.2"), std::string::npos) << c[i];
}

TEST(CalibrateMeasure, NoDriverFailsWithAClearMessage) {
  MeasureOptions o;
  o.cuda_path = "/nonexistent/libcuda.so.1";
  MeasurementSet s;
  std::stringstream log;
  std::string err;
  EXPECT_FALSE(Measure(o, &s, log, &err));
  const bool no_driver = err.find("no NVIDIA driver here") != std::string::npos &&
                         err.find("--from") != std::string::npos;
  const bool no_headers = err.find("without the CUDA headers") != std::string::npos;
  EXPECT_TRUE(no_driver || no_headers) << err;
}

}  // namespace
