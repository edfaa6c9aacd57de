// The wiring of the coordinator's parts (coordinator_state.h holds what they share): the event bus (event_bus.h)
// carries frames to HandleFrame, which hands each to its part: communicators (comm_registry.h), releases
// (release_path.h), context switching (swap_controller.h); the loop's tick refreshes status.json (status_writer.h)
// and checks for hangs (hang_watch.h). Rank bookkeeping (kHello, kOpRecord, kMemory, kIteration, kBye) stays here.
#include "coordinator/coordinator.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/document_shape.h"
#include "common/log.h"
#include "common/net.h"
#include "prism/limits.h"
#include "coordinator/comm_registry.h"
#include "coordinator/coordinator_state.h"
#include "coordinator/hang_watch.h"
#include "coordinator/release_path.h"
#include "coordinator/status_writer.h"
#include "coordinator/store/store_server.h"
#include "coordinator/swap_controller.h"

namespace prism::coord {

using json = nlohmann::json;

namespace {

// Why the shape first: one 16 MiB frame can hold 8 million nested brackets or values, and a parsed value takes
// 16-48 bytes; the scan is far cheaper than the parse (document_shape.h).
bool ShapeOk(BusClient& c, const ipc::FrameView& f) {
  std::string why;
  const DocumentBounds bounds{limits::kMaxBusJsonDepth, limits::kMaxBusJsonValues};
  if (CheckJsonShape(f.payload, bounds, &why)) return true;
  c.drop_reason = fmt::format("message type {}: JSON {}", static_cast<int>(f.type), why);
  return false;
}

// The frame's JSON object; false (the client is dropped) otherwise.
bool ParseObject(BusClient& c, const ipc::FrameView& f, json* j) {
  if (!ShapeOk(c, f)) return false;
  *j = json::parse(f.payload, nullptr, false);
  if (j->is_discarded() || !j->is_object()) {
    c.drop_reason = fmt::format("message type {} carries no JSON object", static_cast<int>(f.type));
    return false;
  }
  return true;
}

bool NeedHello(BusClient& c, const ipc::FrameView& f) {
  if (c.rank >= 0) return true;
  c.drop_reason = fmt::format("message type {} before kHello", static_cast<int>(f.type));
  return false;
}

// A fixed-size payload from a rank that said hello; false (the client is dropped) otherwise.
template <typename T>
bool Pod(BusClient& c, const ipc::FrameView& f, T* out, const char* name) {
  if (!NeedHello(c, f)) return false;
  if (ipc::DecodePod(f, out)) return true;
  c.drop_reason = fmt::format("{} of {} bytes, expected {}", name, f.payload.size(), sizeof(*out));
  return false;
}

}  // namespace


class Coordinator::Impl {
 public:
  Impl()
      : st_([this](BusId id, BusClient& c, const ipc::FrameView& f) { HandleFrame(id, c, f); },
            [this](BusId id, BusClient& c) { return OnDrop(id, c); }),
        comms_(st_),
        release_(st_, comms_.comms()),
        status_(st_, comms_.comms(), release_, store_),
        hang_watch_(st_, store_) {}

  bool Start(const CoordinatorOptions& opts, std::string* error);
  void Stop();
  std::string StatusJson() { return status_.StatusJson(); }
  void RegisterGroup(const std::string& name, std::vector<int> members, const std::string& desc) {
    st_.vr->RegisterGroup(name, std::move(members), desc);
    store_.RetryWaits();
  }
  bool SwapAdmitted(int rank);
  void SwapRankExited(int rank);
  SwapStats SwapSummary();

  CoordinatorState st_;

 private:
  void Loop();
  // Hands a frame to its type's handler. A handler that finds the frame malformed sets c.drop_reason (the bus then
  // drops the client).
  void HandleFrame(BusId id, BusClient& c, const ipc::FrameView& f);
  void HandleHello(BusId id, BusClient& c, const ipc::FrameView& f);
  void HandleCommInit(BusId id, BusClient& c, const ipc::FrameView& f);
  void HandleRealNcclId(BusId id, BusClient& c, const ipc::FrameView& f);
  void HandleOpArrive(BusId id, BusClient& c, const ipc::FrameView& f);
  void HandleOpRecord(BusClient& c, const ipc::FrameView& f);
  void HandleMemory(BusClient& c, const ipc::FrameView& f);
  void HandleIteration(BusClient& c, const ipc::FrameView& f);
  void HandleOpData(BusClient& c, const ipc::FrameView& f);
  void NoteExchangeWaits(const std::vector<ExchangeHub::Wait>& waits);
  void SendExchangeResults(std::vector<ExchangeHub::Outgoing>& out);
  void HandleMemRoom(BusId id, BusClient& c, const ipc::FrameView& f);
  void HandleBye(BusClient& c, const ipc::FrameView& f);
  // A client leaves the bus: its rank (when this was its connection) is lost; true when it never said goodbye.
  bool OnDrop(BusId id, BusClient& c);

  store::StoreServer store_;
  CommRegistry comms_;
  ReleasePath release_;
  StatusWriter status_;
  HangWatch hang_watch_;
  std::unique_ptr<SwapController> swap_;  // null without --swap
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool stopped_ = false;
};

bool Coordinator::Impl::Start(const CoordinatorOptions& opts, std::string* error) {
  st_.opts = opts;
  CoordinatorOptions& o = st_.opts;
  // Why the upper bound: per-rank tables are sized by the world before any rank connects.
  if (o.world_size <= 0 || o.world_size > limits::kMaxWorldSize) {
    *error = fmt::format("coordinator: world size {} is outside 1..{}", o.world_size, limits::kMaxWorldSize);
    return false;
  }
  for (int r : o.real_ranks) {
    if (r < 0 || r >= o.world_size) {
      *error = fmt::format("coordinator: real rank {} outside the world of {}", r, o.world_size);
      return false;
    }
  }
  if (o.out_dir.empty()) {
    *error = "coordinator: an output directory is required";
    return false;
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  if (ec) {
    *error = fmt::format("coordinator: cannot create '{}': {}", o.out_dir, ec.message());
    return false;
  }
  const uint64_t started_ns = NowNs();
  status_.set_started_ns(started_ns);
  if (o.run_id.empty()) o.run_id = fmt::format("{}-{}", net::HostName(), ::getpid());
  VirtualRanksOptions vo;
  vo.world_size = o.world_size;
  vo.real_ranks = o.real_ranks;
  vo.ranks_per_root = o.ranks_per_root;
  vo.membership = o.membership;
  st_.vr = std::make_unique<VirtualRanks>(vo);
  for (int r : o.real_ranks) st_.ranks[r] = RankState{};
  st_.hang.set_timeout(o.hang_timeout_s);
  if (o.swap.enabled) {
    swap_ = std::make_unique<SwapController>(st_, comms_.comms(), release_, store_);
    if (!swap_->Start(error)) {
      swap_.reset();
      return false;
    }
    release_.set_swap(swap_.get());
    status_.set_swap(swap_.get());
  }

  store::StoreServerOptions so;
  so.host = o.store_host;
  so.port = o.store_port;
  so.stand_in = st_.vr.get();
  so.record_path = o.record_wire;
  if (swap_) so.on_waits_changed = [swap = swap_.get()] { swap->StoreWaitsChanged(); };
  if (!store_.Start(so, error)) return false;
  CoordinatorEndpoints& ep = st_.ep;
  ep.store_host = o.store_host;
  if (ep.store_host == "0.0.0.0" || ep.store_host == "::" || ep.store_host.empty()) ep.store_host = net::HostName();
  ep.store_port = store_.port();
  ep.info_path = (std::filesystem::path(o.out_dir) / "coordinator.json").string();
  ep.status_path = (std::filesystem::path(o.out_dir) / "status.json").string();
  BusLimits bl;
  bl.max_reply_bytes = o.bus_max_reply_bytes;
  bl.max_parked_bytes = o.bus_max_parked_bytes;
  st_.bus.set_limits(bl);
  if (!st_.bus.Listen(o.out_dir, o.bus_tcp, o.status_interval_ms, started_ns, &ep.socket_path, &ep.bus_tcp, error)) {
    store_.Stop();
    return false;
  }
  if (swap_) swap_->set_wake_fd(st_.bus.wake_fd());
  int wake = st_.bus.wake_fd();
  st_.vr->SetIdListener([wake] {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake, &one, sizeof(one));
  });
  status_.WriteInfo("running");
  status_.MaybeWriteStatus(true);
  thread_ = std::thread([this] { Loop(); });
  if (swap_) swap_->PrintBanner();
  Log("coord")->info("coordinator up: world {}, {} real ranks, store {}:{}, bus {}{}", o.world_size,
                     o.real_ranks.size(), ep.store_host, ep.store_port, ep.socket_path,
                     ep.bus_tcp.empty() ? "" : " and " + ep.bus_tcp);
  return true;
}

void Coordinator::Impl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (swap_) swap_->StopWorker();
  if (thread_.joinable()) {
    stop_ = true;
    st_.bus.Wake();
    thread_.join();
  }
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    st_.bus.CloseClients();
    for (auto& [r, s] : st_.ranks) {
      if (s.state == "connected") s.state = "lost";
    }
  }
  if (status_.info_written()) {
    status_.MaybeWriteStatus(true);
    hang_watch_.WriteFlightRecorder();
  }
  store_.Stop();
  if (st_.vr) st_.vr->SetIdListener(nullptr);
  st_.bus.Close();
  if (!st_.ep.socket_path.empty()) ::unlink(st_.ep.socket_path.c_str());
  if (status_.info_written()) status_.WriteInfo("stopped");
  Log("coord")->info("coordinator stopped ({} operations released; {} prereleased, {} used, {} disagreed)",
                     release_.releases(), release_.prereleases_sent(), release_.prereleases_used(),
                     release_.prerelease_mismatches());
}

void Coordinator::Impl::Loop() {
  std::vector<epoll_event> events(128);
  bool idle_work = false;  // the release policy has work to do ahead (ReleasePolicy::Idle): poll, do not sleep
  while (!stop_) {
    int n = st_.bus.Wait(events.data(), static_cast<int>(events.size()), idle_work ? 0 : -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      Log("coord")->error("epoll_wait: {}; event bus stops", std::strerror(errno));
      return;
    }
    bool tick = false;
    {
      std::lock_guard<std::mutex> lock(st_.mu);
      for (int i = 0; i < n; ++i) {
        switch (st_.bus.Handle(events[static_cast<size_t>(i)])) {
          case EventBus::Event::kWake:
            comms_.RetryParked(false);
            break;
          case EventBus::Event::kTimer:
            comms_.RetryParked(true);
            tick = true;
            break;
          case EventBus::Event::kNone:
            break;
        }
      }
      st_.bus.FlushAndDrop();
      if (swap_) swap_->Pump();
    }
    idle_work = release_.IdleTurn();
    if (swap_) swap_->AfterTurn(tick);
    if (tick) {
      status_.MaybeWriteStatus(false);
      hang_watch_.Check();
    }
  }
}

bool Coordinator::Impl::OnDrop(BusId id, BusClient& c) {
  bool lost = false;
  if (c.rank >= 0) {
    RankState& r = st_.ranks[c.rank];
    if (r.conn == id) {
      release_.ForgetPrereleases(c.rank);
      st_.xhub.ForgetRank(c.rank);
      lost = r.state == "connected";
      if (lost) {
        r.state = "lost";
        st_.hang.SetState(c.rank, "lost");
        if (swap_) swap_->scheduler().Done(c.rank);
      }
      r.conn = 0;
    }
  }
  st_.status_dirty = true;
  return lost;
}

void Coordinator::Impl::HandleFrame(BusId id, BusClient& c, const ipc::FrameView& f) {
  using ipc::MsgType;
  st_.status_dirty = true;
  if (swap_ && c.rank >= 0) swap_->scheduler().Activity(c.rank, NowNs());
  try {
    switch (f.type) {
      case MsgType::kHello: HandleHello(id, c, f); return;
      case MsgType::kCommInit: HandleCommInit(id, c, f); return;
      case MsgType::kRealNcclId: HandleRealNcclId(id, c, f); return;
      case MsgType::kOpArrive: HandleOpArrive(id, c, f); return;
      case MsgType::kOpRecord: HandleOpRecord(c, f); return;
      case MsgType::kMemory: HandleMemory(c, f); return;
      case MsgType::kIteration: HandleIteration(c, f); return;
      case MsgType::kOpData: HandleOpData(c, f); return;
      case MsgType::kMemRoom: HandleMemRoom(id, c, f); return;
      case MsgType::kBye: HandleBye(c, f); return;
      default:
        c.drop_reason = fmt::format("unexpected message type {}", static_cast<int>(f.type));
        return;
    }
  } catch (const std::exception& e) {
    // Why catch here: a shim's malformed JSON (wrong field types) must cost that connection, not the coordinator.
    c.drop_reason = fmt::format("bad message type {}: {}", static_cast<int>(f.type), e.what());
  }
}

void Coordinator::Impl::HandleCommInit(BusId id, BusClient& c, const ipc::FrameView& f) {
  json j;
  if (!NeedHello(c, f) || !ParseObject(c, f, &j)) return;
  comms_.OnCommInit(id, c, std::move(j), f.payload.size());
}

void Coordinator::Impl::HandleRealNcclId(BusId id, BusClient& c, const ipc::FrameView& f) {
  json j;
  if (!NeedHello(c, f) || !ParseObject(c, f, &j)) return;
  comms_.OnRealNcclId(id, c, j);
}

void Coordinator::Impl::HandleOpArrive(BusId id, BusClient& c, const ipc::FrameView& f) {
  ipc::OpArrive a;
  if (!Pod(c, f, &a, "kOpArrive")) return;
  release_.OnArrive(id, c, a);
}

void Coordinator::Impl::HandleOpRecord(BusClient& c, const ipc::FrameView& f) {
  ipc::OpRecord r;
  if (!Pod(c, f, &r, "kOpRecord")) return;
  RankState& s = st_.ranks[c.rank];
  ++s.ops_recorded;
  s.last_record = r;
  s.has_record = true;
  s.last_seen_ns = NowNs();
  st_.hang.Record(c.rank, r, s.last_seen_ns);
}

void Coordinator::Impl::HandleMemory(BusClient& c, const ipc::FrameView& f) {
  ipc::MemorySample m;
  if (!Pod(c, f, &m, "kMemory")) return;
  RankState& s = st_.ranks[c.rank];
  uint64_t current = m.current_bytes, peak = m.peak_bytes;
  s.current_bytes = current;
  s.peak_bytes = std::max(s.peak_bytes, peak);
  s.last_seen_ns = NowNs();
  if (swap_) swap_->scheduler().Memory(c.rank, std::max(s.peak_bytes, current));
}

void Coordinator::Impl::HandleIteration(BusClient& c, const ipc::FrameView& f) {
  ipc::IterationMark m;
  if (!Pod(c, f, &m, "kIteration")) return;
  RankState& s = st_.ranks[c.rank];
  uint64_t iteration = m.iteration, peak = m.peak_bytes, torch_max = m.torch_max_allocated;
  s.iterations = std::max(s.iterations, iteration);
  s.last_iter_dur_ns = m.dur_ns;
  s.last_iter_ns = m.t_ns;
  s.peak_bytes = std::max(s.peak_bytes, peak);
  s.torch_max_allocated = std::max(s.torch_max_allocated, torch_max);
  s.last_seen_ns = NowNs();
  if (swap_ && s.peak_bytes > 0) swap_->scheduler().Memory(c.rank, s.peak_bytes);
  st_.hang.Progress(c.rank, s.last_seen_ns);
}

void Coordinator::Impl::HandleOpData(BusClient& c, const ipc::FrameView& f) {
  if (!NeedHello(c, f)) return;
  ipc::ExchangeHeader h;
  if (f.payload.size() < sizeof(h)) {
    c.drop_reason = fmt::format("kOpData of {} bytes, shorter than its header", f.payload.size());
    return;
  }
  std::memcpy(&h, f.payload.data(), sizeof(h));
  std::vector<ExchangeHub::Outgoing> out;
  std::vector<ExchangeHub::Wait> waits;
  bool over_cap = false;
  std::string why = st_.xhub.OnData(c.rank, h, f.payload.substr(sizeof(h)), &out, &waits, &over_cap);
  if (over_cap) {
    c.drop_reason = why;  // logged when it is dropped
  } else if (!why.empty()) {
    Log("coord")->warn("rank {}: {}", c.rank, why);
  }
  NoteExchangeWaits(waits);
  SendExchangeResults(out);
  if (swap_) swap_->OnExchange(waits);
}

// A real rank blocked in an exchange waits at that operation: the hang diagnosis must see it (a send whose receive
// is never posted, e.g. two ranks that both send first, is a p2p wait-for cycle).
void Coordinator::Impl::NoteExchangeWaits(const std::vector<ExchangeHub::Wait>& waits) {
  const uint64_t now = NowNs();
  for (const ExchangeHub::Wait& w : waits) {
    if (!w.begin) {
      st_.hang.Release(w.rank, w.comm_id, w.seq, now);
      continue;
    }
    const HangOp o{.comm_id = w.comm_id, .seq = w.seq, .op = w.op, .bytes = w.bytes, .peer = w.peer};
    st_.hang.ArriveOp(w.rank, o, now, now);
  }
}

void Coordinator::Impl::SendExchangeResults(std::vector<ExchangeHub::Outgoing>& out) {
  for (ExchangeHub::Outgoing& o : out) {
    auto rs = st_.ranks.find(o.rank);
    if (rs == st_.ranks.end()) continue;
    BusClient* cl = st_.bus.Find(rs->second.conn);
    if (!cl) continue;
    // Why a swap when nothing is queued: a result frame is up to the operation's size; the hub takes the
    // client's drained buffer back for its next result (ExchangeHub::Recycle) instead of faulting in a new one.
    if (cl->out.size() == cl->out_pos) {
      cl->out.swap(o.frames);
      cl->out_pos = 0;
    } else {
      cl->out.append(o.frames);
    }
    st_.xhub.Recycle(std::move(o.frames));
    st_.bus.Flush(rs->second.conn, *cl);
  }
}

void Coordinator::Impl::HandleMemRoom(BusId id, BusClient& c, const ipc::FrameView& f) {
  json j;
  if (!NeedHello(c, f) || !ParseObject(c, f, &j)) return;
  const uint64_t req = j.value("id", uint64_t{0}), bytes = j.value("bytes", uint64_t{0});
  const uint64_t current = j.value("current", uint64_t{0});
  // idle (additive in ipc version 3; absent from an older libprism: false): the rank synchronised its device
  // before asking, so it may be swapped out for another rank's room while it waits.
  const bool idle = j.value("idle", false);
  if (!swap_ || !swap_->RequestRoom(c.rank, req, bytes, current, idle)) {
    st_.bus.SendJson(
        id, ipc::MsgType::kMemRoomAnswer,
        {{"id", req}, {"ok", false}, {"why", swap_ ? "the rank is not scheduled" : "context switching is off"}});
  }
}

void Coordinator::Impl::HandleBye(BusClient& c, const ipc::FrameView& f) {
  if (!NeedHello(c, f) || !ShapeOk(c, f)) return;
  json j = json::parse(f.payload, nullptr, false);
  RankState& s = st_.ranks[c.rank];
  s.state = "bye";
  st_.hang.SetState(c.rank, "bye");
  s.bye_reason = (j.is_object() ? j.value("reason", std::string()) : std::string());
  s.last_seen_ns = NowNs();
  if (swap_) swap_->scheduler().Done(c.rank);
  Log("coord")->info("rank {} said goodbye{}", c.rank, s.bye_reason.empty() ? "" : ": " + s.bye_reason);
}

void Coordinator::Impl::HandleHello(BusId id, BusClient& c, const ipc::FrameView& f) {
  json j;
  if (!ParseObject(c, f, &j)) return;
  int rank = j.value("rank", -1);
  if (rank < 0 || rank >= st_.opts.world_size) {
    st_.bus.SendJson(id, ipc::MsgType::kError,
                     {{"what", fmt::format("rank {} outside the world of {}", rank, st_.opts.world_size)}});
    c.drop_reason = fmt::format("hello with rank {}", rank);
    return;
  }
  if (!st_.vr->IsReal(rank)) {
    // Why refuse: the store already answers for this rank as a virtual one (its ids, its init/ count).
    st_.bus.SendJson(id, ipc::MsgType::kError,
                     {{"what", fmt::format("rank {} is virtual in this emulation (real ranks: {})", rank,
                                           fmt::join(st_.opts.real_ranks, ","))}});
    c.drop_reason = fmt::format("hello from rank {}, which is not a real rank", rank);
    return;
  }
  RankState& s = st_.ranks[rank];
  if (s.conn != 0 && s.conn != id && st_.bus.Find(s.conn)) {
    Log("coord")->warn("rank {} connected again (pid {}); the previous connection is replaced", rank,
                       j.value("pid", 0));
    st_.bus.Find(s.conn)->rank = -1;
  }
  release_.ForgetPrereleases(rank);
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
  if (swap_) swap_->scheduler().Started(rank, s.pid, !s.gpu_id.empty() ? s.gpu_id : fmt::format("{}/{}", s.host, s.gpu), NowNs());
  json ack = {{"version", ipc::kVersion},     {"run_id", st_.opts.run_id},        {"payload", st_.opts.payload},
              {"topology", st_.opts.topology},   {"graph", st_.opts.graph},          {"layout", st_.opts.layout},
              {"out_dir", st_.opts.out_dir},     {"world_size", st_.opts.world_size}, {"real_ranks", st_.opts.real_ranks},
              {"store", fmt::format("{}:{}", st_.ep.store_host, st_.ep.store_port)}};
  // Why only under --swap: the rank then asks for room when an allocation fails (kMemRoom); without it nobody
  // could make room, and the allocation fails as it always did.
  if (swap_) ack["swap"] = true;
  st_.bus.SendJson(id, ipc::MsgType::kHelloAck, ack);
  Log("coord")->info("rank {} connected (pid {}, host {}, gpu {})", rank, s.pid, s.host, s.gpu);
}

bool Coordinator::Impl::SwapAdmitted(int rank) {
  std::lock_guard<std::mutex> lock(st_.mu);
  if (!swap_) return true;
  return swap_->scheduler().Admitted(rank);
}

void Coordinator::Impl::SwapRankExited(int rank) {
  std::lock_guard<std::mutex> lock(st_.mu);
  if (!swap_) return;
  swap_->scheduler().Done(rank);
  swap_->Pump();
}

SwapStats Coordinator::Impl::SwapSummary() {
  std::lock_guard<std::mutex> lock(st_.mu);
  return swap_ ? swap_->scheduler().Stats() : SwapStats{};
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

const CoordinatorEndpoints& Coordinator::endpoints() const { return impl_->st_.ep; }
void Coordinator::Stop() {
  if (impl_) impl_->Stop();
}
void Coordinator::RegisterGroup(const std::string& name, std::vector<int> members, const std::string& desc) {
  impl_->RegisterGroup(name, std::move(members), desc);
}
std::string Coordinator::StatusJson() { return impl_->StatusJson(); }
VirtualRanks& Coordinator::virtual_ranks() { return *impl_->st_.vr; }
bool Coordinator::SwapAdmitted(int rank) { return impl_->SwapAdmitted(rank); }
void Coordinator::SwapRankExited(int rank) { impl_->SwapRankExited(rank); }
SwapStats Coordinator::SwapSummary() { return impl_->SwapSummary(); }

}  // namespace prism::coord
