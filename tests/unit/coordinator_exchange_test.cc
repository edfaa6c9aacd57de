// ExchangeHub: the coordinator's assembly of real members' inputs and p2p hand-over
// (src/coordinator/bus/exchange_hub.h).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/ipc_io.h"
#include "coordinator/bus/exchange_hub.h"
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
  // Send first: buffered, then the request is answered at once (and the sender acknowledged).
  hub.OnData(20, Header(OpKind::kSend, 0, 0, 1, 1, 4), Ints({42}), &out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(hub.BufferedSends(), 1u);
  hub.OnData(21, Header(OpKind::kRecv, 0, 0, 1, 1, 0, 0, ipc::kExchangeRecvRequest), "", &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].rank, 21);
  EXPECT_EQ(Decode(out[0].frames).second, Ints({42}));
  EXPECT_EQ(out[1].rank, 20);
  EXPECT_EQ(Decode(out[1].frames).first.flags, ipc::kExchangeSendDone);
  // Receive first: parked until the send arrives, then answered to the receiver; the send is acknowledged at once.
  out.clear();
  hub.OnData(21, Header(OpKind::kRecv, 1, 0, 1, 1, 0, 0, ipc::kExchangeRecvRequest), "", &out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(hub.PendingReceives(), 1u);
  hub.OnData(20, Header(OpKind::kSend, 1, 0, 1, 1, 4), Ints({43}), &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].rank, 21);
  EXPECT_EQ(Decode(out[0].frames).second, Ints({43}));
  EXPECT_EQ(out[1].rank, 20);
  EXPECT_EQ(Decode(out[1].frames).first.flags, ipc::kExchangeSendDone);
  EXPECT_EQ(hub.PendingReceives() + hub.BufferedSends(), 0u);
  EXPECT_TRUE(hub.Waits().empty());
}

// NCCL's rendezvous: a send completes only once its receive is posted. The acknowledgement carries the send's
// header (comm, key, source, destination) and no bytes.
TEST(ExchangeHub, SendIsAcknowledgedOnlyOnceItsReceiveIsPosted) {
  ExchangeHub hub;
  hub.AddComm(7, {20, 21, 22}, {true, true, true});
  std::vector<ExchangeHub::Outgoing> out;
  std::vector<ExchangeHub::Wait> waits;
  ipc::ExchangeHeader s = Header(OpKind::kSend, 0, 0, 2, 2, 8);
  s.seq = 11;
  EXPECT_EQ(hub.OnData(20, s, Ints({1, 2}), &out, &waits), "");
  EXPECT_TRUE(out.empty()) << "no acknowledgement before the receive";
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_TRUE(waits[0].begin);
  EXPECT_EQ(waits[0].rank, 20);
  EXPECT_EQ(waits[0].peer, 22);
  EXPECT_EQ(waits[0].comm_id, 7u);
  EXPECT_EQ(waits[0].seq, 11u);
  EXPECT_EQ(waits[0].op, 103u);
  EXPECT_EQ(waits[0].bytes, 8u);
  // A receive of another pair does not acknowledge it.
  waits.clear();
  hub.OnData(21, Header(OpKind::kRecv, 0, 0, 1, 2, 0, 0, ipc::kExchangeRecvRequest), "", &out, &waits);
  EXPECT_TRUE(out.empty());
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_EQ(waits[0].rank, 21);
  EXPECT_EQ(waits[0].peer, 20);
  EXPECT_EQ(waits[0].op, 104u);
  EXPECT_EQ(hub.Waits().size(), 2u);
  // The matching receive: bytes to 22, the acknowledgement to 20, and 20's wait ends.
  waits.clear();
  ipc::ExchangeHeader r = Header(OpKind::kRecv, 0, 0, 2, 2, 0, 0, ipc::kExchangeRecvRequest);
  r.seq = 3;
  hub.OnData(22, r, "", &out, &waits);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].rank, 22);
  EXPECT_EQ(Decode(out[0].frames).second, Ints({1, 2}));
  EXPECT_EQ(out[1].rank, 20);
  auto [ack, ack_bytes] = Decode(out[1].frames);
  EXPECT_EQ(ack.flags, ipc::kExchangeSendDone);
  EXPECT_EQ(ack.comm_id, 7u);
  EXPECT_EQ(ack.key, 0u);
  EXPECT_EQ(ack.rank, 0);
  EXPECT_EQ(ack.peer, 2);
  EXPECT_EQ(ack.total_bytes, 0u);
  EXPECT_TRUE(ack_bytes.empty());
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_FALSE(waits[0].begin);
  EXPECT_EQ(waits[0].rank, 20);
  EXPECT_EQ(waits[0].seq, 11u);
  ASSERT_EQ(hub.Waits().size(), 1u);
  EXPECT_EQ(hub.Waits()[0].rank, 21);  // still waits for 20's send
}

// Two real ranks that both send to each other first (outside a group): neither send is acknowledged, both ranks
// wait, each for the other (the hang diagnosis's cycle 5 -> 517 -> 5). Posting the receives resolves both.
TEST(ExchangeHub, BothSendFirstLeavesTwoUnacknowledgedSends) {
  ExchangeHub hub;
  hub.AddComm(3, {5, 517}, {true, true});
  std::vector<ExchangeHub::Outgoing> out;
  std::vector<ExchangeHub::Wait> waits;
  ipc::ExchangeHeader a = Header(OpKind::kSend, 0, 0, 1, 4, 16);
  a.comm_id = 3;
  ipc::ExchangeHeader b = Header(OpKind::kSend, 0, 1, 0, 4, 16);
  b.comm_id = 3;
  hub.OnData(5, a, Ints({1, 2, 3, 4}), &out, &waits);
  hub.OnData(517, b, Ints({5, 6, 7, 8}), &out, &waits);
  EXPECT_TRUE(out.empty()) << "a send is not acknowledged before its receive is posted";
  EXPECT_EQ(hub.BufferedSends(), 2u);
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_EQ(waits[0].rank, 5);
  EXPECT_EQ(waits[0].peer, 517);
  EXPECT_EQ(waits[1].rank, 517);
  EXPECT_EQ(waits[1].peer, 5);
  std::vector<ExchangeHub::Wait> now = hub.Waits();
  ASSERT_EQ(now.size(), 2u);
  for (const auto& w : now) {
    EXPECT_EQ(w.op, 103u);
    EXPECT_EQ(w.bytes, 16u);
    EXPECT_EQ(w.seq, 0u);
  }
  // (What NCCL would never get to:) the receives resolve both.
  waits.clear();
  ipc::ExchangeHeader ra = Header(OpKind::kRecv, 0, 1, 0, 4, 0, 0, ipc::kExchangeRecvRequest);
  ra.comm_id = 3;
  ipc::ExchangeHeader rb = Header(OpKind::kRecv, 0, 0, 1, 4, 0, 0, ipc::kExchangeRecvRequest);
  rb.comm_id = 3;
  hub.OnData(5, ra, "", &out, &waits);
  hub.OnData(517, rb, "", &out, &waits);
  EXPECT_EQ(out.size(), 4u);
  EXPECT_EQ(waits.size(), 2u);
  EXPECT_TRUE(hub.Waits().empty());
}

// A collective's early members wait for the others; the last one to post never waited.
TEST(ExchangeHub, CollectiveWaitsUntilEveryRealMemberSent) {
  ExchangeHub hub;
  hub.AddComm(7, {10, 11, 12, 13}, {true, false, true, false});
  std::vector<ExchangeHub::Outgoing> out;
  std::vector<ExchangeHub::Wait> waits;
  ipc::ExchangeHeader h = Header(OpKind::kAllGather, 0, 0, -1, 1, 4);
  h.seq = 9;
  hub.OnData(10, h, Ints({1}), &out, &waits);
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_TRUE(waits[0].begin);
  EXPECT_EQ(waits[0].rank, 10);
  EXPECT_EQ(waits[0].peer, -1);
  EXPECT_EQ(waits[0].op, 2u);       // all_gather as kOpArrive codes it
  EXPECT_EQ(waits[0].bytes, 16u);   // as the shim counts an all_gather: count x 4 B x 4 members
  EXPECT_EQ(waits[0].seq, 9u);
  waits.clear();
  hub.OnData(12, Header(OpKind::kAllGather, 0, 2, -1, 1, 4), Ints({3}), &out, &waits);
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_FALSE(waits[0].begin);
  EXPECT_EQ(waits[0].rank, 10);
  EXPECT_EQ(out.size(), 2u);
}

// The header carries the low 32 bits of the sequence; the hub widens them per rank and communicator.
TEST(ExchangeHub, SequenceIsWidenedAcrossThe32BitWrap) {
  ExchangeHub hub;
  hub.AddComm(7, {0, 1}, {true, true});
  std::vector<ExchangeHub::Outgoing> out;
  std::vector<ExchangeHub::Wait> waits;
  ipc::ExchangeHeader h = Header(OpKind::kSend, 0, 0, 1, 1, 4);
  h.seq = 0xFFFFFFF0u;
  hub.OnData(0, h, Ints({1}), &out, &waits);
  h.key = 1;
  h.seq = 5;  // 2^32 + 5
  hub.OnData(0, h, Ints({1}), &out, &waits);
  h.key = 2;
  h.seq = 0xFFFFFFFEu;  // a little behind: still below the wrap
  hub.OnData(0, h, Ints({1}), &out, &waits);
  ASSERT_EQ(waits.size(), 3u);
  EXPECT_EQ(waits[0].seq, 0xFFFFFFF0ull);
  EXPECT_EQ(waits[1].seq, (1ull << 32) + 5);
  EXPECT_EQ(waits[2].seq, 0xFFFFFFFEull);
}

// A refused frame is answered: a send must not wait forever for an acknowledgement that never comes.
TEST(ExchangeHub, RefusedSendIsAnsweredWithAnError) {
  ExchangeHub hub;
  hub.AddComm(7, {0, 1}, {true, true});
  std::vector<ExchangeHub::Outgoing> out;
  EXPECT_NE(hub.OnData(0, Header(OpKind::kSend, 0, 0, 9, 1, 4), Ints({1}), &out), "");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].rank, 0);
  EXPECT_EQ(Decode(out[0].frames).first.flags, ipc::kExchangeError | ipc::kExchangeSendDone);
  out.clear();
  ipc::ExchangeHeader r = Header(OpKind::kRecv, 0, 0, 1, 1, 0, 0, ipc::kExchangeRecvRequest);
  r.comm_id = 8;  // unknown
  EXPECT_NE(hub.OnData(1, r, "", &out), "");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].rank, 1);
  EXPECT_EQ(Decode(out[0].frames).first.flags, ipc::kExchangeError);
  EXPECT_TRUE(hub.Waits().empty());
}

TEST(ExchangeHub, RefusesUnknownCommAndBadChunks) {
  ExchangeHub hub;
  std::vector<ExchangeHub::Outgoing> out;
  EXPECT_NE(hub.OnData(0, Header(OpKind::kAllReduce, 0, 0, -1, 1, 4), Ints({1}), &out), "");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Decode(out[0].frames).first.flags, ipc::kExchangeError);
  hub.AddComm(7, {0, 1}, {true, true});
  EXPECT_NE(hub.OnData(0, Header(OpKind::kAllReduce, 0, 0, -1, 1, 4, 8), Ints({1}), &out), "");
  EXPECT_NE(hub.OnData(0, Header(OpKind::kAllReduce, 0, 5, -1, 1, 4), Ints({1}), &out), "");
}

// What the hub holds for one rank is capped (limits::kMaxExchangeHeldBytes; 1 KiB here): an input being assembled
// counts whole from its first chunk, buffered sends until their receive; a rank past the cap is refused with
// over_cap (the coordinator drops it), and what it held is counted again once taken.
TEST(ExchangeHub, WhatOneRankMakesItHoldIsCapped) {
  ExchangeHub hub(1024);
  hub.AddComm(7, {20, 21}, {true, true});
  std::vector<ExchangeHub::Outgoing> out;
  bool over = false;
  // A 4-byte first chunk announcing 1000 bytes holds 1000.
  EXPECT_EQ(hub.OnData(20, Header(OpKind::kSend, 0, 0, 1, 250, 1000), Ints({1}), &out, nullptr, &over), "");
  EXPECT_EQ(hub.HeldBytes(20), 1000u);
  // Another announcing 100 more is over the cap: refused (answered with an error), and flagged.
  std::string why = hub.OnData(20, Header(OpKind::kSend, 1, 0, 1, 25, 100), Ints({1}), &out, nullptr, &over);
  EXPECT_TRUE(over);
  EXPECT_NE(why.find("rank 20 has 1000 bytes in exchanges, and 100 more would pass the 1024-byte cap"),
            std::string::npos) << why;
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Decode(out[0].frames).first.flags & ipc::kExchangeError, ipc::kExchangeError);
  EXPECT_EQ(hub.HeldBytes(21), 0u);  // another rank is not charged
  // The connection gone: its assembly is dropped, and a buffered 8-byte send then holds 8 until it is received.
  hub.ForgetRank(20);
  EXPECT_EQ(hub.HeldBytes(20), 0u);
  out.clear();
  over = false;
  EXPECT_EQ(hub.OnData(20, Header(OpKind::kSend, 2, 0, 1, 2, 8), Ints({1, 2}), &out, nullptr, &over), "");
  EXPECT_FALSE(over);
  EXPECT_EQ(hub.HeldBytes(20), 8u);
  hub.OnData(21, Header(OpKind::kRecv, 2, 0, 1, 2, 0, 0, ipc::kExchangeRecvRequest), "", &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Decode(out[0].frames).second, Ints({1, 2}));
  EXPECT_EQ(hub.HeldBytes(20), 0u);
}

// A collective's inputs are held until every real member posted; a member posting twice replaces its input.
TEST(ExchangeHub, CollectiveInputsAreHeldUntilTheLastMember) {
  ExchangeHub hub(1024);
  hub.AddComm(7, {0, 1}, {true, true});
  std::vector<ExchangeHub::Outgoing> out;
  hub.OnData(0, Header(OpKind::kAllReduce, 0, 0, -1, 2, 8), Ints({1, 2}), &out);
  hub.OnData(0, Header(OpKind::kAllReduce, 0, 0, -1, 2, 8), Ints({1, 2}), &out);
  EXPECT_EQ(hub.HeldBytes(0), 8u);
  hub.OnData(1, Header(OpKind::kAllReduce, 0, 1, -1, 2, 8), Ints({3, 4}), &out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Decode(out[0].frames).second, Ints({4, 6}));
  EXPECT_EQ(hub.HeldBytes(0) + hub.HeldBytes(1), 0u);
}

// A result larger than a client may have queued (limits::kMaxBusQueuedBytes; 1 MiB here) is refused before it is
// computed: a world-sized all-gather of a small input asks for world x input bytes.
TEST(ExchangeHub, AResultOverTheCapIsAnErrorNotComputed) {
  ExchangeHub hub(limits::kMaxExchangeHeldBytes, 1 << 20);
  std::vector<int> members(1024);
  std::vector<bool> real(members.size(), false);
  for (size_t i = 0; i < members.size(); ++i) members[i] = static_cast<int>(i);
  real[0] = real[1] = true;
  hub.AddComm(7, members, real);
  std::vector<ExchangeHub::Outgoing> out;
  const uint64_t count = 1024;  // 4 KiB of int32 from each member: 4 MiB of output for each
  std::string in(count * 4, '\1');
  EXPECT_EQ(hub.OnData(0, Header(OpKind::kAllGather, 0, 0, -1, count, in.size()), in, &out), "");
  std::string why = hub.OnData(1, Header(OpKind::kAllGather, 0, 1, -1, count, in.size()), in, &out);
  EXPECT_NE(why.find("a 4194304-byte result is over the 1048576-byte cap"), std::string::npos) << why;
  ASSERT_EQ(out.size(), 2u);
  for (const auto& o : out) EXPECT_EQ(Decode(o.frames).first.flags & ipc::kExchangeError, ipc::kExchangeError);
  // Under the cap, the same gather is computed.
  ExchangeHub roomy(limits::kMaxExchangeHeldBytes, 4 << 20);
  roomy.AddComm(7, members, real);
  out.clear();
  roomy.OnData(0, Header(OpKind::kAllGather, 0, 0, -1, count, in.size()), in, &out);
  EXPECT_EQ(roomy.OnData(1, Header(OpKind::kAllGather, 0, 1, -1, count, in.size()), in, &out), "");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Decode(out[0].frames).second.size(), 4u << 20);
}

}  // namespace
}  // namespace prism::coord
