// The coordinator as the launcher and the shims see it: endpoints and coordinator.json, hello, communicator
// membership from the store's unique ids, releases when every real member arrived, status, and the CLI.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/ipc_io.h"
#include "coordinator/coordinator.h"
#include "coordinator/store/store_client.h"

namespace prism::coord {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  fs::path p = fs::path(::testing::TempDir()) / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

json ReadJson(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

// A fake libprism: the bus side of one real rank.
class FakeShim {
 public:
  FakeShim(const std::string& socket, int rank) : rank_(rank) {
    std::string err;
    fd_ = ipc::ConnectUnix(socket, &err);
    EXPECT_GE(fd_, 0) << err;
  }
  ~FakeShim() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool SendJson(ipc::MsgType t, const json& j) {
    std::string s = j.dump(), err;
    return ipc::SendFrame(fd_, t, s.data(), s.size(), &err) == ipc::IoStatus::kOk;
  }
  template <typename T>
  bool SendPod(ipc::MsgType t, const T& pod) {
    std::string err;
    return ipc::SendFrame(fd_, t, &pod, sizeof(pod), &err) == ipc::IoStatus::kOk;
  }
  bool Recv(ipc::Frame* f, int timeout_ms = 5000) {
    std::string err;
    return ipc::RecvFrame(fd_, f, timeout_ms, &err) == ipc::IoStatus::kOk;
  }
  json Hello(const json& extra = json::object()) {
    json hello = {{"rank", rank_}, {"world_size", 8}, {"pid", 1000 + rank_}, {"host", "h"}, {"gpu", 0},
                  {"local_rank", rank_}};
    hello.update(extra);
    EXPECT_TRUE(SendJson(ipc::MsgType::kHello, hello));
    ipc::Frame f;
    EXPECT_TRUE(Recv(&f));
    EXPECT_EQ(f.type, ipc::MsgType::kHelloAck);
    return json::parse(f.payload);
  }
  json CommInit(const std::string& id, int nranks, int comm_rank, const std::string& desc = "") {
    EXPECT_TRUE(SendJson(ipc::MsgType::kCommInit,
                         {{"key", ipc::HexEncode(id)}, {"nranks", nranks}, {"rank", comm_rank}, {"desc", desc}}));
    ipc::Frame f;
    EXPECT_TRUE(Recv(&f, 10000));  // an unknown id is answered after comm_wait_ms
    EXPECT_EQ(f.type, ipc::MsgType::kCommInfo);
    return json::parse(f.payload);
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int rank_;
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions o;
    o.world_size = 8;
    o.real_ranks = {0, 5};
    o.out_dir = TempDir("coord");
    o.status_interval_ms = 20;
    o.comm_wait_ms = 300;
    std::string error;
    coord_ = Coordinator::Start(o, &error);
    ASSERT_TRUE(coord_) << error;
  }
  void TearDown() override { coord_.reset(); }

  std::unique_ptr<store::StoreClient> Store() {
    auto c = std::make_unique<store::StoreClient>();
    EXPECT_TRUE(c->Connect(coord_->endpoints().store_host, coord_->endpoints().store_port)) << c->error();
    return c;
  }

  std::unique_ptr<Coordinator> coord_;
};

TEST_F(CoordinatorTest, InfoFileSaysHowToReachIt) {
  const auto& ep = coord_->endpoints();
  json info = ReadJson(ep.info_path);
  EXPECT_EQ(info["state"], "running");
  EXPECT_EQ(info["store_port"], ep.store_port);
  EXPECT_EQ(info["socket"], ep.socket_path);
  EXPECT_EQ(info["pid"], ::getpid());
  EXPECT_EQ(info["world_size"], 8);
  EXPECT_EQ(info["real_ranks"], json::array({0, 5}));
  EXPECT_NE(ep.store_port, 0);
  EXPECT_TRUE(fs::exists(ep.socket_path));
  coord_->Stop();
  EXPECT_EQ(ReadJson(ep.info_path)["state"], "stopped");
  EXPECT_FALSE(fs::exists(ep.socket_path));
}

TEST_F(CoordinatorTest, HelloFromARealRankAndRefusalOfAVirtualOne) {
  FakeShim r5(coord_->endpoints().socket_path, 5);
  json ack = r5.Hello();
  EXPECT_EQ(ack["world_size"], 8);
  EXPECT_EQ(ack["real_ranks"], json::array({0, 5}));
  EXPECT_EQ(ack["payload"], "mirror");
  FakeShim r3(coord_->endpoints().socket_path, 3);
  ASSERT_TRUE(r3.SendJson(ipc::MsgType::kHello, {{"rank", 3}}));
  ipc::Frame f;
  ASSERT_TRUE(r3.Recv(&f));
  EXPECT_EQ(f.type, ipc::MsgType::kError);
  EXPECT_NE(f.payload.find("virtual"), std::string::npos) << f.payload;
  EXPECT_FALSE(r3.Recv(&f, 2000)) << "the coordinator closes the connection";
}

TEST_F(CoordinatorTest, CommMembersFromTheStoreAndReleaseWhenAllRealMembersArrived) {
  // torch's exchange: rank 0 (real leader of the default group) sets the id; rank 5 reads it.
  auto s0 = Store();
  auto s5 = Store();
  std::string id(128, '\x11');
  ASSERT_TRUE(s0->Set("/default_pg/0//cuda//0", id));
  std::string got;
  ASSERT_TRUE(s5->WaitGet("/default_pg/0//cuda//0", 5000, &got));
  ASSERT_EQ(got, id);

  FakeShim r0(coord_->endpoints().socket_path, 0);
  FakeShim r5(coord_->endpoints().socket_path, 5);
  r0.Hello();
  r5.Hello();
  json c0 = r0.CommInit(id, 8, 0);
  json c5 = r5.CommInit(id, 8, 5);
  ASSERT_FALSE(c0.contains("error")) << c0.dump();
  EXPECT_EQ(c0["comm_id"], c5["comm_id"]);
  EXPECT_EQ(c0["members"], json::array({0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(c0["real"], json::array({true, false, false, false, false, true, false, false}));
  EXPECT_EQ(c0["virtual_leader"], false);
  uint32_t comm = c0["comm_id"];

  ipc::OpArrive a{};
  a.comm_id = comm;
  a.op = 1;
  a.seq = 1;
  a.arrival_ns = 1000;
  a.model_dur_ns = 50;
  a.peer = -1;
  ASSERT_TRUE(r0.SendPod(ipc::MsgType::kOpArrive, a));
  ipc::Frame f;
  EXPECT_FALSE(r0.Recv(&f, 200)) << "rank 5 has not arrived";
  json st = json::parse(coord_->StatusJson());
  ASSERT_TRUE(st["ranks"][0].contains("waiting"));
  EXPECT_EQ(st["ranks"][0]["waiting"]["waiting_for"], json::array({5}));
  a.arrival_ns = 2000;
  ASSERT_TRUE(r5.SendPod(ipc::MsgType::kOpArrive, a));
  for (FakeShim* s : {&r0, &r5}) {
    ASSERT_TRUE(s->Recv(&f));
    ASSERT_EQ(f.type, ipc::MsgType::kOpRelease);
    ipc::OpRelease rel{};
    ASSERT_TRUE(ipc::DecodePod(f, &rel));
    EXPECT_EQ(rel.comm_id, comm);
    EXPECT_EQ(rel.seq, 1u);
    EXPECT_EQ(rel.release_ns, 2050u);
    EXPECT_EQ(rel.last_rank, 5);
  }
}

// Passthrough (ipc.h): a communicator of real members on distinct GPUs runs on the real NCCL; rank 0's real unique
// id reaches every member through the coordinator, whoever asks first.
TEST_F(CoordinatorTest, AllRealMembersOnDistinctGpusPassThroughAndShareRankZerosRealId) {
  auto s0 = Store();
  ASSERT_TRUE(s0->Set("/default_pg/0//1//__prism_group__", R"({"name":"1","ranks":[0,5],"desc":"TP"})"));
  std::string id(128, '\x22');
  ASSERT_TRUE(s0->Set("/default_pg/0//1//cuda//0", id));
  FakeShim r0(coord_->endpoints().socket_path, 0);
  FakeShim r5(coord_->endpoints().socket_path, 5);
  r0.Hello({{"gpu_id", "h/0"}, {"passthrough", true}});
  r5.Hello({{"gpu_id", "h/1"}, {"passthrough", true}});
  json c0 = r0.CommInit(id, 2, 0);
  json c5 = r5.CommInit(id, 2, 1);
  ASSERT_FALSE(c0.contains("error")) << c0.dump();
  EXPECT_EQ(c0["members"], json::array({0, 5}));
  EXPECT_EQ(c0["passthrough"], true);
  EXPECT_EQ(c5["passthrough"], true);
  uint32_t comm = c0["comm_id"];
  // The world (virtual members too) does not pass through.
  std::string wid(128, '\x33');
  ASSERT_TRUE(s0->Set("/default_pg/0//cuda//0", wid));
  EXPECT_EQ(r0.CommInit(wid, 8, 0)["passthrough"], false);

  ASSERT_TRUE(r5.SendJson(ipc::MsgType::kRealNcclId, {{"comm_id", comm}}));
  ipc::Frame f;
  EXPECT_FALSE(r5.Recv(&f, 200)) << "rank 0 has not posted its id yet";
  std::string real_id(128, '\x44');
  ASSERT_TRUE(r0.SendJson(ipc::MsgType::kRealNcclId, {{"comm_id", comm}, {"id", ipc::HexEncode(real_id)}}));
  for (FakeShim* s : {&r0, &r5}) {
    ASSERT_TRUE(s->Recv(&f));
    ASSERT_EQ(f.type, ipc::MsgType::kRealNcclIdInfo);
    json j = json::parse(f.payload);
    EXPECT_EQ(j["comm_id"], comm);
    EXPECT_EQ(j["id"], ipc::HexEncode(real_id));
  }
  // A late asker gets it at once; a malformed post is refused.
  ASSERT_TRUE(r5.SendJson(ipc::MsgType::kRealNcclId, {{"comm_id", comm}}));
  ASSERT_TRUE(r5.Recv(&f));
  EXPECT_EQ(json::parse(f.payload)["id"], ipc::HexEncode(real_id));
  ASSERT_TRUE(r0.SendJson(ipc::MsgType::kRealNcclId, {{"comm_id", comm}, {"id", "abcd"}}));
  ASSERT_TRUE(r0.Recv(&f));
  EXPECT_TRUE(json::parse(f.payload).contains("error"));
}

TEST_F(CoordinatorTest, RealMembersSharingAGpuOrUnableToRunNcclDoNotPassThrough) {
  auto s0 = Store();
  ASSERT_TRUE(s0->Set("/default_pg/0//1//__prism_group__", R"({"name":"1","ranks":[0,5],"desc":"TP"})"));
  std::string id(128, '\x55');
  ASSERT_TRUE(s0->Set("/default_pg/0//1//cuda//0", id));
  FakeShim r0(coord_->endpoints().socket_path, 0);
  FakeShim r5(coord_->endpoints().socket_path, 5);
  r0.Hello({{"gpu_id", "h/0"}, {"passthrough", true}});
  r5.Hello({{"gpu_id", "h/0"}, {"passthrough", true}});  // one GPU for both: NCCL would refuse
  json c0 = r0.CommInit(id, 2, 0);
  ASSERT_FALSE(c0.contains("error")) << c0.dump();
  EXPECT_EQ(c0["passthrough"], false);
  ASSERT_TRUE(r0.SendJson(ipc::MsgType::kRealNcclId, {{"comm_id", c0["comm_id"]}}));
  ipc::Frame f;
  ASSERT_TRUE(r0.Recv(&f));
  EXPECT_TRUE(json::parse(f.payload).contains("error"));

  // Distinct GPUs, but rank 5 found no real NCCL (or PRISM_PASSTHROUGH=0): no passthrough either.
  ASSERT_TRUE(s0->Set("/default_pg/0//2//__prism_group__", R"({"name":"2","ranks":[0,5],"desc":"DP"})"));
  std::string id2(128, '\x66');
  ASSERT_TRUE(s0->Set("/default_pg/0//2//cuda//0", id2));
  FakeShim q0(coord_->endpoints().socket_path, 0);
  FakeShim q5(coord_->endpoints().socket_path, 5);
  q0.Hello({{"gpu_id", "h/0"}, {"passthrough", true}});
  q5.Hello({{"gpu_id", "h/1"}, {"passthrough", false}});
  EXPECT_EQ(q0.CommInit(id2, 2, 0)["passthrough"], false);
}

TEST_F(CoordinatorTest, SplitChildNamedByItsMembersListPassesThrough) {
  // torch with device_id bound makes new_group a ncclCommSplit of the world: no unique id, no name; the real
  // members send the child's stable key and the members they know (found on the GPU: world 8, ranks 0,1 real; here 0 and 5).
  FakeShim r0(coord_->endpoints().socket_path, 0);
  FakeShim r1(coord_->endpoints().socket_path, 5);
  r0.Hello({{"gpu_id", "h/0"}, {"passthrough", true}});
  r1.Hello({{"gpu_id", "h/1"}, {"passthrough", true}});
  auto init = [](FakeShim& s, int rank, json members) {
    EXPECT_TRUE(s.SendJson(ipc::MsgType::kCommInit,
                           {{"key", "split:00000000deadbeef"}, {"nranks", 2}, {"rank", rank}, {"members", members}}));
    ipc::Frame f;
    EXPECT_TRUE(s.Recv(&f));
    return json::parse(f.payload);
  };
  json c0 = init(r0, 0, {0, 5});
  json c1 = init(r1, 1, {0, 5});
  ASSERT_FALSE(c0.contains("error")) << c0.dump();
  ASSERT_FALSE(c1.contains("error")) << c1.dump();
  EXPECT_EQ(c0["comm_id"], c1["comm_id"]);
  EXPECT_EQ(c0["members"], json::array({0, 5}));
  EXPECT_EQ(c0["passthrough"], true);
  // A list that does not hold the sender at its communicator rank is refused, as is one out of the world.
  EXPECT_TRUE(init(r0, 0, {5, 0}).contains("error"));
  json bad = init(r0, 0, {0, 999});
  EXPECT_TRUE(bad.contains("error")) << bad.dump();
}

TEST_F(CoordinatorTest, VirtualLeaderCommWithOneRealMember) {
  auto s5 = Store();
  ASSERT_TRUE(s5->Set("/default_pg/0//1//__prism_group__", R"({"name":"1","ranks":[4,5,6],"desc":"TP"})"));
  std::string id;
  ASSERT_TRUE(s5->WaitGet("/default_pg/0//1//cuda//0", 5000, &id));
  ASSERT_TRUE(ipc::IsVirtualNcclId(id.data(), id.size()));
  FakeShim r5(coord_->endpoints().socket_path, 5);
  r5.Hello();
  json c = r5.CommInit(id, 3, 1);
  ASSERT_FALSE(c.contains("error")) << c.dump();
  EXPECT_EQ(c["members"], json::array({4, 5, 6}));
  EXPECT_EQ(c["virtual_leader"], true);
  EXPECT_EQ(c["group"], "1");
  ipc::OpArrive a{};
  a.comm_id = c["comm_id"];
  a.seq = 9;
  a.arrival_ns = 5000;
  a.model_dur_ns = 7;
  ASSERT_TRUE(r5.SendPod(ipc::MsgType::kOpArrive, a));
  ipc::Frame f;
  ASSERT_TRUE(r5.Recv(&f));
  ipc::OpRelease rel{};
  ASSERT_TRUE(ipc::DecodePod(f, &rel));
  EXPECT_EQ(rel.release_ns, 5007u);
  EXPECT_EQ(rel.last_rank, -1);
}

// Prereleases (ipc.h kOpPrerelease) over the bus, with a release policy that knows the virtual members' arrivals
// ahead (floor 10000 + 100 x seq, duration 50; the graph expects a broadcast at seq 3, an all-reduce elsewhere):
// after a communicator's first release the rank gets the rules of its next 4 operations; an arrival whose every
// operation was prereleased for its op gets no kOpRelease, one whose op differs does; a new connection of the rank
// starts afresh (nothing prereleased to the old one suppresses an answer).
class AheadPolicy : public ReleasePolicy {
 public:
  ReleaseDecision Decide(const CommView&, uint64_t seq, std::span<const Arrival> arrivals) override {
    ReleaseDecision d;
    const uint64_t arrival = arrivals[0].op.arrival_ns, floor = Floor(seq);
    d.release_ns = std::max(arrival, floor) + 50;
    d.last_rank = arrival > floor ? arrivals[0].rank : 4;
    return d;
  }
  std::optional<Prerelease> Predict(const CommView&, uint64_t seq, int) override {
    Prerelease p;
    p.floor_ns = Floor(seq);
    p.dur_ns = 50;
    p.floor_rank = 4;
    p.op = seq == 3 ? 4 : 1;
    return p;
  }
  static uint64_t Floor(uint64_t seq) { return 10000 + 100 * seq; }
};

TEST(CoordinatorPrerelease, SentAheadTakenByOpAndForgottenOnANewConnection) {
  AheadPolicy policy;
  CoordinatorOptions o;
  o.world_size = 8;
  o.real_ranks = {5};
  o.out_dir = TempDir("coord-pre");
  o.comm_wait_ms = 300;
  o.release_policy = &policy;
  std::string error;
  auto coord = Coordinator::Start(o, &error);
  ASSERT_TRUE(coord) << error;
  store::StoreClient st;
  ASSERT_TRUE(st.Connect(coord->endpoints().store_host, coord->endpoints().store_port)) << st.error();
  ASSERT_TRUE(st.Set("/default_pg/0//1//__prism_group__", R"({"name":"1","ranks":[4,5,6],"desc":"TP"})"));
  std::string id;
  ASSERT_TRUE(st.WaitGet("/default_pg/0//1//cuda//0", 5000, &id));
  auto arrive = [](FakeShim& r, uint32_t comm, uint64_t seq, uint32_t op) {
    ipc::OpArrive a{};
    a.comm_id = comm;
    a.op = op;
    a.seq = seq;
    a.arrival_ns = 20000 + seq;  // after every floor: the rank arrives last
    a.model_dur_ns = 7;
    a.nops = 1;
    EXPECT_TRUE(r.SendPod(ipc::MsgType::kOpArrive, a));
  };
  // Frames until `pred` takes one (prereleases are collected on the way); false on a timeout.
  std::map<uint64_t, ipc::OpPrerelease> pre;
  auto next = [&pre](FakeShim& r, ipc::OpRelease* rel, int timeout_ms) {
    for (;;) {
      ipc::Frame f;
      if (!r.Recv(&f, timeout_ms)) return false;
      if (f.type == ipc::MsgType::kOpPrerelease) {
        ipc::OpPrerelease p{};
        EXPECT_TRUE(ipc::DecodePod(f, &p));
        pre[p.seq] = p;
        continue;
      }
      if (f.type == ipc::MsgType::kOpRelease) return ipc::DecodePod(f, rel);
    }
  };
  {
    FakeShim r5(coord->endpoints().socket_path, 5);
    r5.Hello({{"prerelease", true}});
    const json c = r5.CommInit(id, 3, 1);
    const uint32_t comm = c["comm_id"];
    arrive(r5, comm, 0, 1);
    ipc::OpRelease rel{};
    ASSERT_TRUE(next(r5, &rel, 5000));
    EXPECT_EQ(rel.seq, 0u) << "a communicator's first operation is answered";
    EXPECT_EQ(rel.release_ns, 20050u);
    arrive(r5, comm, 1, 1);  // prereleased for its op: no answer
    arrive(r5, comm, 2, 1);  // the same
    arrive(r5, comm, 3, 1);  // prereleased for a broadcast: answered
    ASSERT_TRUE(next(r5, &rel, 5000));
    EXPECT_EQ(rel.seq, 3u);
    EXPECT_EQ(rel.release_ns, 20053u);
    for (uint64_t s : {1, 2, 3, 4}) {
      ASSERT_TRUE(pre.count(s)) << "no prerelease for seq " << s;
      EXPECT_EQ(pre[s].floor_ns, AheadPolicy::Floor(s));
      EXPECT_EQ(pre[s].dur_ns, 50);
      EXPECT_EQ(pre[s].floor_rank, 4);
      EXPECT_EQ(pre[s].op, s == 3 ? 4u : 1u);
    }
    EXPECT_EQ(pre.count(0), 0u);
  }
  // The rank's process starts again: a new connection, sequence numbers from 0. Nothing the old connection was sent
  // may suppress an answer: seq 0 is answered, and every later one is prereleased to the new connection first.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  pre.clear();
  FakeShim again(coord->endpoints().socket_path, 5);
  again.Hello({{"prerelease", true}});
  const json c = again.CommInit(id, 3, 1);
  const uint32_t comm = c["comm_id"];
  arrive(again, comm, 0, 1);
  ipc::OpRelease rel{};
  ASSERT_TRUE(next(again, &rel, 5000));
  EXPECT_EQ(rel.seq, 0u);
  arrive(again, comm, 1, 1);
  arrive(again, comm, 2, 3);  // a reduce-scatter where the graph has an all-reduce: answered
  ASSERT_TRUE(next(again, &rel, 5000));
  EXPECT_EQ(rel.seq, 2u);
  EXPECT_TRUE(pre.count(1)) << "seq 1 was prereleased to the new connection";
}

TEST_F(CoordinatorTest, UnknownCommIsAnsweredWithAnError) {
  FakeShim r5(coord_->endpoints().socket_path, 5);
  r5.Hello();
  json c = r5.CommInit(std::string(128, '\x33'), 4, 1);
  EXPECT_EQ(c["comm_id"], 0);
  EXPECT_TRUE(c.contains("error"));
  // Description matching: a registered group found by torch's commDesc.
  coord_->RegisterGroup("7", {5, 6}, "PIPELINE_MODEL_PARALLEL_GROUP");
  json d = r5.CommInit(std::string(128, '\x34'), 2, 0, "PIPELINE_MODEL_PARALLEL_GROUP:7");
  ASSERT_FALSE(d.contains("error")) << d.dump();
  EXPECT_EQ(d["members"], json::array({5, 6}));
  // By torch group name (libprism sends it when it knows it).
  coord_->RegisterGroup("8", {1, 5, 7});
  ASSERT_TRUE(r5.SendJson(ipc::MsgType::kCommInit, {{"key", ipc::HexEncode(std::string(128, '\x36'))},
                                                    {"nranks", 3}, {"rank", 1}, {"name", "8"}}));
  ipc::Frame f;
  ASSERT_TRUE(r5.Recv(&f));
  json n = json::parse(f.payload);
  ASSERT_FALSE(n.contains("error")) << n.dump();
  EXPECT_EQ(n["members"], json::array({1, 5, 7}));
  // The world by size.
  json w = r5.CommInit(std::string(128, '\x35'), 8, 5);
  ASSERT_FALSE(w.contains("error")) << w.dump();
  EXPECT_EQ(w["members"].size(), 8u);
}

TEST_F(CoordinatorTest, LeaderCommInitRacingItsOwnSetIsAnsweredWhenTheSetLands) {
  // A real leader SETs its id (store, no reply) and at once sends kCommInit (bus): the bus may see it first.
  FakeShim r0(coord_->endpoints().socket_path, 0);
  r0.Hello();
  std::string id(128, '\x51');
  ASSERT_TRUE(r0.SendJson(ipc::MsgType::kCommInit, {{"key", ipc::HexEncode(id)}, {"nranks", 4}, {"rank", 0}}));
  std::string id2(128, '\x52');
  ASSERT_TRUE(r0.SendJson(ipc::MsgType::kCommInit, {{"key", ipc::HexEncode(id2)}, {"nranks", 8}, {"rank", 0}}));
  ipc::Frame f;
  EXPECT_FALSE(r0.Recv(&f, 200)) << "parked until the store has the id; the second waits behind the first";
  auto s0 = Store();
  ASSERT_TRUE(s0->Set("/default_pg/0//3//__prism_group__", R"({"name":"3","ranks":[0,1,2,3]})"));
  ASSERT_TRUE(s0->Set("/default_pg/0//3//cuda//0", id));
  ASSERT_TRUE(r0.Recv(&f));
  json c = json::parse(f.payload);
  EXPECT_EQ(c["key"], ipc::HexEncode(id));
  EXPECT_EQ(c["members"], json::array({0, 1, 2, 3}));
  ASSERT_TRUE(r0.Recv(&f));
  json w = json::parse(f.payload);
  EXPECT_EQ(w["key"], ipc::HexEncode(id2));
  EXPECT_EQ(w["members"].size(), 8u) << "resolved by the world size, in order";
}

TEST_F(CoordinatorTest, StatusFollowsIterationsMemoryAndGoodbye) {
  FakeShim r0(coord_->endpoints().socket_path, 0);
  r0.Hello();
  ipc::IterationMark it{};
  it.iteration = 3;
  it.dur_ns = 512000000;
  it.peak_bytes = 16ull << 30;
  ASSERT_TRUE(r0.SendPod(ipc::MsgType::kIteration, it));
  ipc::MemorySample m{};
  m.current_bytes = 1 << 30;
  m.peak_bytes = 17ull << 30;
  ASSERT_TRUE(r0.SendPod(ipc::MsgType::kMemory, m));
  ASSERT_TRUE(r0.SendJson(ipc::MsgType::kBye, {{"reason", "done"}}));
  json st;
  for (int i = 0; i < 100; ++i) {
    st = json::parse(coord_->StatusJson());
    if (st["ranks"][0]["state"] == "bye") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(st["ranks"][0]["state"], "bye");
  EXPECT_EQ(st["ranks"][0]["iterations"], 3);
  EXPECT_DOUBLE_EQ(st["ranks"][0]["last_iteration_s"].get<double>(), 0.512);
  EXPECT_EQ(st["ranks"][0]["peak_memory_bytes"], 17ull << 30);
  EXPECT_EQ(st["ranks"][1]["state"], "not connected");
  // status.json on disk follows.
  for (int i = 0; i < 100; ++i) {
    json disk = ReadJson(coord_->endpoints().status_path);
    if (disk["ranks"][0]["state"] == "bye") return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "status.json never showed rank 0's goodbye";
}

TEST_F(CoordinatorTest, GarbageOnTheBusCostsOnlyThatConnection) {
  std::string err;
  int bad = ipc::ConnectUnix(coord_->endpoints().socket_path, &err);
  ASSERT_GE(bad, 0) << err;
  const char junk[] = "this is not a prism frame at all";
  ASSERT_EQ(ipc::WriteAll(bad, junk, sizeof(junk), &err), ipc::IoStatus::kOk);
  char b;
  EXPECT_EQ(ipc::ReadExact(bad, &b, 1, 5000, &err), ipc::IoStatus::kClosed);
  ::close(bad);
  // A frame before kHello, and a half frame then a disconnect.
  FakeShim early(coord_->endpoints().socket_path, 5);
  ipc::OpArrive a{};
  ASSERT_TRUE(early.SendPod(ipc::MsgType::kOpArrive, a));
  ipc::Frame f;
  EXPECT_FALSE(early.Recv(&f, 2000));
  {
    FakeShim half(coord_->endpoints().socket_path, 0);
    std::string frame = ipc::EncodeFrame(ipc::MsgType::kHello, R"({"rank":0})");
    ASSERT_EQ(ipc::WriteAll(half.fd(), frame.data(), 7, &err), ipc::IoStatus::kOk);
  }
  FakeShim good(coord_->endpoints().socket_path, 0);
  EXPECT_EQ(good.Hello()["world_size"], 8);
}

// The bus's per-client caps through the coordinator's own handlers (limits.h; event_bus_test.cc has the bus alone).
class CoordinatorBusCaps : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions o;
    o.world_size = 4096;
    o.real_ranks = {0, 5};
    o.out_dir = TempDir("coord-caps");
    o.comm_wait_ms = 1000;  // a world kCommInit waits this long for a real member that never said hello
    o.bus_max_reply_bytes = 1 << 20;
    o.bus_max_parked_bytes = 4096;
    std::string error;
    coord_ = Coordinator::Start(o, &error);
    ASSERT_TRUE(coord_) << error;
  }
  // Sends `frames` without reading anything, then reads whatever came until the coordinator closes the connection:
  // true when it did within 5 s.
  bool ClosedAfter(FakeShim& shim, const std::string& frames) {
    std::string error;
    if (ipc::WriteAll(shim.fd(), frames.data(), frames.size(), &error) != ipc::IoStatus::kOk) return true;
    ipc::Frame f;
    for (;;) {
      ipc::IoStatus st = ipc::RecvFrame(shim.fd(), &f, 5000, &error);
      if (st == ipc::IoStatus::kClosed || st == ipc::IoStatus::kError) return true;
      if (st == ipc::IoStatus::kTimeout) return false;
    }
  }
  // The other real rank is served: its hello, and its kCommInit of the world with all 4096 members.
  void ExpectServed() {
    FakeShim good(coord_->endpoints().socket_path, 5);
    good.Hello();
    json info = good.CommInit("w", 4096, 5);
    EXPECT_EQ(info["members"].size(), 4096u) << info.dump().substr(0, 200);
  }
  std::unique_ptr<Coordinator> coord_;
};

TEST_F(CoordinatorBusCaps, CommInitsWhoseMemberListsAreNotReadDropOnlyThatClient) {
  FakeShim bad(coord_->endpoints().socket_path, 0);
  bad.Hello();
  // ~60 bytes each, answered with the world's 4096 members (~45 KB): 200 of them ask for 9 MB.
  std::string frames;
  json req = {{"key", "w"}, {"nranks", 4096}, {"rank", 0}};
  for (int i = 0; i < 200; ++i) frames += ipc::EncodeFrame(ipc::MsgType::kCommInit, req.dump());
  EXPECT_TRUE(ClosedAfter(bad, frames));
  ExpectServed();
}

TEST_F(CoordinatorBusCaps, CommInitsParkedPastTheCapDropOnlyThatClient) {
  FakeShim bad(coord_->endpoints().socket_path, 0);
  bad.Hello();
  // Unknown 128-byte ids wait for the store (comm_wait_ms): ~300 bytes each held per request.
  std::string frames;
  for (int i = 0; i < 64; ++i) {
    std::string id(128, static_cast<char>(i + 1));
    frames += ipc::EncodeFrame(ipc::MsgType::kCommInit,
                               json{{"key", ipc::HexEncode(id)}, {"nranks", 2}, {"rank", 0}}.dump());
  }
  EXPECT_TRUE(ClosedAfter(bad, frames));
  ExpectServed();
}

TEST_F(CoordinatorBusCaps, JsonNestedTooDeepDropsOnlyThatClient) {
  FakeShim bad(coord_->endpoints().socket_path, 0);
  std::string deep = std::string(1000, '[') + std::string(1000, ']');
  std::string hello = R"({"rank":0,"x":)" + deep + "}";
  EXPECT_TRUE(ClosedAfter(bad, ipc::EncodeFrame(ipc::MsgType::kHello, hello)));
  ExpectServed();
}

TEST(CoordinatorStart, BadOptionsAreClearErrors) {
  std::string error;
  CoordinatorOptions o;
  o.world_size = 4;
  o.real_ranks = {4};
  o.out_dir = TempDir("coord-bad");
  EXPECT_FALSE(Coordinator::Start(o, &error));
  EXPECT_NE(error.find("real rank 4"), std::string::npos) << error;
  o.real_ranks = {0};
  o.bus_tcp = "nonsense";
  EXPECT_FALSE(Coordinator::Start(o, &error));
  EXPECT_NE(error.find("nonsense"), std::string::npos) << error;
}

TEST(CoordinatorStart, TcpBusForOtherHosts) {
  CoordinatorOptions o;
  o.world_size = 2;
  o.real_ranks = {0, 1};
  o.out_dir = TempDir("coord-tcp");
  o.bus_tcp = "127.0.0.1:0";
  std::string error;
  auto c = Coordinator::Start(o, &error);
  ASSERT_TRUE(c) << error;
  std::string host = c->endpoints().bus_tcp.substr(0, c->endpoints().bus_tcp.rfind(':'));
  int port = std::stoi(c->endpoints().bus_tcp.substr(c->endpoints().bus_tcp.rfind(':') + 1));
  ASSERT_GT(port, 0);
  int fd = ipc::ConnectTcp(host, static_cast<uint16_t>(port), 2000, &error);
  ASSERT_GE(fd, 0) << error;
  std::string hello = R"({"rank":1})";
  ASSERT_EQ(ipc::SendFrame(fd, ipc::MsgType::kHello, hello.data(), hello.size(), &error), ipc::IoStatus::kOk);
  ipc::Frame f;
  ASSERT_EQ(ipc::RecvFrame(fd, &f, 5000, &error), ipc::IoStatus::kOk) << error;
  EXPECT_EQ(f.type, ipc::MsgType::kHelloAck);
  ::close(fd);
}

// The CLI, as a user runs it: prism-run coordinator, then prism-run status, then SIGTERM.
std::string RunCapture(const std::string& cmd, int* rc) {
  std::string out;
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  int st = ::pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

TEST(CoordinatorCli, RunsAloneAndStatusShowsIt) {
  const char* prism_run = std::getenv("PRISM_RUN");
  if (!prism_run || !fs::exists(prism_run)) GTEST_SKIP() << "PRISM_RUN not set to a built prism-run";
  std::string out = TempDir("coord-cli");
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::string log = out + "/coordinator.log";
    std::freopen(log.c_str(), "w", stdout);
    std::freopen(log.c_str(), "a", stderr);
    ::execl(prism_run, prism_run, "coordinator", "--world-size", "16", "--ranks", "0,9", "--port", "0", "--out",
            out.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  json info;
  for (int i = 0; i < 200; ++i) {
    if (fs::exists(out + "/coordinator.json") && fs::exists(out + "/status.json")) {
      info = ReadJson(out + "/coordinator.json");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_FALSE(info.is_null()) << "no coordinator.json";
  store::StoreClient c;
  ASSERT_TRUE(c.Connect("127.0.0.1", info["store_port"].get<uint16_t>())) << c.error();
  int64_t v = 0;
  ASSERT_TRUE(c.Add("init/", 1, &v));
  EXPECT_EQ(v, 15) << "14 virtual workers counted, plus this one";
  int rc = -1;
  std::string status = RunCapture(std::string(prism_run) + " status " + out, &rc);
  EXPECT_EQ(rc, 0) << status;
  EXPECT_NE(status.find("world 16, real ranks 0,9"), std::string::npos) << status;
  EXPECT_NE(status.find("virtual ranks (14)"), std::string::npos) << status;
  EXPECT_NE(status.find("running"), std::string::npos) << status;
  ::kill(pid, SIGTERM);
  int st = 0;
  ::waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(ReadJson(out + "/coordinator.json")["state"], "stopped");
  status = RunCapture(std::string(prism_run) + " status " + out, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(status.find("stopped"), std::string::npos) << status;
}

TEST(CoordinatorCli, BadInputExitsTwo) {
  const char* prism_run = std::getenv("PRISM_RUN");
  if (!prism_run || !fs::exists(prism_run)) GTEST_SKIP() << "PRISM_RUN not set to a built prism-run";
  int rc = -1;
  std::string out = RunCapture(std::string(prism_run) + " coordinator --world-size 8 --ranks 9 --out " +
                                   TempDir("coord-cli-bad"),
                               &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--ranks \"9\": rank 9 is outside the world (ranks 0-7)"), std::string::npos) << out;
  out = RunCapture(std::string(prism_run) + " status " + TempDir("coord-cli-empty"), &rc);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("no coordinator.json"), std::string::npos) << out;
}

}  // namespace
}  // namespace prism::coord
