// Frame codec and socket helpers of include/prism/ipc.h (src/common/ipc_io.h), as the shim and coordinator use them.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "common/ipc_io.h"

namespace prism::ipc {
namespace {

TEST(IpcIo, PodFrameRoundTripsThroughTheDecoderByteByByte) {
  OpArrive a{};
  a.comm_id = 7;
  a.op = 3;
  a.seq = 123456789012ull;
  a.bytes = 1 << 20;
  a.arrival_ns = 1795936804850678368ull;
  a.peer = -1;
  std::string wire = EncodePod(MsgType::kOpArrive, a) + EncodeFrame(MsgType::kHello, R"({"rank":5})") +
                     EncodeFrame(MsgType::kBye, "");
  FrameDecoder d;
  std::vector<Frame> got;
  for (char ch : wire) {
    d.Feed(&ch, 1);
    Frame f;
    DecodeStatus st;
    while ((st = d.Next(&f)) == DecodeStatus::kFrame) got.push_back(f);
    ASSERT_EQ(st, DecodeStatus::kNeedMore);
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].type, MsgType::kOpArrive);
  OpArrive b{};
  ASSERT_TRUE(DecodePod(got[0], &b));
  EXPECT_EQ(b.seq, a.seq);
  EXPECT_EQ(b.arrival_ns, a.arrival_ns);
  EXPECT_EQ(b.peer, -1);
  EXPECT_EQ(got[1].type, MsgType::kHello);
  EXPECT_EQ(got[1].payload, R"({"rank":5})");
  EXPECT_EQ(got[2].type, MsgType::kBye);
  EXPECT_TRUE(got[2].payload.empty());
  OpRelease wrong{};
  EXPECT_FALSE(DecodePod(got[0], &wrong)) << "size mismatch must be caught";
  EXPECT_EQ(d.buffered(), 0u);
}

// The coordinator's way in (Reserve + Commit, reads sized by WantBytes) and out (NextView): frames of every size,
// split anywhere, come out whole and unchanged, and a large frame is asked for as its rest, never beyond its end.
TEST(IpcIo, ReserveCommitAndViewsCarryFramesWithoutCopies) {
  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  std::string wire = EncodeFrame(MsgType::kHello, R"({"rank":1})") + EncodeFrame(MsgType::kOpData, big) +
                     EncodeFrame(MsgType::kBye, "") + EncodeFrame(MsgType::kOpData, big.substr(0, 5000));
  for (size_t step : {size_t{1} << 10, size_t{7777}, size_t{64} << 10}) {
    FrameDecoder d;
    std::vector<std::pair<MsgType, std::string>> got;
    size_t pos = 0;
    while (pos < wire.size()) {
      const size_t want = d.WantBytes(step);
      EXPECT_GE(want, step);
      const size_t n = std::min({want, step * 3, wire.size() - pos});
      std::memcpy(d.Reserve(want), wire.data() + pos, n);
      d.Commit(n);
      pos += n;
      FrameView v;
      DecodeStatus st;
      while ((st = d.NextView(&v)) == DecodeStatus::kFrame) got.emplace_back(v.type, std::string(v.payload));
      ASSERT_EQ(st, DecodeStatus::kNeedMore);
    }
    ASSERT_EQ(got.size(), 4u) << step;
    EXPECT_EQ(got[0].second, R"({"rank":1})");
    EXPECT_EQ(got[1].first, MsgType::kOpData);
    EXPECT_TRUE(got[1].second == big) << step;
    EXPECT_EQ(got[2].first, MsgType::kBye);
    EXPECT_TRUE(got[3].second == big.substr(0, 5000)) << step;
    EXPECT_EQ(d.buffered(), 0u);
  }
  // With a large frame's header in, the next read is its rest.
  FrameDecoder d;
  std::string one = EncodeFrame(MsgType::kOpData, big);
  std::memcpy(d.Reserve(100), one.data(), 100);
  d.Commit(100);
  EXPECT_EQ(d.WantBytes(64 << 10), one.size() - 100);
}

TEST(IpcIo, BadHeadersStopTheStream) {
  auto expect_error = [](FrameHeader h, const char* what) {
    FrameDecoder d;
    d.Feed(&h, sizeof(h));
    Frame f;
    EXPECT_EQ(d.Next(&f), DecodeStatus::kError) << what;
    EXPECT_NE(d.error().find(what), std::string::npos) << d.error();
    EXPECT_EQ(d.Next(&f), DecodeStatus::kError) << "stays failed";
  };
  FrameHeader h;
  h.type = static_cast<uint16_t>(MsgType::kHello);
  FrameHeader bad = h;
  bad.magic = 0x50545448;  // "HTTP"
  expect_error(bad, "bad frame magic");
  bad = h;
  bad.version = kVersion + 1;
  expect_error(bad, ("unsupported frame version " + std::to_string(kVersion + 1)).c_str());
  bad = h;
  bad.length = kMaxFrameBytes + 1;
  expect_error(bad, "exceeds the limit");
  bad = h;
  bad.type = 0;
  expect_error(bad, "invalid");
  std::string big;
  EXPECT_FALSE(AppendFrame(&big, MsgType::kHello, "", kMaxFrameBytes + 1ull));
}

TEST(IpcIo, SendAndReceiveOverASocket) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  std::string big(3 << 20, 'x');  // larger than a socket buffer: exercises short writes
  std::thread writer([&] {
    std::string err;
    EXPECT_EQ(SendFrame(sv[0], MsgType::kCommInfo, big.data(), big.size(), &err), IoStatus::kOk) << err;
    IterationMark m{};
    m.iteration = 4;
    EXPECT_EQ(SendFrame(sv[0], MsgType::kIteration, &m, sizeof(m), &err), IoStatus::kOk) << err;
  });
  Frame f;
  std::string err;
  ASSERT_EQ(RecvFrame(sv[1], &f, 5000, &err), IoStatus::kOk) << err;
  EXPECT_EQ(f.type, MsgType::kCommInfo);
  EXPECT_EQ(f.payload, big);
  ASSERT_EQ(RecvFrame(sv[1], &f, 5000, &err), IoStatus::kOk) << err;
  IterationMark m{};
  ASSERT_TRUE(DecodePod(f, &m));
  EXPECT_EQ(m.iteration, 4u);
  writer.join();
  EXPECT_EQ(RecvFrame(sv[1], &f, 50, &err), IoStatus::kTimeout);
  ::close(sv[0]);
  EXPECT_EQ(RecvFrame(sv[1], &f, 1000, &err), IoStatus::kClosed);
  ::close(sv[1]);
}

TEST(IpcIo, WriteToAClosedPeerIsAnErrorNotASignal) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ::close(sv[1]);
  std::string err;
  EXPECT_NE(SendFrame(sv[0], MsgType::kBye, "", 0, &err), IoStatus::kOk);
  ::close(sv[0]);
}

TEST(IpcIo, ConnectErrorsNameTheTarget) {
  std::string err;
  EXPECT_EQ(ConnectUnix("/nonexistent/prism.sock", &err), -1);
  EXPECT_NE(err.find("/nonexistent/prism.sock"), std::string::npos) << err;
  EXPECT_EQ(ConnectTcp("127.0.0.1", 1, 1000, &err), -1);
  EXPECT_NE(err.find("127.0.0.1:1"), std::string::npos) << err;
}

TEST(IpcIo, Hex) {
  std::string bytes("\x00\x01\xab\xff", 4), back;
  EXPECT_EQ(HexEncode(bytes), "0001abff");
  ASSERT_TRUE(HexDecode("0001ABff", &back));
  EXPECT_EQ(back, bytes);
  EXPECT_FALSE(HexDecode("abc", &back));
  EXPECT_FALSE(HexDecode("zz", &back));
}

}  // namespace
}  // namespace prism::ipc
