// Frame codec and socket helpers of include/prism/ipc.h (src/common/ipc_io.h), as the shim and coordinator use them.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <thread>

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
