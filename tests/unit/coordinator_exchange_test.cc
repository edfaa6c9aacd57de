// ExchangeHub: the coordinator's assembly of real members' inputs and p2p hand-over (src/coordinator/exchange_hub.h).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/ipc_io.h"
#include "coordinator/exchange_hub.h"
#include "nccl_patch/semantics.h"

namespace prism::coord {
namespace {

using payload::OpKind;

ipc::ExchangeHeader Header(OpKind op, uint64_t key, int rank, int peer, uint64_t count, uint64_t total,
                           uint64_t offset = 0, uint32_t flags = 0) {
  ipc::ExchangeHeader h{};
  h.comm_id = 7;
  h.op = static_cast<uint16_t>(op);
  h.dtype = static_cast<uint8_t>(payload::DataType::kInt32);
  h.redop = 0;
  h.key = key;
  h.rank = rank;
  h.peer = peer;
  h.count = count;
  h.total_bytes = total;
  h.offset = offset;
  h.flags = flags;
  return h;
}

std::string Ints(std::vector<int32_t> v) { return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4); }

// Decodes every kOpResult frame in `frames`: (header of the last, assembled bytes).
std::pair<ipc::ExchangeHeader, std::string> Decode(const std::string& frames) {
  ipc::FrameDecoder d(ipc::kMaxFrameBytes);
  d.Feed(frames.data(), frames.size());
  ipc::Frame f;
  ipc::ExchangeHeader h{};
  std::string bytes;
  while (d.Next(&f) == ipc::DecodeStatus::kFrame) {
    EXPECT_EQ(f.type, ipc::MsgType::kOpResult);
    std::memcpy(&h, f.payload.data(), sizeof(h));
    bytes += f.payload.substr(sizeof(h));
  }
  return {h, bytes};
}

TEST(ExchangeHub, AllReduceWaitsForEveryRealMemberThenAnswersEach) {
  ExchangeHub hub;
  hub.AddComm(7, {10, 11, 12, 13}, {true, false, true, false});
  std::vector<ExchangeHub::Outgoing> out;
  EXPECT_EQ(hub.OnData(10, Header(OpKind::kAllReduce, 0, 0, -1, 1, 4), Ints({1}), &out), "");
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(hub.PendingCollectives(), 1u);
  EXPECT_EQ(hub.OnData(12, Header(OpKind::kAllReduce, 0, 2, -1, 1, 4), Ints({100}), &out), "");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(hub.PendingCollectives(), 0u);
  for (auto& o : out) {
    auto [h, bytes] = Decode(o.frames);
    EXPECT_EQ(h.flags, 0u);
    EXPECT_EQ(bytes, Ints({202}));  // 1 + 1 (virtual 1 stands in for member 0) + 100 + 100
  }
  EXPECT_EQ(out[0].rank, 10);
  EXPECT_EQ(out[1].rank, 12);
}

TEST(ExchangeHub, ChunkedInputIsAssembled) {
  ExchangeHub hub;
  hub.AddComm(7, {0, 1}, {true, true});
  std::vector<ExchangeHub::Outgoing> out;
  EXPECT_EQ(hub.OnData(0, Header(OpKind::kAllGather, 3, 0, -1, 2, 8, 0), Ints({1}), &out), "");
  EXPECT_EQ(hub.OnData(0, Header(OpKind::kAllGather, 3, 0, -1, 2, 8, 4), Ints({2}), &out), "");
  EXPECT_EQ(hub.OnData(1, Header(OpKind::kAllGather, 3, 1, -1, 2, 8), Ints({3, 4}), &out), "");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Decode(out[0].frames).second, Ints({1, 2, 3, 4}));
}

TEST(ExchangeHub, DisagreeingMembersGetAnErrorNotData) {
  ExchangeHub hub;
  hub.AddComm(7, {0, 1}, {true, true});
  std::vector<ExchangeHub::Outgoing> out;
  hub.OnData(0, Header(OpKind::kAllReduce, 0, 0, -1, 1, 4), Ints({1}), &out);
  std::string why = hub.OnData(1, Header(OpKind::kAllReduce, 0, 1, -1, 2, 8), Ints({1, 2}), &out);
  EXPECT_NE(why.find("disagree"), std::string::npos) << why;
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Decode(out[0].frames).first.flags, ipc::kExchangeError);
}

TEST(ExchangeHub, BroadcastFromVirtualRootIsLocal) {
  ExchangeHub hub;
  hub.AddComm(7, {0, 1, 2}, {false, true, true});
  std::vector<ExchangeHub::Outgoing> out;
  hub.OnData(1, Header(OpKind::kBroadcast, 0, 1, 0, 1, 0), "", &out);
  hub.OnData(2, Header(OpKind::kBroadcast, 0, 2, 0, 1, 0), "", &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Decode(out[0].frames).first.flags, ipc::kExchangeLocal);
}

TEST(ExchangeHub, P2pSendBeforeOrAfterTheReceive) {
  ExchangeHub hub;
  hub.AddComm(7, {20, 21}, {true, true});
  std::vector<ExchangeHub::Outgoing> out;
  // Send first: buffered, then the request is answered at once.
  hub.OnData(20, Header(OpKind::kSend, 0, 0, 1, 1, 4), Ints({42}), &out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(hub.BufferedSends(), 1u);
  hub.OnData(21, Header(OpKind::kRecv, 0, 0, 1, 1, 0, 0, ipc::kExchangeRecvRequest), "", &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].rank, 21);
  EXPECT_EQ(Decode(out[0].frames).second, Ints({42}));
  // Receive first: parked until the send arrives, then answered to the receiver.
  out.clear();
  hub.OnData(21, Header(OpKind::kRecv, 1, 0, 1, 1, 0, 0, ipc::kExchangeRecvRequest), "", &out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(hub.PendingReceives(), 1u);
  hub.OnData(20, Header(OpKind::kSend, 1, 0, 1, 1, 4), Ints({43}), &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].rank, 21);
  EXPECT_EQ(Decode(out[0].frames).second, Ints({43}));
}

TEST(ExchangeHub, RefusesUnknownCommAndBadChunks) {
  ExchangeHub hub;
  std::vector<ExchangeHub::Outgoing> out;
  EXPECT_NE(hub.OnData(0, Header(OpKind::kAllReduce, 0, 0, -1, 1, 4), Ints({1}), &out), "");
  hub.AddComm(7, {0, 1}, {true, true});
  EXPECT_NE(hub.OnData(0, Header(OpKind::kAllReduce, 0, 0, -1, 1, 4, 8), Ints({1}), &out), "");
  EXPECT_NE(hub.OnData(0, Header(OpKind::kAllReduce, 0, 5, -1, 1, 4), Ints({1}), &out), "");
}

}  // namespace
}  // namespace prism::coord
