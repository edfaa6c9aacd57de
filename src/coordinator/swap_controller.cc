#include "coordinator/swap_controller.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/log.h"
#include "common/net.h"
#include "common/sizes.h"

namespace prism::coord {

using json = nlohmann::json;

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

bool SwapController::Start(std::string* error) {
  driver_ = st_.opts.swap_driver;
  if (!driver_) {
    std::string why;
    std::unique_ptr<SwapDriver> d = OpenCudaCheckpointDriver(st_.opts.swap.driver, &why);
    if (!d) {
      *error = "coordinator: context switching (--swap) needs the CUDA driver's checkpoint API: " + why;
      return false;
    }
    driver_ = std::move(d);
  }
  SwapConfig cfg = st_.opts.swap;
  std::string cap_from = "--gpu-mem-cap";
  if (cfg.gpu_cap_bytes == 0) {
    const uint64_t total = driver_->DeviceMemory(0);
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
  usage_ = st_.opts.swap_usage;
  if (usage_) {
    usage_from_ = "measured per process (the caller's source)";
  } else if (cfg.usage_library.empty()) {
    usage_from_ = fmt::format("tracked peak + {} context (measuring is off)", FormatBytes(cfg.context_bytes));
  } else {
    std::string why;
    usage_ = OpenNvmlUsage(cfg.usage_library, &why);
    usage_from_ = usage_ ? std::string("measured per process (NVML)")
                         : fmt::format("tracked peak + {} context (NVML: {})", FormatBytes(cfg.context_bytes), why);
  }
  sched_ = std::make_unique<SwapScheduler>(cfg);
  for (int r : st_.opts.real_ranks) {
    auto g = cfg.rank_gpu.find(r);
    sched_->AddRank(r, g == cfg.rank_gpu.end() ? std::string() : g->second);
  }
  // Why printed once the coordinator is up: a start that fails later (its store port taken) is retried.
  banner_ =
      fmt::format("prism: swap: on; GPU cap {} ({}), host budget {} ({}), {} rank(s) start as GPUs have room; "
                  "footprints: {}",
                  FormatBytes(cfg.gpu_cap_bytes), cap_from,
                  cfg.host_cap_bytes ? FormatBytes(cfg.host_cap_bytes) : std::string("unlimited"), host_from,
                  st_.opts.real_ranks.size(), usage_from_);
  last_progress_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] { Worker(); });
  return true;
}

void SwapController::Print(const std::string& line) {
  if (st_.opts.swap_print) {
    st_.opts.swap_print(line);
  } else {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

std::string SwapController::ProgressLine() {
  SwapStats s = sched_->Stats();
  return fmt::format("prism: swap: ranks finished {}/{}, on GPU {}, swapped out {}, not started {}; swaps {} out + {} "
                     "in, {} moved, {:.1f} s swapping",
                     s.finished, s.ranks, s.resident, s.out, s.unstarted, s.swaps_out, s.swaps_in,
                     FormatBytes(s.bytes_out + s.bytes_in), s.seconds_out + s.seconds_in);
}

bool SwapController::RequestRoom(int rank, uint64_t req, uint64_t bytes, uint64_t current, bool idle) {
  if (!sched_->RequestRoom(rank, req, bytes, current, NowNs(), idle)) return false;
  Log("coord")->info("swap: rank {} waits for room: an allocation of {} failed (it holds {}); footprint now {}{}",
                     rank, FormatBytes(bytes), FormatBytes(current), FormatBytes(sched_->Footprint(rank)),
                     idle ? "; its GPU is idle" : "");
  return true;
}

void SwapController::AnswerRooms(uint64_t now) {
  for (const RoomAnswer& a : sched_->TakeRoomAnswers(now)) {
    auto rs = st_.ranks.find(a.rank);
    if (rs != st_.ranks.end() && st_.bus.Find(rs->second.conn)) {
      st_.bus.SendJson(rs->second.conn, ipc::MsgType::kMemRoomAnswer, {{"id", a.id}, {"ok", a.ok}, {"why", a.why}});
    }
    if (a.ok) {
      Log("coord")->info("swap: rank {} may retry its allocation of {}: {}", a.rank, FormatBytes(a.bytes), a.why);
    } else {
      Print(fmt::format("prism: swap: rank {}'s allocation of {} gets no room ({}); it fails as without --swap",
                        a.rank, FormatBytes(a.bytes), a.why));
    }
    st_.status_dirty = true;
  }
}

void SwapController::Pump() {
  const uint64_t now = NowNs();
  AnswerRooms(now);
  // Why progress: a rank started late (admitted when its GPU had room) is the run moving on; the ranks waiting for
  // it in an exchange must not be diagnosed as a hang while it starts up.
  for (int r : sched_->Starting()) st_.hang.Progress(r, now);
  for (;;) {
    std::optional<SwapAction> a = sched_->Next(now);
    if (!a) break;
    if (a->kind == SwapAction::kAdmit) {
      Log("coord")->info("swap: rank {} may start on GPU {} ({})", a->rank, a->gpu, a->why);
      st_.status_dirty = true;
      continue;  // the launcher polls SwapAdmitted; look for more
    }
    Log("coord")->info("swap: {} rank {} (pid {}, {}) on GPU {}: {}", SwapActionName(a->kind), a->rank, a->pid,
                       FormatBytes(a->bytes), a->gpu, a->why);
    {
      std::lock_guard<std::mutex> lock(job_mu_);
      job_ = *a;
    }
    job_cv_.notify_all();
    break;  // one checkpoint call at a time
  }
  ReleaseOut();  // a rank that just began swapping out no longer holds up the releases it was needed for
  AnswerRooms(now);
  for (const std::string& n : sched_->TakeNotices()) Print("prism: " + n);
  const SwapStats s = sched_->Stats();
  const uint64_t mark = s.swaps_out + s.swaps_in + static_cast<uint64_t>(s.finished);
  const auto t = std::chrono::steady_clock::now();
  if (mark != progress_mark_ &&
      t - last_progress_ >= std::chrono::duration<double>(std::max(st_.opts.swap_progress_s, 0.0))) {
    progress_mark_ = mark;
    last_progress_ = t;
    Print(ProgressLine());
  }
}

void SwapController::Worker() {
  for (;;) {
    SwapAction a;
    {
      std::unique_lock<std::mutex> lock(job_mu_);
      job_cv_.wait(lock, [&] { return stop_ || job_.has_value(); });
      if (stop_) return;
      a = *job_;
      job_.reset();
    }
    SwapResult r = a.kind == SwapAction::kSwapOut ? driver_->SwapOut(a.pid, sched_->config().lock_timeout_ms)
                                                  : driver_->SwapIn(a.pid);
    std::lock_guard<std::mutex> lock(st_.mu);
    sched_->Finished(a, r.ok, r.seconds, NowNs());
    st_.status_dirty = true;
    // Why progress: a long checkpoint is the run moving on; the hang diagnosis must not take it for a stall.
    if (r.ok) st_.hang.Progress(a.rank, NowNs());
    if (r.ok) {
      Log("coord")->info("swap: rank {} swapped {} in {:.3f} s ({:.2f} GB/s); GPU {} holds {}, host {}", a.rank,
                         a.kind == SwapAction::kSwapOut ? "out" : "in", r.seconds,
                         r.seconds > 0 ? static_cast<double>(a.bytes) / r.seconds / 1e9 : 0.0, a.gpu,
                         FormatBytes(sched_->GpuUsed(a.gpu)), FormatBytes(sched_->HostUsed()));
    } else {
      Print(fmt::format("prism: swap: {} rank {} failed: {}{}", SwapActionName(a.kind), a.rank, r.error,
                        a.kind == SwapAction::kSwapOut ? "; it stays on the GPU"
                                                       : "; the rank is given up on (its process may be stuck)"));
    }
    Pump();
  }
}

void SwapController::UpdateWaits() {
  std::map<int, std::vector<int>> waiting_for;
  std::map<uint32_t, std::vector<int>> posted;  // comm -> real members blocked in one of its collectives
  for (const ExchangeHub::Wait& w : st_.xhub.Waits()) {
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
  for (const auto& [r, s] : st_.ranks) {
    auto it = waiting_for.find(r);
    sched_->SetWaits(r, it == waiting_for.end() ? std::vector<int>{} : it->second);
  }
}

void SwapController::ReleaseOut() {
  std::vector<std::pair<uint32_t, uint64_t>> done;
  for (auto& [key, arrivals] : release_.pending()) {
    const auto [comm_id, seq] = key;
    if (arrivals.empty() || comm_id < 1 || comm_id > comms_.size()) continue;
    const CommView& comm = comms_[comm_id - 1];
    auto ex = exchanged_.find(key);
    std::vector<int> missing;
    bool ok = ex != exchanged_.end();
    for (int m : comm.real_members) {
      if (!ok) break;
      if (std::any_of(arrivals.begin(), arrivals.end(), [&](const Arrival& x) { return x.rank == m; })) continue;
      // Why only a locked member: a resident one sends its arrival in microseconds, with its real GPU time.
      const SwapPhase ph = sched_->phase(m);
      ok = ex->second.count(m) > 0 && (ph == SwapPhase::kSwappingOut || ph == SwapPhase::kOut);
      missing.push_back(m);
    }
    if (!ok || missing.empty()) continue;
    if (release_.HoldOnDisagreement(comm, seq, arrivals)) continue;
    // Its arrival stands in as the latest known one: it posted before the exchange completed, which the last real
    // arrival's rank did after reaching the operation (a swapped-out member was blocked, so never the last).
    Arrival base = *std::max_element(arrivals.begin(), arrivals.end(), [](const Arrival& a, const Arrival& b) {
      return a.op.arrival_ns < b.op.arrival_ns;
    });
    std::vector<Arrival> all = arrivals;
    for (int m : missing) all.push_back(Arrival{m, base.op});
    const std::string frame = release_.SendRelease(comm, seq, all, arrivals, NowNs(), true);
    for (int m : missing) owed_[{m, comm_id, seq}] = frame;
    Log("coord")->debug("swap: comm {} seq {} released without the arrival of swapped-out rank(s) {}", comm_id, seq,
                        fmt::join(missing, ","));
    done.push_back(key);
  }
  for (const auto& key : done) {
    release_.Released(key);
    exchanged_.erase(key);
  }
}

bool SwapController::LateArrival(BusId id, BusClient& c, const ipc::OpArrive& a) {
  auto it = owed_.find({c.rank, a.comm_id, a.seq});
  if (it == owed_.end()) return false;
  RankState& s = st_.ranks[c.rank];
  ++s.ops_arrived;
  s.last_seen_ns = NowNs();
  st_.hang.Arrive(c.rank, a, s.last_seen_ns);
  st_.hang.Release(c.rank, a.comm_id, a.seq, s.last_seen_ns);
  if (BusClient* cl = st_.bus.Find(id)) cl->out.append(it->second);
  owed_.erase(it);
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

void SwapController::StoreWaits() {
  // Outside st_.mu: the store answers on its own thread, and /proc is read here.
  const std::vector<std::string> peers = store_.BlockedPeers();
  std::map<std::string, int> known;
  std::map<int, int> pid_rank;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    known = store_peer_rank_;
    for (const auto& [r, s] : st_.ranks) {
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
  std::lock_guard<std::mutex> lock(st_.mu);
  if (!sched_) return;
  // Why keep only the blocked ones: a port is reused by a later connection, the mapping must not outlive its own.
  store_peer_rank_ = std::move(now_known);
  for (const auto& [r, s] : st_.ranks) sched_->SetStoreWait(r, blocked.count(r) > 0);
  Pump();
}

json SwapController::Json() {
  SwapStats s = sched_->Stats();
  const SwapConfig& cfg = sched_->config();
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
          {"footprint_source", usage_from_},
          {"footprints_measured", s.measured},
          {"context_bytes", cfg.context_bytes}};
}

void SwapController::Measure() {
  const auto t = std::chrono::steady_clock::now();
  std::map<int, int> pid_rank;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    if (!sched_) return;
    if (t - usage_last_ < std::chrono::duration<double>(std::max(sched_->config().usage_interval_s, 0.0))) return;
    // Why this host's ranks only: NVML sees this host's GPUs, and a remote rank's pid may be a local process's.
    const std::string here = net::HostName();
    for (const auto& [r, s] : st_.ranks) {
      if (s.pid > 0 && s.state == "connected" && (s.host.empty() || s.host == here)) pid_rank[s.pid] = r;
    }
  }
  usage_last_ = t;
  if (pid_rank.empty()) return;
  // Outside st_.mu: an NVML query takes milliseconds. The scheduler keeps only measurements of resident ranks.
  std::map<int, uint64_t> by_pid;
  std::string why;
  const bool ok = usage_(&by_pid, &why);
  std::lock_guard<std::mutex> lock(st_.mu);
  if (!sched_) return;
  if (!ok) {
    if (usage_logged_.insert(-1).second) Log("coord")->warn("swap: measuring GPU memory per process: {}", why);
    return;
  }
  for (const auto& [pid, rank] : pid_rank) {
    auto it = by_pid.find(pid);
    if (it == by_pid.end()) continue;
    sched_->Measured(rank, it->second);
    if (sched_->IsMeasured(rank) && usage_logged_.insert(rank).second) {
      const RankState& s = st_.ranks[rank];
      Log("coord")->info("swap: rank {} (pid {}) uses {} of GPU memory (tracked peak {}): footprint {}", rank, pid,
                         FormatBytes(it->second), FormatBytes(s.peak_bytes), FormatBytes(sched_->Footprint(rank)));
    }
  }
  Pump();  // a footprint smaller than assumed may make room for a rank
}

void SwapController::StopWorker() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(job_mu_);
    stop_ = true;
  }
  job_cv_.notify_all();
  thread_.join();
}

void SwapController::StoreWaitsChanged() {
  // Why a flag and a wake-up: the store's thread must not take the mutex; the event loop maps the waits to ranks.
  store_dirty_ = true;
  const int fd = wake_fd_.load();
  uint64_t one = 1;
  if (fd >= 0) {
    [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof(one));
  }
}

void SwapController::OnExchange(const std::vector<ExchangeHub::Wait>& waits) {
  for (const ExchangeHub::Wait& w : waits) {
    // A collective's member whose wait ended posted its input there: it arrived (ReleaseOut).
    if (!w.begin && w.op != 103 && w.op != 104) exchanged_[{w.comm_id, w.seq}].insert(w.rank);
  }
  if (exchanged_.size() > 4096) exchanged_.erase(exchanged_.begin());
  UpdateWaits();
  ReleaseOut();
}

void SwapController::AfterTurn(bool tick) {
  if (store_dirty_.exchange(false) || tick) StoreWaits();
  if (tick && usage_) Measure();
}

}  // namespace prism::coord
