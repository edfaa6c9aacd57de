#include "interpose/core/coord_client.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <tuple>
#include <cstdlib>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/ipc_io.h"
#include "common/log.h"
#include "interpose/core/config.h"
#include "interpose/core/cost.h"
#include "interpose/core/event_log.h"
#include "interpose/core/gpu.h"
#include "interpose/core/progress.h"
#include "interpose/core/real_symbols.h"
#include "interpose/core/runtime.h"
#include "nccl_patch/semantics.h"

namespace prism::interpose {

// The connection to the coordinator and what its reader thread received (a part of the runtime, runtime.h).
struct CoordConn {
  std::mutex mu;  // connect + requests
  std::mutex write_mu;
  std::condition_variable cv;
  int fd = -1;
  bool tried = false;
  std::atomic<bool> active{false};
  std::atomic<bool> reading{false};  // the reader thread runs (its last act is to clear this)
  std::atomic<bool> swap{false};  // kHelloAck said "swap": true (kMemRoom may be sent)
  // Replies to requests (kHelloAck, kCommInfo, kError), in arrival order.
  std::vector<ipc::Frame> replies;
  std::mutex release_mu;
  std::map<std::pair<uint32_t, uint64_t>, std::pair<uint64_t, int32_t>> releases;
  std::map<std::pair<uint32_t, uint64_t>, ipc::OpPrerelease> prereleases;  // under release_mu
  // kOpResult: (comm, key, p2p source or -1) -> (flags, bytes); `done` when assembled.
  struct Result {
    uint32_t flags = 0;
    uint64_t total = 0;
    std::string bytes;      // the payload, unless it went to `dst`
    uint64_t received = 0;  // payload bytes read so far
    bool done = false;
    // CoordExpectResult: where the payload goes (page-locked staging in the engine), at most `cap` bytes.
    uint8_t* dst = nullptr;
    uint64_t cap = 0;
    bool in_place = false;  // the payload is at dst
    bool reading = false;   // the reader thread is filling it (outside the lock): nobody may erase it
  };
  std::mutex result_mu;
  std::condition_variable result_cv;
  std::map<std::tuple<uint32_t, uint64_t, int32_t>, Result> results;
  // kExchangeSendDone: (comm, key, destination) -> the acknowledgement's flags.
  std::map<std::tuple<uint32_t, uint64_t, int32_t>, uint32_t> send_done;
};

CoordConn* NewCoordConn() { return new CoordConn(); }

// Shuts the connection down, which ends the reader within its read. Why a reader still running after a second is
// left the object (it never happens here): it may still touch it.
void DestroyPart(CoordConn* c) {
  if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
  for (int i = 0; i < 200 && c->reading.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (c->reading.load()) return;
  if (c->fd >= 0) close(c->fd);
  delete c;
}

namespace {

using Conn = CoordConn;

Conn& C() { return Rt().coord(); }

// One kOpResult whose frame header was read: reads its exchange header, then its bytes straight to where they go
// (the waiter's buffer registered by CoordExpectResult, else the result's string), one copy from the socket.
ipc::IoStatus ReadResult(const Config& cfg, Conn& c, uint32_t length, std::string* err) {
  ipc::ExchangeHeader h{};
  ipc::IoStatus st = ipc::ReadExact(c.fd, &h, sizeof(h), -1, err);
  if (st != ipc::IoStatus::kOk) return st;
  const uint64_t n = length - sizeof(h);
  const bool p2p = h.op == static_cast<uint16_t>(payload::OpKind::kRecv) ||
                   h.op == static_cast<uint16_t>(payload::OpKind::kSend);
  if (h.flags & ipc::kExchangeSendDone) {
    std::string drop(n, '\0');  // an acknowledgement carries no bytes
    if (n && (st = ipc::ReadExact(c.fd, drop.data(), n, -1, err)) != ipc::IoStatus::kOk) return st;
    if (!cfg.send_rendezvous) return ipc::IoStatus::kOk;  // nobody waits for it
    {
      // Why keyed by the destination: this rank is the source of every send it waits for, and keys count per
      // destination (ipc.h), so (comm, key, source) would not tell two sends apart.
      std::lock_guard<std::mutex> lock(c.result_mu);
      c.send_done[{h.comm_id, h.key, h.peer}] = h.flags;
    }
    c.result_cv.notify_all();
    return ipc::IoStatus::kOk;
  }
  char* to = nullptr;
  Conn::Result* r = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.result_mu);
    r = &c.results[{h.comm_id, h.key, p2p ? h.rank : -1}];  // Why a pointer: map nodes stay where they are
    r->flags = h.flags;
    r->total = h.total_bytes;
    if (r->received == 0) r->in_place = r->dst != nullptr && h.total_bytes <= r->cap;
    if (r->in_place && h.offset == r->received && h.offset + n <= r->cap) {
      to = reinterpret_cast<char*>(r->dst) + h.offset;
    } else {
      r->in_place = false;
      if (r->bytes.empty()) r->bytes.reserve(std::min<uint64_t>(h.total_bytes, uint64_t{1} << 34));
      const size_t at = r->bytes.size();
      r->bytes.resize(at + n);
      to = r->bytes.data() + at;
    }
    r->reading = true;
  }
  // The waiter reads neither the buffer nor the string before `done`, so the bytes are read without the lock.
  if (n && (st = ipc::ReadExact(c.fd, to, n, -1, err)) != ipc::IoStatus::kOk) return st;
  {
    std::lock_guard<std::mutex> lock(c.result_mu);
    r->received += n;
    r->done = r->received >= r->total;
    r->reading = false;
  }
  c.result_cv.notify_all();
  return ipc::IoStatus::kOk;
}

// Why the runtime as an argument: the reader serves the runtime that connected (tests install others).
void ReaderLoop(Runtime* rt) {
  Conn& c = rt->coord();
  for (;;) {
    ipc::Frame f;
    std::string err;
    ipc::FrameHeader fh;
    ipc::IoStatus st = ipc::ReadExact(c.fd, &fh, sizeof(fh), -1, &err);
    if (st == ipc::IoStatus::kOk) {
      err = ipc::CheckHeader(fh);
      if (!err.empty()) st = ipc::IoStatus::kError;
    }
    if (st == ipc::IoStatus::kOk && fh.type == static_cast<uint16_t>(ipc::MsgType::kOpResult) &&
        fh.length >= sizeof(ipc::ExchangeHeader)) {
      st = ReadResult(rt->config(), c, fh.length, &err);
      if (st == ipc::IoStatus::kOk) continue;
    } else if (st == ipc::IoStatus::kOk) {
      f.type = static_cast<ipc::MsgType>(fh.type);
      f.version = fh.version;
      f.payload.resize(fh.length);
      if (fh.length) st = ipc::ReadExact(c.fd, f.payload.data(), fh.length, -1, &err);
    }
    if (st != ipc::IoStatus::kOk) {
      Log("interpose")->error("coordinator connection lost ({}); operations fall back to the local rule",
                              err.empty() ? "closed" : err);
      c.active.store(false);
      c.cv.notify_all();
      c.result_cv.notify_all();
      c.reading.store(false);
      return;
    }
    if (f.type == ipc::MsgType::kOpResult) continue;  // shorter than its header
    if (f.type == ipc::MsgType::kOpRelease) {
      ipc::OpRelease rel{};
      if (!ipc::DecodePod(f, &rel)) continue;
      std::lock_guard<std::mutex> lock(c.release_mu);
      c.releases[{rel.comm_id, rel.seq}] = {rel.release_ns, rel.last_rank};
      continue;
    }
    if (f.type == ipc::MsgType::kOpPrerelease) {
      ipc::OpPrerelease pr{};
      if (!ipc::DecodePod(f, &pr)) continue;
      std::lock_guard<std::mutex> lock(c.release_mu);
      c.prereleases[{pr.comm_id, pr.seq}] = pr;
      continue;
    }
    if (f.type == ipc::MsgType::kHelloAck) {
      nlohmann::json j = nlohmann::json::parse(f.payload, nullptr, false);
      if (j.is_object()) c.swap.store(j.value("swap", false));
      // Why: a checkpointed process's driver calls block until its restore, and the progress thread must keep
      // talking to the coordinator meanwhile, so its arrival reads must not be event queries.
      if (c.swap.load()) rt->gpu().UseKernelStamps("the coordinator may checkpoint this process (--swap)");
    }
    {
      std::lock_guard<std::mutex> lock(c.mu);
      c.replies.push_back(std::move(f));
    }
    c.cv.notify_all();
  }
}

bool SendJson(ipc::MsgType type, const nlohmann::json& j) {
  Conn& c = C();
  std::string text = j.dump();
  std::string err;
  std::lock_guard<std::mutex> lock(c.write_mu);
  return ipc::SendFrame(c.fd, type, text.data(), text.size(), &err) == ipc::IoStatus::kOk;
}

enum class Wait { kGot, kTimeout, kLost };

// Sends one request and waits up to timeout_ms for the first reply after it that `accept` takes; that reply leaves
// the queue into *out. The reader thread queues replies (kHelloAck, kCommInfo, kError, kRealNcclIdInfo) in order.
template <typename Accept>
Wait Request(ipc::MsgType type, const nlohmann::json& j, int timeout_ms, Accept accept, ipc::Frame* out) {
  Conn& c = C();
  std::unique_lock<std::mutex> lock(c.mu);
  size_t seen = c.replies.size();
  lock.unlock();
  if (!SendJson(type, j)) return Wait::kLost;
  lock.lock();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    seen = std::min(seen, c.replies.size());  // Why: another thread's request may have taken earlier replies
    for (size_t i = seen; i < c.replies.size(); ++i) {
      if (!accept(c.replies[i])) continue;
      *out = std::move(c.replies[i]);
      c.replies.erase(c.replies.begin() + static_cast<long>(i));
      return Wait::kGot;
    }
    if (!c.active.load()) return Wait::kLost;
    if (c.cv.wait_until(lock, deadline) == std::cv_status::timeout) return Wait::kTimeout;
  }
}

}  // namespace

bool CoordConnect() {
  Conn& c = C();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.tried) return c.active.load();
  c.tried = true;
  const Config& cfg = Cfg();
  std::string err, where;
  if (!cfg.coord_socket.empty()) {
    where = cfg.coord_socket;
    c.fd = ipc::ConnectUnix(cfg.coord_socket, &err);
  } else if (!cfg.coord_addr.empty()) {
    where = cfg.coord_addr;
    size_t colon = cfg.coord_addr.rfind(':');
    int port = colon == std::string::npos ? -1 : std::atoi(cfg.coord_addr.c_str() + colon + 1);
    if (port <= 0 || port > 65535) {
      Log("interpose")->error("PRISM_COORD_ADDR='{}' is not HOST:PORT", cfg.coord_addr);
      return false;
    }
    c.fd = ipc::ConnectTcp(cfg.coord_addr.substr(0, colon), static_cast<uint16_t>(port), 10000, &err);
  } else {
    return false;
  }
  if (c.fd < 0) {
    Log("interpose")->error("cannot reach the coordinator at {}: {}; communicators with several real members "
                            "use the local rule",
                            where, err);
    return false;
  }
  try {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    nlohmann::json hello = {{"rank", cfg.rank},           {"world_size", cfg.world_size},
                            {"local_rank", cfg.local_rank}, {"pid", static_cast<int>(getpid())},
                            {"host", host},               {"gpu", cfg.phys_device},
                            {"gpu_id", PhysicalGpuId(host, std::getenv("CUDA_VISIBLE_DEVICES"), cfg.phys_device)},
                            {"passthrough", cfg.passthrough && RealNccl().Complete()},
                            {"prerelease", true},
                            {"version", ipc::kVersion}};
    c.active.store(true);
    if (!SendJson(ipc::MsgType::kHello, hello)) {
      c.active.store(false);
      return false;
    }
    c.reading.store(true);
    std::thread(&ReaderLoop, &Rt()).detach();
  } catch (...) {
    c.reading.store(false);
    c.active.store(false);
    return false;
  }
  return true;
}

bool CoordActive() { return C().active.load(std::memory_order_relaxed); }

bool CoordSwapOn() { return C().active.load() && C().swap.load(); }

CoordReply CoordAskRoom(uint64_t id, uint64_t bytes, uint64_t current, uint64_t peak, int timeout_ms,
                        std::string* why, bool idle) {
  if (!CoordSwapOn()) {
    *why = "no coordinator with context switching";
    return CoordReply::kNoAnswer;
  }
  try {
    nlohmann::json j = {{"id", id}, {"bytes", bytes}, {"current", current}, {"peak", peak}, {"idle", idle}};
    auto mine = [id](const ipc::Frame& f) {
      if (f.type != ipc::MsgType::kMemRoomAnswer) return false;
      nlohmann::json r = nlohmann::json::parse(f.payload, nullptr, false);
      return r.is_object() && r.value("id", uint64_t{0}) == id;
    };
    ipc::Frame f;
    switch (Request(ipc::MsgType::kMemRoom, j, timeout_ms, mine, &f)) {
      case Wait::kLost: *why = "coordinator connection lost"; return CoordReply::kNoAnswer;
      case Wait::kTimeout:
        *why = "no answer within " + std::to_string(timeout_ms / 1000) + " s";
        return CoordReply::kNoAnswer;
      case Wait::kGot: break;
    }
    nlohmann::json r = nlohmann::json::parse(f.payload);
    *why = r.value("why", std::string());
    return r.value("ok", false) ? CoordReply::kOk : CoordReply::kRefused;
  } catch (...) {
    *why = "exception";
    return CoordReply::kNoAnswer;
  }
}

std::string PhysicalGpuId(const std::string& host, const char* visible_devices, int phys_device) {
  std::string entry = std::to_string(phys_device);
  if (visible_devices != nullptr && visible_devices[0] != '\0') {
    std::string v(visible_devices);
    size_t start = 0;
    for (int i = 0;; ++i) {
      size_t comma = v.find(',', start);
      if (i == phys_device) {
        entry = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        break;
      }
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return host + "/" + entry;
}

bool CoordRealNcclId(uint32_t comm_id, const std::string& post_hex, int timeout_ms, std::string* id_hex,
                     std::string* error) {
  if (!CoordConnect()) {
    *error = "no coordinator";
    return false;
  }
  try {
    nlohmann::json j = {{"comm_id", comm_id}};
    if (!post_hex.empty()) j["id"] = post_hex;
    auto mine = [comm_id](const ipc::Frame& f) {
      if (f.type != ipc::MsgType::kRealNcclIdInfo) return false;
      nlohmann::json r = nlohmann::json::parse(f.payload, nullptr, false);
      return !r.is_discarded() && r.value("comm_id", 0u) == comm_id;
    };
    ipc::Frame f;
    switch (Request(ipc::MsgType::kRealNcclId, j, timeout_ms, mine, &f)) {
      case Wait::kLost: *error = "coordinator connection lost"; return false;
      case Wait::kTimeout:
        *error = "no real NCCL unique id from communicator rank 0 within " + std::to_string(timeout_ms / 1000) + " s";
        return false;
      case Wait::kGot: break;
    }
    nlohmann::json r = nlohmann::json::parse(f.payload);
    if (r.contains("error")) {
      *error = "coordinator: " + r.value("error", std::string());
      return false;
    }
    *id_hex = r.value("id", std::string());
    return true;
  } catch (...) {
    *error = "exception";
    return false;
  }
}

bool ParseCommInfo(const std::string& text, CoordCommInfo* out, std::string* error) {
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (j.contains("error")) {
      *error = "coordinator: " + j.at("error").get<std::string>();
      return false;
    }
    out->comm_id = j.at("comm_id").get<uint32_t>();
    if (out->comm_id == 0) {
      *error = "kCommInfo without a communicator id";
      return false;
    }
    out->members = j.value("members", std::vector<int32_t>{});
    out->desc = j.contains("desc") && j["desc"].is_string() ? j["desc"].get<std::string>() : std::string();
    out->group = j.contains("group") && j["group"].is_string() ? j["group"].get<std::string>() : std::string();
    out->real.clear();
    if (j.contains("real")) {
      for (const auto& b : j.at("real")) out->real.push_back(b.get<bool>());
    }
    out->passthrough = j.value("passthrough", false);
    if (!out->real.empty() && out->real.size() != out->members.size()) {
      *error = "kCommInfo: 'real' and 'members' differ in length";
      return false;
    }
    return true;
  } catch (const std::exception& e) {
    *error = std::string("kCommInfo: ") + e.what();
    return false;
  }
}

CoordReply CoordCommInit(const std::string& key, int nranks, int rank, const std::string& desc,
                         const std::string& name, int64_t parent_comm_id, int color, int timeout_ms,
                         CoordCommInfo* out, const std::vector<int32_t>* members) {
  if (!CoordConnect()) return CoordReply::kNoAnswer;
  try {
    nlohmann::json j = {{"key", key}, {"nranks", nranks}, {"rank", rank}, {"desc", desc}, {"name", name}};
    if (parent_comm_id >= 0) {
      j["parent"] = parent_comm_id;
      j["color"] = color;
    }
    if (members != nullptr && !members->empty()) j["members"] = *members;
    auto answer = [](const ipc::Frame& f) {
      return f.type == ipc::MsgType::kCommInfo || f.type == ipc::MsgType::kError;
    };
    ipc::Frame f;
    switch (Request(ipc::MsgType::kCommInit, j, timeout_ms, answer, &f)) {
      case Wait::kLost: return CoordReply::kNoAnswer;
      case Wait::kTimeout:
        Log("interpose")->error("coordinator did not answer kCommInit within {} ms", timeout_ms);
        return CoordReply::kNoAnswer;
      case Wait::kGot: break;
    }
    if (f.type == ipc::MsgType::kError) {
      Log("interpose")->error("coordinator refused communicator {}: {}", key.substr(0, 16), f.payload);
      return CoordReply::kRefused;
    }
    std::string err;
    CoordCommInfo info;
    if (!ParseCommInfo(f.payload, &info, &err)) {
      Log("interpose")->warn("communicator {}: {}", key.substr(0, 16), err);
      return CoordReply::kRefused;
    }
    *out = std::move(info);
    return CoordReply::kOk;
  } catch (...) {
    return CoordReply::kNoAnswer;
  }
}

namespace {
// ipc.h's op code: prism::trace::CollOp for collectives, 100 + NodeKind for p2p.
uint32_t IpcOp(uint8_t op) {
  switch (static_cast<payload::OpKind>(op)) {
    case payload::OpKind::kAllReduce: return 1;
    case payload::OpKind::kAllGather: return 2;
    case payload::OpKind::kReduceScatter: return 3;
    case payload::OpKind::kBroadcast: return 4;
    case payload::OpKind::kReduce: return 5;
    case payload::OpKind::kAllToAll: return 6;
    case payload::OpKind::kSend: return 103;
    case payload::OpKind::kRecv: return 104;
    default: return 0;
  }
}
}  // namespace


bool CoordSendArrive(const GateUnit& u) {
  Conn& c = C();
  if (!c.active.load()) return false;
  ipc::OpArrive a{};
  a.comm_id = u.coord_comm_id;
  a.op = IpcOp(u.event.op);
  a.seq = u.event.seq;
  a.bytes = u.event.bytes;
  a.arrival_ns = u.event.arrival_ns;
  a.model_dur_ns = u.dur_ns;
  a.nops = std::max<uint32_t>(u.comm_ops, 1);
  a.peer = u.event.peer;
  std::string err;
  std::lock_guard<std::mutex> lock(c.write_mu);
  return ipc::SendFrame(c.fd, ipc::MsgType::kOpArrive, &a, sizeof(a), &err) == ipc::IoStatus::kOk;
}

namespace {
void SendPod(ipc::MsgType type, const void* pod, size_t len) {
  Conn& c = C();
  if (!c.active.load(std::memory_order_relaxed)) return;
  std::string err;
  std::lock_guard<std::mutex> lock(c.write_mu);
  ipc::SendFrame(c.fd, type, pod, len, &err);
}
}  // namespace

void CoordSendRecord(const OpEvent& e) {
  ipc::OpRecord r{};
  // Why the coordinator's id: the coordinator (status, hang diagnosis, FR dumps) keys communicators by its own ids,
  // which differ from this process's (a rank's first communicator is local 0).
  r.comm_id = e.coord_comm_id;
  r.op = IpcOp(e.op);
  r.seq = e.seq;
  r.bytes = e.bytes;
  r.arrival_ns = e.arrival_ns;
  r.release_ns = e.release_ns;
  r.model_dur_ns = e.model_dur_ns;
  r.wait_on_rank = e.wait_on_rank;
  r.dtype = static_cast<uint8_t>(TraceDTypeOf(static_cast<payload::DataType>(e.dtype)));  // ipc.h: trace::DType
  r.peer = e.peer;
  r.algo = e.algo;
  r.proto = e.proto;
  SendPod(ipc::MsgType::kOpRecord, &r, sizeof(r));
}

void CoordSendIteration(uint32_t iteration, uint64_t t_ns, uint64_t dur_ns, uint64_t peak, uint64_t torch_max) {
  ipc::IterationMark m{};
  m.iteration = iteration;
  m.t_ns = t_ns;
  m.dur_ns = dur_ns;
  m.peak_bytes = peak;
  m.torch_max_allocated = torch_max;
  SendPod(ipc::MsgType::kIteration, &m, sizeof(m));
}

void CoordSendMemory(uint64_t t_ns, uint64_t current, uint64_t peak) {
  ipc::MemorySample m{};
  m.t_ns = t_ns;
  m.current_bytes = current;
  m.peak_bytes = peak;
  SendPod(ipc::MsgType::kMemory, &m, sizeof(m));
}

bool CoordTakeRelease(const GateUnit& u, uint64_t* release_ns, int32_t* last_rank) {
  Conn& c = C();
  const uint32_t comm_id = u.coord_comm_id, nops = std::max<uint32_t>(u.comm_ops, 1);
  const uint64_t seq = u.event.seq, arrival_ns = u.event.arrival_ns;
  std::lock_guard<std::mutex> lock(c.release_mu);
  auto drop_prereleases = [&] {
    for (uint32_t k = 0; k < nops && !c.prereleases.empty(); ++k) c.prereleases.erase({comm_id, seq + k});
  };
  // The coordinator's answer: it sends one when some operation of the unit was not prereleased for the unit's op.
  auto it = c.releases.find({comm_id, seq});
  if (it != c.releases.end()) {
    *release_ns = it->second.first;
    *last_rank = it->second.second;
    c.releases.erase(it);
    drop_prereleases();
    return true;
  }
  if (c.prereleases.empty()) return false;
  const uint32_t unit_op = IpcOp(u.event.op);  // what CoordSendArrive sends: the coordinator tests the same
  uint64_t release = 0;
  int32_t last = -1;
  for (uint32_t k = 0; k < nops; ++k) {
    auto p = c.prereleases.find({comm_id, seq + k});
    if (p == c.prereleases.end() || (unit_op != 0 && p->second.op != unit_op)) return false;
    const uint64_t floor = p->second.floor_ns;
    const uint64_t r = ipc::PrereleaseAt(arrival_ns, floor, p->second.dur_ns, u.dur_ns);
    if (k == 0 || r > release) {
      release = r;
      const int32_t fr = p->second.floor_rank;
      last = fr < 0 ? -1 : (arrival_ns > floor ? static_cast<int32_t>(Cfg().rank) : fr);
    }
  }
  drop_prereleases();
  *release_ns = release;
  *last_rank = last;
  return true;
}

namespace {
// Writes every byte of iov[0..n) (sendmsg; short writes and EINTR retried; never SIGPIPE).
bool WriteVec(int fd, struct iovec* iov, int n) {
  while (n > 0) {
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (w < 0) {
      if (ipc::RetryWrite(fd)) continue;
      return false;
    }
    size_t left = static_cast<size_t>(w);
    while (n > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --n;
    }
    if (n > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}
}  // namespace

bool CoordSendData(const ipc::ExchangeHeader& h_in, const void* bytes, uint64_t len) {
  Conn& c = C();
  if (!c.active.load()) return false;
  // Why gather writes: the bytes go from the caller's (page-locked) buffer to the socket, with no frame copy.
  return ipc::ForEachExchangeFrame(
      ipc::MsgType::kOpData, h_in, len, [&](ipc::FrameHeader& fh, ipc::ExchangeHeader& h, uint64_t off, uint64_t n) {
        struct iovec iov[3] = {{&fh, sizeof(fh)}, {&h, sizeof(h)},
                               {const_cast<char*>(static_cast<const char*>(bytes) + off), static_cast<size_t>(n)}};
        std::lock_guard<std::mutex> lock(c.write_mu);
        return WriteVec(c.fd, iov, n ? 3 : 2);
      });
}

void CoordExpectResult(uint32_t comm_id, uint64_t key, int32_t p2p_src, void* dst, uint64_t capacity) {
  Conn& c = C();
  std::lock_guard<std::mutex> lock(c.result_mu);
  Conn::Result& r = c.results[std::make_tuple(comm_id, key, p2p_src)];
  if (r.received == 0 && !r.reading) {
    r.dst = static_cast<uint8_t*>(dst);
    r.cap = capacity;
  }
}

void CoordForgetResult(uint32_t comm_id, uint64_t key, int32_t p2p_src) {
  Conn& c = C();
  std::lock_guard<std::mutex> lock(c.result_mu);
  auto it = c.results.find(std::make_tuple(comm_id, key, p2p_src));
  if (it != c.results.end() && it->second.received == 0 && !it->second.reading) c.results.erase(it);
}

bool CoordWaitResult(uint32_t comm_id, uint64_t key, int32_t p2p_src, uint32_t* flags, std::string* bytes) {
  bool in_place = false;
  uint64_t size = 0;
  if (!CoordWaitResultAt(comm_id, key, p2p_src, flags, &size, &in_place, bytes)) return false;
  return true;
}

bool CoordWaitResultAt(uint32_t comm_id, uint64_t key, int32_t p2p_src, uint32_t* flags, uint64_t* size,
                       bool* in_place, std::string* bytes) {
  Conn& c = C();
  std::unique_lock<std::mutex> lock(c.result_mu);
  const auto k = std::make_tuple(comm_id, key, p2p_src);
  for (;;) {
    auto it = c.results.find(k);
    if (it != c.results.end() && it->second.done) {
      *flags = it->second.flags;
      *size = it->second.total;
      *in_place = it->second.in_place;
      bytes->clear();
      if (!it->second.in_place) *bytes = std::move(it->second.bytes);
      c.results.erase(it);
      return true;
    }
    if (!c.active.load()) return false;
    // Why a timed wait: the reader thread's notify can race with active going false on a lost connection.
    c.result_cv.wait_for(lock, std::chrono::milliseconds(200));
  }
}

bool CoordWaitSendDone(uint32_t comm_id, uint64_t key, int32_t dst, uint32_t* flags) {
  Conn& c = C();
  std::unique_lock<std::mutex> lock(c.result_mu);
  const auto k = std::make_tuple(comm_id, key, dst);
  for (;;) {
    auto it = c.send_done.find(k);
    if (it != c.send_done.end()) {
      *flags = it->second;
      c.send_done.erase(it);
      return true;
    }
    if (!c.active.load()) return false;
    c.result_cv.wait_for(lock, std::chrono::milliseconds(200));
  }
}

}  // namespace prism::interpose
