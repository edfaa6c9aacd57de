// HangDetector fed synthetic arrivals, releases and records on a fake clock (no sleeping): a disagreement at one
// sequence, a member that never arrived, a 2-rank p2p cycle, and no alarm while progress continues.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/ipc_io.h"
#include "coordinator/hang/hang_detector.h"
#include "coordinator/store/store_client.h"

namespace prism::coord {
namespace {

constexpr uint64_t kSec = 1'000'000'000ull;
constexpr uint32_t kAllReduce = 1, kAllGather = 2, kSend = 103, kRecv = 104;

ipc::OpArrive Arr(uint32_t comm, uint64_t seq, uint32_t op, uint64_t bytes, int32_t peer = -1) {
  ipc::OpArrive a{};
  a.comm_id = comm;
  a.seq = seq;
  a.op = op;
  a.bytes = bytes;
  a.peer = peer;
  return a;
}

ipc::OpRecord Rec(uint32_t comm, uint64_t seq, uint32_t op, uint64_t bytes, uint8_t dtype) {
  ipc::OpRecord r{};
  r.comm_id = comm;
  r.seq = seq;
  r.op = op;
  r.bytes = bytes;
  r.dtype = dtype;
  return r;
}

// Four real ranks 0..3 in one data-parallel communicator of 8 (4..7 virtual).
HangDetector FourReal(double timeout = 60) {
  HangDetector d(timeout);
  d.AddComm(1, "DATA_PARALLEL_GROUP", {0, 1, 2, 3, 4, 5, 6, 7}, {true, true, true, true, false, false, false, false});
  return d;
}

TEST(HangDetector, MismatchAtOneSequence) {
  HangDetector d = FourReal();
  uint64_t t = 1000 * kSec;
  // Sequence 0 completes everywhere (records carry the dtype).
  for (int r = 0; r < 4; ++r) d.Arrive(r, Arr(1, 0, kAllReduce, 2 << 20), t);
  for (int r = 0; r < 4; ++r) d.Release(r, 1, 0, t);
  for (int r = 0; r < 4; ++r) d.Record(r, Rec(1, 0, kAllReduce, 2 << 20, 3), t);
  // Sequence 1: rank 2 all_reduces 1 MiB, its peers 2 MiB; rank 3 all_gathers.
  d.Arrive(0, Arr(1, 1, kAllReduce, 2 << 20), t + kSec);
  d.Arrive(1, Arr(1, 1, kAllReduce, 2 << 20), t + kSec);
  d.Arrive(2, Arr(1, 1, kAllReduce, 1 << 20), t + kSec);
  d.Arrive(3, Arr(1, 1, kAllGather, 2 << 20), t + 2 * kSec);
  // The coordinator would release here; say it did not (e.g. the shim refused), and time passes.
  EXPECT_FALSE(d.Check(t + 61 * kSec));
  auto diag = d.Check(t + 62 * kSec + 1);
  ASSERT_TRUE(diag);
  ASSERT_EQ(diag->mismatches.size(), 1u);
  const HangMismatch& m = diag->mismatches[0];
  EXPECT_EQ(m.comm_id, 1u);
  EXPECT_EQ(m.seq, 1u);
  EXPECT_EQ(m.comm_name, "DATA_PARALLEL_GROUP");
  EXPECT_EQ(m.what, "op, size");
  ASSERT_EQ(m.ops.size(), 4u);
  EXPECT_EQ(m.ops[2].first, 2);
  EXPECT_EQ(m.ops[2].second.bytes, 1u << 20);
  EXPECT_EQ(m.ops[3].second.op, kAllGather);
  // Sequence 0 agreed: not reported.
  EXPECT_EQ(diag->waits.size(), 4u);
  std::string text = diag->ToText();
  EXPECT_NE(text.find("op, size mismatch at comm 1 (DATA_PARALLEL_GROUP) seq 1"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 2 all_reduce 1 MiB"), std::string::npos) << text;
  auto j = nlohmann::json::parse(diag->ToJson());
  EXPECT_EQ(j["mismatches"][0]["differs"], "op, size");
  EXPECT_EQ(j["mismatches"][0]["ops"][0]["dtype"], nullptr);  // kOpArrive carries no dtype
  // Reported once per stall.
  EXPECT_FALSE(d.Check(t + 200 * kSec));
}

TEST(HangDetector, DtypeMismatchFromRecords) {
  HangDetector d = FourReal();
  uint64_t t = 10 * kSec;
  for (int r = 0; r < 4; ++r) d.Record(r, Rec(1, 5, kAllReduce, 4096, r == 1 ? 1 : 3), t);
  d.Arrive(0, Arr(1, 6, kAllReduce, 4096), t);
  auto diag = d.Check(t + 60 * kSec);
  ASSERT_TRUE(diag);
  ASSERT_EQ(diag->mismatches.size(), 1u);
  EXPECT_EQ(diag->mismatches[0].seq, 5u);
  EXPECT_EQ(diag->mismatches[0].what, "dtype");
}

TEST(HangDetector, NeverArrivedMember) {
  HangDetector d = FourReal();
  uint64_t t = 5 * kSec;
  for (uint64_t s = 0; s < 3; ++s) {
    for (int r = 0; r < 4; ++r) d.Arrive(r, Arr(1, s, kAllReduce, 1024), t + s * kSec);
    for (int r = 0; r < 4; ++r) d.Release(r, 1, s, t + s * kSec);
  }
  // Sequence 3: ranks 0, 1, 3 arrive; rank 2 skipped ahead to other work (an iteration mark) and never comes.
  d.Progress(2, t + 3 * kSec);
  for (int r : {0, 1, 3}) d.Arrive(r, Arr(1, 3, kAllReduce, 1024), t + 4 * kSec);
  ASSERT_FALSE(d.Check(t + 63 * kSec));
  auto diag = d.Check(t + 64 * kSec);
  ASSERT_TRUE(diag);
  EXPECT_TRUE(diag->mismatches.empty());
  EXPECT_TRUE(diag->cycles.empty());
  ASSERT_EQ(diag->missing.size(), 1u);
  EXPECT_EQ(diag->missing[0].seq, 3u);
  EXPECT_EQ(diag->missing[0].arrived, (std::vector<int>{0, 1, 3}));
  ASSERT_EQ(diag->missing[0].missing.size(), 1u);
  EXPECT_EQ(diag->missing[0].missing[0].first, 2);
  EXPECT_EQ(diag->missing[0].missing[0].second, 2);  // it reached seq 2
  ASSERT_EQ(diag->waits.size(), 3u);
  for (const HangWait& w : diag->waits) {
    EXPECT_EQ(w.blocked_by, std::vector<int>{2});  // virtual members 4..7 mirror: not waited for
    EXPECT_EQ(w.held_up_by, 2);
    ASSERT_EQ(w.chain.size(), 2u);
    EXPECT_NE(w.chain[1].find("rank 2 is not waiting; it last reached comm 1 (DATA_PARALLEL_GROUP) seq 2"),
              std::string::npos)
        << w.chain[1];
  }
}

TEST(HangDetector, TwoRankP2pCycle) {
  HangDetector d(30);
  // Ranks 3 and 9, both real, share a 2-rank communicator; both send first without a group.
  d.AddComm(7, "p2p 3:9", {3, 9}, {true, true});
  d.AddComm(1, "world", {3, 9}, {true, true});
  uint64_t t = 100 * kSec;
  d.Arrive(3, Arr(1, 0, kAllReduce, 8), t);
  d.Arrive(9, Arr(1, 0, kAllReduce, 8), t);
  d.Release(3, 1, 0, t);
  d.Release(9, 1, 0, t);
  d.Arrive(3, Arr(7, 0, kSend, 1 << 20, /*peer comm rank*/ 1), t + kSec);
  d.Arrive(9, Arr(7, 0, kSend, 1 << 20, 0), t + kSec);
  auto diag = d.Check(t + 31 * kSec);
  ASSERT_TRUE(diag);
  ASSERT_EQ(diag->cycles.size(), 1u);
  EXPECT_EQ(diag->cycles[0], (std::vector<int>{3, 9}));
  ASSERT_EQ(diag->mismatches.size(), 1u);
  EXPECT_EQ(diag->mismatches[0].what, "p2p direction");
  for (const HangWait& w : diag->waits) {
    EXPECT_EQ(w.blocked_by.size(), 1u);
    EXPECT_NE(w.chain.back().find("a wait-for cycle"), std::string::npos) << w.chain.back();
  }
  EXPECT_NE(diag->ToText().find("wait-for cycle: 3 -> 9 -> 3"), std::string::npos) << diag->ToText();
}

TEST(HangDetector, MatchedSendRecvIsNoCycle) {
  HangDetector d(30);
  d.AddComm(7, "p2p 3:9", {3, 9}, {true, true});
  uint64_t t = 100 * kSec;
  d.Arrive(3, Arr(7, 0, kSend, 64, 1), t);
  d.Arrive(9, Arr(7, 0, kRecv, 64, 0), t);
  auto diag = d.Check(t + 31 * kSec);
  ASSERT_TRUE(diag);  // stalled anyway (never released), but nobody blocks anybody
  EXPECT_TRUE(diag->cycles.empty());
  EXPECT_TRUE(diag->mismatches.empty());
  for (const HangWait& w : diag->waits) EXPECT_TRUE(w.blocked_by.empty());
}

TEST(HangDetector, NoAlarmWhileProgressContinues) {
  HangDetector d = FourReal(10);
  uint64_t t = 0;
  // Rank 0 waits on seq 0 for 10 minutes while ranks 1..3 keep making progress (iterations, records).
  d.Arrive(0, Arr(1, 0, kAllReduce, 1024), t);
  for (int step = 1; step <= 600; ++step) {
    t = static_cast<uint64_t>(step) * kSec;
    if (step % 5 == 0) d.Progress(1 + step % 3, t);
    if (step % 7 == 0) d.Record(3, Rec(2, static_cast<uint64_t>(step), kAllReduce, 8, 1), t);
    EXPECT_FALSE(d.Check(t)) << "step " << step;
  }
  // Nobody waits: no alarm however long it is quiet.
  HangDetector quiet = FourReal(10);
  quiet.Arrive(0, Arr(1, 0, kAllReduce, 8), kSec);
  quiet.Release(0, 1, 0, kSec);
  EXPECT_FALSE(quiet.Check(1000 * kSec));
  // Progress then stops: reported once 10 s later, and again after a new stall.
  EXPECT_FALSE(d.Check(t + 9 * kSec));
  EXPECT_TRUE(d.Check(t + 10 * kSec));
  EXPECT_FALSE(d.Check(t + 11 * kSec));
  d.Progress(1, t + 12 * kSec);
  EXPECT_FALSE(d.Check(t + 13 * kSec));
  EXPECT_TRUE(d.Check(t + 22 * kSec));
  // timeout 0: off.
  d.set_timeout(0);
  d.Progress(1, t + 30 * kSec);
  EXPECT_FALSE(d.Check(t + 10000 * kSec));
}

namespace fs = std::filesystem;
using json = nlohmann::json;

json ReadJson(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

// At the user's level: `prism-run coordinator --hang-timeout 1` with two fake shims on its bus; rank 0 arrives at
// an all_reduce of the world, rank 5 never does. The coordinator writes hang.json, prints the diagnosis and, with
// the default --on-hang stop, exits 4. (Real time, about 1.5 s: the only test here that waits.)
TEST(HangDetectorCli, CoordinatorWritesHangJsonAndStops) {
  const char* prism_run = std::getenv("PRISM_RUN");
  if (!prism_run || !fs::exists(prism_run)) GTEST_SKIP() << "PRISM_RUN not set to a built prism-run";
  fs::path out = fs::path(::testing::TempDir()) / ("hang-cli-" + std::to_string(::getpid()));
  fs::remove_all(out);
  fs::create_directories(out);
  std::string log = (out / "coordinator.log").string();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::freopen(log.c_str(), "w", stdout);
    std::freopen(log.c_str(), "a", stderr);
    ::execl(prism_run, prism_run, "coordinator", "--world-size", "8", "--ranks", "0,5", "--hang-timeout", "1",
            "--out", out.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  json info;
  for (int i = 0; i < 400 && info.is_null(); ++i) {
    if (fs::exists(out / "coordinator.json")) info = ReadJson((out / "coordinator.json").string());
    else std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_FALSE(info.is_null()) << "no coordinator.json";
  store::StoreClient st;
  ASSERT_TRUE(st.Connect("127.0.0.1", info["store_port"].get<uint16_t>())) << st.error();
  std::string id(128, '\x22');
  ASSERT_TRUE(st.Set("/default_pg/0//cuda//0", id));
  std::string err;
  int fds[2];
  uint32_t comm = 0;
  for (int i = 0; i < 2; ++i) {
    int rank = i == 0 ? 0 : 5;
    fds[i] = ipc::ConnectUnix(info["socket"].get<std::string>(), &err);
    ASSERT_GE(fds[i], 0) << err;
    for (auto [type, j] : {std::pair{ipc::MsgType::kHello, json{{"rank", rank}, {"pid", 1}}},
                           std::pair{ipc::MsgType::kCommInit,
                                     json{{"key", ipc::HexEncode(id)}, {"nranks", 8}, {"rank", rank}}}}) {
      std::string s = j.dump();
      ASSERT_EQ(ipc::SendFrame(fds[i], type, s.data(), s.size(), &err), ipc::IoStatus::kOk) << err;
      ipc::Frame f;
      ASSERT_EQ(ipc::RecvFrame(fds[i], &f, 10000, &err), ipc::IoStatus::kOk) << err;
      if (f.type == ipc::MsgType::kCommInfo) comm = json::parse(f.payload)["comm_id"].get<uint32_t>();
    }
  }
  ASSERT_NE(comm, 0u);
  ipc::OpArrive a = Arr(comm, 0, kAllReduce, 1 << 20);
  ASSERT_EQ(ipc::SendFrame(fds[0], ipc::MsgType::kOpArrive, &a, sizeof(a), &err), ipc::IoStatus::kOk) << err;
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 400 && done == 0; ++i) {  // up to 20 s
    done = ::waitpid(pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (done == 0) {
    ::kill(pid, SIGTERM);
    ::waitpid(pid, &status, 0);
    FAIL() << "the coordinator did not stop on the hang";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 4) << status;
  ::close(fds[0]);
  ::close(fds[1]);
  ASSERT_TRUE(fs::exists(out / "hang.json"));
  json h = ReadJson((out / "hang.json").string());
  ASSERT_EQ(h["never_arrived"].size(), 1u) << h.dump(2);
  EXPECT_EQ(h["never_arrived"][0]["arrived"], json::array({0}));
  EXPECT_EQ(h["never_arrived"][0]["never_arrived"][0]["rank"], 5);
  EXPECT_EQ(h["waiting"][0]["held_up_by"], 5);
  std::ifstream lf(log);
  std::stringstream text;
  text << lf.rdbuf();
  EXPECT_NE(text.str().find("never arrived: rank 5 (no op there)"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("rank 0 waits"), std::string::npos) << text.str();
  fs::remove_all(out);
}

}  // namespace
}  // namespace prism::coord
