// The parts of the measurer that need no GPU (src/calibrate/measure.h): message sizes, rounding, communicator
// sizes, size parsing, where NCCL is looked for, and a clear failure where there is no driver.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

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
  // PyTorch's wheel (if any python here has one) before the loader's path, the toolkit's last.
  ASSERT_GE(c.size(), 2u);
  EXPECT_EQ(c[c.size() - 2], "libnccl.so.2");
  for (size_t i = 0; i + 2 < c.size(); ++i) EXPECT_NE(c[i].find("/libnccl.so.2"), std::string::npos) << c[i];
  EXPECT_EQ(c.back(), "/usr/local/cuda/lib64/libnccl.so.2");
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

#ifdef PRISM_CALIB_FAKE_CUDA
// The whole measurer against fakes of libcuda and NCCL (tests/unit/calibrate_fake_*.cc): which calls it makes with
// which counts, the file it produces, NVLS switched off before NCCL starts.
class CalibrateFakeGpus : public testing::Test {
 protected:
  void SetUp() override {
    log_ = (std::filesystem::path(testing::TempDir()) / ("fake_nccl_" + std::to_string(::getpid()) + ".log")).string();
    std::filesystem::remove(log_);
    setenv("FAKE_NCCL_LOG", log_.c_str(), 1);
    unsetenv("NCCL_NVLS_ENABLE");
    unsetenv("NCCL_NVLINK_SHARP_ENABLE");
    o_.cuda_path = PRISM_CALIB_FAKE_CUDA;
    o_.nccl_path = PRISM_CALIB_FAKE_NCCL;
    o_.min_bytes = 8;
    o_.max_bytes = 8192;
    o_.target_ms = 0.2;
    o_.max_iters = 20;
    o_.warmup = 2;
  }
  void TearDown() override {
    std::filesystem::remove(log_);
    unsetenv("FAKE_NCCL_LOG");
    unsetenv("FAKE_CUDA_GPUS");
    unsetenv("FAKE_CUDA_INIT_ERROR");
  }
  // (op, nranks) -> the counts each rank passed, from the fake's log.
  std::map<std::pair<std::string, int>, std::vector<size_t>> Calls() const {
    std::map<std::pair<std::string, int>, std::vector<size_t>> out;
    std::ifstream f(log_);
    std::string op;
    int rank, nranks, peer;
    size_t count;
    while (f >> op >> rank >> nranks >> count >> peer) out[{op, nranks}].push_back(count);
    return out;
  }
  std::string log_;
  MeasureOptions o_;
};

TEST_F(CalibrateFakeGpus, MeasuresEveryOpSizeAndCommunicator) {
  setenv("FAKE_CUDA_GPUS", "4", 1);
  MeasurementSet s;
  std::stringstream log;
  std::string err;
  ASSERT_TRUE(Measure(o_, &s, log, &err)) << err << "\n" << log.str();
  EXPECT_EQ(s.gpu_name, "Fake H200");
  EXPECT_EQ(s.compute_capability, 90);
  EXPECT_EQ(s.gpu_count, 4);
  EXPECT_EQ(s.nccl_version, "2.28.9");
  EXPECT_EQ(s.nccl_library, PRISM_CALIB_FAKE_NCCL);
  EXPECT_EQ(s.cuda_driver_version, 13000);
  EXPECT_EQ(s.Env("NCCL_NVLS_ENABLE"), "0");
  EXPECT_EQ(s.Env("NCCL_NVLINK_SHARP_ENABLE"), "0");
  EXPECT_FALSE(s.NvlsAllowed());
  // 5 collectives x communicators of 2 and 4, sizes 8 B .. 8 KiB by 4 (8 32 128 512 2K 8K; all-gather, reduce-
  // scatter and all-to-all round up to one f32 per rank: 16 B on 4 GPUs), send/receive 0 -> 1, 2, 3.
  std::map<std::tuple<std::string, int>, int> points;
  for (const Measurement& m : s.results) {
    ++points[{ToString(m.op), m.nranks}];
    EXPECT_GE(m.iterations, 5);
    EXPECT_GT(m.time_us, 0.0);
    EXPECT_GT(m.busbw_GBps, 0.0);
  }
  EXPECT_EQ((points[{"allreduce", 2}]), 6);
  EXPECT_EQ((points[{"allreduce", 4}]), 6);
  EXPECT_EQ((points[{"allgather", 4}]), 6);
  EXPECT_EQ((points[{"broadcast", 2}]), 6);
  EXPECT_EQ((points[{"alltoall", 4}]), 6);
  EXPECT_EQ(points.size(), 11u);
  EXPECT_EQ((points[{"sendrecv", 2}]), 18);
  for (const Measurement& m : s.results) {
    if (m.op == MeasuredOp::kAllGather && m.nranks == 4) {
      EXPECT_EQ(m.bytes % 16, 0u) << m.bytes;
    }
    if (m.op == MeasuredOp::kSendRecv) {
      EXPECT_EQ(m.src, 0);
    }
  }
  // What NCCL was asked: f32 counts; all-gather's send count and reduce-scatter's receive count are per rank.
  auto calls = Calls();
  const auto key = [](const char* op, int n) { return std::make_pair(std::string(op), n); };
  EXPECT_FALSE(calls[key("allreduce", 4)].empty());
  for (size_t c : calls[key("allreduce", 4)]) EXPECT_TRUE(c == 2 || c == 8 || c == 32 || c == 128 || c == 512 || c == 2048) << c;
  for (size_t c : calls[key("allgather", 4)]) EXPECT_TRUE(c == 1 || c == 2 || c == 8 || c == 32 || c == 128 || c == 512) << c;
  for (size_t c : calls[key("reducescatter", 2)]) EXPECT_TRUE(c == 1 || c == 4 || c == 16 || c == 64 || c == 256 || c == 1024) << c;
  EXPECT_EQ(calls[key("send", 4)].size(), calls[key("recv", 4)].size());
  EXPECT_FALSE(calls[key("send", 4)].empty());
  // The table.
  EXPECT_NE(log.str().find("measuring on 4 x Fake H200"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("busbw GB/s"), std::string::npos);
  // And the file reads back.
  MeasurementSet back;
  ASSERT_TRUE(MeasurementsFromJson(MeasurementsToJson(s), &back, &err)) << err;
  EXPECT_EQ(back.results.size(), s.results.size());
}

TEST_F(CalibrateFakeGpus, OptionsSelectOpsPairsAndCommunicators) {
  setenv("FAKE_CUDA_GPUS", "3", 1);
  o_.ops = {MeasuredOp::kSendRecv, MeasuredOp::kAllReduce};
  o_.comm_sizes = {3};
  o_.all_pairs = true;
  o_.max_bytes = 32;
  MeasurementSet s;
  std::stringstream log;
  std::string err;
  ASSERT_TRUE(Measure(o_, &s, log, &err)) << err;
  int ar = 0, p2p = 0;
  std::map<std::pair<int, int>, int> pairs;
  for (const Measurement& m : s.results) {
    ASSERT_TRUE(m.op == MeasuredOp::kAllReduce || m.op == MeasuredOp::kSendRecv);
    if (m.op == MeasuredOp::kAllReduce) {
      ++ar;
      EXPECT_EQ(m.nranks, 3);
    } else {
      ++p2p;
      ++pairs[{m.src, m.dst}];
    }
  }
  EXPECT_EQ(ar, 2);        // 8 B, 32 B
  EXPECT_EQ(p2p, 12);      // 6 ordered pairs x 2 sizes
  EXPECT_EQ(pairs.size(), 6u);
}

TEST_F(CalibrateFakeGpus, RespectsNvlsVariablesTheUserSet) {
  setenv("NCCL_NVLS_ENABLE", "1", 1);  // the fake NCCL then refuses to start: what the user set is kept
  MeasurementSet s;
  std::stringstream log;
  std::string err;
  EXPECT_FALSE(Measure(o_, &s, log, &err));
  EXPECT_NE(err.find("ncclCommInitAll"), std::string::npos) << err;
  unsetenv("NCCL_NVLS_ENABLE");
}

TEST_F(CalibrateFakeGpus, FailsClearlyWithOneGpuOrNoDevice) {
  setenv("FAKE_CUDA_GPUS", "1", 1);
  MeasurementSet s;
  std::stringstream log;
  std::string err;
  EXPECT_FALSE(Measure(o_, &s, log, &err));
  EXPECT_NE(err.find("1 visible GPU(s)"), std::string::npos) << err;
  setenv("FAKE_CUDA_GPUS", "2", 1);
  o_.gpus = 4;
  EXPECT_FALSE(Measure(o_, &s, log, &err));
  EXPECT_NE(err.find("--gpus 4: only 2 visible"), std::string::npos) << err;
  o_.gpus = 0;
  setenv("FAKE_CUDA_INIT_ERROR", "1", 1);
  EXPECT_FALSE(Measure(o_, &s, log, &err));
  EXPECT_NE(err.find("cuInit failed"), std::string::npos) << err;
  unsetenv("FAKE_CUDA_INIT_ERROR");
  o_.nccl_path = "/nonexistent/libnccl.so.2";
  EXPECT_FALSE(Measure(o_, &s, log, &err));
  EXPECT_NE(err.find("cannot load NCCL"), std::string::npos) << err;
}
#endif  // PRISM_CALIB_FAKE_CUDA

}  // namespace
