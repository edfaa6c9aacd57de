// The coordinator of one emulation: the rendezvous store (TCP, c10d's TCPStore protocol, with virtual ranks standing
// in) and the event bus that libprism.so in every real rank talks to (include/prism/ipc.h frames over a Unix socket,
// and over TCP for other hosts). It answers communicator membership (kCommInit -> kCommInfo), releases operations
// when every real member arrived (kOpArrive -> kOpRelease), keeps where every real rank is for `prism-run status`,
// and writes <out>/coordinator.json (how to reach it) and <out>/status.json (refreshed while it runs).
//
// The launcher runs it in a background thread of prism-run:
//   auto coord = prism::coord::Coordinator::Start(opts, &error);   // nullptr + error on failure
//   coord->endpoints()  -> store host/port for MASTER_ADDR/MASTER_PORT, socket for PRISM_COORD_SOCKET
//   coord->Stop();      // or destroy it
// `prism-run coordinator ...` runs the same thing alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/non_copyable.h"
#include "coordinator/store/virtual_ranks.h"
#include "coordinator/swap/swap_driver.h"
#include "coordinator/swap/swap_scheduler.h"
#include "coordinator/swap/swap_usage.h"
#include "model/group_membership.h"
#include "prism/ipc.h"
#include "prism/limits.h"

namespace prism::coord {

// One real rank's arrival at an operation.
struct Arrival {
  int rank = -1;  // global rank
  ipc::OpArrive op{};
};

struct ReleaseDecision {
  uint64_t release_ns = 0;
  int last_rank = -1;  // global rank whose arrival decided it; -1 when the duration did
};

struct CommView {
  uint32_t comm_id = 0;
  std::string key;
  std::vector<int> members;       // global ranks, communicator-rank order
  std::vector<int> real_members;  // those that run for real
  // Communicators with the same members created before this one (torch makes a second communicator of a
  // pipeline pair for its send/recv): the n-th of a member set is the n-th of the graph's (GraphRelease).
  uint32_t member_twin = 0;
  // Every member real, on its own GPU, able to run real NCCL (kHello): the members use a real NCCL communicator,
  // whose unique id rank 0 posts here (ipc.h kRealNcclId).
  bool passthrough = false;
  std::string real_nccl_id;  // hex, once posted
  // The process group's description (Megatron's group name, e.g. "PIPELINE_MODEL_PARALLEL_GROUP"; "" when unknown),
  // and how many communicators with the same members and description came before this one. Why: groups of
  // different kinds can have the same members (with tp 1 the model-parallel group is the pipeline group), and the
  // graph numbers its communicators in first-use order, not creation order, so member_twin alone can pick the wrong
  // one (GraphRelease::GraphComm).
  std::string desc;
  uint32_t desc_twin = 0;
};

// Decides when an operation completes at target scale once every real member arrived. The default: max(arrivals)
// + the longest duration the shims sent (OpArrive::model_dur_ns). Graph replay plugs in here:
// virtual members' arrivals and recorded durations.
class ReleasePolicy {
 public:
  virtual ~ReleasePolicy() = default;
  virtual ReleaseDecision Decide(const CommView& comm, uint64_t seq, std::span<const Arrival> arrivals) = 0;
  // Work a policy may do ahead of its next decisions while the event loop has nothing to read, for about
  // `budget_ns`; true while more remains (the loop then calls again instead of sleeping). Why: a decision a real
  // rank waits for should not pay for computing the virtual ranks' future (GraphRelease: the next repetition).
  // `stop`: polled between small steps; true ends the work early (the coordinator: a message is waiting), so that
  // a real rank's arrival waits for at most one step, not the whole budget.
  virtual bool Idle(int64_t budget_ns, const std::function<bool()>& stop) {
    (void)budget_ns;
    (void)stop;
    return false;
  }
  // The release rule of real rank `rank`'s operation `seq` on `comm` before the rank reaches it, when the policy
  // can fix it already: every other member is virtual and its arrival known (ipc::OpPrerelease has the rule; the
  // policy's Decide must give the same answer once the arrival comes). nullopt: not (yet) known; ask again later.
  struct Prerelease {
    uint64_t floor_ns = 0;
    int64_t dur_ns = -1;
    int32_t floor_rank = -1;
    uint32_t op = 0;  // the operation the policy expects there (ipc::OpArrive::op's code)
  };
  virtual std::optional<Prerelease> Predict(const CommView& comm, uint64_t seq, int rank) {
    (void)comm;
    (void)seq;
    (void)rank;
    return std::nullopt;
  }
  // Changes whenever Predict may answer differently (GraphRelease: a virtual arrival was computed); a caller may
  // skip asking again while it stays the same.
  virtual uint64_t PredictEpoch() const { return 0; }
};
ReleaseDecision DefaultRelease(const CommView& comm, uint64_t seq, std::span<const Arrival> arrivals);

// The hang diagnosis's default: seconds without progress of any real rank while some wait (--hang-timeout). Every
// command that starts a coordinator takes it from here.
inline constexpr double kDefaultHangTimeoutS = 60.0;

struct CoordinatorOptions {
  int world_size = 0;
  std::vector<int> real_ranks = {0};    // logical ranks that run for real; every other rank is virtual
  std::string store_host = "127.0.0.1";  // bind address of the store; "0.0.0.0" for multi-node
  uint16_t store_port = 0;               // 0: pick a free port (reported in endpoints())
  std::string out_dir;                   // required: coord.sock, coordinator.json, status.json go here
  std::string bus_tcp;                   // "HOST:PORT" (port 0 = pick): also serve the event bus over TCP
  std::string layout, graph, topology, payload = "mirror", run_id;  // passed to shims in kHelloAck, recorded
  int ranks_per_root = 128;              // TORCH_NCCL_RANKS_PER_ROOT the job runs with
  const world::GroupMembership* membership = nullptr;  // e.g. the launcher's Megatron layout (not owned)
  ReleasePolicy* release_policy = nullptr;      // not owned; nullptr: DefaultRelease
  std::string record_wire;               // capture every byte store clients send (store_server.h format)
  int status_interval_ms = 500;          // status.json refresh
  // A kCommInit whose id the store has not seen yet waits this long for it (a leader's SET races its kCommInit).
  int comm_wait_ms = 5000;
  // Per-client caps of the event bus (include/prism/limits.h has the rest and why; tests lower these).
  uint64_t bus_max_reply_bytes = limits::kMaxBusReplyBytes;
  uint64_t bus_max_parked_bytes = limits::kMaxBusParkedBytes;
  // Passthrough (ipc.h): a communicator whose members are all real, each on its own GPU and able to run real NCCL,
  // runs on the real NCCL. false: never (every communicator goes through libprism's exchange or gate).
  bool passthrough = true;
  // Fewest members a passthrough communicator has. 2: a one-member communicator stays libprism's (a real NCCL
  // communicator per one-rank group would cost GPU memory for nothing); 1 makes a world of one real rank pass
  // through (PRISM_PASSTHROUGH_MIN_MEMBERS=1 for prism-run: the one-GPU check of the real-NCCL path).
  int passthrough_min_members = 2;
  // Hang diagnosis (hang_detector.h): when no real rank made progress for this long while some wait, write
  // <out>/hang.json and print the diagnosis to stderr. <= 0: off.
  double hang_timeout_s = kDefaultHangTimeoutS;
  // Called once per stall on the bus thread, after hang.json is written (argument: its path), e.g. to stop the
  // workers (--on-hang stop). Must not call back into the coordinator. Empty: keep running (--on-hang wait).
  std::function<void(const std::string& hang_json)> on_hang;
  // Context switching (collect, swap_scheduler.h): when enabled, ranks start only when the launcher's
  // SwapAdmitted says so, and ranks blocked in an exchange are swapped out of GPU memory to make room for others.
  SwapConfig swap;
  std::shared_ptr<SwapDriver> swap_driver;  // tests: a driver to use; nullptr: OpenCudaCheckpointDriver(swap.driver)
  // Per-process GPU memory (swap_usage.h); tests: a source to use; empty: OpenNvmlUsage(swap.usage_library).
  GpuUsageFn swap_usage;
  std::function<void(const std::string&)> swap_print;  // progress and notices (default: stdout)
  double swap_progress_s = 10;                          // at most one progress line this often
};

struct CoordinatorEndpoints {
  std::string store_host;   // what clients connect to (the bind address, or this host's name for 0.0.0.0)
  uint16_t store_port = 0;
  std::string socket_path;  // event bus, Unix socket (PRISM_COORD_SOCKET)
  std::string bus_tcp;      // "host:port" of the TCP event bus ("" when not asked for) (PRISM_COORD_ADDR)
  std::string info_path;    // <out>/coordinator.json
  std::string status_path;  // <out>/status.json
};

class Coordinator : NonCopyable {
 public:
  static std::unique_ptr<Coordinator> Start(const CoordinatorOptions& opts, std::string* error);
  ~Coordinator();

  const CoordinatorEndpoints& endpoints() const;
  // Stops the bus and the store, writes the last status, removes the socket. Idempotent.
  void Stop();

  // Registers a process group's members (torch group name, global ranks in group order), e.g. from the layout.
  void RegisterGroup(const std::string& name, std::vector<int> members, const std::string& desc = {});
  // The status document (what status.json holds), built now.
  std::string StatusJson();
  VirtualRanks& virtual_ranks();
  // Context switching: may the launcher start this rank now (always true without --swap); the rank's process ended
  // (it never said hello, or died): it leaves the scheduler; the scheduler's figures (zeros without --swap).
  bool SwapAdmitted(int rank);
  void SwapRankExited(int rank);
  SwapStats SwapSummary();

  class Impl;

 private:
  explicit Coordinator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Keys the coordinator SETs in its own store (raw, as on the wire), so a client anywhere can read them with a plain
// TCPStore GET: coordinator.json's content (how to reach its event bus, its real ranks), the status document
// (status.json's content, refreshed with it) and the last hang diagnosis (hang.json's content). No torch key starts
// with "__prism__/".
inline constexpr const char* kInfoKey = "__prism__/coordinator.json";
inline constexpr const char* kStatusKey = "__prism__/status.json";
inline constexpr const char* kHangKey = "__prism__/hang.json";
// Followed by nccl_trace_rank_<R>: each real rank's Flight Recorder dump (flight_recorder.h), at a hang and at stop.
inline constexpr const char* kFrKeyPrefix = "__prism__/flight_recorder/";

}  // namespace prism::coord
