// libprism's side of allocation admission under context switching (core/memory.h WaitForRoom / RetryWithRoom, ipc.h
// kMemRoom) against a scripted coordinator on a Unix socket: a failed allocation asks for room only when the
// coordinator's kHelloAck said "swap": true, retries once per room granted, asks at most kMaxRoomAsks times for one
// allocation, and after a refusal fails at once (torch's caching allocator frees its cache and calls again: that
// call must not wait a second time, nor loop). Before asking it synchronises the device through the real driver
// (cuCtxSynchronize, faked here) and says idle in the request when that succeeded.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/ipc_io.h"
#include "interpose/core/config.h"
#include "interpose/core/coord_client.h"
#include "interpose/core/memory.h"
#include "interpose/core/real_symbols.h"
#include "interpose/core/runtime.h"

namespace prism::interpose {
namespace {

using nlohmann::json;

int ListenUnix(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  unlink(path.c_str());
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 1) != 0) return -1;
  return fd;
}

// A coordinator that acknowledges the hello (with "swap" as told) and answers each kMemRoom with the next of
// `answers` (yes when they run out), recording the requests.
class ScriptedCoordinator {
 public:
  ScriptedCoordinator(bool swap, std::deque<bool> answers) : swap_(swap), answers_(std::move(answers)) {
    path_ = "/tmp/prism_swaproom_" + std::to_string(getpid()) + ".sock";
    lfd_ = ListenUnix(path_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~ScriptedCoordinator() {
    client_.reset();  // closes the client's end: Serve's read fails
    if (lfd_ >= 0) ::shutdown(lfd_, SHUT_RDWR);  // and its next accept
    thread_.join();
    if (lfd_ >= 0) close(lfd_);
    unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }
  bool listening() const { return lfd_ >= 0; }
  std::vector<json> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  // The client: libprism's runtime of the rank that connects here (Connect).
  std::optional<ScopedRuntime> client_;

 private:
  // Serves one client after the other (a test may start a fresh runtime: a new connection).
  void Serve() {
    for (;;) {
      int fd = accept(lfd_, nullptr, nullptr);
      if (fd < 0) return;
      ServeOne(fd);
    }
  }

  void ServeOne(int fd) {
    std::string err;
    for (;;) {
      ipc::Frame f;
      if (ipc::RecvFrame(fd, &f, 20000, &err) != ipc::IoStatus::kOk) break;
      if (f.type == ipc::MsgType::kHello) {
        json ack = {{"run_id", "t"}};
        if (swap_) ack["swap"] = true;
        std::string s = ack.dump();
        ipc::SendFrame(fd, ipc::MsgType::kHelloAck, s.data(), s.size(), &err);
      } else if (f.type == ipc::MsgType::kMemRoom) {
        json j = json::parse(f.payload);
        bool ok = true;
        {
          std::lock_guard<std::mutex> lock(mu_);
          requests_.push_back(j);
          if (!answers_.empty()) {
            ok = answers_.front();
            answers_.pop_front();
          }
        }
        std::string s = json{{"id", j.at("id")}, {"ok", ok}, {"why", ok ? "1 rank swapped out" : "nothing"}}.dump();
        ipc::SendFrame(fd, ipc::MsgType::kMemRoomAnswer, s.data(), s.size(), &err);
      }
    }
    close(fd);
  }

  bool swap_;
  std::deque<bool> answers_;
  std::string path_;
  int lfd_ = -1;
  std::mutex mu_;
  std::vector<json> requests_;
  std::thread thread_;
};

// Connects libprism's client (a fresh runtime, with `driver` as its driver table when given) to `coord`; true once
// the hello was acknowledged (and, when `swap`, understood).
bool Connect(ScriptedCoordinator& coord, bool swap, const DriverFns* driver = nullptr) {
  Config c;
  c.rank = 3;
  c.world_size = 4;
  c.coord_socket = coord.path();
  coord.client_.reset();
  coord.client_.emplace(Runtime::Parts{.config = c, .driver = driver});
  if (!CoordConnect()) return false;
  if (!swap) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return true;
  }
  for (int i = 0; i < 400 && !CoordSwapOn(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return CoordSwapOn();
}

constexpr int kOom = 2;  // stands for cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY
constexpr int kOk = 0;

TEST(SwapRoom, AFailedAllocationIsRetriedOncePerRoomGranted) {
  ScriptedCoordinator coord(true, {true, true});
  ASSERT_TRUE(coord.listening());
  ASSERT_TRUE(Connect(coord, true));
  int tries = 0;
  // The allocation still fails after the first room (fragmentation, another process): asked again, then it fits.
  int e = memory::RetryWithRoom(96ull << 20, kOom, [&] { return ++tries < 2 ? kOom : kOk; });
  EXPECT_EQ(e, kOk);
  EXPECT_EQ(tries, 2);
  auto reqs = coord.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].at("bytes").get<uint64_t>(), 96ull << 20);
  EXPECT_TRUE(reqs[0].contains("current"));
  EXPECT_NE(reqs[0].at("id"), reqs[1].at("id"));
}

TEST(SwapRoom, AskedAtMostKMaxRoomAsksTimesForOneAllocation) {
  ScriptedCoordinator coord(true, {});
  ASSERT_TRUE(Connect(coord, true));
  int tries = 0;
  int e = memory::RetryWithRoom(1ull << 30, kOom, [&] {
    ++tries;
    return kOom;
  });
  EXPECT_EQ(e, kOom);
  EXPECT_EQ(tries, memory::kMaxRoomAsks);
  EXPECT_EQ(coord.requests().size(), static_cast<size_t>(memory::kMaxRoomAsks));
  EXPECT_FALSE(memory::WaitForRoom(1, memory::kMaxRoomAsks));
  EXPECT_EQ(coord.requests().size(), static_cast<size_t>(memory::kMaxRoomAsks)) << "no ask beyond the limit";
}

TEST(SwapRoom, ARefusalFailsTheAllocationAndTheCacheFreeingRetryAtOnce) {
  ScriptedCoordinator coord(true, {false});
  ASSERT_TRUE(Connect(coord, true));
  int tries = 0;
  auto again = [&] {
    ++tries;
    return kOk;
  };
  EXPECT_EQ(memory::RetryWithRoom(1ull << 30, kOom, again), kOom);
  EXPECT_EQ(tries, 0) << "refused: not retried";
  // torch frees its cache and allocates again; that fails too: no second wait within kRoomQuietS.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(memory::RetryWithRoom(1ull << 30, kOom, again), kOom);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(coord.requests().size(), 1u);
  // A rank that was never refused (a fresh runtime: as after the quiet period) asks again.
  ASSERT_TRUE(Connect(coord, true));
  EXPECT_EQ(memory::RetryWithRoom(1ull << 30, kOom, again), kOk) << "after the quiet period it asks again";
  EXPECT_EQ(coord.requests().size(), 2u);
}

std::atomic<int> g_syncs{0};
CUresult CUDAAPI FakeSyncOk() {
  ++g_syncs;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI FakeSyncFails() {
  ++g_syncs;
  return CUDA_ERROR_LAUNCH_FAILED;
}

// The room-waiter deadlock of the GPU case swap_big (s19c): every rank waited for room and none could be swapped out.
// A rank whose device is idle may be swapped out while it waits, so libprism synchronises it and says so.
TEST(SwapRoom, TheDeviceIsSynchronisedBeforeAskingAndTheRequestSaysIdle) {
  DriverFns fake;
  fake.loaded = true;
  fake.cuCtxSynchronize = &FakeSyncOk;
  ScriptedCoordinator coord(true, {true, true, true});
  ASSERT_TRUE(Connect(coord, true, &fake));
  g_syncs = 0;
  int tries = 0;
  auto once = [&] { return ++tries == 1 ? kOk : kOom; };
  EXPECT_EQ(memory::RetryWithRoom(128ull << 20, kOom, once), kOk);
  EXPECT_EQ(g_syncs.load(), 1) << "synchronised once, before asking";
  // A synchronisation that fails (a sticky error) asks all the same, without idle; so does a driver without it.
  fake.cuCtxSynchronize = &FakeSyncFails;
  tries = 0;
  EXPECT_EQ(memory::RetryWithRoom(128ull << 20, kOom, once), kOk);
  EXPECT_EQ(g_syncs.load(), 2);
  fake.cuCtxSynchronize = nullptr;
  tries = 0;
  EXPECT_EQ(memory::RetryWithRoom(128ull << 20, kOom, once), kOk);
  auto reqs = coord.requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].value("idle", false), true) << reqs[0].dump();
  EXPECT_EQ(reqs[1].value("idle", true), false) << reqs[1].dump();
  EXPECT_EQ(reqs[2].value("idle", true), false) << reqs[2].dump();
}

TEST(SwapRoom, WithoutSwapNothingIsAsked) {
  ScriptedCoordinator coord(false, {});
  ASSERT_TRUE(Connect(coord, false));
  EXPECT_TRUE(CoordActive());
  EXPECT_FALSE(CoordSwapOn());
  int tries = 0;
  EXPECT_EQ(memory::RetryWithRoom(1ull << 30, kOom, [&] {
              ++tries;
              return kOk;
            }),
            kOom);
  EXPECT_EQ(tries, 0);
  EXPECT_TRUE(coord.requests().empty());
}

}  // namespace
}  // namespace prism::interpose
