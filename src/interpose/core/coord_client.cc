#include "interpose/core/coord_client.h"

#include <sys/socket.h>
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
#include "interpose/core/progress.h"
#include "interpose/core/real_symbols.h"
#include "nccl_patch/semantics.h"

namespace prism::interpose {
namespace {

struct Conn {
  std::mutex mu;  // connect + requests
  std::mutex write_mu;
  std::condition_variable cv;
  int fd = -1;
  bool tried = false;
  std::atomic<bool> active{false};
  // Replies to requests (kHelloAck, kCommInfo, kError), in arrival order.
  std::vector<ipc::Frame> replies;
  std::mutex release_mu;
  std::map<std::pair<uint32_t, uint64_t>, std::pair<uint64_t, int32_t>> releases;
  // kOpResult: (comm, key, p2p source or -1) -> (flags, bytes); `done` when assembled.
  struct Result {
    uint32_t flags = 0;
    uint64_t total = 0;
    std::string bytes;
    bool done = false;
  };
  std::mutex result_mu;
  std::condition_variable result_cv;
  std::map<std::tuple<uint32_t, uint64_t, int32_t>, Result> results;
  // kExchangeSendDone: (comm, key, destination) -> the acknowledgement's flags.
  std::map<std::tuple<uint32_t, uint64_t, int32_t>, uint32_t> send_done;
};

Conn& C() {
  static Conn* c = new Conn();  // Why leaked: the reader thread runs until exit.
  return *c;
}

void ReaderLoop() {
  Conn& c = C();
  for (;;) {
    ipc::Frame f;
    std::string err;
    ipc::IoStatus st = ipc::RecvFrame(c.fd, &f, -1, &err);
    if (st != ipc::IoStatus::kOk) {
      Log("interpose")->error("coordinator connection lost ({}); operations fall back to the local rule",
                              err.empty() ? "closed" : err);
      c.active.store(false);
      c.cv.notify_all();
      c.result_cv.notify_all();
      return;
    }
    if (f.type == ipc::MsgType::kOpResult) {
      ipc::ExchangeHeader h{};
      if (f.payload.size() < sizeof(h)) continue;
      std::memcpy(&h, f.payload.data(), sizeof(h));
      const bool p2p = h.op == static_cast<uint16_t>(payload::OpKind::kRecv) ||
                       h.op == static_cast<uint16_t>(payload::OpKind::kSend);
      {
        std::lock_guard<std::mutex> lock(c.result_mu);
        if ((h.flags & ipc::kExchangeSendDone) && !Cfg().send_rendezvous) continue;  // nobody waits for it
        if (h.flags & ipc::kExchangeSendDone) {
          // Why keyed by the destination: this rank is the source of every send it waits for, and keys count per
          // destination (ipc.h), so (comm, key, source) would not tell two sends apart.
          c.send_done[{h.comm_id, h.key, h.peer}] = h.flags;
          c.result_cv.notify_all();
          continue;
        }
        Conn::Result& r = c.results[{h.comm_id, h.key, p2p ? h.rank : -1}];
        r.flags = h.flags;
        r.total = h.total_bytes;
        r.bytes.append(f.payload, sizeof(h), std::string::npos);
        r.done = r.bytes.size() >= r.total;
      }
      c.result_cv.notify_all();
      continue;
    }
    if (f.type == ipc::MsgType::kOpRelease) {
      ipc::OpRelease rel{};
      if (!ipc::DecodePod(f, &rel)) continue;
      std::lock_guard<std::mutex> lock(c.release_mu);
      c.releases[{rel.comm_id, rel.seq}] = {rel.release_ns, rel.last_rank};
      continue;
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
                            {"version", ipc::kVersion}};
    c.active.store(true);
    if (!SendJson(ipc::MsgType::kHello, hello)) {
      c.active.store(false);
      return false;
    }
    std::thread(&ReaderLoop).detach();
  } catch (...) {
    c.active.store(false);
    return false;
  }
  return true;
}

bool CoordActive() { return C().active.load(std::memory_order_relaxed); }

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

bool CoordTakeRelease(uint32_t comm_id, uint64_t seq, uint64_t* release_ns, int32_t* last_rank) {
  Conn& c = C();
  std::lock_guard<std::mutex> lock(c.release_mu);
  auto it = c.releases.find({comm_id, seq});
  if (it == c.releases.end()) return false;
  *release_ns = it->second.first;
  *last_rank = it->second.second;
  c.releases.erase(it);
  return true;
}

bool CoordSendData(const ipc::ExchangeHeader& h_in, const void* bytes, uint64_t len) {
  Conn& c = C();
  if (!c.active.load()) return false;
  ipc::ExchangeHeader h = h_in;
  h.total_bytes = len;
  std::string frame;
  std::string err;
  uint64_t off = 0;
  do {
    const uint64_t n = std::min<uint64_t>(ipc::kExchangeChunkBytes, len - off);
    h.offset = off;
    try {
      frame.assign(sizeof(h) + n, '\0');
    } catch (...) {
      return false;
    }
    std::memcpy(frame.data(), &h, sizeof(h));
    if (n) std::memcpy(frame.data() + sizeof(h), static_cast<const char*>(bytes) + off, n);
    {
      std::lock_guard<std::mutex> lock(c.write_mu);
      if (ipc::SendFrame(c.fd, ipc::MsgType::kOpData, frame.data(), frame.size(), &err) != ipc::IoStatus::kOk) {
        return false;
      }
    }
    off += n;
  } while (off < len);
  return true;
}

bool CoordWaitResult(uint32_t comm_id, uint64_t key, int32_t p2p_src, uint32_t* flags, std::string* bytes) {
  Conn& c = C();
  std::unique_lock<std::mutex> lock(c.result_mu);
  const auto k = std::make_tuple(comm_id, key, p2p_src);
  for (;;) {
    auto it = c.results.find(k);
    if (it != c.results.end() && it->second.done) {
      *flags = it->second.flags;
      *bytes = std::move(it->second.bytes);
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

void CoordResetForTest() {
  Conn& c = C();
  // Why shut the old connection down first: its peer (a test's scripted server) may be gone while the reader
  // thread has not noticed yet; the next test must not inherit a dead socket.
  if (c.active.load() && c.fd >= 0) {
    ::shutdown(c.fd, SHUT_RDWR);
    for (int i = 0; i < 200 && c.active.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.active.load()) return;  // the reader did not stop: leave it
  if (c.fd >= 0) close(c.fd);
  c.fd = -1;
  c.tried = false;
  c.replies.clear();
  std::lock_guard<std::mutex> rl(c.result_mu);
  c.results.clear();
  c.send_done.clear();
}

}  // namespace prism::interpose
