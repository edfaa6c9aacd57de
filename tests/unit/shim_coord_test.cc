// libprism against a scripted coordinator on a Unix socket (include/prism/ipc.h frames): hello, kCommInit ->
// kCommInfo (members, which are real), and for a communicator with two real members kOpArrive -> kOpRelease,
// whose release time (not the local rule) opens the gate.
#include <nccl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/ipc_io.h"
#include "interpose/core/comm.h"
#include "interpose/core/config.h"
#include "interpose/core/coord_client.h"
#include "interpose/core/event_log.h"
#include "interpose/core/progress.h"
#include "interpose/core/real_symbols.h"
#include "interpose/core/recorded.h"
#include "interpose/core/runtime.h"
#include "interpose/core/submit.h"
#include "interpose/core/unit_stats.h"
#include "shim_fake_gpu.h"

namespace prism::interpose {
namespace {

// The scripted coordinator's listening socket at `path` (a stale file is removed); -1 on failure.
int ListenUnix(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  unlink(path.c_str());
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 1) != 0) return -1;
  return fd;
}

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
  int lfd = ListenUnix(path);
  ASSERT_GE(lfd, 0) << path;

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
  Config c;
  c.rank = 0;
  c.world_size = 8;
  c.real_ranks = {0, 1};
  c.fixed_dur_us = 1000;
  c.coord_socket = path;
  c.exchange = false;  // this test is about the release; ExchangeWritesTheCoordinatorsResult covers data
  ScopedRuntime rt({.config = c, .gpu = &gpu});
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
}

// The coordinator's release time comes back after it has passed (its decision took 5 ms): the gate opens at once,
// and the op line carries the decided release_ns and, in opened_ns, when the gate actually opened (docs/fill.md,
// "Coordinator latency").
// The client side of the scripted-coordinator tests below: rank 0 of a two-rank communicator on a fake GPU, with
// `c`'s real ranks and graph, connects to the coordinator at c.coord_socket, runs `n` all-reduces one after the
// other, stops its event log, calls `after_stop` (the test's server ends there) and returns the log's op lines.
std::vector<nlohmann::json> OpLinesOfAllReduces(Config c, const std::string& tag, int n,
                                                const std::function<void()>& after_stop) {
  testing::FakeGpu gpu;
  auto dir = std::filesystem::temp_directory_path() / ("prism_coord_" + tag + "_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  c.rank = 0;
  c.world_size = 2;
  c.fixed_dur_us = 1;
  c.exchange = false;
  c.out_dir = dir.string();
  ScopedRuntime rt({.config = c, .gpu = &gpu});
  ncclUniqueId id;
  GetUniqueId(&id);
  InitArgs a;
  a.nranks = 2;
  a.rank = 0;
  a.ids = &id;
  Comm* comm = nullptr;
  EXPECT_EQ(CommInit(a, &comm), ncclSuccess);
  EXPECT_TRUE(comm && comm->use_coordinator);
  usleep(50000);  // what the coordinator sends right after kCommInfo reaches the reader thread
  std::vector<float> buf(16);
  OpCall call;
  call.op = payload::OpKind::kAllReduce;
  call.comm = comm;
  call.count = buf.size();
  call.send = buf.data();
  call.recv = buf.data();
  for (int i = 0; comm && i < n; ++i) {
    EXPECT_EQ(Submit(call), ncclSuccess);
    EXPECT_TRUE(ProgressDrain(5000000000ull));
  }
  usleep(300000);  // the writer flushes every 200 ms
  EventLogStop();
  after_stop();
  std::vector<nlohmann::json> ops;
  std::ifstream in(EventLogPath());
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("type") == "op") ops.push_back(std::move(j));
  }
  std::filesystem::remove_all(dir);
  return ops;
}

TEST(ShimCoord, LateReleaseLogsWhenTheGateOpened) {
  std::string path = "/tmp/prism_coord_late_" + std::to_string(getpid()) + ".sock";
  int lfd = ListenUnix(path);
  ASSERT_GE(lfd, 0) << path;
  std::thread server([&] {
    int fd = accept(lfd, nullptr, nullptr);
    std::string err;
    for (;;) {
      ipc::Frame f;
      if (ipc::RecvFrame(fd, &f, 5000, &err) != ipc::IoStatus::kOk) break;
      if (f.type == ipc::MsgType::kCommInit) {
        nlohmann::json j = nlohmann::json::parse(f.payload);
        nlohmann::json r = {{"key", j.at("key")}, {"comm_id", 4}, {"members", {0, 1}}, {"real", {true, true}}};
        std::string s = r.dump();
        ipc::SendFrame(fd, ipc::MsgType::kCommInfo, s.data(), s.size(), &err);
      } else if (f.type == ipc::MsgType::kOpArrive) {
        ipc::OpArrive a{};
        ASSERT_TRUE(ipc::DecodePod(f, &a));
        usleep(5000);  // the decision's latency
        ipc::OpRelease rel{};
        rel.comm_id = a.comm_id;
        rel.seq = a.seq;
        rel.release_ns = a.arrival_ns + 1000;  // 1 us after the arrival: long past when it arrives
        rel.last_rank = 1;
        ipc::SendFrame(fd, ipc::MsgType::kOpRelease, &rel, sizeof(rel), &err);
      } else if (f.type == ipc::MsgType::kOpRecord) {
        break;
      }
    }
    usleep(100000);
    close(fd);
  });

  Config c;
  c.real_ranks = {0, 1};
  c.coord_socket = path;
  const std::vector<nlohmann::json> ops = OpLinesOfAllReduces(c, "late", 1, [&] {
    server.join();
    close(lfd);
    unlink(path.c_str());
  });
  ASSERT_EQ(ops.size(), 1u);
  for (const nlohmann::json& j : ops) {
    ASSERT_TRUE(j.contains("opened_ns")) << j.dump();
    const uint64_t release = j.at("release_ns").get<uint64_t>(), opened = j.at("opened_ns").get<uint64_t>();
    EXPECT_EQ(release, j.at("arrival_ns").get<uint64_t>() + 1000) << "the logged release is the decided one";
    EXPECT_GE(opened, release + 5000000) << "the gate opened after the 5 ms decision: " << j.dump();
  }
}

// Prereleases (ipc.h kOpPrerelease): under --graph, an operation whose other members are virtual is released by the
// shim itself on arrival, by the rule the coordinator sent ahead, with no round trip (the arrival still goes out);
// an operation whose prerelease names another op (the job left the graph) waits for kOpRelease as before. The fake coordinator answers arrivals 5 ms late and only
// those it did not prerelease, as the coordinator does.
TEST(ShimCoord, PrereleasedOperationOpensWithoutWaitingForTheCoordinator) {
  std::string path = "/tmp/prism_coord_pre_" + std::to_string(getpid()) + ".sock";
  int lfd = ListenUnix(path);
  ASSERT_GE(lfd, 0) << path;
  bool hello_says_prerelease = false;
  std::vector<uint64_t> arrived;
  std::thread server([&] {
    int fd = accept(lfd, nullptr, nullptr);
    std::string err;
    int records = 0;
    for (;;) {
      ipc::Frame f;
      if (ipc::RecvFrame(fd, &f, 5000, &err) != ipc::IoStatus::kOk) break;
      if (f.type == ipc::MsgType::kHello) {
        hello_says_prerelease = nlohmann::json::parse(f.payload).value("prerelease", false);
      } else if (f.type == ipc::MsgType::kCommInit) {
        nlohmann::json j = nlohmann::json::parse(f.payload);
        nlohmann::json r = {{"key", j.at("key")}, {"comm_id", 4}, {"members", {0, 1}}, {"real", {true, false}}};
        std::string s = r.dump();
        ipc::SendFrame(fd, ipc::MsgType::kCommInfo, s.data(), s.size(), &err);
        ipc::OpPrerelease pr{};
        pr.comm_id = 4;
        pr.op = 1;  // all-reduce (trace::CollOp), the op the shim will run
        pr.seq = 0;
        pr.floor_ns = 1000;  // virtual rank 1 arrived long before: the release is the arrival plus the duration
        pr.dur_ns = 7000;
        pr.floor_rank = 1;
        ipc::SendFrame(fd, ipc::MsgType::kOpPrerelease, &pr, sizeof(pr), &err);
        pr.seq = 1;
        pr.op = 4;  // broadcast: the graph expected another op there (the job left the graph); not taken
        ipc::SendFrame(fd, ipc::MsgType::kOpPrerelease, &pr, sizeof(pr), &err);
      } else if (f.type == ipc::MsgType::kOpArrive) {
        ipc::OpArrive a{};
        ASSERT_TRUE(ipc::DecodePod(f, &a));
        arrived.push_back(a.seq);
        if (a.seq == 0) continue;  // prereleased: no answer
        // Why 50 ms: far above what a loaded CI machine delays a thread by, so the two cases below stay apart.
        usleep(50000);
        ipc::OpRelease rel{};
        rel.comm_id = a.comm_id;
        rel.seq = a.seq;
        rel.release_ns = a.arrival_ns + 1000;
        rel.last_rank = 1;
        ipc::SendFrame(fd, ipc::MsgType::kOpRelease, &rel, sizeof(rel), &err);
      } else if (f.type == ipc::MsgType::kOpRecord) {
        if (++records == 2) break;
      }
    }
    usleep(100000);
    close(fd);
  });

  Config c;
  c.real_ranks = {0};
  c.graph = "g.prism";  // any: a one-real-member communicator goes through the coordinator under --graph
  c.coord_socket = path;
  const std::vector<nlohmann::json> ops = OpLinesOfAllReduces(c, "pre", 2, [&] {
    server.join();
    close(lfd);
    unlink(path.c_str());
  });
  EXPECT_TRUE(hello_says_prerelease);
  EXPECT_EQ(arrived, (std::vector<uint64_t>{0, 1})) << "a prereleased arrival still goes to the coordinator";
  ASSERT_EQ(ops.size(), 2u);
  for (const nlohmann::json& j : ops) {
    const uint64_t arrival = j.at("arrival_ns").get<uint64_t>(), release = j.at("release_ns").get<uint64_t>();
    const uint64_t opened = j.at("opened_ns").get<uint64_t>();
    if (j.at("seq") == 0) {
      EXPECT_EQ(release, arrival + 7000) << j.dump();
      EXPECT_EQ(j.at("wait_on_rank"), 0) << "it arrived after the virtual rank: " << j.dump();
      EXPECT_LT(opened, release + 40000000) << "opened without the coordinator's 50 ms: " << j.dump();
    } else {
      EXPECT_EQ(release, arrival + 1000) << j.dump();
      EXPECT_GE(opened, release + 50000000) << "prerelease for another op: the answer's 50 ms: " << j.dump();
    }
  }
}

// Real data between real members: the shim sends its input (kOpData), writes the coordinator's result (kOpResult)
// into the receive buffer instead of the mirror rule; a send to a real peer posts its bytes and waits for the
// acknowledgement, a receive from it asks. In a group every operation is posted before any waits.
TEST(ShimCoord, ExchangeWritesTheCoordinatorsResult) {
  std::string path = "/tmp/prism_coord_xtest_" + std::to_string(getpid()) + ".sock";
  int lfd = ListenUnix(path);
  ASSERT_GE(lfd, 0) << path;

  std::vector<ipc::ExchangeHeader> data_headers;
  std::vector<std::string> data_bytes;
  std::thread server([&] {
    int fd = accept(lfd, nullptr, nullptr);
    std::string err;
    int answered = 0;
    ipc::ExchangeHeader send_h{};
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
        if (h.op == static_cast<uint16_t>(payload::OpKind::kSend)) {
          send_h = h;  // acknowledged once the receive is posted (below), as the coordinator does
          continue;
        }
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
        if (h.op == static_cast<uint16_t>(payload::OpKind::kRecv)) {
          ipc::ExchangeHeader ack = send_h;
          ack.flags = ipc::kExchangeSendDone;
          ack.total_bytes = 0;
          ipc::SendFrame(fd, ipc::MsgType::kOpResult, &ack, sizeof(ack), &err);
        }
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
    close(fd);
  });

  testing::FakeGpu gpu;
  Config c;
  c.rank = 0;
  c.world_size = 2;
  c.real_ranks = {0, 1};
  c.fixed_dur_us = 10;
  c.coord_socket = path;
  c.send_rendezvous = true;  // PRISM_SEND_RENDEZVOUS=1 (opt-in)
  ScopedRuntime rt({.config = c, .gpu = &gpu});
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
  // Each carries its operation's sequence on the communicator (the hang diagnosis names where a rank waits).
  EXPECT_EQ(data_headers[0].seq, 0u);
  EXPECT_EQ(data_headers[1].seq, 1u);
  EXPECT_EQ(data_headers[2].seq, 2u);
}

// A send to a real peer outside a group returns only once the coordinator acknowledged it (kExchangeSendDone: the
// receive was posted), as NCCL's send waits for its receiver; the acknowledgement is matched by destination.
// The completed send's kOpRecord names the coordinator's communicator id (not the process-local one).
TEST(ShimCoord, ExchangedSendWaitsForTheAcknowledgement) {
  std::string path = "/tmp/prism_coord_stest_" + std::to_string(getpid()) + ".sock";
  int lfd = ListenUnix(path);
  ASSERT_GE(lfd, 0) << path;

  std::atomic<bool> acked{false};
  std::atomic<int> sends{0};
  std::atomic<int64_t> record_comm{-1}, record_op{-1};
  std::thread server([&] {
    int fd = accept(lfd, nullptr, nullptr);
    std::string err;
    for (;;) {
      ipc::Frame f;
      if (ipc::RecvFrame(fd, &f, 5000, &err) != ipc::IoStatus::kOk) break;
      if (f.type == ipc::MsgType::kOpRecord) {
        ipc::OpRecord rec{};
        ASSERT_TRUE(ipc::DecodePod(f, &rec));
        record_comm = rec.comm_id;
        record_op = rec.op;
        break;
      }
      if (f.type == ipc::MsgType::kCommInit) {
        nlohmann::json j = nlohmann::json::parse(f.payload);
        nlohmann::json r = {{"key", j.at("key")}, {"comm_id", 6}, {"members", {0, 1, 2}}, {"real", {true, true, true}}};
        std::string s = r.dump();
        ipc::SendFrame(fd, ipc::MsgType::kCommInfo, s.data(), s.size(), &err);
      } else if (f.type == ipc::MsgType::kOpData) {
        ipc::ExchangeHeader h{};
        std::memcpy(&h, f.payload.data(), sizeof(h));
        if (h.op != static_cast<uint16_t>(payload::OpKind::kSend)) continue;
        ++sends;
        // The receiver posts its receive 300 ms later. First an acknowledgement for the same key to another
        // destination, which must not complete this send.
        usleep(150000);
        ipc::ExchangeHeader other = h;
        other.peer = 2;
        other.flags = ipc::kExchangeSendDone;
        other.total_bytes = 0;
        ipc::SendFrame(fd, ipc::MsgType::kOpResult, &other, sizeof(other), &err);
        usleep(150000);
        ipc::ExchangeHeader ack = h;
        ack.flags = ipc::kExchangeSendDone;
        ack.total_bytes = 0;
        acked = true;
        ipc::SendFrame(fd, ipc::MsgType::kOpResult, &ack, sizeof(ack), &err);
      }
    }
    usleep(300000);
    close(fd);
  });

  testing::FakeGpu gpu;
  auto dir = std::filesystem::temp_directory_path() / ("prism_coord_stest_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  Config c;
  c.rank = 0;
  c.world_size = 3;
  c.real_ranks = {0, 1, 2};
  c.fixed_dur_us = 10;
  c.coord_socket = path;
  c.send_rendezvous = true;  // PRISM_SEND_RENDEZVOUS=1 (opt-in)
  c.out_dir = dir.string();  // the event writer sends kOpRecord
  ScopedRuntime rt({.config = c, .gpu = &gpu});
  ncclUniqueId id;
  GetUniqueId(&id);
  InitArgs a;
  a.nranks = 3;
  a.rank = 0;
  a.ids = &id;
  Comm* comm = nullptr;
  ASSERT_EQ(CommInit(a, &comm), ncclSuccess);
  ASSERT_TRUE(comm->use_coordinator);

  std::vector<float> sendbuf{5, 6, 7, 8};
  OpCall snd;
  snd.op = payload::OpKind::kSend;
  snd.comm = comm;
  snd.count = 4;
  snd.peer = 1;
  snd.send = sendbuf.data();
  const uint64_t t0 = HostNowNs();
  ASSERT_EQ(Submit(snd), ncclSuccess);
  const uint64_t took = HostNowNs() - t0;
  EXPECT_TRUE(acked) << "the send returned before the coordinator acknowledged it";
  EXPECT_GE(took, 250000000u) << "the send did not wait for its receive";
  EXPECT_EQ(sends, 1);
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  server.join();
  EXPECT_EQ(record_comm, 6) << "kOpRecord must carry the coordinator's communicator id (local id " << comm->id << ")";
  EXPECT_EQ(record_op, 103);  // send
  close(lfd);
  unlink(path.c_str());
  std::filesystem::remove_all(dir);
}

// A group whose operations lie on two streams runs as two units; the sends of the first must not wait for their
// acknowledgement before the second unit's receive is posted (NCCL posts a whole group at once). The scripted
// coordinator acknowledges the send only after the receive request came.
TEST(ShimCoord, GroupAcrossStreamsPostsEveryUnitBeforeWaitingForItsSends) {
  std::string path = "/tmp/prism_coord_gtest_" + std::to_string(getpid()) + ".sock";
  int lfd = ListenUnix(path);
  ASSERT_GE(lfd, 0) << path;

  std::atomic<bool> recv_request{false};
  std::thread server([&] {
    int fd = accept(lfd, nullptr, nullptr);
    std::string err;
    ipc::ExchangeHeader send_h{};
    for (;;) {
      ipc::Frame f;
      // Why 3 s: a shim that waits for the acknowledgement first never sends the request; the test then ends.
      if (ipc::RecvFrame(fd, &f, 3000, &err) != ipc::IoStatus::kOk) break;
      if (f.type == ipc::MsgType::kCommInit) {
        nlohmann::json j = nlohmann::json::parse(f.payload);
        nlohmann::json r = {{"key", j.at("key")}, {"comm_id", 4}, {"members", {0, 1}}, {"real", {true, true}}};
        std::string s = r.dump();
        ipc::SendFrame(fd, ipc::MsgType::kCommInfo, s.data(), s.size(), &err);
      } else if (f.type == ipc::MsgType::kOpData) {
        ipc::ExchangeHeader h{};
        std::memcpy(&h, f.payload.data(), sizeof(h));
        if (h.op == static_cast<uint16_t>(payload::OpKind::kSend)) {
          send_h = h;
          continue;
        }
        recv_request = true;
        std::vector<float> out(4, 9.0f);
        ipc::ExchangeHeader r = h;
        r.flags = 0;
        r.total_bytes = 16;
        std::string payload(reinterpret_cast<const char*>(&r), sizeof(r));
        payload.append(reinterpret_cast<const char*>(out.data()), 16);
        ipc::SendFrame(fd, ipc::MsgType::kOpResult, payload.data(), payload.size(), &err);
        ipc::ExchangeHeader ack = send_h;
        ack.flags = ipc::kExchangeSendDone;
        ack.total_bytes = 0;
        ipc::SendFrame(fd, ipc::MsgType::kOpResult, &ack, sizeof(ack), &err);
        break;
      }
    }
    usleep(300000);
    close(fd);
  });

  testing::FakeGpu gpu;
  Config c;
  c.rank = 0;
  c.world_size = 2;
  c.real_ranks = {0, 1};
  c.fixed_dur_us = 10;
  c.coord_socket = path;
  c.send_rendezvous = true;  // PRISM_SEND_RENDEZVOUS=1 (opt-in)
  ScopedRuntime rt({.config = c, .gpu = &gpu});
  ncclUniqueId id;
  GetUniqueId(&id);
  InitArgs a;
  a.nranks = 2;
  a.rank = 0;
  a.ids = &id;
  Comm* comm = nullptr;
  ASSERT_EQ(CommInit(a, &comm), ncclSuccess);
  ASSERT_TRUE(comm->use_coordinator);

  std::vector<float> sendbuf{5, 6, 7, 8}, recvbuf(4, 0);
  OpCall snd;
  snd.op = payload::OpKind::kSend;
  snd.comm = comm;
  snd.count = 4;
  snd.peer = 1;
  snd.send = sendbuf.data();
  snd.stream = reinterpret_cast<cudaStream_t>(uintptr_t{0x10});
  OpCall rcv = snd;
  rcv.op = payload::OpKind::kRecv;
  rcv.send = nullptr;
  rcv.recv = recvbuf.data();
  rcv.stream = reinterpret_cast<cudaStream_t>(uintptr_t{0x20});
  ASSERT_EQ(GroupStart(), ncclSuccess);
  ASSERT_EQ(Submit(snd), ncclSuccess);
  ASSERT_EQ(Submit(rcv), ncclSuccess);
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  EXPECT_TRUE(recv_request) << "the receive of the second stream was not posted";
  EXPECT_EQ(recvbuf, (std::vector<float>(4, 9.0f)));
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  server.join();
  close(lfd);
  unlink(path.c_str());
}

// torch's all-to-all with uneven splits (Megatron MoE's alltoall token dispatcher) on NCCL: one group of a send to
// and a receive from every member, the rank itself included. The pair to the rank itself is a local copy and takes no
// sequence number: the graph has no node for it, and GraphRelease maps a rank's n-th numbered operation on a
// communicator to the graph's n-th node there. A unit's kOpArrive carries its first peer operation's sequence and
// counts only the peer operations; a unit of only the copy never reaches the coordinator; the event file writes the
// copy's "seq" as -1; the receive from itself copies its own send, under every payload policy.
TEST(ShimCoord, SendAndReceiveToItselfTakeNoSequenceNumber) {
  std::string path = "/tmp/prism_coord_self_" + std::to_string(getpid()) + ".sock";
  int lfd = ListenUnix(path);
  ASSERT_GE(lfd, 0) << path;
  std::mutex mu;
  std::vector<std::tuple<uint64_t, uint32_t, uint32_t>> arrived;  // (seq, nops, op)
  std::vector<uint64_t> recorded;                                 // kOpRecord seqs
  std::thread server([&] {
    int fd = accept(lfd, nullptr, nullptr);
    std::string err;
    for (;;) {
      ipc::Frame f;
      if (ipc::RecvFrame(fd, &f, 1500, &err) != ipc::IoStatus::kOk) break;
      if (f.type == ipc::MsgType::kCommInit) {
        nlohmann::json j = nlohmann::json::parse(f.payload);
        nlohmann::json r = {{"key", j.at("key")}, {"comm_id", 4}, {"members", {0, 1, 2, 3}},
                            {"real", {false, false, true, false}}};
        std::string s = r.dump();
        ipc::SendFrame(fd, ipc::MsgType::kCommInfo, s.data(), s.size(), &err);
      } else if (f.type == ipc::MsgType::kOpArrive) {
        ipc::OpArrive a{};
        ASSERT_TRUE(ipc::DecodePod(f, &a));
        {
          std::lock_guard<std::mutex> l(mu);
          arrived.emplace_back(a.seq, a.nops, a.op);
        }
        ipc::OpRelease rel{};
        rel.comm_id = a.comm_id;
        rel.seq = a.seq;
        rel.release_ns = a.arrival_ns + 1000;
        rel.last_rank = -1;
        ipc::SendFrame(fd, ipc::MsgType::kOpRelease, &rel, sizeof(rel), &err);
      } else if (f.type == ipc::MsgType::kOpRecord) {
        ipc::OpRecord rec{};
        ASSERT_TRUE(ipc::DecodePod(f, &rec));
        std::lock_guard<std::mutex> l(mu);
        recorded.push_back(rec.seq);
      }
    }
    close(fd);
  });

  testing::FakeGpu gpu;
  auto dir = std::filesystem::temp_directory_path() / ("prism_coord_self_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  Config c;
  c.rank = 2;  // communicator rank 2 of 4: the pair to itself sits between peer operations
  c.world_size = 4;
  c.real_ranks = {2};
  c.graph = "g.prism";  // a one-real-member communicator goes through the coordinator under --graph
  c.fixed_dur_us = 1;
  c.payload = "zeros";
  c.coord_socket = path;
  c.out_dir = dir.string();
  ScopedRuntime rt({.config = c, .gpu = &gpu});
  ncclUniqueId id;
  GetUniqueId(&id);
  InitArgs a;
  a.nranks = 4;
  a.rank = 2;
  a.ids = &id;
  Comm* comm = nullptr;
  ASSERT_EQ(CommInit(a, &comm), ncclSuccess);
  ASSERT_TRUE(comm->use_coordinator);

  std::vector<std::vector<float>> to(4), from(4);
  for (int q = 0; q < 4; ++q) {  // uneven splits; the copy's two sides are of one size
    to[q].assign(4 + q, static_cast<float>(q));
    from[q].assign(q == 2 ? 4 + q : 8 + q, -1.f);
  }
  auto op = [&](payload::OpKind kind, int peer) {
    OpCall o;
    o.op = kind;
    o.comm = comm;
    o.peer = peer;
    std::vector<float>& buf = kind == payload::OpKind::kSend ? to[peer] : from[peer];
    o.count = buf.size();
    if (kind == payload::OpKind::kSend) o.send = buf.data();
    else o.recv = buf.data();
    return Submit(o);
  };
  using payload::OpKind;
  // Unit 1, torch's order (a send and a receive per member in turn): the copy is the third pair.
  ASSERT_EQ(GroupStart(), ncclSuccess);
  for (int q = 0; q < 4; ++q) {
    ASSERT_EQ(op(OpKind::kSend, q), ncclSuccess);
    ASSERT_EQ(op(OpKind::kRecv, q), ncclSuccess);
  }
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  // Unit 2: every token stayed on the rank, only the copy.
  ASSERT_EQ(GroupStart(), ncclSuccess);
  ASSERT_EQ(op(OpKind::kSend, 2), ncclSuccess);
  ASSERT_EQ(op(OpKind::kRecv, 2), ncclSuccess);
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  // Unit 3: a collective on the same communicator.
  std::vector<float> x(16, 1.f);
  OpCall ar;
  ar.op = OpKind::kAllReduce;
  ar.comm = comm;
  ar.count = x.size();
  ar.send = x.data();
  ar.recv = x.data();
  ASSERT_EQ(Submit(ar), ncclSuccess);
  // Unit 4, every send then every receive.
  ASSERT_EQ(GroupStart(), ncclSuccess);
  for (int q = 0; q < 4; ++q) ASSERT_EQ(op(OpKind::kSend, q), ncclSuccess);
  for (int q = 0; q < 4; ++q) ASSERT_EQ(op(OpKind::kRecv, q), ncclSuccess);
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  EXPECT_EQ(comm->seq.load(), 13u) << "6 peer operations, the all-reduce, 6 peer operations";
  usleep(300000);  // the writer flushes (and sends its kOpRecords) every 200 ms
  EventLogStop();
  server.join();
  close(lfd);
  unlink(path.c_str());

  // Why sorted: the progress thread sends arrivals and logs releases in the order it finds them, not issue order.
  std::sort(arrived.begin(), arrived.end());
  std::sort(recorded.begin(), recorded.end());
  constexpr uint32_t kMixed = 0, kAllReduceOp = 1;
  EXPECT_EQ(arrived, (std::vector<std::tuple<uint64_t, uint32_t, uint32_t>>{
                         {0, 6, kMixed}, {6, 1, kAllReduceOp}, {7, 6, kMixed}}))
      << "kOpArrive (seq, nops, op): the copy to itself is neither numbered nor counted";
  EXPECT_EQ(recorded, (std::vector<uint64_t>{0, 6, 7})) << "no kOpRecord for the unit of only the copy";

  std::vector<nlohmann::json> ops;
  std::ifstream in(EventLogPath());
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("type") == "op") ops.push_back(std::move(j));
  }
  ASSERT_EQ(ops.size(), 4u);
  std::sort(ops.begin(), ops.end(), [](const nlohmann::json& x, const nlohmann::json& y) {
    return x.at("arrival_ns").get<uint64_t>() < y.at("arrival_ns").get<uint64_t>();
  });
  auto seqs = [](const nlohmann::json& j) {
    std::vector<int64_t> s;
    for (const auto& o : j.at("ops")) s.push_back(o.at("seq").get<int64_t>());
    return s;
  };
  EXPECT_EQ(ops[0].at("seq"), 0);
  EXPECT_EQ(ops[0].at("nops"), 8);
  EXPECT_EQ(seqs(ops[0]), (std::vector<int64_t>{0, 1, 2, 3, -1, -1, 4, 5}));
  EXPECT_EQ(ops[1].at("seq"), -1) << "a unit of only the copy has no sequence number";
  EXPECT_EQ(seqs(ops[1]), (std::vector<int64_t>{-1, -1}));
  EXPECT_EQ(ops[2].at("seq"), 6);
  EXPECT_EQ(ops[3].at("seq"), 7);
  EXPECT_EQ(seqs(ops[3]), (std::vector<int64_t>{7, 8, -1, 9, 10, 11, -1, 12}));

  // Under the zeros policy the receives from virtual peers are zero-filled, the receive from itself copies its send.
  int self_copies = 0;
  {
    std::lock_guard<std::mutex> l(gpu.mu);
    for (size_t i = 0; i < gpu.steps.size(); ++i) {
      const payload::Step& st = gpu.steps[i];
      const uint64_t dst = payload::StepAddr(gpu.descs[i], st.dst_buf, st.dst_offset);
      if (dst != reinterpret_cast<uint64_t>(from[2].data())) continue;
      EXPECT_EQ(st.kind, payload::StepKind::kCopy) << "the receive from itself was filled, not copied";
      if (st.kind != payload::StepKind::kCopy) continue;
      EXPECT_EQ(payload::StepAddr(gpu.descs[i], st.src_buf, st.src_offset), reinterpret_cast<uint64_t>(to[2].data()));
      ++self_copies;
    }
  }
  EXPECT_EQ(self_copies, 3) << "units 1, 2 and 4";
  std::filesystem::remove_all(dir);
}

// collect's exchange (--real-routing: the expert-parallel peers run for real): the copy to itself stays local, never
// a kOpData round trip through the coordinator, and is not recorded (PRISM_RECORD_PAYLOADS): a payload is named by
// (communicator, sequence), and the copy has none. The peer operations keep their sequence numbers in the exchange
// headers and the recording. The unit (real data, point-to-point only) is released locally, as before.
TEST(ShimCoord, CopyToItselfIsNeitherExchangedNorRecorded) {
  std::string path = "/tmp/prism_coord_selfx_" + std::to_string(getpid()) + ".sock";
  int lfd = ListenUnix(path);
  ASSERT_GE(lfd, 0) << path;
  std::mutex mu;
  std::vector<ipc::ExchangeHeader> data;
  std::atomic<int> arrives{0};
  std::thread server([&] {
    int fd = accept(lfd, nullptr, nullptr);
    std::string err;
    for (;;) {
      ipc::Frame f;
      if (ipc::RecvFrame(fd, &f, 1500, &err) != ipc::IoStatus::kOk) break;
      if (f.type == ipc::MsgType::kCommInit) {
        nlohmann::json j = nlohmann::json::parse(f.payload);
        nlohmann::json r = {{"key", j.at("key")}, {"comm_id", 5}, {"members", {0, 1, 2, 3}},
                            {"real", {true, true, false, false}}};
        std::string s = r.dump();
        ipc::SendFrame(fd, ipc::MsgType::kCommInfo, s.data(), s.size(), &err);
      } else if (f.type == ipc::MsgType::kOpData) {
        ipc::ExchangeHeader h{};
        std::memcpy(&h, f.payload.data(), sizeof(h));
        {
          std::lock_guard<std::mutex> l(mu);
          data.push_back(h);
        }
        if (!(h.flags & ipc::kExchangeRecvRequest)) continue;  // a send: no answer (no rendezvous)
        // Any receive request gets 9.0s of its size from its source.
        std::vector<float> out(h.count, 9.0f);
        ipc::ExchangeHeader r = h;
        r.flags = 0;
        r.total_bytes = out.size() * sizeof(float);
        r.offset = 0;
        std::string payload(reinterpret_cast<const char*>(&r), sizeof(r));
        payload.append(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(float));
        ipc::SendFrame(fd, ipc::MsgType::kOpResult, payload.data(), payload.size(), &err);
      } else if (f.type == ipc::MsgType::kOpArrive) {
        ++arrives;
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
    close(fd);
  });

  const std::string rec = "/tmp/prism_coord_selfx_" + std::to_string(getpid()) + ".bin";
  testing::FakeGpu gpu;
  Config c;
  c.rank = 0;
  c.world_size = 4;
  c.real_ranks = {0, 1};
  c.fixed_dur_us = 1;
  c.coord_socket = path;
  c.record_payloads = rec;
  std::optional<ScopedRuntime> rt;
  rt.emplace(Runtime::Parts{.config = c, .gpu = &gpu});
  ncclUniqueId id;
  GetUniqueId(&id);
  InitArgs a;
  a.nranks = 4;
  a.rank = 0;
  a.ids = &id;
  Comm* comm = nullptr;
  ASSERT_EQ(CommInit(a, &comm), ncclSuccess);
  ASSERT_TRUE(comm->use_coordinator);
  ASSERT_EQ(comm->member_real, (std::vector<uint8_t>{1, 1, 0, 0}));

  std::vector<std::vector<float>> to(4), from(4);
  for (int q = 0; q < 4; ++q) {
    to[q].assign(4, static_cast<float>(q + 1));
    from[q].assign(4, -1.f);
  }
  ASSERT_EQ(GroupStart(), ncclSuccess);
  for (int q = 0; q < 4; ++q) {  // torch's order: the copy to itself (communicator rank 0) first
    OpCall s;
    s.op = payload::OpKind::kSend;
    s.comm = comm;
    s.peer = q;
    s.count = 4;
    s.send = to[q].data();
    ASSERT_EQ(Submit(s), ncclSuccess);
    OpCall r = s;
    r.op = payload::OpKind::kRecv;
    r.send = nullptr;
    r.recv = from[q].data();
    ASSERT_EQ(Submit(r), ncclSuccess);
  }
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  ASSERT_TRUE(ProgressDrain(5000000000ull));
  EXPECT_EQ(from[1], std::vector<float>(4, 9.0f)) << "the real peer's data";
  EXPECT_EQ(comm->seq.load(), 6u);
  rt.reset();  // closes the recording
  server.join();
  close(lfd);
  unlink(path.c_str());

  ASSERT_EQ(data.size(), 2u) << "only the send to and the receive from the real peer go through the coordinator";
  for (const ipc::ExchangeHeader& h : data) {
    EXPECT_NE(h.rank, h.peer) << "an exchange of the rank with itself";
    EXPECT_EQ(h.op == static_cast<uint16_t>(payload::OpKind::kSend) ? h.peer : h.rank, 1);
  }
  EXPECT_EQ(data[0].seq, 0u) << "the send to peer 1: the first numbered operation";
  EXPECT_EQ(data[1].seq, 1u);
  EXPECT_EQ(arrives.load(), 0) << "a point-to-point unit with real data is released locally";
  {
    std::lock_guard<std::mutex> l(gpu.mu);
    bool self_copied = false;
    for (size_t i = 0; i < gpu.steps.size(); ++i) {
      const payload::Step& st = gpu.steps[i];
      if (st.kind != payload::StepKind::kCopy) continue;
      if (payload::StepAddr(gpu.descs[i], st.dst_buf, st.dst_offset) == reinterpret_cast<uint64_t>(from[0].data()))
        self_copied = payload::StepAddr(gpu.descs[i], st.src_buf, st.src_offset) ==
                      reinterpret_cast<uint64_t>(to[0].data());
    }
    EXPECT_TRUE(self_copied) << "the receive from itself copies its own send";
  }
  // The recording: one record, the receive from peer 1 at sequence 1.
  std::ifstream in(rec, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), sizeof(kPayloadMagic));
  std::vector<RecordHeader> records;
  for (size_t off = sizeof(kPayloadMagic); off + sizeof(RecordHeader) <= bytes.size();) {
    RecordHeader h{};
    std::memcpy(&h, bytes.data() + off, sizeof(h));
    records.push_back(h);
    off += sizeof(h) + h.bytes;
  }
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].seq, 1u);
  EXPECT_EQ(records[0].op, static_cast<uint16_t>(payload::OpKind::kRecv));
  EXPECT_EQ(records[0].bytes, 16u);
  std::remove(rec.c_str());
}

}  // namespace
}  // namespace prism::interpose

namespace prism::interpose {
namespace {

// Passthrough: when the coordinator says every member is real and on its own GPU, communicator rank 0 posts a real
// unique id, the real NCCL communicator is made from it, and operations, groups and destroy go to the real NCCL
// (here a recording fake of it), never to libprism's gate.
namespace fake_nccl {
std::atomic<int> init_calls{0}, allreduce_calls{0}, group_start{0}, group_end{0}, destroy_calls{0}, send_calls{0};
int init_nranks = -1, init_rank = -1;
ncclUniqueId init_id{};
int dummy_comm = 0;
ncclResult_t GetUniqueId(ncclUniqueId* id) {
  std::memset(id->internal, 0x5a, sizeof(id->internal));
  return ncclSuccess;
}
ncclResult_t InitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t*) {
  ++init_calls;
  init_nranks = nranks;
  init_rank = rank;
  init_id = id;
  *comm = reinterpret_cast<ncclComm_t>(&dummy_comm);
  return ncclSuccess;
}
ncclResult_t AllReduce(const void*, void*, size_t count, ncclDataType_t, ncclRedOp_t, ncclComm_t comm, cudaStream_t) {
  if (comm == reinterpret_cast<ncclComm_t>(&dummy_comm) && count == 16) ++allreduce_calls;
  return ncclSuccess;
}
ncclResult_t Send(const void*, size_t, ncclDataType_t, int peer, ncclComm_t, cudaStream_t) {
  if (peer == 1) ++send_calls;
  return ncclSuccess;
}
ncclResult_t GroupStart() {
  ++group_start;
  return ncclSuccess;
}
ncclResult_t GroupEnd() {
  ++group_end;
  return ncclSuccess;
}
ncclResult_t Destroy(ncclComm_t) {
  ++destroy_calls;
  return ncclSuccess;
}
const char* ErrorString(ncclResult_t) { return "fake"; }
void Unused() { std::abort(); }
}  // namespace fake_nccl

TEST(ShimCoord, PassthroughCommunicatorRunsOnTheRealNccl) {
  std::string path = "/tmp/prism_coord_ptest_" + std::to_string(getpid()) + ".sock";
  int lfd = ListenUnix(path);
  ASSERT_GE(lfd, 0) << path;

  NcclFns fake;
#define PRISM_FAKE_UNUSED(name) fake.name = reinterpret_cast<decltype(fake.name)>(&fake_nccl::Unused);
  PRISM_NCCL_FUNCS(PRISM_FAKE_UNUSED)
#undef PRISM_FAKE_UNUSED
  fake.ncclGetUniqueId = &fake_nccl::GetUniqueId;
  fake.ncclCommInitRankConfig = &fake_nccl::InitRankConfig;
  fake.ncclAllReduce = &fake_nccl::AllReduce;
  fake.ncclSend = &fake_nccl::Send;
  fake.ncclGroupStart = &fake_nccl::GroupStart;
  fake.ncclGroupEnd = &fake_nccl::GroupEnd;
  fake.ncclCommDestroy = &fake_nccl::Destroy;
  fake.ncclGetErrorString = &fake_nccl::ErrorString;

  std::atomic<bool> hello_can{false}, saw_arrive{false};
  std::string posted;
  std::thread server([&] {
    int fd = accept(lfd, nullptr, nullptr);
    std::string err;
    for (;;) {
      ipc::Frame f;
      if (ipc::RecvFrame(fd, &f, 1500, &err) != ipc::IoStatus::kOk) break;
      if (f.type == ipc::MsgType::kHello) {
        nlohmann::json j = nlohmann::json::parse(f.payload);
        hello_can = j.at("passthrough") == true && !j.at("gpu_id").get<std::string>().empty();
      } else if (f.type == ipc::MsgType::kCommInit) {
        nlohmann::json j = nlohmann::json::parse(f.payload);
        nlohmann::json r = {{"key", j.at("key")}, {"comm_id", 3},          {"members", {0, 1}},
                            {"real", {true, true}}, {"passthrough", true}};
        std::string s = r.dump();
        ipc::SendFrame(fd, ipc::MsgType::kCommInfo, s.data(), s.size(), &err);
      } else if (f.type == ipc::MsgType::kRealNcclId) {
        nlohmann::json j = nlohmann::json::parse(f.payload);
        posted = j.value("id", std::string());
        nlohmann::json r = {{"comm_id", j.at("comm_id")}, {"id", posted}};
        std::string s = r.dump();
        ipc::SendFrame(fd, ipc::MsgType::kRealNcclIdInfo, s.data(), s.size(), &err);
      } else if (f.type == ipc::MsgType::kOpArrive || f.type == ipc::MsgType::kOpData) {
        saw_arrive = true;
      }
    }
    close(fd);
  });

  testing::FakeGpu gpu;
  auto events_dir = std::filesystem::temp_directory_path() / ("prism_ptest_" + std::to_string(getpid()));
  std::filesystem::create_directories(events_dir);
  Config c;
  c.rank = 0;
  c.world_size = 2;
  c.real_ranks = {0, 1};
  c.fixed_dur_us = 1000;
  c.coord_socket = path;
  c.out_dir = events_dir.string();
  ScopedRuntime rt({.config = c, .gpu = &gpu, .nccl = &fake});
  ncclUniqueId id;
  GetUniqueId(&id);
  InitArgs a;
  a.nranks = 2;
  a.rank = 0;
  a.ids = &id;
  Comm* comm = nullptr;
  ASSERT_EQ(CommInit(a, &comm), ncclSuccess);
  EXPECT_TRUE(hello_can);
  EXPECT_EQ(fake_nccl::init_calls.load(), 1);
  EXPECT_EQ(fake_nccl::init_nranks, 2);
  EXPECT_EQ(fake_nccl::init_rank, 0);
  EXPECT_EQ(static_cast<unsigned char>(fake_nccl::init_id.internal[7]), 0x5a) << "not rank 0's real id";
  EXPECT_EQ(posted.size(), 256u);
  EXPECT_FALSE(comm->use_coordinator);
  EXPECT_EQ(PassthroughComms(), 1);

  std::vector<float> buf(16);
  OpCall call;
  call.op = payload::OpKind::kAllReduce;
  call.comm = comm;
  call.count = buf.size();
  call.send = buf.data();
  call.recv = buf.data();
  ASSERT_EQ(Submit(call), ncclSuccess);
  EXPECT_EQ(fake_nccl::allreduce_calls.load(), 1);
  ASSERT_EQ(GroupStart(), ncclSuccess);
  OpCall send;
  send.op = payload::OpKind::kSend;
  send.comm = comm;
  send.count = 4;
  send.send = buf.data();
  send.peer = 0;  // a send to itself (the real NCCL copies it) takes no sequence number here either
  ASSERT_EQ(Submit(send), ncclSuccess);
  send.peer = 1;
  ASSERT_EQ(Submit(send), ncclSuccess);
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  EXPECT_EQ(fake_nccl::send_calls.load(), 1);
  EXPECT_EQ(fake_nccl::group_start.load(), 1);
  EXPECT_EQ(fake_nccl::group_end.load(), 1);
  ASSERT_TRUE(ProgressDrain(2000000000ull));
  EXPECT_EQ(UnitsExecuted(), 0u) << "a passthrough operation went through libprism's gate";
  EXPECT_EQ(CommDestroy(comm), ncclSuccess);
  EXPECT_EQ(fake_nccl::destroy_calls.load(), 1);
  EXPECT_EQ(PassthroughComms(), 0);
  // With no passthrough communicator left, groups stay libprism's own.
  ASSERT_EQ(GroupStart(), ncclSuccess);
  ASSERT_EQ(GroupEnd(), ncclSuccess);
  EXPECT_EQ(fake_nccl::group_start.load(), 1);

  // Both passthrough units (the all-reduce, the group's send) were stamped on the GPU and logged.
  usleep(300000);  // the writer flushes every 200 ms
  EventLogStop();
  std::ifstream in(EventLogPath());
  std::vector<nlohmann::json> ops;
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("type") == "op") ops.push_back(j);
  }
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].at("op"), "allreduce");
  EXPECT_EQ(ops[1].at("op"), "send");
  for (const auto& o : ops) {
    EXPECT_EQ(o.value("passthrough", 0), 1);
    EXPECT_GE(o.at("release_ns").get<uint64_t>(), o.at("arrival_ns").get<uint64_t>());
    EXPECT_GT(o.at("arrival_ns").get<uint64_t>(), 0u);
  }
  EXPECT_EQ(ops[0].at("sseq"), 0);
  EXPECT_EQ(ops[1].at("sseq"), 1);
  EXPECT_EQ(ops[1].at("seq"), 1);
  ASSERT_EQ(ops[1].at("ops").size(), 2u);
  EXPECT_EQ(ops[1].at("ops")[0].at("seq"), -1);
  EXPECT_EQ(ops[1].at("ops")[1].at("seq"), 1);
  std::filesystem::remove_all(events_dir);
  server.join();
  close(lfd);
  unlink(path.c_str());
  EXPECT_FALSE(saw_arrive) << "a passthrough operation asked the coordinator for a release";
}

}  // namespace
}  // namespace prism::interpose
