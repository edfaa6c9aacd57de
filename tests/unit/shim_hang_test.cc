// libprism's own p2p exchange path through a real coordinator, as torch's lazy 2-rank p2p communicator uses it:
// two forked real ranks (GPU boundary faked, tests/unit/shim_fake_gpu.h) run CommInit with a unique id that went
// through the coordinator's store under torch's p2p key ("/default_pg/0//cuda//1:5": members not known at init,
// the coordinator names them), then send and receive as torch's dist.send/dist.recv do (each call one NCCL group:
// ProcessGroupNCCL::pointToPoint wraps it in ncclGroupStart/End). The fake-shim tests (hang_e2e_test
// `Exchanged*`) speak the protocol without libprism's engine; these go through Submit/GroupEnd/RunExchange, the
// progress thread and the event writer's kOpRecord (docs/hang.md "Exchange waits", docs/payload.md "Exchange").
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <optional>

#include "coordinator/coordinator.h"
#include "coordinator/store/store_client.h"
#include "interpose/core/comm.h"
#include "interpose/core/config.h"
#include "interpose/core/progress.h"
#include "interpose/core/runtime.h"
#include "interpose/core/submit.h"
#include "shim_fake_gpu.h"

namespace prism::interpose {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kWorld = 8;
constexpr uint64_t kCount = 1 << 16;  // floats: 256 KiB per direction
const std::vector<int> kReal = {1, 5};
constexpr const char* kP2pKey = "/default_pg/0//cuda//1:5";  // torch's key of the lazy p2p communicator of 1 and 5

enum class Script {
  kSendThenRecv,       // dist.send then dist.recv: each one ncclGroupStart/ncclSend|ncclRecv/ncclGroupEnd (torch)
  kBareSendThenRecv,   // ncclSend then ncclRecv outside any group
  kGroupSendRecv,      // one group with the send and the receive (Megatron's pipeline exchange)
  // Rank 1: one group with an all-reduce and a send on one stream (one unit); rank 5: the all-reduce, then it reads
  // its result (its host waits until the all-reduce's gate opened), then the receive.
  kGroupAllReduceSend,
};

bool ReadFull(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// One real rank: libprism's engine in this (forked) process. Returns the exit code: 0 when every operation
// completed and the receive holds the peer's bytes.
int RankMain(int rank, const std::string& socket, const std::string& out_dir, const ncclUniqueId& id, Script script,
             bool rendezvous) {
  static testing::FakeGpu gpu;
  Config c;
  c.rank = rank;
  c.world_size = kWorld;
  c.real_ranks = kReal;
  c.fixed_dur_us = 10;
  c.coord_socket = socket;
  c.send_rendezvous = rendezvous;
  c.out_dir = out_dir;  // the event writer sends kOpRecord (completed operations) to the coordinator
  // Why static: the forked rank _exits with the result while the progress thread may still read the runtime.
  static std::optional<ScopedRuntime> rt;
  rt.emplace(Runtime::Parts{.config = c, .gpu = &gpu});
  InitArgs a;
  a.nranks = 2;
  a.rank = rank == kReal[0] ? 0 : 1;
  a.ids = &id;
  Comm* comm = nullptr;
  if (CommInit(a, &comm) != ncclSuccess) return 10;
  if (comm->members != std::vector<int32_t>{1, 5} || comm->member_real != std::vector<uint8_t>{1, 1} ||
      !comm->use_coordinator || comm->coord_comm_id == 0) {
    return 11;
  }
  const int peer = 1 - a.rank;
  std::vector<float> sendbuf(kCount, static_cast<float>(rank)), recvbuf(kCount, -1.0f);
  OpCall snd;
  snd.op = payload::OpKind::kSend;
  snd.comm = comm;
  snd.count = kCount;
  snd.peer = peer;
  snd.send = sendbuf.data();
  OpCall rcv = snd;
  rcv.op = payload::OpKind::kRecv;
  rcv.send = nullptr;
  rcv.recv = recvbuf.data();
  auto grouped = [](const std::vector<OpCall>& ops) {
    if (GroupStart() != ncclSuccess) return false;
    for (const OpCall& o : ops) {
      if (Submit(o) != ncclSuccess) return false;
    }
    return GroupEnd() == ncclSuccess;
  };
  switch (script) {
    case Script::kSendThenRecv:
      if (!grouped({snd}) || !grouped({rcv})) return 12;
      break;
    case Script::kBareSendThenRecv:
      if (Submit(snd) != ncclSuccess || Submit(rcv) != ncclSuccess) return 12;
      break;
    case Script::kGroupSendRecv:
      // Each side posts in its own order (Megatron's send_forward_recv_backward and its mirror).
      if (!(rank == kReal[0] ? grouped({snd, rcv}) : grouped({rcv, snd}))) return 12;
      break;
    case Script::kGroupAllReduceSend: {
      std::vector<float> in(kCount, 1.0f), out(kCount, 0.0f);
      OpCall ar = snd;
      ar.op = payload::OpKind::kAllReduce;
      ar.peer = 0;
      ar.send = in.data();
      ar.recv = out.data();
      if (rank == kReal[0]) {
        if (!grouped({ar, snd})) return 12;
        return ProgressDrain(5000000000ull) ? 0 : 14;
      }
      if (!grouped({ar})) return 12;
      // As torch's .item() on the result: the host waits until the stream passed the all-reduce's gate.
      const bool released = ProgressDrain(3000000000ull);
      if (!grouped({rcv})) return 12;
      if (!released) return 15;
      break;
    }
  }
  const float want = static_cast<float>(kReal[static_cast<size_t>(peer)]);
  for (float v : recvbuf) {
    if (v != want) return 13;
  }
  if (!ProgressDrain(5000000000ull)) return 14;
  usleep(300000);  // the event writer flushes (and sends its kOpRecords) every 200 ms
  return 0;
}

// The two real ranks (forked before any thread of this process exists), the coordinator, the unique id in its store.
class P2pRun {
 public:
  P2pRun(Script script, bool rendezvous, double hang_timeout_s) {
    out_ = fs::path(::testing::TempDir()) / ("shim-hang-" + std::to_string(::getpid()));
    fs::remove_all(out_);
    fs::create_directories(out_);
    std::memcpy(id_.internal, "PRISMRID", 8);
    std::mt19937_64 rng(std::random_device{}());
    for (size_t b = 8; b + 8 <= sizeof(id_.internal); b += 8) {
      const uint64_t x = rng();
      std::memcpy(id_.internal + b, &x, 8);
    }
    for (int rank : kReal) {
      int go[2];
      if (::pipe(go) != 0) return;
      pid_t pid = ::fork();
      if (pid == 0) {
        ::close(go[1]);
        char path[512] = {0};
        uint32_t len = 0;
        if (!ReadFull(go[0], &len, 4) || len >= sizeof(path) || !ReadFull(go[0], path, len)) _exit(1);
        const std::string events = (out_ / ("rank" + std::to_string(rank))).string();
        fs::create_directories(events);
        _exit(RankMain(rank, path, events, id_, script, rendezvous));
      }
      ::close(go[0]);
      pids_.push_back(pid);
      go_.push_back(go[1]);
    }
    coord::CoordinatorOptions o;
    o.world_size = kWorld;
    o.real_ranks = kReal;
    o.passthrough = false;  // both real ranks on one GPU in the GPU suite's case: no real NCCL among them
    o.out_dir = out_.string();
    o.hang_timeout_s = hang_timeout_s;
    o.status_interval_ms = 100;
    o.on_hang = [this](const std::string&) { hang_ = true; };
    coord_ = coord::Coordinator::Start(o, &error_);
    if (!coord_) return;
    // The p2p leader (rank 1, p2p rank 0) SETs its unique id under torch's key; the coordinator learns the id's
    // members from the key (they are unknown to the ranks at CommInit: "members not known yet").
    store::StoreClient st;
    if (!st.Connect(coord_->endpoints().store_host, coord_->endpoints().store_port) ||
        !st.Set(kP2pKey, std::string(id_.internal, sizeof(id_.internal)))) {
      error_ = "store: " + st.error();
      return;
    }
    const std::string& sock = coord_->endpoints().socket_path;
    for (int w : go_) {
      uint32_t len = static_cast<uint32_t>(sock.size());
      if (::write(w, &len, 4) != 4 || ::write(w, sock.data(), len) != static_cast<ssize_t>(len)) error_ = "pipe";
      ::close(w);
    }
    go_.clear();
    ok_ = true;
  }
  ~P2pRun() {
    for (int w : go_) ::close(w);
    KillRanks();
    if (coord_) coord_->Stop();
    fs::remove_all(out_);
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  bool hang() const { return hang_; }
  const fs::path& out() const { return out_; }

  // Waits up to `timeout_s` for both ranks to exit; their exit codes (-1: still running or killed).
  std::vector<int> WaitRanks(double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      bool running = false;
      for (size_t i = 0; i < pids_.size(); ++i) {
        if (pids_[i] <= 0) continue;
        int st = 0;
        pid_t r = ::waitpid(pids_[i], &st, WNOHANG);
        if (r == pids_[i]) {
          codes_[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
          pids_[i] = 0;
        } else {
          running = true;
        }
      }
      if (!running) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return codes_;
  }
  // Waits up to `timeout_s` for the coordinator's hang diagnosis.
  bool WaitHang(double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!hang_ && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return hang_;
  }
  void KillRanks() {
    for (pid_t& p : pids_) {
      if (p <= 0) continue;
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
      p = 0;
    }
  }

 private:
  fs::path out_;
  ncclUniqueId id_{};
  std::vector<pid_t> pids_;
  std::vector<int> go_;
  std::vector<int> codes_ = std::vector<int>(kReal.size(), -1);
  std::unique_ptr<coord::Coordinator> coord_;
  std::atomic<bool> hang_{false};
  std::string error_;
  bool ok_ = false;
};

json ReadJson(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in, nullptr, false);
}

// Both real ranks send to each other first (hang_suite.sh `hang_p2p`, PRISM_SEND_RENDEZVOUS=1): each send waits
// for its receive, which neither posts. The coordinator must see both waiting in their exchanged sends and report
// the cycle 1 -> 5 -> 1 within --hang-timeout. Before the fix a send inside a group (torch's dist.send) was
// released by the progress thread while its host thread still waited for the acknowledgement in GroupEnd: the
// completed send's kOpRecord took the wait off the hang detector and nothing was ever diagnosed.
void ExpectCycle(Script script) {
  P2pRun run(script, /*rendezvous=*/true, /*hang_timeout_s=*/1.0);
  ASSERT_TRUE(run.ok()) << run.error();
  const bool hang = run.WaitHang(10.0);
  std::vector<int> codes = run.WaitRanks(0.0);
  run.KillRanks();
  ASSERT_TRUE(hang) << "no hang diagnosed within 10 s (--hang-timeout 1); rank exit codes " << codes[0] << ","
                    << codes[1] << " (-1: still running)";
  json h = ReadJson(run.out() / "hang.json");
  ASSERT_TRUE(h.is_object()) << "hang.json";
  bool cycle = false;
  for (const json& c : h["cycles"]) {
    std::set<int> s;
    for (const json& r : c) s.insert(r.get<int>());
    cycle = cycle || s == std::set<int>{1, 5};
  }
  EXPECT_TRUE(cycle) << h.dump(2);
  // The communicator is named as the pair it is, not as the group whose key its id went under.
  EXPECT_NE(h["text"].get<std::string>().find("p2p 1:5) seq 0"), std::string::npos) << h["text"];
  ASSERT_EQ(h["waiting"].size(), 2u) << h.dump(2);
  for (const json& w : h["waiting"]) {
    EXPECT_EQ(w["op"]["op"], "send") << w.dump();
    EXPECT_EQ(w["op"]["seq"], 0) << w.dump();
  }
}

TEST(ShimHang, TorchSendsFirstOnALazyP2pCommIsACycle) { ExpectCycle(Script::kSendThenRecv); }

TEST(ShimHang, BareSendsFirstIsACycle) { ExpectCycle(Script::kBareSendThenRecv); }

// Without the rendezvous (the default) the same job completes: sends complete when posted, each receive gets the
// peer's bytes, and no hang is reported.
TEST(ShimHang, WithoutRendezvousSendsFirstCompletes) {
  P2pRun run(Script::kSendThenRecv, /*rendezvous=*/false, /*hang_timeout_s=*/1.0);
  ASSERT_TRUE(run.ok()) << run.error();
  std::vector<int> codes = run.WaitRanks(20.0);
  EXPECT_EQ(codes, (std::vector<int>{0, 0})) << "10 init, 11 members, 12 an operation failed, 13 wrong bytes, "
                                                "14 not drained, -1 still running";
  EXPECT_FALSE(run.hang());
  EXPECT_FALSE(fs::exists(run.out() / "hang.json"));
}

// Megatron's pipeline exchange: one group with the send and the receive on each side, default settings and with the
// rendezvous. It completes with the peer's bytes (the group's sends wait only after every unit was posted).
TEST(ShimHang, GroupedSendRecvCompletes) {
  for (bool rendezvous : {false, true}) {
    SCOPED_TRACE(rendezvous ? "PRISM_SEND_RENDEZVOUS=1" : "default");
    P2pRun run(Script::kGroupSendRecv, rendezvous, /*hang_timeout_s=*/1.0);
    ASSERT_TRUE(run.ok()) << run.error();
    std::vector<int> codes = run.WaitRanks(20.0);
    EXPECT_EQ(codes, (std::vector<int>{0, 0})) << "10 init, 11 members, 12 an operation failed, 13 wrong bytes, "
                                                  "14 not drained, -1 still running";
    EXPECT_FALSE(run.hang());
  }
}

// Under the rendezvous a unit with an exchanged send is held until GroupEnd got its acknowledgement; a collective in
// that unit must still reach the coordinator at once: its other members' gates open only with this rank's kOpArrive,
// and here the receive that acknowledges the send comes only after rank 5 read the all-reduce's result (NCCL
// completes the all-reduce without the send).
TEST(ShimHang, GroupedAllReduceAndSendDoesNotHoldTheAllReduce) {
  for (bool rendezvous : {false, true}) {
    SCOPED_TRACE(rendezvous ? "PRISM_SEND_RENDEZVOUS=1" : "default");
    P2pRun run(Script::kGroupAllReduceSend, rendezvous, /*hang_timeout_s=*/30.0);
    ASSERT_TRUE(run.ok()) << run.error();
    std::vector<int> codes = run.WaitRanks(20.0);
    EXPECT_EQ(codes, (std::vector<int>{0, 0})) << "10 init, 11 members, 12 an operation failed, 13 wrong bytes, "
                                                  "14 not drained, 15 the all-reduce was not released, -1 still running";
  }
}

}  // namespace
}  // namespace prism::interpose
