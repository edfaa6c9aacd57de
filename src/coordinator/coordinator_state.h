// What the coordinator's parts (coordinator.cc wires them) share: the options, the event bus, every real rank's
// state, the hang detector and the exchange hub, all under one mutex that the bus thread holds while it handles a
// batch of events. Each part keeps its own state beside this (the communicators, the pending releases, the swap
// scheduler) and is called under the same mutex unless its header says otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "coordinator/coordinator.h"
#include "coordinator/bus/event_bus.h"
#include "coordinator/bus/exchange_hub.h"
#include "coordinator/hang/hang_detector.h"

namespace prism::coord {

struct RankState {
  std::string state = "not connected";
  int pid = 0;
  std::string host;
  int gpu = -1;
  std::string gpu_id;        // physical GPU ("host/CUDA_VISIBLE_DEVICES entry"), kHello
  bool can_passthrough = false;
  bool prerelease = false;   // kHello "prerelease": takes kOpPrerelease
  int local_rank = -1;
  BusId conn = 0;
  uint64_t connected_ns = 0, last_seen_ns = 0;
  uint64_t iterations = 0, last_iter_dur_ns = 0, last_iter_ns = 0;
  uint64_t peak_bytes = 0, current_bytes = 0, torch_max_allocated = 0;
  uint64_t ops_recorded = 0, ops_arrived = 0;
  ipc::OpRecord last_record{};
  bool has_record = false;
  bool waiting = false;
  uint32_t waiting_comm = 0;
  uint64_t waiting_seq = 0;
  uint64_t waiting_since_ns = 0;
  uint32_t waiting_op = 0;
  std::string bye_reason;
};

struct CoordinatorState {
  CoordinatorState(EventBus::FrameHandler on_frame, EventBus::DropHandler on_drop)
      : bus(std::move(on_frame), std::move(on_drop)) {}

  CoordinatorOptions opts;
  CoordinatorEndpoints ep;
  std::unique_ptr<VirtualRanks> vr;
  std::mutex mu;  // everything below; the bus thread holds it while handling a batch
  EventBus bus;
  std::map<int, RankState> ranks;  // real ranks
  HangDetector hang;
  ExchangeHub xhub;  // real data between real members
  bool status_dirty = true;
};

inline uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

}  // namespace prism::coord
