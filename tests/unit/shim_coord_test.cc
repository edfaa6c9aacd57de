// libprism against a scripted coordinator on a Unix socket (include/prism/ipc.h frames): hello, kCommInit ->
// kCommInfo (members, which are real), and for a communicator with two real members kOpArrive -> kOpRelease,
// whose release time (not the local rule) opens the gate.
#include <nccl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/ipc_io.h"
#include "interpose/core/comm.h"
#include "interpose/core/config.h"
#include "interpose/core/coord_client.h"
#include "interpose/core/engine.h"
#include "interpose/core/progress.h"
#include "shim_fake_gpu.h"

namespace prism::interpose {
namespace {

TEST(ShimCoord, ParseCommInfo) {
  CoordCommInfo info;
  std::string err;
  ASSERT_TRUE(ParseCommInfo(R"({"key":"ab","comm_id":4,"members":[0,8],"real":[true,false]})", &info, &err));
  EXPECT_EQ(info.comm_id, 4u);
  EXPECT_EQ(info.members, (std::vector<int32_t>{0, 8}));
  EXPECT_FALSE(ParseCommInfo(R"({"comm_id":0,"members":[],"real":[],"error":"members unknown"})", &info, &err));
  EXPECT_NE(err.find("members unknown"), std::string::npos);
  EXPECT_FALSE(ParseCommInfo(R"({"comm_id":2,"members":[0,8],"real":[true]})", &info, &err));
  EXPECT_FALSE(ParseCommInfo("not json", &info, &err));
}

TEST(ShimCoord, TwoRealMembersAreReleasedByTheCoordinator) {
  std::string path = "/tmp/prism_coord_test_" + std::to_string(getpid()) + ".sock";
  int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  unlink(path.c_str());
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(lfd, 1), 0);

  std::atomic<bool> saw_hello{false}, saw_init{false}, saw_arrive{false};
  std::atomic<uint64_t> released_at{0};
  std::thread server([&] {
    int fd = accept(lfd, nullptr, nullptr);
    std::string err;
    for (;;) {
      ipc::Frame f;
      if (ipc::RecvFrame(fd, &f, 10000, &err) != ipc::IoStatus::kOk) break;
      if (f.type == ipc::MsgType::kHello) {
        saw_hello = nlohmann::json::parse(f.payload).at("rank") == 0;
      } else if (f.type == ipc::MsgType::kCommInit) {
        nlohmann::json j = nlohmann::json::parse(f.payload);
        saw_init = j.at("nranks") == 4 && j.at("key").get<std::string>().size() == 256;
        nlohmann::json r = {{"key", j.at("key")}, {"comm_id", 9}, {"members", {0, 1, 2, 3}},
                            {"real", {true, true, false, false}}};
        std::string s = r.dump();
        ipc::SendFrame(fd, ipc::MsgType::kCommInfo, s.data(), s.size(), &err);
      } else if (f.type == ipc::MsgType::kOpArrive) {
        ipc::OpArrive a{};
        ASSERT_TRUE(ipc::DecodePod(f, &a));
        saw_arrive = a.comm_id == 9 && a.model_dur_ns == 1000000 && a.op == 1;
        ipc::OpRelease rel{};
        rel.comm_id = a.comm_id;
        rel.seq = a.seq;
        rel.release_ns = a.arrival_ns + 40000000;  // the other real rank is 40 ms late
        rel.last_rank = 1;
        released_at = rel.release_ns;
        ipc::SendFrame(fd, ipc::MsgType::kOpRelease, &rel, sizeof(rel), &err);
        break;
      }
    }
    usleep(100000);
    close(fd);
  });

  testing::FakeGpu gpu;
  SetGpuForTest(&gpu);
  Config c;
  c.rank = 0;
  c.world_size = 8;
  c.real_ranks = {0, 1};
  c.fixed_dur_us = 1000;
  c.coord_socket = path;
  c.exchange = false;  // this test is about the release; ExchangeWritesTheCoordinatorsResult covers data
  SetConfigForTest(c);
  ResetCommsForTest();
  ncclUniqueId id;
  GetUniqueId(&id);
  InitArgs a;
  a.nranks = 4;
  a.rank = 0;
  a.ids = &id;
  Comm* comm = nullptr;
  ASSERT_EQ(CommInit(a, &comm), ncclSuccess);
  EXPECT_EQ(comm->members, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(comm->real_members, 2);
  EXPECT_TRUE(comm->use_coordinator);
  EXPECT_EQ(comm->coord_comm_id, 9u);

  std::vector<float> buf(16);
  OpCall call;
  call.op = payload::OpKind::kAllReduce;
  call.comm = comm;
  call.count = buf.size();
  call.send = buf.data();
  call.recv = buf.data();
  ASSERT_EQ(Submit(call), ncclSuccess);
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  EXPECT_GE(HostNowNs(), released_at.load()) << "gate opened before the coordinator's release time";
  server.join();
  close(lfd);
  unlink(path.c_str());
  EXPECT_TRUE(saw_hello);
  EXPECT_TRUE(saw_init);
  EXPECT_TRUE(saw_arrive);
  SetGpuForTest(nullptr);
}

// Real data between real members: the shim sends its input (kOpData), writes the coordinator's result (kOpResult)
// into the receive buffer instead of the mirror rule; a send to a real peer posts its bytes, a receive from it asks.
TEST(ShimCoord, ExchangeWritesTheCoordinatorsResult) {
  std::string path = "/tmp/prism_coord_xtest_" + std::to_string(getpid()) + ".sock";
  int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  unlink(path.c_str());
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(lfd, 1), 0);

  std::vector<ipc::ExchangeHeader> data_headers;
  std::vector<std::string> data_bytes;
  std::thread server([&] {
    int fd = accept(lfd, nullptr, nullptr);
    std::string err;
    int answered = 0;
    for (;;) {
      ipc::Frame f;
      if (ipc::RecvFrame(fd, &f, 10000, &err) != ipc::IoStatus::kOk) break;
      if (f.type == ipc::MsgType::kCommInit) {
        nlohmann::json j = nlohmann::json::parse(f.payload);
        nlohmann::json r = {{"key", j.at("key")}, {"comm_id", 5}, {"members", {0, 1}}, {"real", {true, true}}};
        std::string s = r.dump();
        ipc::SendFrame(fd, ipc::MsgType::kCommInfo, s.data(), s.size(), &err);
      } else if (f.type == ipc::MsgType::kOpData) {
        ipc::ExchangeHeader h{};
        std::memcpy(&h, f.payload.data(), sizeof(h));
        data_headers.push_back(h);
        data_bytes.push_back(f.payload.substr(sizeof(h)));
        if (h.op == static_cast<uint16_t>(payload::OpKind::kSend)) continue;  // a send wants no answer
        // Answer: a collective gets 4 floats of 7.0; a receive gets 4 floats of 9.0.
        const float v = h.op == static_cast<uint16_t>(payload::OpKind::kRecv) ? 9.0f : 7.0f;
        std::vector<float> out(4, v);
        ipc::ExchangeHeader r = h;
        r.flags = 0;
        r.total_bytes = 16;
        r.offset = 0;
        std::string payload(reinterpret_cast<const char*>(&r), sizeof(r));
        payload.append(reinterpret_cast<const char*>(out.data()), 16);
        ipc::SendFrame(fd, ipc::MsgType::kOpResult, payload.data(), payload.size(), &err);
        if (++answered == 2) break;
      } else if (f.type == ipc::MsgType::kOpArrive) {
        ipc::OpArrive a{};
        ipc::DecodePod(f, &a);
        ipc::OpRelease rel{};
        rel.comm_id = a.comm_id;
        rel.seq = a.seq;
        rel.release_ns = a.arrival_ns;
        rel.last_rank = -1;
        ipc::SendFrame(fd, ipc::MsgType::kOpRelease, &rel, sizeof(rel), &err);
      }
    }
    usleep(300000);
    close(fd);
  });

  testing::FakeGpu gpu;
  SetGpuForTest(&gpu);
  Config c;
  c.rank = 0;
  c.world_size = 2;
  c.real_ranks = {0, 1};
  c.fixed_dur_us = 10;
  c.coord_socket = path;
  SetConfigForTest(c);
  ResetCommsForTest();
  CoordResetForTest();
  ncclUniqueId id;
  GetUniqueId(&id);
  InitArgs a;
  a.nranks = 2;
  a.rank = 0;
  a.ids = &id;
  Comm* comm = nullptr;
  ASSERT_EQ(CommInit(a, &comm), ncclSuccess);
  ASSERT_TRUE(comm->use_coordinator);
  ASSERT_EQ(comm->member_real, (std::vector<uint8_t>{1, 1}));

  std::vector<float> in{1, 2, 3, 4}, out(4, 0);
  OpCall call;
  call.op = payload::OpKind::kAllReduce;
  call.comm = comm;
  call.count = 4;
  call.send = in.data();
  call.recv = out.data();
  ASSERT_EQ(Submit(call), ncclSuccess);
  EXPECT_EQ(out, (std::vector<float>(4, 7.0f))) << "the coordinator's result, not the mirror rule (2 x input)";

  // A group: send 4 floats to the real peer, receive 4 from it.
  std::vector<float> sendbuf{5, 6, 7, 8}, recvbuf(4, 0);
  ASSERT_EQ(GroupStart(), ncclSuccess);
  OpCall snd = call;
  snd.op = payload::OpKind::kSend;
  snd.peer = 1;
  snd.send = sendbuf.data();
  snd.recv = nullptr;
  ASSERT_EQ(Submit(snd), ncclSuccess);
  OpCall rcv = call;
  rcv.op = payload::OpKind::kRecv;
  rcv.peer = 1;
  rcv.send = nullptr;
  rcv.recv = recvbuf.data();
  ASSERT_EQ(Submit(rcv), ncclSuccess);
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  EXPECT_EQ(recvbuf, (std::vector<float>(4, 9.0f)));
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  server.join();
  close(lfd);
  unlink(path.c_str());

  ASSERT_EQ(data_headers.size(), 3u);
  EXPECT_EQ(data_headers[0].op, static_cast<uint16_t>(payload::OpKind::kAllReduce));
  EXPECT_EQ(data_headers[0].comm_id, 5u);
  EXPECT_EQ(data_headers[0].key, 0u);
  EXPECT_EQ(data_bytes[0], std::string(reinterpret_cast<const char*>(in.data()), 16));
  EXPECT_EQ(data_headers[1].op, static_cast<uint16_t>(payload::OpKind::kSend));
  EXPECT_EQ(data_headers[1].rank, 0);
  EXPECT_EQ(data_headers[1].peer, 1);
  EXPECT_EQ(data_bytes[1], std::string(reinterpret_cast<const char*>(sendbuf.data()), 16));
  EXPECT_EQ(data_headers[2].op, static_cast<uint16_t>(payload::OpKind::kRecv));
  EXPECT_EQ(data_headers[2].flags, ipc::kExchangeRecvRequest);
  EXPECT_EQ(data_headers[2].rank, 1);  // the source
  EXPECT_EQ(data_headers[2].peer, 0);
  SetGpuForTest(nullptr);
}

}  // namespace
}  // namespace prism::interpose
