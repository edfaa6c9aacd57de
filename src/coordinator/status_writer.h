// The coordinator's documents for others to read (docs/coordinator.md): <out>/coordinator.json (how to reach it)
// and <out>/status.json (where every real rank is, refreshed while it runs), each also SET in its own store
// (kInfoKey, kStatusKey) for readers on other hosts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/coordinator_state.h"
#include "coordinator/release_path.h"
#include "coordinator/store/store_server.h"

namespace prism::coord {

class SwapController;

class StatusWriter {
 public:
  StatusWriter(CoordinatorState& st, const std::vector<CommView>& comms, const ReleasePath& release,
               store::StoreServer& store)
      : st_(st), comms_(comms), release_(release), store_(store) {}
  void set_swap(SwapController* swap) { swap_ = swap; }
  void set_started_ns(uint64_t ns) { started_ns_ = ns; }

  // The rest without the mutex (each takes it). `state`: "running" or "stopped".
  void WriteInfo(const char* state);
  bool info_written() const { return info_written_; }
  std::string StatusJson();
  // status.json when something changed (CoordinatorState::status_dirty) or `force`, else every 10th call.
  void MaybeWriteStatus(bool force);

 private:
  nlohmann::json StatusLocked();  // under the mutex

  CoordinatorState& st_;
  const std::vector<CommView>& comms_;  // CommRegistry's
  const ReleasePath& release_;
  store::StoreServer& store_;
  SwapController* swap_ = nullptr;
  uint64_t started_ns_ = 0;
  int idle_ticks_ = 0;
  bool info_written_ = false;
};

}  // namespace prism::coord
