#include "coordinator/coordinator.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/ipc_io.h"
#include "common/log.h"
#include "coordinator/exchange_hub.h"
#include "coordinator/flight_recorder.h"
#include "coordinator/hang_detector.h"
#include "coordinator/store_server.h"

namespace prism::coord {
namespace {

using json = nlohmann::json;
using BusId = uint64_t;

constexpr BusId kUnixListenId = 1;
constexpr BusId kTcpListenId = 2;
constexpr BusId kWakeId = 3;
constexpr BusId kTimerId = 4;
// Why this large: kOpResult frames carry real members' outputs (a gradient bucket can be hundreds of MB); a shim reads
// them on its own reader thread, so a client over this limit has stopped reading.
constexpr uint64_t kMaxBusOutput = 8ull << 30;

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

std::string HostName() {
  char h[256] = {0};
  ::gethostname(h, sizeof(h) - 1);
  return h;
}

bool WriteFileAtomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return false;
    f << text;
    if (!f.good()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

bool SplitHostPort(const std::string& s, std::string* host, uint16_t* port) {
  size_t c = s.rfind(':');
  if (c == std::string::npos) return false;
  *host = s.substr(0, c);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  try {
    int p = std::stoi(s.substr(c + 1));
    if (p < 0 || p > 65535) return false;
    *port = static_cast<uint16_t>(p);
  } catch (...) {
    return false;
  }
  return true;
}

const char* OpName(uint32_t op) {
  // prism::trace::CollOp values are the lead's; only names for status lines, numbers are printed too.
  if (op >= 100) return op == 103 ? "send" : op == 104 ? "recv" : "p2p";
  return "coll";
}

}  // namespace

ReleaseDecision DefaultRelease(const CommView& comm, uint64_t seq, std::span<const Arrival> arrivals) {
  ReleaseDecision d;
  uint64_t latest = 0;
  uint64_t dur = 0;
  for (const Arrival& a : arrivals) {
    // Why copies: OpArrive is packed; binding a reference (std::max) to its fields is misaligned.
    uint64_t at = a.op.arrival_ns, d_ns = a.op.model_dur_ns;
    if (at >= latest) {
      latest = at;
      d.last_rank = a.rank;
    }
    dur = std::max(dur, d_ns);
  }
  if (arrivals.size() <= 1) d.last_rank = -1;  // nobody else to wait for: the duration decides
  d.release_ns = latest + dur;
  return d;
}

bool ParseRankList(const std::string& text, int world_size, std::vector<int>* out, std::string* error) {
  out->clear();
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    if (part.empty()) {
      *error = fmt::format("rank list '{}': empty entry", text);
      return false;
    }
    int lo = 0, hi = 0;
    size_t dash = part.find('-');
    try {
      size_t used = 0;
      if (dash == std::string::npos) {
        lo = hi = std::stoi(part, &used);
        if (used != part.size()) throw std::invalid_argument("trailing");
      } else {
        lo = std::stoi(part.substr(0, dash), &used);
        if (used != dash) throw std::invalid_argument("trailing");
        hi = std::stoi(part.substr(dash + 1), &used);
        if (used != part.size() - dash - 1) throw std::invalid_argument("trailing");
      }
    } catch (...) {
      *error = fmt::format("rank list '{}': '{}' is not a rank or a range a-b", text, part);
      return false;
    }
    if (lo < 0 || hi < lo || (world_size > 0 && hi >= world_size)) {
      *error = fmt::format("rank list '{}': '{}' is outside 0..{}", text, part, world_size - 1);
      return false;
    }
    for (int r = lo; r <= hi; ++r) out->push_back(r);
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
  return true;
}

class Coordinator::Impl {
 public:
  bool Start(const CoordinatorOptions& opts, std::string* error);
  void Stop();
  std::string StatusJson();
  void RegisterGroup(const std::string& name, std::vector<int> members, const std::string& desc) {
    vr_->RegisterGroup(name, std::move(members), desc);
    store_.RetryWaits();
  }

  bool SwapAdmitted(int rank);
  void SwapRankExited(int rank);
  SwapStats SwapSummary();

  CoordinatorOptions opts_;
  CoordinatorEndpoints ep_;
  std::unique_ptr<VirtualRanks> vr_;

 private:
  struct BusClient {
    int fd = -1;
    std::string peer;
    ipc::FrameDecoder decoder;
    std::string out;
    size_t out_pos = 0;
    bool want_write = false;
    int rank = -1;
    std::string drop_reason;
  };
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

  bool Listen(std::string* error);
  void Loop();
  void AcceptOn(int listen_fd);
  void OnReadable(BusId id);
  void HandleFrame(BusId id, BusClient& c, const ipc::FrameView& f);
  void Send(BusId id, ipc::MsgType type, std::string_view payload);
  void SendJson(BusId id, ipc::MsgType type, const json& j) { Send(id, type, j.dump()); }
  void Flush(BusId id, BusClient& c);
  void DropClient(BusId id);
  void HandleHello(BusId id, BusClient& c, const json& j);
  // Answers a kCommInit; false (nothing sent) when the members are unknown and `final` is false: the request is
  // then parked until the store records a new id or the deadline passes.
  bool HandleCommInit(BusId id, BusClient& c, const json& j, bool final);
  void RetryParked(bool timer);
  // Whether a new communicator with these members runs on the real NCCL; nullopt while a real member has not said
  // hello yet (its GPU is unknown) and `final` is false.
  std::optional<bool> DecidePassthrough(const std::vector<int>& members, bool final);
  void HandleRealNcclId(BusId id, BusClient& c, const json& j);
  void HandleArrive(BusId id, BusClient& c, const ipc::OpArrive& a);
  // True (and the operation is not released) when every real member arrived at (comm, seq) but they issued
  // different operations there (hang_detector.h Disagreement): real NCCL would hang or corrupt, so it is held
  // and reported at once on stderr; the hang diagnosis follows after --hang-timeout.
  bool HoldOnDisagreement(const CommView& comm, uint64_t seq, const std::vector<Arrival>& arrivals);
  // Decides (comm, seq)'s release over `decide_on` and queues the kOpRelease frame to every rank of `send_to`
  // (flushed when `flush`), taking them off their waits. Returns the frame.
  std::string SendRelease(const CommView& comm, uint64_t seq, const std::vector<Arrival>& decide_on,
                          const std::vector<Arrival>& send_to, uint64_t now_ns, bool flush);
  void MaybeWriteStatus(bool force);
  json StatusLocked();
  void WriteInfo(const char* state);
  void CheckHang();
  // <out>/flight_recorder/nccl_trace_rank_<R> for every real rank (flight_recorder.h); at a hang and at stop.
  void WriteFlightRecorder();
  // Context switching (swap_scheduler.h). StartSwap: the driver, the caps, the worker thread. PumpSwap (under mu_):
  // the next action goes to the worker; notices and progress lines. UpdateSwapWaits (under mu_): who waits for whom
  // in exchanges, after every kOpData. SwapWorker: runs one checkpoint call at a time outside mu_.
  bool StartSwap(std::string* error);
  void PumpSwap();
  void UpdateSwapWaits();
  void SwapWorker();
  void SwapPrint(const std::string& line);
  // Allocation admission (ipc.h kMemRoom, SwapScheduler::RequestRoom): a rank's allocation failed; it waits for the
  // answer, which SwapAnswerRooms (under mu_, from PumpSwap) sends once the scheduler decided.
  void HandleMemRoom(BusId id, BusClient& c, const json& j);
  void SwapAnswerRooms(uint64_t now);
  std::string SwapProgressLine();
  json SwapJsonLocked();

  store::StoreServer store_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  int epoll_fd_ = -1, unix_fd_ = -1, tcp_fd_ = -1, wake_fd_ = -1, timer_fd_ = -1;
  std::mutex mu_;  // bus state below; the bus thread holds it while handling a batch
  std::unordered_map<BusId, BusClient> clients_;
  BusId next_id_ = 16;
  std::map<int, RankState> ranks_;  // real ranks
  std::vector<CommView> comms_;     // comm_id - 1 -> view
  std::unordered_map<std::string, uint32_t> comm_by_key_;
  std::unordered_map<std::string, uint32_t> comm_by_id_;  // unique-id hex (kCommInit "key") -> comm id
  std::map<std::pair<uint32_t, uint64_t>, std::vector<Arrival>> pending_;
  struct Parked {
    BusId id;
    json request;
    std::chrono::steady_clock::time_point deadline;
  };
  // Why park: a leader's SET of its id (store, TCP) and its kCommInit (bus) race; the SET has no reply.
  std::vector<Parked> parked_;
  // Prereleases (ipc::OpPrerelease): per communicator with one real member that takes them, the next sequence
  // number to predict and the end of the released ones; the prereleased operations until their unit arrives.
  struct PredictCursor {
    uint64_t next = 0, released = 0;
  };
  std::map<uint32_t, PredictCursor> predict_;
  std::map<std::pair<uint32_t, uint64_t>, ReleasePolicy::Prerelease> prereleased_;
  uint64_t predict_epoch_ = UINT64_MAX;  // ReleasePolicy::PredictEpoch at the last pass that left nothing to send
  bool predict_dirty_ = false;           // a release moved a cursor since
  uint64_t prereleases_sent_ = 0, prereleases_used_ = 0, prerelease_mismatches_ = 0;
  void SendPrereleases();
  void ForgetPrereleases(int rank);
  bool StopIdle() const;
  uint64_t releases_ = 0;
  uint64_t started_ns_ = 0;
  bool status_dirty_ = true;
  int idle_ticks_ = 0;
  bool stopped_ = false;
  bool info_written_ = false;
  HangDetector hang_;  // under mu_
  ExchangeHub xhub_;   // real data between real members; under mu_
  std::map<std::pair<uint32_t, uint64_t>, std::string> held_;  // (comm, seq) -> what differs; under mu_
  std::map<uint32_t, std::vector<BusId>> real_id_waiters_;  // passthrough comm -> members asking for its id
  std::unique_ptr<SwapScheduler> swap_;  // under mu_; null without --swap
  std::shared_ptr<SwapDriver> swap_driver_;
  std::thread swap_thread_;
  std::mutex swap_mu_;  // the worker's job; taken after mu_, never around it
  std::condition_variable swap_cv_;
  std::optional<SwapAction> swap_job_;
  bool swap_stop_ = false;
  std::chrono::steady_clock::time_point swap_last_progress_{};
  uint64_t swap_progress_mark_ = 0;  // swaps + finished at the last progress line
  std::string swap_banner_;          // the "swap: on" line, printed once Start succeeded
  // A collective's release needs every real member's kOpArrive, which libprism sends only after the member's
  // exchange returned; a member swapped out while blocked in that exchange sends it only once restored, so the
  // others' gates stayed shut until then (the GPU run of s17: every swap in came from the stall rule). Its exchange
  // input proves it arrived: SwapReleaseOut releases without it and keeps the release for its late kOpArrive.
  void SwapReleaseOut();
  bool SwapLateArrival(BusId id, BusClient& c, const ipc::OpArrive& a);
  std::map<std::pair<uint32_t, uint64_t>, std::set<int>> swap_exchanged_;  // (comm, seq) -> members that posted
  std::map<std::tuple<int, uint32_t, uint64_t>, std::string> swap_owed_;    // (rank, comm, seq) -> kOpRelease frame
  // Store waits (store_server.h BlockedPeers) mapped to ranks through /proc: peer "host:port" -> rank.
  void SwapStoreWaits();
  std::atomic<bool> swap_store_dirty_{false};
  std::atomic<int> swap_wake_fd_{-1};
  std::map<std::string, int> swap_store_peer_rank_;
  // Footprints from each rank's process's GPU memory (swap_usage.h): asked on the timer, outside mu_, at most every
  // SwapConfig::usage_interval_s. swap_usage_from_: where footprints come from, for the banner and the summary.
  void SwapMeasure();
  GpuUsageFn swap_usage_;
  std::string swap_usage_from_;
  std::chrono::steady_clock::time_point swap_usage_last_{};
  std::set<int> swap_usage_logged_;  // ranks whose first measurement is in the log
};

bool Coordinator::Impl::Start(const CoordinatorOptions& opts, std::string* error) {
  opts_ = opts;
  if (opts_.world_size <= 0) {
    *error = "coordinator: world size must be positive";
    return false;
  }
  for (int r : opts_.real_ranks) {
    if (r < 0 || r >= opts_.world_size) {
      *error = fmt::format("coordinator: real rank {} outside the world of {}", r, opts_.world_size);
      return false;
    }
  }
  if (opts_.out_dir.empty()) {
    *error = "coordinator: an output directory is required";
    return false;
  }
  std::error_code ec;
  std::filesystem::create_directories(opts_.out_dir, ec);
  if (ec) {
    *error = fmt::format("coordinator: cannot create '{}': {}", opts_.out_dir, ec.message());
    return false;
  }
  started_ns_ = NowNs();
  if (opts_.run_id.empty()) opts_.run_id = fmt::format("{}-{}", HostName(), ::getpid());
  VirtualRanksOptions vo;
  vo.world_size = opts_.world_size;
  vo.real_ranks = opts_.real_ranks;
  vo.ranks_per_root = opts_.ranks_per_root;
  vo.membership = opts_.membership;
  vr_ = std::make_unique<VirtualRanks>(vo);
  for (int r : opts_.real_ranks) ranks_[r] = RankState{};
  hang_.set_timeout(opts_.hang_timeout_s);
  if (opts_.swap.enabled && !StartSwap(error)) return false;

  store::StoreServerOptions so;
  so.host = opts_.store_host;
  so.port = opts_.store_port;
  so.stand_in = vr_.get();
  so.record_path = opts_.record_wire;
  if (opts_.swap.enabled) {
    // Why a flag and a wake-up: the store's thread must not take mu_; the event loop maps the waits to ranks.
    so.on_waits_changed = [this] {
      swap_store_dirty_ = true;
      const int fd = swap_wake_fd_.load();
      uint64_t one = 1;
      if (fd >= 0) {
        [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof(one));
      }
    };
  }
  if (!store_.Start(so, error)) return false;
  ep_.store_host = opts_.store_host;
  if (ep_.store_host == "0.0.0.0" || ep_.store_host == "::" || ep_.store_host.empty()) ep_.store_host = HostName();
  ep_.store_port = store_.port();
  ep_.info_path = (std::filesystem::path(opts_.out_dir) / "coordinator.json").string();
  ep_.status_path = (std::filesystem::path(opts_.out_dir) / "status.json").string();
  if (!Listen(error)) {
    store_.Stop();
    return false;
  }
  int wake = wake_fd_;
  vr_->SetIdListener([wake] {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake, &one, sizeof(one));
  });
  WriteInfo("running");
  MaybeWriteStatus(true);
  thread_ = std::thread([this] { Loop(); });
  if (!swap_banner_.empty()) SwapPrint(swap_banner_);
  Log("coord")->info("coordinator up: world {}, {} real ranks, store {}:{}, bus {}{}", opts_.world_size,
                     opts_.real_ranks.size(), ep_.store_host, ep_.store_port, ep_.socket_path,
                     ep_.bus_tcp.empty() ? "" : " and " + ep_.bus_tcp);
  return true;
}

bool Coordinator::Impl::Listen(std::string* error) {
  std::string path = (std::filesystem::absolute(opts_.out_dir) / "coord.sock").string();
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    // Why: sun_path holds 107 characters; deep output directories do not fit.
    path = fmt::format("/tmp/prism-coord-{}-{}.sock", ::getpid(), started_ns_ % 1000000);
  }
  ::unlink(path.c_str());
  unix_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (unix_fd_ < 0 || ::bind(unix_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(unix_fd_, SOMAXCONN) != 0) {
    *error = fmt::format("coordinator: cannot listen on Unix socket '{}': {}", path, std::strerror(errno));
    return false;
  }
  ep_.socket_path = path;
  if (!opts_.bus_tcp.empty()) {
    std::string host;
    uint16_t port = 0;
    if (!SplitHostPort(opts_.bus_tcp, &host, &port)) {
      *error = fmt::format("coordinator: bus address '{}' is not HOST:PORT", opts_.bus_tcp);
      return false;
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &res);
        rc != 0) {
      *error = fmt::format("coordinator: bus address '{}': {}", opts_.bus_tcp, gai_strerror(rc));
      return false;
    }
    for (addrinfo* ai = res; ai && tcp_fd_ < 0; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
      int one = 1;
      if (fd >= 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (fd >= 0 && ::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
        tcp_fd_ = fd;
      } else if (fd >= 0) {
        ::close(fd);
      }
    }
    ::freeaddrinfo(res);
    if (tcp_fd_ < 0) {
      *error = fmt::format("coordinator: cannot listen on bus address '{}': {}", opts_.bus_tcp, std::strerror(errno));
      return false;
    }
    sockaddr_storage ss{};
    socklen_t sl = sizeof(ss);
    ::getsockname(tcp_fd_, reinterpret_cast<sockaddr*>(&ss), &sl);
    uint16_t bound = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                              : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    std::string adv = (host.empty() || host == "0.0.0.0" || host == "::") ? HostName() : host;
    ep_.bus_tcp = fmt::format("{}:{}", adv, bound);
  }
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0 || timer_fd_ < 0) {
    *error = fmt::format("coordinator: epoll/eventfd/timerfd: {}", std::strerror(errno));
    return false;
  }
  swap_wake_fd_ = wake_fd_;
  itimerspec its{};
  int ms = std::max(opts_.status_interval_ms, 10);
  its.it_interval.tv_sec = ms / 1000;
  its.it_interval.tv_nsec = (ms % 1000) * 1000000L;
  its.it_value = its.it_interval;
  ::timerfd_settime(timer_fd_, 0, &its, nullptr);
  auto add = [this](int fd, BusId id) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  };
  add(unix_fd_, kUnixListenId);
  if (tcp_fd_ >= 0) add(tcp_fd_, kTcpListenId);
  add(wake_fd_, kWakeId);
  add(timer_fd_, kTimerId);
  return true;
}

void Coordinator::Impl::WriteInfo(const char* state) {
  json j;
  j["version"] = 1;
  j["state"] = state;
  j["run_id"] = opts_.run_id;
  j["pid"] = ::getpid();
  j["host"] = HostName();
  j["store_host"] = ep_.store_host;
  j["store_bind"] = opts_.store_host;
  j["store_port"] = ep_.store_port;
  j["socket"] = ep_.socket_path;
  j["bus_tcp"] = ep_.bus_tcp;
  j["world_size"] = opts_.world_size;
  j["real_ranks"] = opts_.real_ranks;
  j["out_dir"] = opts_.out_dir;
  j["layout"] = opts_.layout;
  j["graph"] = opts_.graph;
  j["payload"] = opts_.payload;
  j["started_ns"] = started_ns_;
  j["status"] = "status.json";
  if (std::string(state) != "running") j["stopped_ns"] = NowNs();
  info_written_ = true;
  std::string text = j.dump(2) + "\n";
  if (!WriteFileAtomic(ep_.info_path, text)) {
    Log("coord")->error("cannot write {}: {}", ep_.info_path, std::strerror(errno));
  }
  // Why in the store too: a prism-run joining from another host learns the event bus port and the real ranks there.
  store_.Call([&](store::StoreState& st) { st.Set(kInfoKey, text); });
}

void Coordinator::Impl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (swap_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(swap_mu_);
      swap_stop_ = true;
    }
    swap_cv_.notify_all();
    swap_thread_.join();
  }
  if (thread_.joinable()) {
    stop_ = true;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, c] : clients_) ::close(c.fd);
    clients_.clear();
    for (auto& [r, s] : ranks_) {
      if (s.state == "connected") s.state = "lost";
    }
  }
  if (info_written_) {
    MaybeWriteStatus(true);
    WriteFlightRecorder();
  }
  store_.Stop();
  if (vr_) vr_->SetIdListener(nullptr);
  for (int* fd : {&unix_fd_, &tcp_fd_, &epoll_fd_, &wake_fd_, &timer_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  if (!ep_.socket_path.empty()) ::unlink(ep_.socket_path.c_str());
  if (info_written_) WriteInfo("stopped");
  Log("coord")->info("coordinator stopped ({} operations released; {} prereleased, {} used, {} disagreed)",
                     releases_, prereleases_sent_, prereleases_used_, prerelease_mismatches_);
}

void Coordinator::Impl::Loop() {
  std::vector<epoll_event> events(128);
  bool idle_work = false;  // the release policy has work to do ahead (ReleasePolicy::Idle): poll, do not sleep
  while (!stop_) {
    int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), idle_work ? 0 : -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      Log("coord")->error("epoll_wait: {}; event bus stops", std::strerror(errno));
      return;
    }
    bool tick = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int i = 0; i < n; ++i) {
        BusId id = events[static_cast<size_t>(i)].data.u64;
        uint32_t ev = events[static_cast<size_t>(i)].events;
        if (id == kUnixListenId) {
          AcceptOn(unix_fd_);
        } else if (id == kTcpListenId) {
          AcceptOn(tcp_fd_);
        } else if (id == kWakeId) {
          uint64_t v;
          while (::read(wake_fd_, &v, sizeof(v)) > 0) {
          }
          RetryParked(false);
        } else if (id == kTimerId) {
          uint64_t v;
          while (::read(timer_fd_, &v, sizeof(v)) > 0) {
          }
          RetryParked(true);
          tick = true;
        } else if (clients_.count(id)) {
          if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) OnReadable(id);
          auto it = clients_.find(id);
          if (it != clients_.end() && (ev & EPOLLOUT)) Flush(id, it->second);
        }
      }
      std::vector<BusId> drop;
      for (auto& [id, c] : clients_) {
        // Flushed even when dropping: a kError should reach the peer before the close.
        if (c.out_pos < c.out.size()) Flush(id, c);
        if (!c.drop_reason.empty()) drop.push_back(id);
      }
      for (BusId id : drop) DropClient(id);
      if (swap_) PumpSwap();
    }
    if (opts_.release_policy) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        SendPrereleases();
      }
      // Why 200 us: the slice's budget; a message that arrives meanwhile ends it after the current virtual rank's
      // step (StopIdle), so an arrival waits microseconds, not the slice.
      idle_work = opts_.release_policy->Idle(200'000, [this] { return StopIdle(); });
      std::lock_guard<std::mutex> lock(mu_);
      SendPrereleases();
      // Predict may have queued work (a member it advanced has more): one step, and poll instead of sleeping if
      // more remains.
      if (!idle_work) idle_work = opts_.release_policy->Idle(0, [this] { return StopIdle(); });
    }
    if (swap_ && (swap_store_dirty_.exchange(false) || tick)) SwapStoreWaits();
    if (swap_ && tick && swap_usage_) SwapMeasure();
    if (tick) {
      MaybeWriteStatus(false);
      CheckHang();
    }
  }
}

void Coordinator::Impl::AcceptOn(int listen_fd) {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) Log("coord")->error("accept: {}", std::strerror(errno));
      return;
    }
    if (listen_fd == tcp_fd_) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    BusId id = next_id_++;
    BusClient c;
    c.fd = fd;
    c.peer = listen_fd == tcp_fd_ ? "tcp#" + std::to_string(id) : "unix#" + std::to_string(id);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    clients_.emplace(id, std::move(c));
  }
}

void Coordinator::Impl::OnReadable(BusId id) {
  BusClient& c = clients_.at(id);
  bool eof = false;
  // Why read into the decoder and handle frames after every read: a frame's bytes are copied once, by the kernel,
  // and handed on as a view (kOpData: up to 8 MiB of exchange bytes), which lives until the next read.
  for (int turns = 0; turns < 16 && c.drop_reason.empty(); ++turns) {
    const size_t want = c.decoder.WantBytes(64 * 1024);
    ssize_t n = ::recv(c.fd, c.decoder.Reserve(want), want, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {
      eof = true;
      break;
    }
    c.decoder.Commit(static_cast<size_t>(n));
    ipc::FrameView f;
    for (;;) {
      ipc::DecodeStatus st = c.decoder.NextView(&f);
      if (st == ipc::DecodeStatus::kNeedMore) break;
      if (st == ipc::DecodeStatus::kError) {
        c.drop_reason = c.decoder.error();
        break;
      }
      HandleFrame(id, c, f);
      if (!c.drop_reason.empty()) break;
    }
  }
  if (eof && c.drop_reason.empty()) {
    c.drop_reason = c.decoder.buffered() ? fmt::format("disconnected mid-frame ({} bytes)", c.decoder.buffered())
                                         : "closed";
  }
}

void Coordinator::Impl::Send(BusId id, ipc::MsgType type, std::string_view payload) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  if (!ipc::AppendFrame(&it->second.out, type, payload.data(), payload.size())) {
    Log("coord")->error("dropping an oversized {}-byte message to {}", payload.size(), it->second.peer);
  }
}

void Coordinator::Impl::Flush(BusId id, BusClient& c) {
  while (c.out_pos < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_pos += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (c.drop_reason.empty()) c.drop_reason = fmt::format("send failed: {}", std::strerror(errno));
    return;
  }
  if (c.out_pos == c.out.size()) {
    c.out.clear();
    c.out_pos = 0;
  } else if (c.out.size() - c.out_pos > kMaxBusOutput) {
    if (c.drop_reason.empty()) c.drop_reason = "does not read its messages";
    return;
  }
  bool want = c.out_pos < c.out.size();
  if (want != c.want_write) {
    c.want_write = want;
    epoll_event ev{};
    ev.events = EPOLLIN | (want ? EPOLLOUT : 0u);
    ev.data.u64 = id;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  }
}

void Coordinator::Impl::DropClient(BusId id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  BusClient& c = it->second;
  bool lost = false;
  if (c.rank >= 0) {
    RankState& r = ranks_[c.rank];
    if (r.conn == id) {
      ForgetPrereleases(c.rank);
      lost = r.state == "connected";
      if (lost) {
        r.state = "lost";
        hang_.SetState(c.rank, "lost");
        if (swap_) swap_->Done(c.rank);
      }
      r.conn = 0;
    }
  }
  if (c.drop_reason != "closed") {
    Log("coord")->warn("dropping bus client {}: {}", c.peer, c.drop_reason);
  } else if (lost) {
    Log("coord")->warn("{} disconnected without saying goodbye", c.peer);
  }
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  ::close(c.fd);
  clients_.erase(it);
  status_dirty_ = true;
}

void Coordinator::Impl::HandleFrame(BusId id, BusClient& c, const ipc::FrameView& f) {
  using ipc::MsgType;
  status_dirty_ = true;
  if (swap_ && c.rank >= 0) swap_->Activity(c.rank, NowNs());
  auto parse = [&](json* j) {
    *j = json::parse(f.payload, nullptr, false);
    if (j->is_discarded() || !j->is_object()) {
      c.drop_reason = fmt::format("message type {} carries no JSON object", static_cast<int>(f.type));
      return false;
    }
    return true;
  };
  auto need_hello = [&]() {
    if (c.rank >= 0) return true;
    c.drop_reason = fmt::format("message type {} before kHello", static_cast<int>(f.type));
    return false;
  };
  try {
    switch (f.type) {
      case MsgType::kHello: {
        json j;
        if (parse(&j)) HandleHello(id, c, j);
        return;
      }
      case MsgType::kCommInit: {
        json j;
        if (!need_hello() || !parse(&j)) return;
        // Replies keep the order of requests: behind a parked request of this client, park too.
        bool behind = std::any_of(parked_.begin(), parked_.end(), [&](const Parked& p) { return p.id == id; });
        if (behind || !HandleCommInit(id, c, j, false)) {
          parked_.push_back(Parked{id, std::move(j), std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.comm_wait_ms)});
        }
        return;
      }
      case MsgType::kRealNcclId: {
        json j;
        if (!need_hello() || !parse(&j)) return;
        HandleRealNcclId(id, c, j);
        return;
      }
      case MsgType::kOpArrive: {
        ipc::OpArrive a;
        if (!need_hello()) return;
        if (!ipc::DecodePod(f, &a)) {
          c.drop_reason = fmt::format("kOpArrive of {} bytes, expected {}", f.payload.size(), sizeof(a));
          return;
        }
        HandleArrive(id, c, a);
        return;
      }
      case MsgType::kOpRecord: {
        ipc::OpRecord r;
        if (!need_hello()) return;
        if (!ipc::DecodePod(f, &r)) {
          c.drop_reason = fmt::format("kOpRecord of {} bytes, expected {}", f.payload.size(), sizeof(r));
          return;
        }
        RankState& s = ranks_[c.rank];
        ++s.ops_recorded;
        s.last_record = r;
        s.has_record = true;
        s.last_seen_ns = NowNs();
        hang_.Record(c.rank, r, s.last_seen_ns);
        return;
      }
      case MsgType::kMemory: {
        ipc::MemorySample m;
        if (!need_hello()) return;
        if (!ipc::DecodePod(f, &m)) {
          c.drop_reason = fmt::format("kMemory of {} bytes, expected {}", f.payload.size(), sizeof(m));
          return;
        }
        RankState& s = ranks_[c.rank];
        uint64_t current = m.current_bytes, peak = m.peak_bytes;
        s.current_bytes = current;
        s.peak_bytes = std::max(s.peak_bytes, peak);
        s.last_seen_ns = NowNs();
        if (swap_) swap_->Memory(c.rank, std::max(s.peak_bytes, current));
        return;
      }
      case MsgType::kIteration: {
        ipc::IterationMark m;
        if (!need_hello()) return;
        if (!ipc::DecodePod(f, &m)) {
          c.drop_reason = fmt::format("kIteration of {} bytes, expected {}", f.payload.size(), sizeof(m));
          return;
        }
        RankState& s = ranks_[c.rank];
        uint64_t iteration = m.iteration, peak = m.peak_bytes, torch_max = m.torch_max_allocated;
        s.iterations = std::max(s.iterations, iteration);
        s.last_iter_dur_ns = m.dur_ns;
        s.last_iter_ns = m.t_ns;
        s.peak_bytes = std::max(s.peak_bytes, peak);
        s.torch_max_allocated = std::max(s.torch_max_allocated, torch_max);
        s.last_seen_ns = NowNs();
        if (swap_ && s.peak_bytes > 0) swap_->Memory(c.rank, s.peak_bytes);
        hang_.Progress(c.rank, s.last_seen_ns);
        return;
      }
      case MsgType::kOpData: {
        if (!need_hello()) return;
        ipc::ExchangeHeader h;
        if (f.payload.size() < sizeof(h)) {
          c.drop_reason = fmt::format("kOpData of {} bytes, shorter than its header", f.payload.size());
          return;
        }
        std::memcpy(&h, f.payload.data(), sizeof(h));
        std::vector<ExchangeHub::Outgoing> out;
        std::vector<ExchangeHub::Wait> waits;
        std::string why = xhub_.OnData(c.rank, h, f.payload.substr(sizeof(h)), &out, &waits);
        if (!why.empty()) Log("coord")->warn("rank {}: {}", c.rank, why);
        // A real rank blocked in an exchange waits at that operation: the hang diagnosis must see it (a send
        // whose receive is never posted, e.g. two ranks that both send first, is a p2p wait-for cycle).
        const uint64_t now = NowNs();
        for (const ExchangeHub::Wait& w : waits) {
          if (!w.begin) {
            hang_.Release(w.rank, w.comm_id, w.seq, now);
            continue;
          }
          HangOp o;
          o.comm_id = w.comm_id;
          o.seq = w.seq;
          o.op = w.op;
          o.bytes = w.bytes;
          o.peer = w.peer;
          hang_.ArriveOp(w.rank, o, now, now);
        }
        for (ExchangeHub::Outgoing& o : out) {
          auto rs = ranks_.find(o.rank);
          if (rs == ranks_.end()) continue;
          auto cl = clients_.find(rs->second.conn);
          if (cl == clients_.end()) continue;
          // Why a swap when nothing is queued: a result frame is up to the operation's size; the hub takes the
          // client's drained buffer back for its next result (ExchangeHub::Recycle) instead of faulting in a new one.
          if (cl->second.out.size() == cl->second.out_pos) {
            cl->second.out.swap(o.frames);
            cl->second.out_pos = 0;
          } else {
            cl->second.out.append(o.frames);
          }
          xhub_.Recycle(std::move(o.frames));
          Flush(cl->first, cl->second);
        }
        if (swap_) {
          for (const ExchangeHub::Wait& w : waits) {
            // A collective's member whose wait ended posted its input there: it arrived (SwapReleaseOut).
            if (!w.begin && w.op != 103 && w.op != 104) swap_exchanged_[{w.comm_id, w.seq}].insert(w.rank);
          }
          if (swap_exchanged_.size() > 4096) swap_exchanged_.erase(swap_exchanged_.begin());
          UpdateSwapWaits();
          SwapReleaseOut();
        }
        return;
      }
      case MsgType::kMemRoom: {
        json j;
        if (!need_hello() || !parse(&j)) return;
        HandleMemRoom(id, c, j);
        return;
      }
      case MsgType::kBye: {
        if (!need_hello()) return;
        json j = json::parse(f.payload, nullptr, false);
        RankState& s = ranks_[c.rank];
        s.state = "bye";
        hang_.SetState(c.rank, "bye");
        s.bye_reason = (j.is_object() ? j.value("reason", std::string()) : std::string());
        s.last_seen_ns = NowNs();
        if (swap_) swap_->Done(c.rank);
        Log("coord")->info("rank {} said goodbye{}", c.rank, s.bye_reason.empty() ? "" : ": " + s.bye_reason);
        return;
      }
      default:
        c.drop_reason = fmt::format("unexpected message type {}", static_cast<int>(f.type));
        return;
    }
  } catch (const std::exception& e) {
    // Why catch here: a shim's malformed JSON (wrong field types) must cost that connection, not the coordinator.
    c.drop_reason = fmt::format("bad message type {}: {}", static_cast<int>(f.type), e.what());
  }
}

void Coordinator::Impl::HandleHello(BusId id, BusClient& c, const json& j) {
  int rank = j.value("rank", -1);
  if (rank < 0 || rank >= opts_.world_size) {
    SendJson(id, ipc::MsgType::kError, {{"what", fmt::format("rank {} outside the world of {}", rank,
                                                             opts_.world_size)}});
    c.drop_reason = fmt::format("hello with rank {}", rank);
    return;
  }
  if (!vr_->IsReal(rank)) {
    // Why refuse: the store already answers for this rank as a virtual one (its ids, its init/ count).
    SendJson(id, ipc::MsgType::kError,
             {{"what", fmt::format("rank {} is virtual in this emulation (real ranks: {})", rank,
                                   fmt::join(opts_.real_ranks, ","))}});
    c.drop_reason = fmt::format("hello from rank {}, which is not a real rank", rank);
    return;
  }
  RankState& s = ranks_[rank];
  if (s.conn != 0 && s.conn != id && clients_.count(s.conn)) {
    Log("coord")->warn("rank {} connected again (pid {}); the previous connection is replaced", rank,
                       j.value("pid", 0));
    clients_.at(s.conn).rank = -1;
  }
  ForgetPrereleases(rank);
  c.rank = rank;
  s.state = "connected";
  s.conn = id;
  s.pid = j.value("pid", 0);
  s.host = j.value("host", std::string());
  s.gpu = j.value("gpu", -1);
  s.gpu_id = j.value("gpu_id", std::string());
  s.can_passthrough = j.value("passthrough", false);
  s.prerelease = j.value("prerelease", false);
  s.local_rank = j.value("local_rank", -1);
  s.connected_ns = s.last_seen_ns = NowNs();
  c.peer = fmt::format("rank {} (pid {})", rank, s.pid);
  if (swap_) swap_->Started(rank, s.pid, !s.gpu_id.empty() ? s.gpu_id : fmt::format("{}/{}", s.host, s.gpu), NowNs());
  json ack = {{"version", ipc::kVersion},     {"run_id", opts_.run_id},        {"payload", opts_.payload},
              {"topology", opts_.topology},   {"graph", opts_.graph},          {"layout", opts_.layout},
              {"out_dir", opts_.out_dir},     {"world_size", opts_.world_size}, {"real_ranks", opts_.real_ranks},
              {"store", fmt::format("{}:{}", ep_.store_host, ep_.store_port)}};
  // Why only under --swap: the rank then asks for room when an allocation fails (kMemRoom); without it nobody
  // could make room, and the allocation fails as it always did.
  if (swap_) ack["swap"] = true;
  SendJson(id, ipc::MsgType::kHelloAck, ack);
  Log("coord")->info("rank {} connected (pid {}, host {}, gpu {})", rank, s.pid, s.host, s.gpu);
}

void Coordinator::Impl::RetryParked(bool timer) {
  if (parked_.empty()) return;
  auto now = std::chrono::steady_clock::now();
  std::vector<Parked> keep;
  std::vector<BusId> blocked;  // clients with a request still parked: their later ones wait behind it
  for (Parked& p : parked_) {
    auto it = clients_.find(p.id);
    if (it == clients_.end()) continue;
    bool final = timer && now >= p.deadline;
    bool behind = std::find(blocked.begin(), blocked.end(), p.id) != blocked.end();
    if (behind || !HandleCommInit(p.id, it->second, p.request, final)) {
      blocked.push_back(p.id);
      keep.push_back(std::move(p));
    }
  }
  parked_ = std::move(keep);
}

bool Coordinator::Impl::HandleCommInit(BusId id, BusClient& c, const json& j, bool final) {
  std::string key = j.value("key", std::string());
  std::string desc = j.value("desc", std::string());
  int nranks = j.value("nranks", 0);
  int comm_rank = j.value("rank", -1);
  std::vector<int> members;
  std::string comm_key, group, group_desc, how;
  bool virtual_leader = false;
  std::string id_bytes;
  if (!key.empty() && ipc::HexDecode(key, &id_bytes)) {
    if (auto ident = vr_->LookupId(id_bytes); ident && !ident->members.empty()) {
      members = ident->members;
      comm_key = ident->comm_key;
      group = ident->group_name;
      group_desc = ident->group_desc;
      virtual_leader = ident->virtual_leader;
      how = "unique id";
    }
  }
  std::string name = j.value("name", std::string());
  if (members.empty() && !name.empty()) {
    if (auto g = vr_->LookupGroupByName(name)) {
      members = g->members;
      group = g->name;
      group_desc = g->desc;
      comm_key = "group:" + name + ":" + key;
      how = "group name";
    }
  }
  if (members.empty() && !desc.empty()) {
    if (auto g = vr_->LookupGroupByCommDesc(desc)) {
      members = g->members;
      group = g->name;
      group_desc = g->desc;
      comm_key = "desc:" + desc + ":" + key;
      how = "description";
    }
  }
  if (members.empty() && j.contains("members") && j["members"].is_array()) {
    // A split or shrink: the member named them (from the hook's scope or the parent); every member of the same
    // child sends the same key (its stable id), so the first one's list names the communicator.
    for (const json& m : j["members"]) {
      if (m.is_number_integer() && m.get<int>() >= 0 && m.get<int>() < opts_.world_size) members.push_back(m.get<int>());
    }
    comm_key = key;
    how = "the member's list";
  }
  if (members.empty() && nranks == opts_.world_size) {
    members.resize(static_cast<size_t>(nranks));
    for (int i = 0; i < nranks; ++i) members[static_cast<size_t>(i)] = i;
    comm_key = "world:" + key;
    how = "world size";
  }
  // Park (the leader's SET of the id may still be on its way) when nothing matched, or when only a name, a
  // description or the world size matched with the wrong size (a p2p communicator named after its parent group).
  const bool wrong_size = how != "unique id" && nranks != 0 && static_cast<int>(members.size()) != nranks;
  if ((members.empty() || wrong_size) && !final && id_bytes.size() == ipc::kNcclIdBytes) return false;
  json reply = {{"key", key}};
  std::string problem;
  if (members.empty()) {
    problem = "members unknown: the unique id did not go through the store and no registered group matches";
  } else if (nranks != 0 && static_cast<int>(members.size()) != nranks) {
    problem = fmt::format("found {} members by {}, the communicator has {}", members.size(), how, nranks);
  } else if (comm_rank >= 0 && (comm_rank >= static_cast<int>(members.size()) ||
                                members[static_cast<size_t>(comm_rank)] != c.rank)) {
    problem = fmt::format("rank {} is not communicator rank {} of the members found by {}", c.rank, comm_rank, how);
  }
  if (!problem.empty()) {
    Log("coord")->warn("comm init from rank {} (key {}..., desc '{}'): {}", c.rank, key.substr(0, 16), desc, problem);
    reply["comm_id"] = 0;
    reply["members"] = json::array();
    reply["real"] = json::array();
    reply["error"] = problem;
    SendJson(id, ipc::MsgType::kCommInfo, reply);
    return true;
  }
  uint32_t comm_id;
  auto it = comm_by_key_.find(comm_key);
  auto by_id0 = key.empty() ? comm_by_id_.end() : comm_by_id_.find(key);
  std::optional<bool> passthrough = false;
  if (it == comm_by_key_.end() && by_id0 == comm_by_id_.end()) {
    passthrough = DecidePassthrough(members, final);
    if (!passthrough) return false;  // park: a real member's GPU is not known yet
  }
  // Why also by the unique id: a leader's kCommInit can beat its own SET of the id to the store and resolve by group
  // name, while its peers resolve by the id; both must land on one communicator (seen as two comm ids in a test).
  auto by_id = key.empty() ? comm_by_id_.end() : comm_by_id_.find(key);
  if (it == comm_by_key_.end() && by_id != comm_by_id_.end()) it = comm_by_key_.find(comms_[by_id->second - 1].key);
  if (it != comm_by_key_.end()) {
    comm_id = it->second;
  } else {
    CommView v;
    v.comm_id = static_cast<uint32_t>(comms_.size() + 1);
    v.key = comm_key;
    v.members = members;
    for (int m : members) {
      if (vr_->IsReal(m)) v.real_members.push_back(m);
    }
    v.passthrough = *passthrough;
    {
      std::vector<int> sorted = members;
      std::sort(sorted.begin(), sorted.end());
      for (const CommView& o : comms_) {
        std::vector<int> os = o.members;
        std::sort(os.begin(), os.end());
        if (os == sorted) ++v.member_twin;
      }
    }
    if (v.passthrough) {
      Log("coord")->info("comm {} ({} members, '{}'): passthrough (real NCCL among its members)", v.comm_id,
                         members.size(), !group_desc.empty() ? group_desc : group);
    }
    comms_.push_back(std::move(v));
    comm_id = comms_.back().comm_id;
    comm_by_key_[comm_key] = comm_id;
    std::vector<bool> is_real;
    for (int m : members) is_real.push_back(vr_->IsReal(m));
    xhub_.AddComm(comm_id, members, is_real);
    HangComm hc;
    hc.name = !group_desc.empty() ? group_desc : !group.empty() ? "group " + group : std::string();
    // torch's lazy 2-rank p2p communicator (its unique id under a "<low>:<high>" key of its process group) carries
    // that group's name; say which pair it is (as flight_recorder.cc names p2p communicators read from dumps), so
    // "comm 1 (default_pg)" is not taken for the whole default group.
    const size_t last = comm_key.rfind("//");
    const std::string tail = last == std::string::npos ? std::string() : comm_key.substr(last + 2);
    const size_t colon = tail.find(':');
    auto digits = [](const std::string& s) {
      return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    };
    if (how == "unique id" && members.size() == 2 && colon != std::string::npos && digits(tail.substr(0, colon)) &&
        digits(tail.substr(colon + 1))) {
      hc.name = fmt::format("{}{}p2p {}:{}", hc.name, hc.name.empty() ? "" : " ", members[0], members[1]);
    }
    hc.members = members;
    hc.real = std::move(is_real);
    hc.pg_name = group;
    hc.pg_desc = group_desc;
    if (!group.empty()) {
      if (auto g = vr_->LookupGroupByName(group)) hc.pg_members = g->members;
    }
    hang_.AddComm(comm_id, std::move(hc));
  }
  if (!key.empty()) comm_by_id_.emplace(key, comm_id);
  std::vector<bool> real;
  for (int m : members) real.push_back(vr_->IsReal(m));
  reply["comm_id"] = comm_id;
  reply["members"] = members;
  reply["real"] = real;
  reply["group"] = group;
  reply["desc"] = group_desc;
  reply["virtual_leader"] = virtual_leader;
  reply["passthrough"] = comms_[comm_id - 1].passthrough;
  SendJson(id, ipc::MsgType::kCommInfo, reply);
  return true;
}

std::optional<bool> Coordinator::Impl::DecidePassthrough(const std::vector<int>& members, bool final) {
  if (!opts_.passthrough || static_cast<int>(members.size()) < std::max(opts_.passthrough_min_members, 1)) {
    return false;
  }
  std::set<std::string> gpus;
  for (int m : members) {
    if (!vr_->IsReal(m)) return false;
    auto it = ranks_.find(m);
    if (it == ranks_.end() || it->second.conn == 0) {
      if (final) return false;
      return std::nullopt;
    }
    const RankState& s = it->second;
    if (!s.can_passthrough || s.gpu_id.empty() || !gpus.insert(s.gpu_id).second) return false;
  }
  return true;
}

void Coordinator::Impl::HandleRealNcclId(BusId id, BusClient& c, const json& j) {
  const uint32_t comm_id = j.value("comm_id", 0u);
  if (comm_id == 0 || comm_id > comms_.size() || !comms_[comm_id - 1].passthrough) {
    SendJson(id, ipc::MsgType::kRealNcclIdInfo,
             {{"comm_id", comm_id}, {"error", fmt::format("comm {} is not a passthrough communicator", comm_id)}});
    return;
  }
  CommView& v = comms_[comm_id - 1];
  if (j.contains("id")) {
    std::string hex = j.value("id", std::string());
    std::string bytes;
    if (!ipc::HexDecode(hex, &bytes) || bytes.size() != ipc::kNcclIdBytes) {
      SendJson(id, ipc::MsgType::kRealNcclIdInfo, {{"comm_id", comm_id}, {"error", "malformed unique id"}});
      return;
    }
    if (!v.real_nccl_id.empty() && v.real_nccl_id != hex) {
      Log("coord")->warn("comm {}: rank {} posted a second real NCCL unique id; the first stays", comm_id, c.rank);
    } else {
      v.real_nccl_id = hex;
    }
  }
  if (v.real_nccl_id.empty()) {
    real_id_waiters_[comm_id].push_back(id);
    return;
  }
  json reply = {{"comm_id", comm_id}, {"id", v.real_nccl_id}};
  SendJson(id, ipc::MsgType::kRealNcclIdInfo, reply);
  auto w = real_id_waiters_.find(comm_id);
  if (w != real_id_waiters_.end()) {
    for (BusId waiter : w->second) {
      if (clients_.count(waiter)) SendJson(waiter, ipc::MsgType::kRealNcclIdInfo, reply);
    }
    real_id_waiters_.erase(w);
  }
}

void Coordinator::Impl::HandleArrive(BusId id, BusClient& c, const ipc::OpArrive& a) {
  // Why copies: OpArrive is packed; references to its fields (fmt, std::pair) would be misaligned.
  const uint32_t comm_id = a.comm_id, op = a.op;
  const uint64_t seq = a.seq, arrival_ns = a.arrival_ns;
  if (comm_id == 0 || comm_id > comms_.size()) {
    SendJson(id, ipc::MsgType::kError, {{"what", fmt::format("kOpArrive for unknown comm {}", comm_id)}});
    return;
  }
  const CommView& comm = comms_[comm_id - 1];
  if (std::find(comm.real_members.begin(), comm.real_members.end(), c.rank) == comm.real_members.end()) {
    SendJson(id, ipc::MsgType::kError,
             {{"what", fmt::format("rank {} is not a member of comm {}", c.rank, comm_id)}});
    return;
  }
  if (swap_ && SwapLateArrival(id, c, a)) return;
  RankState& s = ranks_[c.rank];
  ++s.ops_arrived;
  s.waiting = true;
  s.waiting_comm = comm_id;
  s.waiting_seq = seq;
  s.waiting_op = op;
  s.waiting_since_ns = arrival_ns;
  s.last_seen_ns = NowNs();
  hang_.Arrive(c.rank, a, s.last_seen_ns);
  auto& arrivals = pending_[{comm_id, seq}];
  auto dup = std::find_if(arrivals.begin(), arrivals.end(), [&](const Arrival& x) { return x.rank == c.rank; });
  if (dup != arrivals.end()) {
    Log("coord")->warn("rank {} arrived twice at comm {} seq {}", c.rank, comm_id, seq);
    dup->op = a;
  } else {
    arrivals.push_back(Arrival{c.rank, a});
  }
  if (arrivals.size() < comm.real_members.size()) {
    if (swap_) SwapReleaseOut();
    return;
  }
  if (HoldOnDisagreement(comm, seq, arrivals)) return;
  SendRelease(comm, seq, arrivals, arrivals, s.last_seen_ns, false);
  pending_.erase({comm_id, seq});
  swap_exchanged_.erase({comm_id, seq});
  ++releases_;
}

std::string Coordinator::Impl::SendRelease(const CommView& comm, uint64_t seq, const std::vector<Arrival>& decide_on,
                                           const std::vector<Arrival>& send_to, uint64_t now_ns, bool flush) {
  ReleaseDecision d = opts_.release_policy ? opts_.release_policy->Decide(comm, seq, decide_on)
                                           : DefaultRelease(comm, seq, decide_on);
  ipc::OpRelease rel{};
  rel.comm_id = comm.comm_id;
  rel.seq = seq;
  rel.release_ns = d.release_ns;
  rel.last_rank = d.last_rank;
  std::string frame = ipc::EncodePod(ipc::MsgType::kOpRelease, rel);
  for (const Arrival& x : send_to) {
    RankState& rs = ranks_[x.rank];
    if (rs.waiting && rs.waiting_comm == comm.comm_id && rs.waiting_seq == seq) rs.waiting = false;
    hang_.Release(x.rank, comm.comm_id, seq, now_ns);
    const uint64_t nops = std::max<uint32_t>(x.op.nops, 1);
    auto pc = predict_.find(comm.comm_id);
    if (pc != predict_.end()) {
      pc->second.released = std::max(pc->second.released, seq + nops);
      pc->second.next = std::max(pc->second.next, pc->second.released);
      predict_dirty_ = true;
    } else if (opts_.release_policy && rs.prerelease && comm.real_members.size() == 1) {
      predict_[comm.comm_id] = PredictCursor{seq + nops, seq + nops};
      predict_dirty_ = true;
    }
    // A unit whose every operation was prereleased: the rank released it itself (the same rule); no frame.
    bool all = true;
    uint64_t rule = 0;
    const uint32_t unit_op = x.op.op;
    for (uint64_t k = 0; k < nops; ++k) {
      auto it = prereleased_.find({comm.comm_id, seq + k});
      if (it == prereleased_.end()) {
        all = false;
        continue;
      }
      // The rank's test (ipc::OpPrerelease): a unit of another op than the graph's does not take it.
      if (unit_op != 0 && it->second.op != unit_op) all = false;
      const ReleasePolicy::Prerelease& p = it->second;
      rule = std::max(rule, ipc::PrereleaseAt(x.op.arrival_ns, p.floor_ns, p.dur_ns, x.op.model_dur_ns));
      prereleased_.erase(it);
    }
    if (all) {
      ++prereleases_used_;
      if (rule != d.release_ns && ++prerelease_mismatches_ <= 10) {
        Log("coord")->warn("comm {} seq {}: rank {} released itself at {} (prerelease) but the decision is {} "
                           "({:+.3f} us)",
                           comm.comm_id, seq, x.rank, rule, uint64_t{d.release_ns},
                           (static_cast<double>(d.release_ns) - static_cast<double>(rule)) * 1e-3);
      }
      continue;
    }
    auto cl = clients_.find(rs.conn);
    if (cl == clients_.end()) continue;
    cl->second.out.append(frame);
    if (flush) Flush(cl->first, cl->second);
  }
  return frame;
}

bool Coordinator::Impl::StopIdle() const {
  pollfd p{epoll_fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

void Coordinator::Impl::SendPrereleases() {
  if (!opts_.release_policy || predict_.empty()) return;
  const uint64_t epoch = opts_.release_policy->PredictEpoch();
  if (!predict_dirty_ && epoch == predict_epoch_) return;
  predict_dirty_ = false;
  // Why the epoch read before the pass: Predict's own advances move it, and a communicator asked before them in
  // this pass must be asked again.
  predict_epoch_ = epoch;
  // Why a window: the rank needs the next few answers before it arrives; further ones cost the virtual ranks'
  // advance now, which Idle does cheaper in bulk.
  constexpr uint64_t kAhead = 4;
  for (auto& [comm_id, pc] : predict_) {
    if (comm_id < 1 || comm_id > comms_.size()) continue;
    const CommView& comm = comms_[comm_id - 1];
    if (comm.real_members.size() != 1) continue;
    const int rank = comm.real_members[0];
    RankState& rs = ranks_[rank];
    auto cl = clients_.find(rs.conn);
    if (cl == clients_.end()) continue;
    bool sent = false;
    while (pc.next < pc.released + kAhead) {
      // A unit the rank already reported is decided by its arrival (pending_ holds it until all members came).
      if (pending_.count({comm_id, pc.next})) break;
      std::optional<ReleasePolicy::Prerelease> p = opts_.release_policy->Predict(comm, pc.next, rank);
      if (!p) break;
      ipc::OpPrerelease pr{};
      pr.comm_id = comm_id;
      pr.seq = pc.next;
      pr.floor_ns = p->floor_ns;
      pr.dur_ns = p->dur_ns;
      pr.floor_rank = p->floor_rank;
      pr.op = p->op;
      cl->second.out.append(ipc::EncodePod(ipc::MsgType::kOpPrerelease, pr));
      prereleased_[{comm_id, pc.next}] = *p;
      ++prereleases_sent_;
      ++pc.next;
      sent = true;
    }
    if (sent) Flush(cl->first, cl->second);
  }
}

void Coordinator::Impl::ForgetPrereleases(int rank) {
  // A rank's new connection (a restarted process) numbers its operations from 0 again: what was prereleased to the
  // old one must neither be counted as taken nor suppress an answer.
  for (auto it = predict_.begin(); it != predict_.end();) {
    const uint32_t comm_id = it->first;
    const bool mine = comm_id >= 1 && comm_id <= comms_.size() && comms_[comm_id - 1].real_members.size() == 1 &&
                      comms_[comm_id - 1].real_members[0] == rank;
    if (!mine) {
      ++it;
      continue;
    }
    for (auto p = prereleased_.lower_bound({comm_id, 0}); p != prereleased_.end() && p->first.first == comm_id;)
      p = prereleased_.erase(p);
    it = predict_.erase(it);
  }
}

bool Coordinator::Impl::HoldOnDisagreement(const CommView& comm, uint64_t seq, const std::vector<Arrival>& arrivals) {
  std::vector<std::pair<int, HangOp>> ops;
  for (const Arrival& a : arrivals) {
    HangOp o;
    o.comm_id = a.op.comm_id;
    o.seq = a.op.seq;
    o.op = a.op.op;
    o.bytes = a.op.bytes;
    int32_t peer = a.op.peer;
    if (peer >= 0 && static_cast<size_t>(peer) < comm.members.size()) o.peer = comm.members[static_cast<size_t>(peer)];
    ops.emplace_back(a.rank, o);
  }
  std::string what = Disagreement(ops, comm.members.size() == 2);
  if (what.empty()) return false;
  if (held_.emplace(std::make_pair(comm.comm_id, seq), what).second) {
    hang_.Hold(comm.comm_id, seq, what);
    std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string text =
        fmt::format("prism: {} seq {}: the real members disagree ({}):", hang_.CommName(comm.comm_id), seq, what);
    for (const auto& [rank, o] : ops) text += fmt::format(" rank {} {};", rank, HangOpText(o));
    text.back() = '\n';
    text += "  held there, as NCCL would hang or corrupt; the hang diagnosis follows after --hang-timeout\n";
    // Why stderr: the first sign of the bug the user is looking for, whatever the log level.
    std::fprintf(stderr, "%s", text.c_str());
    std::fflush(stderr);
    Log("coord")->warn("comm {} seq {}: real members disagree ({}); held", comm.comm_id, seq, what);
  }
  return true;
}

json Coordinator::Impl::StatusLocked() {
  json j;
  j["version"] = 1;
  j["t_ns"] = NowNs();
  j["run_id"] = opts_.run_id;
  j["world_size"] = opts_.world_size;
  j["real_ranks"] = opts_.real_ranks;
  j["virtual_ranks"] = opts_.world_size - static_cast<int>(opts_.real_ranks.size());
  j["payload"] = opts_.payload;
  j["graph"] = opts_.graph;
  j["comms"] = comms_.size();
  j["releases"] = releases_;
  j["prereleases"] = {{"sent", prereleases_sent_}, {"used", prereleases_used_}, {"disagreed", prerelease_mismatches_}};
  json ranks = json::array();
  for (const auto& [r, s] : ranks_) {
    json x = {{"rank", r},
              {"state", s.state},
              {"pid", s.pid},
              {"host", s.host},
              {"gpu", s.gpu},
              {"iterations", s.iterations},
              {"last_iteration_s", static_cast<double>(s.last_iter_dur_ns) * 1e-9},
              {"peak_memory_bytes", s.peak_bytes},
              {"current_memory_bytes", s.current_bytes},
              {"torch_max_allocated", s.torch_max_allocated},
              {"ops_arrived", s.ops_arrived},
              {"ops_recorded", s.ops_recorded},
              {"last_seen_ns", s.last_seen_ns}};
    if (!s.bye_reason.empty()) x["bye_reason"] = s.bye_reason;
    if (swap_) x["swap"] = SwapPhaseName(swap_->phase(r));
    if (s.has_record) {
      uint32_t comm = s.last_record.comm_id, op = s.last_record.op;
      uint64_t seq = s.last_record.seq, bytes = s.last_record.bytes;
      x["last_op"] = {{"comm", comm}, {"seq", seq}, {"op", op}, {"bytes", bytes}};
    }
    if (s.waiting) {
      json w = {{"comm", s.waiting_comm}, {"seq", s.waiting_seq}, {"op", s.waiting_op},
                {"kind", OpName(s.waiting_op)}, {"since_ns", s.waiting_since_ns}};
      auto p = pending_.find({s.waiting_comm, s.waiting_seq});
      if (p != pending_.end() && s.waiting_comm >= 1 && s.waiting_comm <= comms_.size()) {
        std::vector<int> missing;
        for (int m : comms_[s.waiting_comm - 1].real_members) {
          bool in = std::any_of(p->second.begin(), p->second.end(), [&](const Arrival& a) { return a.rank == m; });
          if (!in) missing.push_back(m);
        }
        w["waiting_for"] = missing;
      }
      x["waiting"] = w;
    }
    ranks.push_back(std::move(x));
  }
  j["ranks"] = std::move(ranks);
  json held = json::array();
  for (const auto& [key, what] : held_) held.push_back({{"comm", key.first}, {"seq", key.second}, {"differs", what}});
  j["held"] = std::move(held);
  if (swap_) j["swap"] = SwapJsonLocked();
  AddPositions(hang_, &j);
  return j;
}

std::string Coordinator::Impl::StatusJson() {
  json j;
  {
    std::lock_guard<std::mutex> lock(mu_);
    j = StatusLocked();
  }
  store::ServerStats st = store_.Stats();
  j["store"] = {{"host", ep_.store_host},
                {"port", ep_.store_port},
                {"clients", st.clients},
                {"accepted", st.accepted},
                {"dropped", st.dropped},
                {"keys", st.store.keys},
                {"bytes", st.store.bytes},
                {"waits", st.store.waits},
                {"requests", st.store.requests},
                {"synthesized", st.store.materialized},
                {"waited_keys", store_.WaitedKeys(20)},
                {"unresolved_groups", vr_->Unresolved()}};
  return j.dump(2) + "\n";
}

void Coordinator::Impl::MaybeWriteStatus(bool force) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Store activity changes status too (clients, waits): refresh at least every 10 intervals.
    if (!force && !status_dirty_ && ++idle_ticks_ < 10) return;
    idle_ticks_ = 0;
    status_dirty_ = false;
  }
  std::string text = StatusJson();
  if (!WriteFileAtomic(ep_.status_path, text)) {
    Log("coord")->warn("cannot write {}: {}", ep_.status_path, std::strerror(errno));
  }
  // Why also in the store: `prism-run status HOST:PORT` and prism-runs joining from other hosts read it there.
  store_.Call([&](store::StoreState& st) { st.Set(kStatusKey, text); });
}

void Coordinator::Impl::CheckHang() {
  std::optional<HangDiagnosis> d;
  {
    std::lock_guard<std::mutex> lock(mu_);
    d = hang_.Check(NowNs());
  }
  if (!d) return;
  std::string path = (std::filesystem::path(opts_.out_dir) / "hang.json").string();
  std::string hang_json = d->ToJson();
  if (!WriteFileAtomic(path, hang_json)) Log("coord")->error("cannot write {}: {}", path, std::strerror(errno));
  store_.Call([&](store::StoreState& st) { st.Set(kHangKey, hang_json); });
  WriteFlightRecorder();
  std::string text = d->ToText();
  // Why stderr as well as the log: the diagnosis is the answer the user waits for, whatever the log level.
  std::fprintf(stderr, "%s  (written to %s)\n", text.c_str(), path.c_str());
  std::fflush(stderr);
  Log("coord")->warn("hang diagnosed: {} rank(s) waiting, {} mismatch(es), {} cycle(s); see {}", d->waits.size(),
                     d->mismatches.size(), d->cycles.size(), path);
  if (opts_.on_hang) opts_.on_hang(path);
}

void Coordinator::Impl::WriteFlightRecorder() {
  std::vector<FrDump> dumps;
  FrVirtualResult virt;
  std::string warning;
  const FrVirtualOptions vopt = FrVirtualOptionsFromEnv(&warning);
  {
    std::lock_guard<std::mutex> lock(mu_);
    dumps = FrDumpsFromDetector(hang_, opts_.world_size, opts_.real_ranks);
    // Why also virtual ranks: torch's analyzer wants every member's dump (flight_recorder.h, docs/hang.md).
    if (!dumps.empty()) virt = FrVirtualDumps(hang_, opts_.world_size, opts_.real_ranks, vopt);
  }
  if (dumps.empty()) return;
  std::string dir = (std::filesystem::path(opts_.out_dir) / kFrDirName).string(), error;
  if (!WriteFrDumps(dumps, dir, &error)) Log("coord")->error("Flight Recorder dumps: {}", error);
  if (!warning.empty()) Log("coord")->warn("Flight Recorder: {}", warning);
  if (!virt.dumps.empty() && !WriteFrDumps(virt.dumps, dir, &error))
    Log("coord")->error("Flight Recorder virtual ranks' dumps: {}", error);
  Log("coord")->info("Flight Recorder: {} real and {} virtual rank dump(s) in {}; groups covered: {}{}", dumps.size(),
                     virt.dumps.size(), dir, virt.covered.empty() ? "none" : fmt::format("{}", fmt::join(virt.covered, "; ")),
                     virt.uncovered.empty() ? ""
                                            : fmt::format("; not covered (torch's analyzer then needs "
                                                          "--allow-incomplete-ranks --mismatch_cap 1000000): {}",
                                                          fmt::join(virt.uncovered, "; ")));
  // For prism-runs on other hosts (they copy their ranks' dumps into their own output).
  store_.Call([&](store::StoreState& st) {
    for (const FrDump& d : dumps) {
      st.Set(std::string(kFrKeyPrefix) + kFrPrefix + std::to_string(d.rank), pickle::Dumps(*FrDumpToPickle(d)));
    }
  });
}

// ---- Context switching (swap_scheduler.h, docs/collect.md "Context switching") ----

namespace {
// MemAvailable of /proc/meminfo in bytes (0 when unknown).
uint64_t HostMemAvailable() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}
}  // namespace

bool Coordinator::Impl::StartSwap(std::string* error) {
  swap_driver_ = opts_.swap_driver;
  if (!swap_driver_) {
    std::string why;
    std::unique_ptr<SwapDriver> d = OpenCudaCheckpointDriver(opts_.swap.driver, &why);
    if (!d) {
      *error = "coordinator: context switching (--swap) needs the CUDA driver's checkpoint API: " + why;
      return false;
    }
    swap_driver_ = std::move(d);
  }
  SwapConfig cfg = opts_.swap;
  std::string cap_from = "--gpu-mem-cap";
  if (cfg.gpu_cap_bytes == 0) {
    const uint64_t total = swap_driver_->DeviceMemory(0);
    if (total == 0) {
      *error = "coordinator: --swap: the driver did not say how much memory GPU 0 has; give --gpu-mem-cap";
      return false;
    }
    // Why a margin: the driver, other processes and fragmentation take some of it.
    const uint64_t margin = std::max<uint64_t>(2ull << 30, total / 20);
    cfg.gpu_cap_bytes = total > margin ? total - margin : total;
    cap_from = fmt::format("GPU 0's {} less {}", FormatBytes(total), FormatBytes(margin));
  }
  std::string host_from = "--host-mem-cap";
  if (cfg.host_cap_bytes == 0) {
    const uint64_t avail = HostMemAvailable();
    // Why 80 % of what is available: a checkpointed rank lives in host RAM; 3 x 60 GiB on a 128 GB host killed one.
    cfg.host_cap_bytes = avail / 10 * 8;
    host_from = avail ? fmt::format("80% of the {} available", FormatBytes(avail)) : "unknown: unlimited";
  }
  swap_usage_ = opts_.swap_usage;
  if (swap_usage_) {
    swap_usage_from_ = "measured per process (the caller's source)";
  } else if (cfg.usage_library.empty()) {
    swap_usage_from_ = fmt::format("tracked peak + {} context (measuring is off)", FormatBytes(cfg.context_bytes));
  } else {
    std::string why;
    swap_usage_ = OpenNvmlUsage(cfg.usage_library, &why);
    swap_usage_from_ = swap_usage_ ? std::string("measured per process (NVML)")
                                   : fmt::format("tracked peak + {} context (NVML: {})",
                                                 FormatBytes(cfg.context_bytes), why);
  }
  swap_ = std::make_unique<SwapScheduler>(cfg);
  for (int r : opts_.real_ranks) {
    auto g = cfg.rank_gpu.find(r);
    swap_->AddRank(r, g == cfg.rank_gpu.end() ? std::string() : g->second);
  }
  // Why printed once the coordinator is up: a start that fails later (its store port taken) is retried.
  swap_banner_ =
      fmt::format("prism: swap: on; GPU cap {} ({}), host budget {} ({}), {} rank(s) start as GPUs have room; "
                  "footprints: {}",
                  FormatBytes(cfg.gpu_cap_bytes), cap_from,
                  cfg.host_cap_bytes ? FormatBytes(cfg.host_cap_bytes) : std::string("unlimited"), host_from,
                  opts_.real_ranks.size(), swap_usage_from_);
  swap_last_progress_ = std::chrono::steady_clock::now();
  swap_thread_ = std::thread([this] { SwapWorker(); });
  return true;
}

void Coordinator::Impl::SwapPrint(const std::string& line) {
  if (opts_.swap_print) {
    opts_.swap_print(line);
  } else {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

std::string Coordinator::Impl::SwapProgressLine() {
  SwapStats s = swap_->Stats();
  return fmt::format("prism: swap: ranks finished {}/{}, on GPU {}, swapped out {}, not started {}; swaps {} out + {} "
                     "in, {} moved, {:.1f} s swapping",
                     s.finished, s.ranks, s.resident, s.out, s.unstarted, s.swaps_out, s.swaps_in,
                     FormatBytes(s.bytes_out + s.bytes_in), s.seconds_out + s.seconds_in);
}

void Coordinator::Impl::HandleMemRoom(BusId id, BusClient& c, const json& j) {
  const uint64_t req = j.value("id", uint64_t{0}), bytes = j.value("bytes", uint64_t{0});
  const uint64_t current = j.value("current", uint64_t{0});
  // idle (additive in ipc version 3; absent from an older libprism: false): the rank synchronised its device before
  // asking, so it may be swapped out for another rank's room while it waits.
  const bool idle = j.value("idle", false);
  if (!swap_ || !swap_->RequestRoom(c.rank, req, bytes, current, NowNs(), idle)) {
    SendJson(id, ipc::MsgType::kMemRoomAnswer,
             {{"id", req}, {"ok", false}, {"why", swap_ ? "the rank is not scheduled" : "context switching is off"}});
    return;
  }
  Log("coord")->info("swap: rank {} waits for room: an allocation of {} failed (it holds {}); footprint now {}{}",
                     c.rank, FormatBytes(bytes), FormatBytes(current), FormatBytes(swap_->Footprint(c.rank)),
                     idle ? "; its GPU is idle" : "");
}

void Coordinator::Impl::SwapAnswerRooms(uint64_t now) {
  for (const RoomAnswer& a : swap_->TakeRoomAnswers(now)) {
    auto rs = ranks_.find(a.rank);
    if (rs != ranks_.end() && clients_.count(rs->second.conn)) {
      SendJson(rs->second.conn, ipc::MsgType::kMemRoomAnswer, {{"id", a.id}, {"ok", a.ok}, {"why", a.why}});
    }
    if (a.ok) {
      Log("coord")->info("swap: rank {} may retry its allocation of {}: {}", a.rank, FormatBytes(a.bytes), a.why);
    } else {
      SwapPrint(fmt::format("prism: swap: rank {}'s allocation of {} gets no room ({}); it fails as without --swap",
                            a.rank, FormatBytes(a.bytes), a.why));
    }
    status_dirty_ = true;
  }
}

void Coordinator::Impl::PumpSwap() {
  const uint64_t now = NowNs();
  SwapAnswerRooms(now);
  // Why progress: a rank started late (admitted when its GPU had room) is the run moving on; the ranks waiting for
  // it in an exchange must not be diagnosed as a hang while it starts up.
  for (int r : swap_->Starting()) hang_.Progress(r, now);
  for (;;) {
    std::optional<SwapAction> a = swap_->Next(now);
    if (!a) break;
    if (a->kind == SwapAction::kAdmit) {
      Log("coord")->info("swap: rank {} may start on GPU {} ({})", a->rank, a->gpu, a->why);
      status_dirty_ = true;
      continue;  // the launcher polls SwapAdmitted; look for more
    }
    Log("coord")->info("swap: {} rank {} (pid {}, {}) on GPU {}: {}", SwapActionName(a->kind), a->rank, a->pid,
                       FormatBytes(a->bytes), a->gpu, a->why);
    {
      std::lock_guard<std::mutex> lock(swap_mu_);
      swap_job_ = *a;
    }
    swap_cv_.notify_all();
    break;  // one checkpoint call at a time
  }
  SwapReleaseOut();  // a rank that just began swapping out no longer holds up the releases it was needed for
  SwapAnswerRooms(now);
  for (const std::string& n : swap_->TakeNotices()) SwapPrint("prism: " + n);
  const SwapStats s = swap_->Stats();
  const uint64_t mark = s.swaps_out + s.swaps_in + static_cast<uint64_t>(s.finished);
  const auto t = std::chrono::steady_clock::now();
  if (mark != swap_progress_mark_ &&
      t - swap_last_progress_ >= std::chrono::duration<double>(std::max(opts_.swap_progress_s, 0.0))) {
    swap_progress_mark_ = mark;
    swap_last_progress_ = t;
    SwapPrint(SwapProgressLine());
  }
}

void Coordinator::Impl::SwapWorker() {
  for (;;) {
    SwapAction a;
    {
      std::unique_lock<std::mutex> lock(swap_mu_);
      swap_cv_.wait(lock, [&] { return swap_stop_ || swap_job_.has_value(); });
      if (swap_stop_) return;
      a = *swap_job_;
      swap_job_.reset();
    }
    SwapResult r = a.kind == SwapAction::kSwapOut ? swap_driver_->SwapOut(a.pid, swap_->config().lock_timeout_ms)
                                                  : swap_driver_->SwapIn(a.pid);
    std::lock_guard<std::mutex> lock(mu_);
    swap_->Finished(a, r.ok, r.seconds, NowNs());
    status_dirty_ = true;
    // Why progress: a long checkpoint is the run moving on; the hang diagnosis must not take it for a stall.
    if (r.ok) hang_.Progress(a.rank, NowNs());
    if (r.ok) {
      Log("coord")->info("swap: rank {} swapped {} in {:.3f} s ({:.2f} GB/s); GPU {} holds {}, host {}", a.rank,
                         a.kind == SwapAction::kSwapOut ? "out" : "in", r.seconds,
                         r.seconds > 0 ? static_cast<double>(a.bytes) / r.seconds / 1e9 : 0.0, a.gpu,
                         FormatBytes(swap_->GpuUsed(a.gpu)), FormatBytes(swap_->HostUsed()));
    } else {
      SwapPrint(fmt::format("prism: swap: {} rank {} failed: {}{}", SwapActionName(a.kind), a.rank, r.error,
                            a.kind == SwapAction::kSwapOut ? "; it stays on the GPU"
                                                           : "; the rank is given up on (its process may be stuck)"));
    }
    PumpSwap();
  }
}

void Coordinator::Impl::UpdateSwapWaits() {
  std::map<int, std::vector<int>> waiting_for;
  std::map<uint32_t, std::vector<int>> posted;  // comm -> real members blocked in one of its collectives
  for (const ExchangeHub::Wait& w : xhub_.Waits()) {
    if (!w.begin || w.rank < 0) continue;
    // Why not sends: unless PRISM_SEND_RENDEZVOUS=1 a send completes when posted; its rank is not blocked.
    if (w.op == 103) continue;
    if (w.op == 104) {
      waiting_for[w.rank].push_back(w.peer >= 0 ? w.peer : w.rank);
      continue;
    }
    posted[w.comm_id].push_back(w.rank);
  }
  for (const auto& [comm_id, ranks] : posted) {
    std::vector<int> missing;
    if (comm_id >= 1 && comm_id <= comms_.size()) {
      for (int m : comms_[comm_id - 1].real_members) {
        if (std::find(ranks.begin(), ranks.end(), m) == ranks.end()) missing.push_back(m);
      }
    }
    for (int r : ranks) {
      auto& v = waiting_for[r];
      v.insert(v.end(), missing.begin(), missing.end());
      if (missing.empty()) v.push_back(r);  // blocked all the same (the answer is on its way)
    }
  }
  for (const auto& [r, s] : ranks_) {
    auto it = waiting_for.find(r);
    swap_->SetWaits(r, it == waiting_for.end() ? std::vector<int>{} : it->second);
  }
}

void Coordinator::Impl::SwapReleaseOut() {
  std::vector<std::pair<uint32_t, uint64_t>> done;
  for (auto& [key, arrivals] : pending_) {
    const auto [comm_id, seq] = key;
    if (arrivals.empty() || comm_id < 1 || comm_id > comms_.size()) continue;
    const CommView& comm = comms_[comm_id - 1];
    auto ex = swap_exchanged_.find(key);
    std::vector<int> missing;
    bool ok = ex != swap_exchanged_.end();
    for (int m : comm.real_members) {
      if (!ok) break;
      if (std::any_of(arrivals.begin(), arrivals.end(), [&](const Arrival& x) { return x.rank == m; })) continue;
      // Why only a locked member: a resident one sends its arrival in microseconds, with its real GPU time.
      const SwapPhase ph = swap_->phase(m);
      ok = ex->second.count(m) > 0 && (ph == SwapPhase::kSwappingOut || ph == SwapPhase::kOut);
      missing.push_back(m);
    }
    if (!ok || missing.empty()) continue;
    if (HoldOnDisagreement(comm, seq, arrivals)) continue;
    // Its arrival stands in as the latest known one: it posted before the exchange completed, which the last real
    // arrival's rank did after reaching the operation (a swapped-out member was blocked, so never the last).
    Arrival base = *std::max_element(arrivals.begin(), arrivals.end(), [](const Arrival& a, const Arrival& b) {
      return a.op.arrival_ns < b.op.arrival_ns;
    });
    std::vector<Arrival> all = arrivals;
    for (int m : missing) all.push_back(Arrival{m, base.op});
    const std::string frame = SendRelease(comm, seq, all, arrivals, NowNs(), true);
    for (int m : missing) swap_owed_[{m, comm_id, seq}] = frame;
    Log("coord")->debug("swap: comm {} seq {} released without the arrival of swapped-out rank(s) {}", comm_id, seq,
                        fmt::join(missing, ","));
    done.push_back(key);
  }
  for (const auto& key : done) {
    pending_.erase(key);
    swap_exchanged_.erase(key);
    ++releases_;
  }
}

bool Coordinator::Impl::SwapLateArrival(BusId id, BusClient& c, const ipc::OpArrive& a) {
  auto it = swap_owed_.find({c.rank, a.comm_id, a.seq});
  if (it == swap_owed_.end()) return false;
  RankState& s = ranks_[c.rank];
  ++s.ops_arrived;
  s.last_seen_ns = NowNs();
  hang_.Arrive(c.rank, a, s.last_seen_ns);
  hang_.Release(c.rank, a.comm_id, a.seq, s.last_seen_ns);
  auto cl = clients_.find(id);
  if (cl != clients_.end()) cl->second.out.append(it->second);
  swap_owed_.erase(it);
  return true;
}

namespace {
// Local TCP port -> socket inode of the connections to `server_port` on this host (/proc/net/tcp, tcp6).
std::map<uint16_t, uint64_t> StoreSocketInodes(uint16_t server_port) {
  std::map<uint16_t, uint64_t> out;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout;
      uint64_t inode = 0;
      if (!(ls >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
      auto port = [](const std::string& a) -> long {
        const size_t c = a.rfind(':');
        return c == std::string::npos ? -1 : std::strtol(a.c_str() + c + 1, nullptr, 16);
      };
      if (port(remote) == server_port && port(local) > 0 && inode != 0) out[static_cast<uint16_t>(port(local))] = inode;
    }
  }
  return out;
}
}  // namespace

void Coordinator::Impl::SwapStoreWaits() {
  // Outside mu_: the store answers on its own thread, and /proc is read here.
  const std::vector<std::string> peers = store_.BlockedPeers();
  std::map<std::string, int> known;
  std::map<int, int> pid_rank;
  {
    std::lock_guard<std::mutex> lock(mu_);
    known = swap_store_peer_rank_;
    for (const auto& [r, s] : ranks_) {
      if (s.pid > 0 && s.state == "connected") pid_rank[s.pid] = r;
    }
  }
  std::map<std::string, int> now_known;
  std::set<int> blocked;
  std::map<uint64_t, std::string> wanted;  // inode -> peer
  std::map<uint16_t, uint64_t> inodes;
  for (const std::string& p : peers) {
    auto k = known.find(p);
    if (k != known.end()) {
      now_known[p] = k->second;
      blocked.insert(k->second);
      continue;
    }
    const size_t c = p.rfind(':');
    if (c == std::string::npos) continue;
    if (inodes.empty()) inodes = StoreSocketInodes(store_.port());
    auto in = inodes.find(static_cast<uint16_t>(std::strtoul(p.c_str() + c + 1, nullptr, 10)));
    if (in != inodes.end()) wanted[in->second] = p;
  }
  // Which rank holds the socket: its pid (from kHello) has a descriptor on it. Only ranks on this host are found.
  for (const auto& [pid, rank] : pid_rank) {
    if (wanted.empty()) break;
    std::error_code ec;
    for (const auto& fd : std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", pid), ec)) {
      std::error_code ec2;
      const std::string target = std::filesystem::read_symlink(fd.path(), ec2).string();
      if (ec2 || target.rfind("socket:[", 0) != 0) continue;
      auto w = wanted.find(std::strtoull(target.c_str() + 8, nullptr, 10));
      if (w == wanted.end()) continue;
      now_known[w->second] = rank;
      blocked.insert(rank);
      wanted.erase(w);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!swap_) return;
  // Why keep only the blocked ones: a port is reused by a later connection, the mapping must not outlive its own.
  swap_store_peer_rank_ = std::move(now_known);
  for (const auto& [r, s] : ranks_) swap_->SetStoreWait(r, blocked.count(r) > 0);
  PumpSwap();
}

json Coordinator::Impl::SwapJsonLocked() {
  SwapStats s = swap_->Stats();
  const SwapConfig& cfg = swap_->config();
  return {{"gpu_cap_bytes", cfg.gpu_cap_bytes},
          {"host_cap_bytes", cfg.host_cap_bytes},
          {"ranks", s.ranks},
          {"finished", s.finished},
          {"on_gpu", s.resident},
          {"swapped_out", s.out},
          {"not_started", s.unstarted},
          {"swaps_out", s.swaps_out},
          {"swaps_in", s.swaps_in},
          {"failures", s.failures},
          {"bytes_out", s.bytes_out},
          {"bytes_in", s.bytes_in},
          {"seconds_out", s.seconds_out},
          {"seconds_in", s.seconds_in},
          {"peak_gpu_bytes", s.peak_gpu_bytes},
          {"peak_host_bytes", s.peak_host_bytes},
          {"rooms_granted", s.rooms_granted},
          {"rooms_refused", s.rooms_refused},
          {"room_swaps_out", s.room_swaps_out},
          {"footprint_source", swap_usage_from_},
          {"footprints_measured", s.measured},
          {"context_bytes", cfg.context_bytes}};
}

void Coordinator::Impl::SwapMeasure() {
  const auto t = std::chrono::steady_clock::now();
  std::map<int, int> pid_rank;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!swap_) return;
    if (t - swap_usage_last_ < std::chrono::duration<double>(std::max(swap_->config().usage_interval_s, 0.0))) return;
    // Why this host's ranks only: NVML sees this host's GPUs, and a remote rank's pid may be a local process's.
    const std::string here = HostName();
    for (const auto& [r, s] : ranks_) {
      if (s.pid > 0 && s.state == "connected" && (s.host.empty() || s.host == here)) pid_rank[s.pid] = r;
    }
  }
  swap_usage_last_ = t;
  if (pid_rank.empty()) return;
  // Outside mu_: an NVML query takes milliseconds. The scheduler keeps only measurements of resident ranks.
  std::map<int, uint64_t> by_pid;
  std::string why;
  const bool ok = swap_usage_(&by_pid, &why);
  std::lock_guard<std::mutex> lock(mu_);
  if (!swap_) return;
  if (!ok) {
    if (swap_usage_logged_.insert(-1).second) Log("coord")->warn("swap: measuring GPU memory per process: {}", why);
    return;
  }
  for (const auto& [pid, rank] : pid_rank) {
    auto it = by_pid.find(pid);
    if (it == by_pid.end()) continue;
    swap_->Measured(rank, it->second);
    if (swap_->IsMeasured(rank) && swap_usage_logged_.insert(rank).second) {
      const RankState& s = ranks_[rank];
      Log("coord")->info("swap: rank {} (pid {}) uses {} of GPU memory (tracked peak {}): footprint {}", rank, pid,
                         FormatBytes(it->second), FormatBytes(s.peak_bytes), FormatBytes(swap_->Footprint(rank)));
    }
  }
  PumpSwap();  // a footprint smaller than assumed may make room for a rank
}

bool Coordinator::Impl::SwapAdmitted(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!swap_) return true;
  return swap_->Admitted(rank);
}

void Coordinator::Impl::SwapRankExited(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!swap_) return;
  swap_->Done(rank);
  PumpSwap();
}

SwapStats Coordinator::Impl::SwapSummary() {
  std::lock_guard<std::mutex> lock(mu_);
  return swap_ ? swap_->Stats() : SwapStats{};
}

Coordinator::Coordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Coordinator::~Coordinator() { Stop(); }

std::unique_ptr<Coordinator> Coordinator::Start(const CoordinatorOptions& opts, std::string* error) {
  auto impl = std::make_unique<Impl>();
  if (!impl->Start(opts, error)) {
    impl->Stop();
    return nullptr;
  }
  return std::unique_ptr<Coordinator>(new Coordinator(std::move(impl)));
}

const CoordinatorEndpoints& Coordinator::endpoints() const { return impl_->ep_; }
void Coordinator::Stop() {
  if (impl_) impl_->Stop();
}
void Coordinator::RegisterGroup(const std::string& name, std::vector<int> members, const std::string& desc) {
  impl_->RegisterGroup(name, std::move(members), desc);
}
std::string Coordinator::StatusJson() { return impl_->StatusJson(); }
VirtualRanks& Coordinator::virtual_ranks() { return *impl_->vr_; }
bool Coordinator::SwapAdmitted(int rank) { return impl_->SwapAdmitted(rank); }
void Coordinator::SwapRankExited(int rank) { impl_->SwapRankExited(rank); }
SwapStats Coordinator::SwapSummary() { return impl_->SwapSummary(); }

}  // namespace prism::coord
