// Context switching on the coordinator's side (swap_scheduler.h decides, swap_driver.h checkpoints, swap_usage.h
// measures; docs/collect.md "Context switching"): the scheduler fed from the bus (starts, memory, waits in exchanges
// and in the store), its actions carried out one checkpoint call at a time on a worker thread, allocation
// admission (kMemRoom), and releases that do not wait for a swapped-out member. Exists only with --swap. Under
// CoordinatorState::mu unless said otherwise.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/coordinator_state.h"
#include "coordinator/release_path.h"
#include "coordinator/store/store_server.h"

namespace prism::coord {

class SwapController {
 public:
  SwapController(CoordinatorState& st, const std::vector<CommView>& comms, ReleasePath& release,
                 store::StoreServer& store)
      : st_(st), comms_(comms), release_(release), store_(store) {}
  ~SwapController() { StopWorker(); }

  // Without the mutex. The driver, the caps, the scheduler and the worker thread; false with *error.
  bool Start(std::string* error);
  // Without the mutex, before the bus thread stops: the worker ends after its current checkpoint call.
  void StopWorker();
  // The "swap: on" line, once the coordinator is up. Why then: a start that fails later (its store port taken) is
  // retried.
  void PrintBanner() { Print(banner_); }
  // From the store's thread, without the mutex: its waits changed (StoreServerOptions::on_waits_changed); the bus
  // loop maps them to ranks on its next turn, woken through the bus's wake_fd once it listens (set_wake_fd).
  void StoreWaitsChanged();
  void set_wake_fd(int fd) { wake_fd_ = fd; }

  SwapScheduler& scheduler() { return *sched_; }
  // The next action goes to the worker; notices and progress lines.
  void Pump();
  // After every kOpData: who waits for whom in exchanges, which members posted their input (ReleaseOut).
  void OnExchange(const std::vector<ExchangeHub::Wait>& waits);
  // Allocation admission (ipc.h kMemRoom, SwapScheduler::RequestRoom): a rank's allocation of `bytes` failed (it
  // holds `current`); it waits for the answer, which AnswerRooms (from Pump) sends once the scheduler decided.
  // False: the rank is not scheduled, and the caller refuses at once.
  bool RequestRoom(int rank, uint64_t req, uint64_t bytes, uint64_t current, bool idle);
  // A collective's release needs every real member's kOpArrive, which libprism sends only after the member's
  // exchange returned; a member swapped out while blocked in that exchange sends it only once restored, so the
  // others' gates stayed shut until then (every swap in then came from the stall rule). Its exchange input proves
  // it arrived: ReleaseOut releases without it and keeps the release for its late kOpArrive (LateArrival: true
  // when the arrival was owed one, which is then sent).
  void ReleaseOut();
  bool LateArrival(BusId id, BusClient& c, const ipc::OpArrive& a);
  // (comm, seq) was released the ordinary way.
  void Forget(const ReleasePath::Key& key) { exchanged_.erase(key); }
  // Without the mutex, on the loop between turns: store waits mapped to ranks (when they changed, or on a tick)
  // and, on a tick, footprints measured.
  void AfterTurn(bool tick);
  nlohmann::json Json();  // status.json's "swap"

 private:
  void Worker();
  void Print(const std::string& line);
  void AnswerRooms(uint64_t now);
  void UpdateWaits();
  std::string ProgressLine();
  // Store waits (store_server.h BlockedPeers) mapped to ranks through /proc: peer "host:port" -> rank.
  void StoreWaits();
  // Footprints from each rank's process's GPU memory (swap_usage.h): asked outside the mutex, at most every
  // SwapConfig::usage_interval_s.
  void Measure();

  CoordinatorState& st_;
  const std::vector<CommView>& comms_;  // CommRegistry's
  ReleasePath& release_;
  store::StoreServer& store_;
  std::unique_ptr<SwapScheduler> sched_;
  std::shared_ptr<SwapDriver> driver_;
  std::thread thread_;
  std::mutex job_mu_;  // the worker's job; taken after CoordinatorState::mu, never around it
  std::condition_variable job_cv_;
  std::optional<SwapAction> job_;
  bool stop_ = false;
  std::chrono::steady_clock::time_point last_progress_{};
  uint64_t progress_mark_ = 0;  // swaps + finished at the last progress line
  std::string banner_;
  std::map<ReleasePath::Key, std::set<int>> exchanged_;               // (comm, seq) -> members that posted
  std::map<std::tuple<int, uint32_t, uint64_t>, std::string> owed_;  // (rank, comm, seq) -> kOpRelease frame
  std::atomic<bool> store_dirty_{false};
  std::atomic<int> wake_fd_{-1};
  std::map<std::string, int> store_peer_rank_;
  // Where footprints come from, for the banner and the summary.
  GpuUsageFn usage_;
  std::string usage_from_;
  std::chrono::steady_clock::time_point usage_last_{};
  std::set<int> usage_logged_;  // ranks whose first measurement is in the log
};

}  // namespace prism::coord
