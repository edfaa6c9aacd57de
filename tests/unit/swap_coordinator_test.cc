// Context switching inside the coordinator (coordinator.h CoordinatorOptions::swap, swap_driver): two real ranks on
// a GPU with room for one, driven over the real event bus by two fake shims, with a test driver whose checkpoint
// blocks until the test lets it finish. Checks the order of events (rank 1 may start only once rank 0, blocked in an
// exchange, is out; rank 0 comes back once rank 1 left) and that the event loop keeps serving while a checkpoint
// call runs (a hello is answered meanwhile).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/ipc_io.h"
#include "coordinator/coordinator.h"
#include "nccl_patch/semantics.h"

namespace prism::coord {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kF = 1ull << 30;

// Records calls; SwapOut waits until Release().
class GateDriver : public SwapDriver {
 public:
  SwapResult SwapOut(int pid, int) override {
    std::unique_lock<std::mutex> lock(mu_);
    calls_.push_back("out " + std::to_string(pid));
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
    return {true, 0.25, ""};
  }
  SwapResult SwapIn(int pid) override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back("in " + std::to_string(pid));
    cv_.notify_all();
    return {true, 0.1, ""};
  }
  uint64_t DeviceMemory(int) override { return 0; }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  bool WaitCalls(size_t n, int ms) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return calls_.size() >= n; });
  }
  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
  std::vector<std::string> calls_;
};

struct Shim {
  int fd = -1;
  ~Shim() {
    if (fd >= 0) ::close(fd);
  }
  void Connect(const std::string& path) {
    std::string err;
    fd = ipc::ConnectUnix(path, &err);
    ASSERT_GE(fd, 0) << err;
  }
  void SendJson(ipc::MsgType t, const json& j) {
    std::string s = j.dump(), err;
    ASSERT_EQ(ipc::SendFrame(fd, t, s.data(), s.size(), &err), ipc::IoStatus::kOk) << err;
  }
  template <typename T>
  void SendPod(ipc::MsgType t, const T& pod) {
    std::string err;
    ASSERT_EQ(ipc::SendFrame(fd, t, &pod, sizeof(pod), &err), ipc::IoStatus::kOk) << err;
  }
  // The next frame of type `want` within ms (others are skipped); false on timeout.
  bool Recv(ipc::MsgType want, ipc::Frame* f, int ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
      if (left <= 0) return false;
      std::string err;
      if (ipc::RecvFrame(fd, f, left, &err) != ipc::IoStatus::kOk) return false;
      if (f->type == want) return true;
    }
  }
  void Hello(int rank, int pid, json* ack = nullptr, const std::string& host = "h") {
    SendJson(ipc::MsgType::kHello, {{"rank", rank}, {"world_size", 2}, {"pid", pid}, {"host", host}, {"gpu", 0},
                                    {"gpu_id", "h/0"}});
    ipc::Frame f;
    ASSERT_TRUE(Recv(ipc::MsgType::kHelloAck, &f, 2000)) << "no hello ack for rank " << rank;
    if (ack) *ack = json::parse(f.payload);
    ipc::MemorySample m{};
    m.current_bytes = m.peak_bytes = kF;
    SendPod(ipc::MsgType::kMemory, m);
  }
  uint32_t CommInit(int rank) {
    SendJson(ipc::MsgType::kCommInit, {{"key", ""}, {"nranks", 2}, {"rank", rank}, {"desc", "world"}});
    ipc::Frame f;
    EXPECT_TRUE(Recv(ipc::MsgType::kCommInfo, &f, 2000));
    return json::parse(f.payload).value("comm_id", 0u);
  }
  void AllReduce(uint32_t comm, int rank, int32_t value) {
    ipc::ExchangeHeader h{};
    h.comm_id = comm;
    h.op = static_cast<uint16_t>(payload::OpKind::kAllReduce);
    h.dtype = static_cast<uint8_t>(payload::DataType::kInt32);
    h.rank = rank;
    h.peer = -1;
    h.count = 1;
    h.total_bytes = 4;
    std::string frame(reinterpret_cast<const char*>(&h), sizeof(h));
    frame.append(reinterpret_cast<const char*>(&value), 4);
    std::string err;
    ASSERT_EQ(ipc::SendFrame(fd, ipc::MsgType::kOpData, frame.data(), frame.size(), &err), ipc::IoStatus::kOk);
  }
};

bool WaitFor(const std::function<bool()>& pred, int ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// Two real ranks on one GPU "h/0" with context switching on, as every test here starts: the GPU's cap and the host
// budget differ per test (context_bytes 0: footprints are the tracked bytes).
CoordinatorOptions TwoRanksOneGpu(const fs::path& out, uint64_t cap, uint64_t host) {
  CoordinatorOptions o;
  o.world_size = 2;
  o.real_ranks = {0, 1};
  o.out_dir = out.string();
  o.status_interval_ms = 50;
  o.hang_timeout_s = 0;
  o.swap.enabled = true;
  o.swap.gpu_cap_bytes = cap;
  o.swap.host_cap_bytes = host;
  o.swap.context_bytes = 0;
  o.swap.rank_gpu = {{0, "h/0"}, {1, "h/0"}};
  return o;
}

TEST(SwapCoordinator, SwapsABlockedRankOutForOneNotStartedAndKeepsServingMeanwhile) {
  fs::path out = fs::temp_directory_path() / ("prism-swapcoord-" + std::to_string(getpid()));
  fs::remove_all(out);
  auto driver = std::make_shared<GateDriver>();
  CoordinatorOptions o = TwoRanksOneGpu(out, kF, 4 * kF);
  o.swap_driver = driver;
  std::vector<std::string> printed;
  std::mutex print_mu;
  o.swap_print = [&](const std::string& s) {
    std::lock_guard<std::mutex> lock(print_mu);
    printed.push_back(s);
  };
  std::string error;
  auto coord = Coordinator::Start(o, &error);
  ASSERT_TRUE(coord) << error;
  const std::string sock = coord->endpoints().socket_path;

  ASSERT_TRUE(WaitFor([&] { return coord->SwapAdmitted(0); }, 2000)) << "rank 0 never admitted";
  EXPECT_FALSE(coord->SwapAdmitted(1)) << "no room for rank 1 beside rank 0";
  Shim s0;
  s0.Connect(sock);
  s0.Hello(0, 4242);
  uint32_t comm = s0.CommInit(0);
  ASSERT_NE(comm, 0u);
  s0.AllReduce(comm, 0, 5);  // rank 0 blocks: rank 1 has not started

  ASSERT_TRUE(driver->WaitCalls(1, 3000)) << "rank 0 was not swapped out";
  EXPECT_EQ(driver->calls()[0], "out 4242");
  // The checkpoint call is running (the driver holds it): the event loop still answers, and rank 1 may not start
  // before rank 0's memory has left the GPU.
  Shim early;
  early.Connect(sock);
  early.SendJson(ipc::MsgType::kHello, {{"rank", 7}, {"world_size", 2}, {"pid", 1}});
  ipc::Frame f;
  EXPECT_TRUE(early.Recv(ipc::MsgType::kError, &f, 1000)) << "the event loop did not answer during a checkpoint";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(coord->SwapAdmitted(1));
  driver->Release();
  ASSERT_TRUE(WaitFor([&] { return coord->SwapAdmitted(1); }, 3000)) << "rank 1 never admitted";

  Shim s1;
  s1.Connect(sock);
  s1.Hello(1, 4343);
  ASSERT_EQ(s1.CommInit(1), comm);
  s1.AllReduce(comm, 1, 7);
  ASSERT_TRUE(s1.Recv(ipc::MsgType::kOpResult, &f, 2000));
  int32_t sum = 0;
  std::memcpy(&sum, f.payload.data() + sizeof(ipc::ExchangeHeader), 4);
  EXPECT_EQ(sum, 12);
  // Rank 0's answer is waiting in its socket; it comes back on the GPU once rank 1 leaves it.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(driver->calls().size(), 1u) << "rank 1 still runs on the GPU: rank 0 stays out";
  s1.SendJson(ipc::MsgType::kBye, {{"reason", "done"}});
  ASSERT_TRUE(driver->WaitCalls(2, 3000)) << "rank 0 was not swapped back in";
  EXPECT_EQ(driver->calls()[1], "in 4242");
  ASSERT_TRUE(s0.Recv(ipc::MsgType::kOpResult, &f, 2000));
  std::memcpy(&sum, f.payload.data() + sizeof(ipc::ExchangeHeader), 4);
  EXPECT_EQ(sum, 12);

  // The driver returned; the worker thread files the result right after.
  ASSERT_TRUE(WaitFor([&] { return coord->SwapSummary().swaps_in == 1; }, 2000));
  SwapStats st = coord->SwapSummary();
  EXPECT_EQ(st.swaps_out, 1u);
  EXPECT_EQ(st.swaps_in, 1u);
  EXPECT_EQ(st.bytes_out, kF);
  EXPECT_DOUBLE_EQ(st.seconds_out, 0.25);
  EXPECT_EQ(st.peak_gpu_bytes, kF);
  json status = json::parse(coord->StatusJson());
  EXPECT_EQ(status["swap"]["swaps_out"], 1);
  EXPECT_EQ(status["ranks"][0]["swap"], "resident");
  EXPECT_EQ(status["ranks"][1]["swap"], "done");
  {
    std::lock_guard<std::mutex> lock(print_mu);
    ASSERT_FALSE(printed.empty());
    EXPECT_NE(printed[0].find("prism: swap: on; GPU cap 1.0 GiB (--gpu-mem-cap)"), std::string::npos) << printed[0];
  }
  coord->Stop();
  fs::remove_all(out);
}

// Allocation admission (ipc.h kMemRoom): both ranks fit as they started, then rank 1's allocation fails while rank 0
// is blocked in an exchange waiting for it; rank 0 is swapped out and rank 1 is told to retry. A second request, with
// rank 1 alone on the GPU, is refused at once.
TEST(SwapCoordinator, ARankWhoseAllocationFailedGetsRoomFromABlockedRank) {
  fs::path out = fs::temp_directory_path() / ("prism-swaproom-" + std::to_string(getpid()));
  fs::remove_all(out);
  auto driver = std::make_shared<GateDriver>();
  CoordinatorOptions o = TwoRanksOneGpu(out, 2 * kF, 4 * kF);
  o.swap_driver = driver;
  std::vector<std::string> printed;
  std::mutex print_mu;
  o.swap_print = [&](const std::string& s) {
    std::lock_guard<std::mutex> lock(print_mu);
    printed.push_back(s);
  };
  std::string error;
  auto coord = Coordinator::Start(o, &error);
  ASSERT_TRUE(coord) << error;
  const std::string sock = coord->endpoints().socket_path;

  ASSERT_TRUE(WaitFor([&] { return coord->SwapAdmitted(0); }, 2000));
  Shim s0;
  s0.Connect(sock);
  json ack;
  s0.Hello(0, 4242, &ack);
  EXPECT_EQ(ack.value("swap", false), true) << "the rank must learn that it may ask for room";
  ASSERT_TRUE(WaitFor([&] { return coord->SwapAdmitted(1); }, 2000)) << "2F of 2F: both fit";
  Shim s1;
  s1.Connect(sock);
  s1.Hello(1, 4343);
  uint32_t comm = s0.CommInit(0);
  ASSERT_EQ(s1.CommInit(1), comm);
  s0.AllReduce(comm, 0, 5);  // rank 0 blocks: it waits for rank 1
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(driver->calls().empty()) << "everything fits: no swap";

  s1.SendJson(ipc::MsgType::kMemRoom, {{"id", 5}, {"bytes", kF}, {"current", kF}, {"peak", kF}});
  ASSERT_TRUE(driver->WaitCalls(1, 3000)) << "rank 0 was not swapped out for rank 1's allocation";
  EXPECT_EQ(driver->calls()[0], "out 4242");
  ipc::Frame f;
  // No answer while the checkpoint runs: the room is not there yet.
  EXPECT_FALSE(s1.Recv(ipc::MsgType::kMemRoomAnswer, &f, 300));
  driver->Release();
  ASSERT_TRUE(s1.Recv(ipc::MsgType::kMemRoomAnswer, &f, 3000)) << "no answer to the room request";
  json a = json::parse(f.payload);
  EXPECT_EQ(a.value("id", 0), 5);
  EXPECT_EQ(a.value("ok", false), true) << a.dump();

  // Alone on the GPU now: nothing can be freed, no at once.
  s1.SendJson(ipc::MsgType::kMemRoom, {{"id", 6}, {"bytes", kF}, {"current", 2 * kF}, {"peak", 2 * kF}});
  ASSERT_TRUE(s1.Recv(ipc::MsgType::kMemRoomAnswer, &f, 3000));
  a = json::parse(f.payload);
  EXPECT_EQ(a.value("id", 0), 6);
  EXPECT_EQ(a.value("ok", true), false);
  EXPECT_NE(a.value("why", std::string()).find("alone"), std::string::npos) << a.dump();
  ASSERT_TRUE(WaitFor([&] { return coord->SwapSummary().rooms_refused == 1; }, 2000));
  SwapStats st = coord->SwapSummary();
  EXPECT_EQ(st.rooms_granted, 1u);
  EXPECT_EQ(st.swaps_out, 1u);
  json status = json::parse(coord->StatusJson());
  EXPECT_EQ(status["swap"]["rooms_granted"], 1);
  {
    std::lock_guard<std::mutex> lock(print_mu);
    bool said = false;
    for (const std::string& p : printed) {
      said = said || p.find("rank 1's allocation of 1.0 GiB gets no room") != std::string::npos;
    }
    EXPECT_TRUE(said) << "the refusal is printed";
  }
  coord->Stop();
  fs::remove_all(out);
}

// The room-waiter deadlock of the GPU case swap_big (s19c): every rank on the GPU waits for room, none is blocked in an
// exchange. A rank whose request says idle (libprism synchronised its device) is swapped out for the oldest request,
// and is restored and answered yes once it fits; its request is not refused meanwhile.
TEST(SwapCoordinator, WhenEveryRankWaitsForRoomOneThatSaidIdleIsSwappedOutAndGrantedWhenBack) {
  fs::path out = fs::temp_directory_path() / ("prism-swapidle-" + std::to_string(getpid()));
  fs::remove_all(out);
  auto driver = std::make_shared<GateDriver>();
  CoordinatorOptions o = TwoRanksOneGpu(out, 4 * kF, 8 * kF);
  o.swap_driver = driver;
  o.swap_print = [](const std::string&) {};
  std::string error;
  auto coord = Coordinator::Start(o, &error);
  ASSERT_TRUE(coord) << error;
  const std::string sock = coord->endpoints().socket_path;
  ASSERT_TRUE(WaitFor([&] { return coord->SwapAdmitted(0); }, 2000));
  Shim s0;
  s0.Connect(sock);
  s0.Hello(0, 4242);
  ASSERT_TRUE(WaitFor([&] { return coord->SwapAdmitted(1); }, 2000));
  Shim s1;
  s1.Connect(sock);
  s1.Hello(1, 4343);

  // Rank 0 asks first (without idle: an older libprism), then rank 1 with idle; each grows to 2F: 4F of 4F.
  s0.SendJson(ipc::MsgType::kMemRoom, {{"id", 1}, {"bytes", kF}, {"current", kF}, {"peak", kF}});
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  s1.SendJson(ipc::MsgType::kMemRoom, {{"id", 2}, {"bytes", kF}, {"current", kF}, {"peak", kF}, {"idle", true}});
  ASSERT_TRUE(driver->WaitCalls(1, 3000)) << "nobody was swapped out for rank 0's allocation";
  EXPECT_EQ(driver->calls()[0], "out 4343");
  driver->Release();
  ipc::Frame f;
  ASSERT_TRUE(s0.Recv(ipc::MsgType::kMemRoomAnswer, &f, 3000));
  json a = json::parse(f.payload);
  EXPECT_EQ(a.value("id", 0), 1);
  EXPECT_EQ(a.value("ok", false), true) << a.dump();
  // Rank 1 is restored (2F + 2F fit the cap) and only then answered.
  ASSERT_TRUE(driver->WaitCalls(2, 3000)) << "rank 1 was not restored";
  EXPECT_EQ(driver->calls()[1], "in 4343");
  ASSERT_TRUE(s1.Recv(ipc::MsgType::kMemRoomAnswer, &f, 3000));
  a = json::parse(f.payload);
  EXPECT_EQ(a.value("id", 0), 2);
  EXPECT_EQ(a.value("ok", false), true) << a.dump();
  EXPECT_NE(a.value("why", std::string()).find("restored"), std::string::npos) << a.dump();
  ASSERT_TRUE(WaitFor([&] { return coord->SwapSummary().rooms_granted == 2; }, 2000));
  SwapStats st = coord->SwapSummary();
  EXPECT_EQ(st.rooms_refused, 0u);
  EXPECT_EQ(st.room_swaps_out, 1u);
  json status = json::parse(coord->StatusJson());
  EXPECT_EQ(status["swap"]["room_swaps_out"], 1);
  coord->Stop();
  fs::remove_all(out);
}

// Footprints from each rank's process's GPU memory (CoordinatorOptions::swap_usage, as NVML would answer): two ranks
// of 1 GiB tracked on a cap of 2.6 GiB. Counted as tracked + the assumed 512 MiB context (1.5 GiB each) only one
// fits; measured at 1.2 GiB each both do. The source is in the banner and in status.json.
TEST(SwapCoordinator, FootprintsComeFromTheMeasuredGpuMemoryOfEachRanksProcess) {
  constexpr uint64_t kMiB = 1ull << 20;
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  for (bool measure : {false, true}) {
    SCOPED_TRACE(measure ? "measured" : "assumed");
    fs::path out = fs::temp_directory_path() / ("prism-swapusage-" + std::to_string(getpid()));
    fs::remove_all(out);
    CoordinatorOptions o = TwoRanksOneGpu(out, 2 * kF + 600 * kMiB, 0);
    o.swap.context_bytes = 512 * kMiB;
    o.swap.usage_library = "";  // never the machine's NVML in a test
    o.swap.usage_interval_s = 0.05;
    std::atomic<int> asked{0};
    if (measure) {
      o.swap_usage = [&](std::map<int, uint64_t>* by_pid, std::string*) {
        ++asked;
        *by_pid = {{4242, kF + 200 * kMiB}, {4343, kF + 200 * kMiB}, {1, 7 * kF}};
        return true;
      };
    }
    o.swap_driver = std::make_shared<GateDriver>();
    std::vector<std::string> printed;
    std::mutex print_mu;
    o.swap_print = [&](const std::string& line) {
      std::lock_guard<std::mutex> lock(print_mu);
      printed.push_back(line);
    };
    std::string error;
    auto coord = Coordinator::Start(o, &error);
    ASSERT_TRUE(coord) << error;
    ASSERT_TRUE(WaitFor([&] { return coord->SwapAdmitted(0); }, 2000)) << "rank 0 never admitted";
    Shim s0;
    s0.Connect(coord->endpoints().socket_path);
    s0.Hello(0, 4242, nullptr, host);
    if (measure) {
      ASSERT_TRUE(WaitFor([&] { return coord->SwapAdmitted(1); }, 3000)) << "rank 1 never admitted";
      EXPECT_GT(asked.load(), 0);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      EXPECT_FALSE(coord->SwapAdmitted(1)) << "1.5 GiB + 1.5 GiB > 2.6 GiB";
    }
    json status = json::parse(coord->StatusJson());
    EXPECT_EQ(status["swap"]["footprints_measured"], measure ? 1 : 0);
    EXPECT_EQ(status["swap"]["footprint_source"], measure ? "measured per process (the caller's source)"
                                                          : "tracked peak + 512.0 MiB context (measuring is off)");
    {
      std::lock_guard<std::mutex> lock(print_mu);
      ASSERT_FALSE(printed.empty());
      EXPECT_NE(printed[0].find(measure ? "; footprints: measured per process"
                                        : "; footprints: tracked peak + 512.0 MiB context"),
                std::string::npos)
          << printed[0];
    }
    coord->Stop();
    fs::remove_all(out);
  }
}

}  // namespace
}  // namespace prism::coord
