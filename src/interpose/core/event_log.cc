#include "interpose/core/event_log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "interpose/core/config.h"
#include "interpose/core/coord_client.h"
#include "interpose/core/unit_stats.h"
#include "interpose/core/gpu.h"
#include "interpose/core/memory.h"
#include "interpose/core/progress.h"
#include "interpose/core/recorded.h"
#include "nccl_patch/semantics.h"
#include "prism/events.h"

namespace prism::interpose {
namespace {

struct PendingIter {
  uint32_t iteration;
  volatile uint64_t* stamp;
  uint64_t host_ns;
  uint64_t torch_max;
  int stream;  // index of the stream the mark was stamped on (-1: a stream that carried no unit)
};

struct Writer {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> lines;  // formatted by producers of rare records
  std::vector<OpEvent> ops;
  std::deque<PendingIter> iters;
  bool stop = false;
  bool started = false;
  std::thread thread;
  FILE* file = nullptr;
  std::string path;
  uint64_t last_iter_t = 0;
  uint64_t last_mem_current = UINT64_MAX;
  uint64_t last_mem_peak = UINT64_MAX;
};

Writer& W() {
  static Writer* w = new Writer();  // Why leaked: producers may run during exit.
  return *w;
}

const char* OpName(uint8_t op) {
  if (op == 0xff) return "group";
  return payload::OpKindName(static_cast<payload::OpKind>(op));
}

// PrismTrace's spelling (include/prism/trace.h, docs/trace-format.md), indexed by ncclDataType_t.
const char* DtypeName(uint8_t t) {
  static const char* const kNames[] = {"i8", "u8", "i32", "u32", "i64", "u64", "f16", "f32", "f64", "bf16",
                                       "f8e4m3", "f8e5m2"};
  return t < sizeof(kNames) / sizeof(kNames[0]) ? kNames[t] : "invalid";
}

// The operation lists of units of several operations (OpEvent::ops_at): a ring of entries of four words (bytes, seq,
// peer << 32 | root, comm_id << 32 | op << 8 | dtype). A producer claims its entries (`next`), then stores them; the
// writer thread reads them and then checks that no later claim came round to them (a seqlock whose sequence is
// `next`).
struct UnitOpRing {
  static constexpr uint64_t kEntries = 1u << 15;  // 1 MiB; a list is lost only after 32768 more entries
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> words[kEntries * 4];
};

UnitOpRing& Ring() {
  // Why allocated on first use and leaked: most jobs never group operations; producers may run during exit.
  static UnitOpRing* r = new UnitOpRing();
  return *r;
}

// Reads the list of `e` into `out` (e.ops_n entries); false when it was overwritten.
bool ReadUnitOps(const OpEvent& e, UnitOpEvent* out) {
  UnitOpRing& r = Ring();
  for (size_t i = 0; i < e.ops_n; ++i) {
    const std::atomic<uint64_t>* w = &r.words[((e.ops_at + i) % UnitOpRing::kEntries) * 4];
    const uint64_t w2 = w[2].load(std::memory_order_relaxed), w3 = w[3].load(std::memory_order_relaxed);
    out[i].bytes = w[0].load(std::memory_order_relaxed);
    out[i].seq = w[1].load(std::memory_order_relaxed);
    out[i].peer = static_cast<int32_t>(static_cast<uint32_t>(w2 >> 32));
    out[i].root = static_cast<int32_t>(static_cast<uint32_t>(w2));
    out[i].comm_id = static_cast<uint32_t>(w3 >> 32);
    out[i].op = static_cast<uint8_t>(w3 >> 8);
    out[i].dtype = static_cast<uint8_t>(w3);
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return r.next.load(std::memory_order_relaxed) - e.ops_at <= UnitOpRing::kEntries;
}

// The event file's "seq": -1 for none (kNoSeq).
long long SeqOut(uint64_t seq) { return seq == kNoSeq ? -1 : static_cast<long long>(seq); }

void WriteOp(FILE* f, const OpEvent& e) {
  char gate[128] = "";
  int at = 0;
  if (e.opened_ns != 0)
    at = std::snprintf(gate, sizeof gate, ",\"opened_ns\":%llu", static_cast<unsigned long long>(e.opened_ns));
  if (e.gate_open_ns != 0 && at >= 0 && static_cast<size_t>(at) < sizeof gate) {
    std::snprintf(gate + at, sizeof gate - static_cast<size_t>(at), ",\"gate_written_ns\":%llu,\"gate_open_ns\":%llu",
                  static_cast<unsigned long long>(e.gate_written_ns), static_cast<unsigned long long>(e.gate_open_ns));
  }
  std::fprintf(f,
               "{\"type\":\"op\",\"comm_id\":%u,\"seq\":%lld,\"op\":\"%s\",\"dtype\":\"%s\",\"bytes\":%llu,"
               "\"peer\":%d,\"arrival_ns\":%llu,\"release_ns\":%llu,\"model_dur_ns\":%llu,\"wait_on_rank\":%d,"
               "\"algo\":%u,\"proto\":%u,\"nops\":%u,\"root\":%d,\"stream\":%u,\"sseq\":%u,\"exchanged\":%u,"
               "\"cost\":\"%s\"%s%s",
               e.comm_id, SeqOut(e.seq), OpName(e.op), DtypeName(e.dtype),
               static_cast<unsigned long long>(e.bytes), e.peer, static_cast<unsigned long long>(e.arrival_ns),
               static_cast<unsigned long long>(e.release_ns), static_cast<unsigned long long>(e.model_dur_ns),
               e.wait_on_rank, e.algo, e.proto, e.nops, e.root, e.stream, e.stream_seq, e.exchanged,
               e.source == 1 ? "fixed" : (e.source == 2 ? "model" : "fallback"), e.passthrough ? ",\"passthrough\":1" : "", gate);
  if (e.ops_n > 0) {
    UnitOpEvent ops[kMaxUnitOps];
    const size_t n = std::min<size_t>(e.ops_n, kMaxUnitOps);
    if (ReadUnitOps(e, ops)) {
      std::fputs(",\"ops\":[", f);
      for (size_t i = 0; i < n; ++i) {
        const UnitOpEvent& o = ops[i];
        std::fprintf(f, "%s{\"op\":\"%s\",\"dtype\":\"%s\",\"bytes\":%llu,\"peer\":%d,\"root\":%d,\"comm_id\":%u,\"seq\":%lld}",
                     i ? "," : "", OpName(o.op), DtypeName(o.dtype), static_cast<unsigned long long>(o.bytes), o.peer,
                     o.root, o.comm_id, SeqOut(o.seq));
      }
      std::fputc(']', f);
      if (n < e.nops) std::fputs(",\"ops_truncated\":1", f);
    } else {
      std::fputs(",\"ops_truncated\":1", f);  // the list was overwritten before this line was written
    }
  }
  std::fputs("}\n", f);
}

void WriteMem(Writer& w, FILE* f, bool force) {
  uint64_t cur = memory::CurrentBytes(), peak = memory::PeakBytes();
  if (!force && cur == w.last_mem_current && peak == w.last_mem_peak) return;
  w.last_mem_current = cur;
  w.last_mem_peak = peak;
  CoordSendMemory(HostNowNs(), cur, peak);
  std::fprintf(f, "{\"type\":\"mem\",\"t_ns\":%llu,\"current_bytes\":%llu,\"peak_bytes\":%llu}\n",
               static_cast<unsigned long long>(HostNowNs()), static_cast<unsigned long long>(cur),
               static_cast<unsigned long long>(peak));
}

// Writes iteration lines whose GPU stamp has arrived (in order). At stop, waits up to 1 s for late stamps and
// falls back to the host time of the mark.
void DrainIters(Writer& w, std::deque<PendingIter>* iters, bool final) {
  uint64_t deadline = HostNowNs() + 1000000000ull;
  while (!iters->empty()) {
    PendingIter& it = iters->front();
    uint64_t t = it.stamp != nullptr ? *it.stamp : it.host_ns;
    if (t == 0) {
      if (!final || HostNowNs() > deadline) {
        if (!final) return;
        t = it.host_ns;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
    }
    uint64_t dur = w.last_iter_t != 0 && t > w.last_iter_t ? t - w.last_iter_t : 0;
    w.last_iter_t = t;
    CoordSendIteration(it.iteration, t, dur, memory::PeakBytes(), it.torch_max);
    std::fprintf(w.file,
                 "{\"type\":\"iter\",\"iteration\":%u,\"t_ns\":%llu,\"dur_ns\":%llu,\"peak_bytes\":%llu,"
                 "\"torch_max_allocated\":%llu,\"clock\":\"%s\",\"stream\":%d}\n",
                 it.iteration, static_cast<unsigned long long>(t), static_cast<unsigned long long>(dur),
                 static_cast<unsigned long long>(memory::PeakBytes()), static_cast<unsigned long long>(it.torch_max),
                 it.stamp != nullptr && *it.stamp != 0 ? "gpu" : "host", it.stream);
    iters->pop_front();
  }
}

void Run() {
  Writer& w = W();
  std::vector<std::string> lines;
  std::vector<OpEvent> ops;
  std::deque<PendingIter> iters;
  auto last_mem = std::chrono::steady_clock::now();
  bool stopping = false;
  while (!stopping) {
    {
      std::unique_lock<std::mutex> lock(w.mu);
      w.cv.wait_for(lock, std::chrono::milliseconds(200),
                    [&] { return w.stop || !w.lines.empty() || !w.ops.empty() || !w.iters.empty(); });
      lines.swap(w.lines);
      ops.swap(w.ops);
      while (!w.iters.empty()) {
        iters.push_back(w.iters.front());
        w.iters.pop_front();
      }
      stopping = w.stop;
    }
    for (const std::string& l : lines) std::fputs(l.c_str(), w.file);
    for (const OpEvent& e : ops) {
      WriteOp(w.file, e);
      // Why not a unit of only copies to itself: it has no sequence number, and the hang diagnosis takes a record
      // as the rank having passed every operation up to the record's (comm, seq).
      if (e.seq != kNoSeq) CoordSendRecord(e);
    }
    lines.clear();
    ops.clear();
    DrainIters(w, &iters, stopping);
    auto now = std::chrono::steady_clock::now();
    if (now - last_mem > std::chrono::seconds(1) || stopping) {
      WriteMem(w, w.file, false);
      last_mem = now;
    }
    std::fflush(w.file);
  }
}

void Push(std::string line) {
  Writer& w = W();
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (!w.started || w.stop) return;
    w.lines.push_back(std::move(line));
  }
  w.cv.notify_one();
}

}  // namespace

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

void EventLogStart() {
  Writer& w = W();
  std::lock_guard<std::mutex> lock(w.mu);
  if (w.started) return;
  const Config& c = Cfg();
  if (c.out_dir.empty()) return;
  mkdir(c.out_dir.c_str(), 0777);  // Why ignore the result: it usually exists (the launcher made it).
  w.path = c.out_dir + "/" + events::FileName(c.rank);
  w.file = std::fopen(w.path.c_str(), "a");
  if (w.file == nullptr) {
    Log("interpose")->error("cannot open event file {}: events are not recorded", w.path);
    return;
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::fprintf(w.file,
               "{\"type\":\"hello\",\"v\":%d,\"rank\":%d,\"world_size\":%d,\"local_rank\":%d,\"pid\":%d,"
               "\"host\":\"%s\",\"gpu\":%d,\"t_ns\":%llu,\"gate\":\"%s\",\"payload\":\"%s\"}\n",
               events::kSchemaVersion, c.rank, c.world_size, c.local_rank, static_cast<int>(getpid()),
               JsonEscape(host).c_str(), c.phys_device, static_cast<unsigned long long>(HostNowNs()),
               c.gate == GateKind::kSpin ? "spin" : (c.gate == GateKind::kNone ? "none" : "wait"),
               JsonEscape(c.payload).c_str());
  for (const std::string& e : c.errors) {
    std::fprintf(w.file, "{\"type\":\"error\",\"what\":\"%s\"}\n", JsonEscape(e).c_str());
  }
  std::fflush(w.file);
  w.started = true;
  try {
    w.thread = std::thread(&Run);
  } catch (...) {
    w.started = false;
  }
}

void LogComm(const CommEvent& e) {
  std::string m = "[";
  for (size_t i = 0; i < e.members.size(); ++i) m += (i ? "," : "") + std::to_string(e.members[i]);
  m += "]";
  std::string line = "{\"type\":\"comm\",\"comm_id\":" + std::to_string(e.comm_id) + ",\"key\":\"" +
                     JsonEscape(e.key) + "\",\"desc\":\"" + JsonEscape(e.desc) + "\",\"name\":\"" +
                     JsonEscape(e.name) + "\",\"nranks\":" + std::to_string(e.nranks) +
                     ",\"rank\":" + std::to_string(e.rank) + ",\"members\":" + (e.members.empty() ? "null" : m) +
                     ",\"real_members\":" + std::to_string(e.real_members) + ",\"origin\":\"" + e.origin + "\"}\n";
  Push(std::move(line));
}

void LogOp(const OpEvent& e) {
  Writer& w = W();
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (!w.started || w.stop) return;
    w.ops.push_back(e);
  }
  w.cv.notify_one();
}

void ReserveUnitOps(OpEvent* e, size_t n) {
  if (n < 2) return;
  UnitOpRing& r = Ring();
  const size_t k = std::min(n, kMaxUnitOps);
  e->ops_at = r.next.fetch_add(k, std::memory_order_relaxed);
  e->ops_n = static_cast<uint8_t>(k);
  // Why: a reader that sees an entry stored after this claim must also see the claim (ReadUnitOps).
  std::atomic_thread_fence(std::memory_order_release);
}

void SetUnitOp(const OpEvent& e, size_t i, const UnitOpEvent& op) {
  if (i >= e.ops_n) return;
  std::atomic<uint64_t>* w = &Ring().words[((e.ops_at + i) % UnitOpRing::kEntries) * 4];
  w[0].store(op.bytes, std::memory_order_relaxed);
  w[1].store(op.seq, std::memory_order_relaxed);
  w[2].store(uint64_t{static_cast<uint32_t>(op.peer)} << 32 | static_cast<uint32_t>(op.root), std::memory_order_relaxed);
  w[3].store(uint64_t{op.comm_id} << 32 | uint64_t{op.op} << 8 | op.dtype, std::memory_order_relaxed);
}

void LogIteration(uint32_t iteration, volatile uint64_t* stamp, uint64_t host_ns, uint64_t torch_max_allocated,
                  int stream) {
  Writer& w = W();
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (!w.started || w.stop) return;
    w.iters.push_back(PendingIter{iteration, stamp, host_ns, torch_max_allocated, stream});
  }
  w.cv.notify_one();
}

void LogWait(uint16_t stream, uint32_t next, uint16_t on, uint32_t after) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "{\"type\":\"wait\",\"stream\":%u,\"next\":%u,\"on\":%u,\"after\":%u}\n", stream, next,
                on, after);
  Push(buf);
}

void LogError(const std::string& what) {
  Push("{\"type\":\"error\",\"what\":\"" + JsonEscape(what) + "\"}\n");
}

void EventLogStop() {
  Writer& w = W();
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (!w.started || w.stop) return;
    w.stop = true;
  }
  w.cv.notify_one();
  if (w.thread.joinable()) w.thread.join();
  // What the recorded-payload policy did (collect: records written; --payload recorded: replayed, missed, not the
  // same operation, and left out for --payload-max-bytes), so a user can see a replay that mostly fell back to mirror.
  const RecordedStats rs = GetRecordedStats();
  char recorded[192] = "";
  if (rs.written + rs.hits + rs.misses + rs.mismatches + rs.over_limit > 0)
    std::snprintf(recorded, sizeof recorded,
                  ",\"recorded\":{\"written\":%llu,\"replayed\":%llu,\"missed\":%llu,\"mismatched\":%llu,"
                  "\"over_limit\":%llu}",
                  static_cast<unsigned long long>(rs.written), static_cast<unsigned long long>(rs.hits),
                  static_cast<unsigned long long>(rs.misses), static_cast<unsigned long long>(rs.mismatches),
                  static_cast<unsigned long long>(rs.over_limit));
  // libprism's own host time per executed unit (what a real rank pays per collective on its thread; sampled, see
  // unit_stats.h), so that a run's cost can be read from its event file (tests/gpu/libprism_cost.sh).
  char host[256] = "";
  if (const uint64_t p50 = HostOverheadQuantileNs(0.5); p50 > 0)  // 0 while no unit was sampled
    std::snprintf(host, sizeof host,
                  ",\"host_ns\":{\"units\":%llu,\"p50\":%llu,\"p90\":%llu,\"own_p50\":%llu,\"own_p90\":%llu,"
                  "\"wakes\":%llu}",
                  static_cast<unsigned long long>(UnitsExecuted()), static_cast<unsigned long long>(p50),
                  static_cast<unsigned long long>(HostOverheadQuantileNs(0.9)),
                  static_cast<unsigned long long>(HostOwnQuantileNs(0.5)),
                  static_cast<unsigned long long>(HostOwnQuantileNs(0.9)),
                  static_cast<unsigned long long>(ProgressWakes()));
  // The same units' mean own time by phase of the unit, and in driver calls (unit_stats.h UnitPhase).
  std::string phases;
  if (const UnitPhaseMeans m = HostPhaseMeansNs(); m.sampled > 0) {
    phases = ",\"host_phase_mean_ns\":{";
    for (int i = 0; i < kUnitPhases; ++i)
      phases += std::string("\"") + kUnitPhaseNames[i] + "\":" + std::to_string(m.own_ns[i]) + ",";
    phases += "\"driver\":" + std::to_string(m.driver_ns) + ",\"sampled\":" + std::to_string(m.sampled) + "}";
    phases += ",\"host_phase_driver_mean_ns\":{";
    for (int i = 0; i < kUnitPhases; ++i)
      phases += std::string(i ? "," : "") + "\"" + kUnitPhaseNames[i] + "\":" + std::to_string(m.driver_by_phase_ns[i]);
    phases += "}";
  }
  std::fprintf(w.file, "{\"type\":\"bye\",\"t_ns\":%llu,\"peak_bytes\":%llu%s%s%s}\n",
               static_cast<unsigned long long>(HostNowNs()), static_cast<unsigned long long>(memory::PeakBytes()),
               recorded, host, phases.c_str());
  std::fclose(w.file);
  w.file = nullptr;
}

std::string EventLogPath() { return W().path; }

}  // namespace prism::interpose
