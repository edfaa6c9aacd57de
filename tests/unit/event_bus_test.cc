// The event bus's per-client caps (include/prism/limits.h, docs/coordinator.md "The event bus"): a frame over the
// size cap, and requests whose replies a client does not read, each cost that client its connection, logged by
// name, while the bus goes on serving the others.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/ipc_io.h"
#include "coordinator/bus/event_bus.h"

namespace prism::coord {
namespace {

namespace fs = std::filesystem;

// A bus on its own thread whose handler answers every kHello with `reply_bytes` bytes (an amplifying request).
class EventBusCaps : public ::testing::Test {
 protected:
  void Start(const BusLimits& limits, size_t reply_bytes) {
    reply_ = std::string(reply_bytes, 'r');
    bus_ = std::make_unique<EventBus>(
        [this](BusId id, BusClient&, const ipc::FrameView& f) {
          if (f.type == ipc::MsgType::kHello) bus_->Send(id, ipc::MsgType::kHelloAck, reply_);
        },
        [this](BusId, BusClient& c) {
          std::lock_guard<std::mutex> lock(mu_);
          dropped_.push_back(c.drop_reason);
          return false;
        });
    bus_->set_limits(limits);
    dir_ = fs::path(::testing::TempDir()) / ("prism_bus_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::string tcp, error;
    ASSERT_TRUE(bus_->Listen(dir_.string(), "", 20, 1, &socket_, &tcp, &error)) << error;
    thread_ = std::thread([this] {
      epoll_event events[16];
      while (!stop_) {
        int n = bus_->Wait(events, 16, 20);
        for (int i = 0; i < n; ++i) bus_->Handle(events[i]);
        bus_->FlushAndDrop();
      }
    });
  }
  void TearDown() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    bus_.reset();
    fs::remove_all(dir_);
  }
  int Connect() {
    std::string error;
    int fd = ipc::ConnectUnix(socket_, &error);
    EXPECT_GE(fd, 0) << error;
    return fd;
  }
  // The reasons the bus dropped clients for, once `n` were dropped (empty after 5 s without).
  std::vector<std::string> DroppedSoon(size_t n) {
    for (int i = 0; i < 250; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (dropped_.size() >= n) return dropped_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return {};
  }
  // Whether a client that reads is still served: a hello answered with the whole reply.
  void ExpectServed() {
    int fd = Connect();
    std::string error;
    ASSERT_EQ(ipc::SendFrame(fd, ipc::MsgType::kHello, "{}", 2, &error), ipc::IoStatus::kOk) << error;
    ipc::Frame f;
    ASSERT_EQ(ipc::RecvFrame(fd, &f, 5000, &error), ipc::IoStatus::kOk) << error;
    EXPECT_EQ(f.type, ipc::MsgType::kHelloAck);
    EXPECT_EQ(f.payload.size(), reply_.size());
    ::close(fd);
  }

  std::unique_ptr<EventBus> bus_;
  std::string reply_, socket_;
  fs::path dir_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> dropped_;
};

TEST_F(EventBusCaps, AFrameOverTheCapDropsItsClientBeforeItsBytes) {
  BusLimits limits;
  limits.max_frame_bytes = 1 << 16;
  Start(limits, 100);
  int bad = Connect();
  ipc::FrameHeader h;
  h.type = static_cast<uint16_t>(ipc::MsgType::kHello);
  h.length = (1 << 16) + 1;  // announced only: the bus must not wait for (or reserve) these bytes
  std::string error;
  ASSERT_EQ(ipc::WriteAll(bad, &h, sizeof(h), &error), ipc::IoStatus::kOk) << error;
  auto reasons = DroppedSoon(1);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_NE(reasons[0].find("frame of 65537 bytes exceeds the limit 65536"), std::string::npos) << reasons[0];
  char b;
  EXPECT_EQ(ipc::ReadExact(bad, &b, 1, 5000, &error), ipc::IoStatus::kClosed);
  ::close(bad);
  ExpectServed();
}

TEST_F(EventBusCaps, RequestsWhoseRepliesAreNotReadAreCappedAsTheyAreQueued) {
  BusLimits limits;
  limits.max_reply_bytes = 1 << 20;
  Start(limits, 64 << 10);  // each 18-byte hello asks for 64 KiB
  int bad = Connect();
  std::string hellos, error;
  for (int i = 0; i < 1024; ++i) hellos += ipc::EncodeFrame(ipc::MsgType::kHello, "{}");  // 18 KiB asking 64 MiB
  ASSERT_EQ(ipc::WriteAll(bad, hellos.data(), hellos.size(), &error), ipc::IoStatus::kOk) << error;
  auto reasons = DroppedSoon(1);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_NE(reasons[0].find("does not read its replies"), std::string::npos) << reasons[0];
  EXPECT_NE(reasons[0].find("1048576-byte cap"), std::string::npos) << reasons[0];
  ::close(bad);
  ExpectServed();
  // Under the cap, the same requests are answered: a client that reads as it goes is never dropped.
  int good = Connect();
  for (int i = 0; i < 64; ++i) {
    ASSERT_EQ(ipc::SendFrame(good, ipc::MsgType::kHello, "{}", 2, &error), ipc::IoStatus::kOk) << error;
    ipc::Frame f;
    ASSERT_EQ(ipc::RecvFrame(good, &f, 5000, &error), ipc::IoStatus::kOk) << error;
  }
  ::close(good);
  auto all = DroppedSoon(3);  // the bad one, then the two good ones as they closed
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[1], "closed");
  EXPECT_EQ(all[2], "closed");
}

}  // namespace
}  // namespace prism::coord
