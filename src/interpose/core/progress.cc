#include "interpose/core/progress.h"

#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "common/log.h"
#include "interpose/core/coord_client.h"
#include "interpose/core/gpu.h"
#include "interpose/core/streams.h"

namespace prism::interpose {
namespace {

constexpr uint32_t kQueueSize = 16384;  // power of two
constexpr uint32_t kReservedSlots = 8;  // top gate slots: clock calibration (gpu.cc)
// Spin (not sleep) when a release is this close. Why 200 us: on the GPU machine (a VM) a sleep overshot by up to
// ~60 us, which made 10 ms gates 50 us late with a 40 us window.
constexpr int64_t kSpinWindowNs = 200000;
constexpr int64_t kMaxSleepNs = 200000;
// Why arrivals are read at most every 2 us: an event-stamped arrival is a driver call (gpu.h), and while the thread
// spins for a near release it would otherwise query every waiting unit's event in a tight loop. An arrival read
// later is not later on the GPU clock; the release it decides is, by at most this.
constexpr uint64_t kArrivalReadNs = 2000;
// Why only the earliest unit of a stream is read: a stream reaches its units in order, so while its earliest unit
// waiting for an arrival has none, the ones behind it have none either, and reading each pending unit's event every
// pass kept the thread inside the driver beside the job's own calls (the shim suite's 200 back-to-back collectives:
// several microseconds more per collective). Once the earliest arrived the next one is read in the same or the next
// pass, with no sleep between. Every kReadAllPasses-th pass reads them all: two threads enqueueing on one stream
// can take stream positions in another order than their stamps'.
constexpr uint32_t kReadAllPasses = 64;

// A unit whose stream position orders its arrival (emulated, on a counted stream).
bool StreamOrdered(const GateUnit& u) { return u.end_slot == UINT32_MAX && u.event.stream < kCountedStreams; }

// Vyukov's bounded MPMC queue (used MPSC): one CAS per push, no allocation.
class UnitQueue {
 public:
  UnitQueue() {
    for (uint32_t i = 0; i < kQueueSize; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  bool Push(const GateUnit& u) {
    uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & (kQueueSize - 1)];
      uint64_t seq = c.seq.load(std::memory_order_acquire);
      int64_t diff = static_cast<int64_t>(seq) - static_cast<int64_t>(pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.unit = u;
          c.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }
  bool Pop(GateUnit* u) {
    uint64_t pos = head_;
    Cell& c = cells_[pos & (kQueueSize - 1)];
    uint64_t seq = c.seq.load(std::memory_order_acquire);
    if (static_cast<int64_t>(seq) - static_cast<int64_t>(pos + 1) < 0) return false;
    *u = c.unit;
    c.seq.store(pos + kQueueSize, std::memory_order_release);
    head_ = pos + 1;
    return true;
  }

 private:
  struct Cell {
    std::atomic<uint64_t> seq;
    GateUnit unit;
  };
  Cell cells_[kQueueSize];
  alignas(64) std::atomic<uint64_t> tail_{0};
  alignas(64) uint64_t head_ = 0;  // consumer only
};

struct Pending {
  GateUnit u;
  bool has_arrival = false;
  bool has_release = false;
  bool arrive_sent = false;
};

// Why the counters are grouped by writer and rate, a cache line each: the job threads' pushes and slot/ticket draws,
// the progress thread's releases and its sleep state would otherwise share lines that every unit moves between
// cores.
struct State {
  UnitQueue queue;
  std::once_flag started;
  // Written by the job threads (pushes, slots and tickets; wake and wakes only when they wake the thread).
  alignas(64) std::atomic<uint64_t> pushed{0};
  std::atomic<uint32_t> ticket{0};
  std::atomic<uint32_t> slot{0};
  std::atomic<uint32_t> wake{0};
  std::atomic<uint64_t> wakes{0};  // futex wakes the pushes issued (a system call on the pushing thread each)
  // Written by the progress thread: per release, and only when it goes to sleep or wakes (read by every push).
  alignas(64) std::atomic<uint64_t> released{0};
  alignas(64) std::atomic<int> sleeping{0};  // 1 while blocked (or about to block) until woken
  alignas(64) Pending pending[kQueueSize];
  uint32_t npending = 0;
  // Released units waiting for their gate-open stamp before they are logged (PRISM_GATE_OPEN_STAMPS).
  std::vector<GateUnit> opening;
};

State& S() {
  static State* s = new State();  // Why leaked: the thread runs until the process ends.
  return *s;
}

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

void SleepNs(int64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  nanosleep(&ts, nullptr);
}

// Opens the unit's gate and logs it (or hands it to PollOpening). Returns the host time it read when it wrote the
// gate word (the loop's new "now": the one clock read per unit that opened_ns costs).
uint64_t Release(State& s, Pending& p) {
  if (!p.u.no_gate) __atomic_store_n(TheGpu().GateWord(p.u.slot), p.u.ticket, __ATOMIC_RELEASE);
  const uint64_t now_host = HostNowNs();
  if (!p.u.no_gate) {
    // Why the GPU clock: release_ns and arrival_ns are on it (and the open stamp), so they compare without a
    // conversion error. opened_ns adds the gate's release latency: the word is written that much before the stream
    // is to pass it, so a gate opened on time logs opened_ns = release_ns (plus the thread's jitter) and one the
    // coordinator decided late logs how late.
    const int64_t written = static_cast<int64_t>(now_host) + TheGpu().Calibration().gpu_minus_host_ns;
    p.u.event.opened_ns = static_cast<uint64_t>(written + p.u.release_lat_ns);
    if (p.u.open_slot != UINT32_MAX) p.u.event.gate_written_ns = static_cast<uint64_t>(written);
  }
  if (p.u.open_slot != UINT32_MAX && !p.u.no_gate) {
    try {
      s.opening.push_back(p.u);
      return now_host;  // logged (and counted released) when the stream passed the gate
    } catch (...) {
    }
  }
  LogOp(p.u.event);
  s.released.fetch_add(1, std::memory_order_release);
  return now_host;
}

// Logs the released units whose gate-open stamp landed. Returns whether some are still waiting.
bool PollOpening(State& s) {
  Gpu& gpu = TheGpu();
  for (size_t i = 0; i < s.opening.size();) {
    GateUnit& u = s.opening[i];
    const uint64_t t = gpu.Arrival(u.open_slot);
    if (t == 0) {
      ++i;
      continue;
    }
    u.event.gate_open_ns = t;
    LogOp(u.event);
    s.released.fetch_add(1, std::memory_order_release);
    s.opening[i] = s.opening.back();
    s.opening.pop_back();
  }
  return !s.opening.empty();
}

void Loop() {
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // Why: default 50 us slack would make every sleep late.
  State& s = S();
  uint64_t arrivals_read_ns = 0;  // host time of the last pass that read arrivals
  uint32_t pass = 0;  // passes that read arrivals
  // Per counted stream, the position of its earliest unit still waiting for an arrival (UINT32_MAX: none); the
  // streams set in this pass, to reset.
  std::vector<uint32_t> head(kCountedStreams, UINT32_MAX);
  std::vector<uint16_t> heads_set;
  for (;;) {
    Gpu& gpu = TheGpu();  // Why per loop: tests swap the GPU backend between cases
    GateUnit u;
    while (s.npending < kQueueSize && s.queue.Pop(&u)) {
      Pending& p = s.pending[s.npending++];
      p = Pending();
      p.u = u;
    }
    const ClockCalibration cal = gpu.Calibration();
    int64_t min_wait = INT64_MAX;       // ns until the nearest known release
    int64_t min_dur = INT64_MAX;        // shortest duration among units still waiting for arrival
    uint64_t now_host = HostNowNs();
    const bool read_arrivals = now_host - arrivals_read_ns >= kArrivalReadNs;
    const bool read_all = read_arrivals && ++pass % kReadAllPasses == 0;
    bool head_arrived = false;
    if (read_arrivals) {
      arrivals_read_ns = now_host;
      for (uint16_t st : heads_set) head[st] = UINT32_MAX;
      heads_set.clear();
      for (uint32_t i = 0; i < s.npending; ++i) {
        const Pending& p = s.pending[i];
        if (p.has_arrival || !StreamOrdered(p.u)) continue;
        uint32_t& h = head[p.u.event.stream];
        if (h == UINT32_MAX) heads_set.push_back(p.u.event.stream);
        h = std::min(h, p.u.event.stream_seq);
      }
    }
    for (uint32_t i = 0; i < s.npending;) {
      Pending& p = s.pending[i];
      if (!p.has_arrival) {
        const bool ordered = StreamOrdered(p.u);
        const bool read = read_arrivals && (read_all || !ordered || p.u.event.stream_seq == head[p.u.event.stream]);
        const uint64_t a = read ? gpu.Arrival(p.u.slot) : 0;
        if (a != 0) {
          if (ordered && p.u.event.stream_seq == head[p.u.event.stream]) {
            head[p.u.event.stream] = p.u.event.stream_seq + 1;
            head_arrived = true;
          }
          p.has_arrival = true;
          p.u.event.arrival_ns = a;
          if (!p.u.via_coordinator && p.u.end_slot == UINT32_MAX) {
            p.u.event.release_ns = a + p.u.dur_ns;
            p.has_release = true;
          }
        } else {
          min_dur = std::min<int64_t>(min_dur, static_cast<int64_t>(p.u.dur_ns));
        }
      }
      if (p.has_arrival && p.u.end_slot != UINT32_MAX && !p.has_release) {
        // Passthrough: the real operations ended when the stream reached the end stamp.
        const uint64_t e = read_arrivals ? gpu.Arrival(p.u.end_slot) : 0;
        if (e != 0) {
          p.u.event.release_ns = std::max<uint64_t>(e, p.u.event.arrival_ns);
          p.has_release = true;
        } else {
          min_dur = std::min<int64_t>(min_dur, static_cast<int64_t>(p.u.dur_ns));
        }
      }
      if (p.has_arrival && p.u.via_coordinator && !p.has_release) {
        uint64_t rel = 0;
        int32_t last = -1;
        // Why before the arrival goes out: a prereleased unit needs no answer (the arrival still goes: the
        // coordinator's graph advances on it); an answer to a unit sent in an earlier pass is taken here too.
        if (CoordTakeRelease(p.u, &rel, &last)) {
          p.u.event.release_ns = rel;
          p.u.event.wait_on_rank = last;
          p.has_release = true;
        }
        if (!p.arrive_sent) {
          p.arrive_sent = CoordSendArrive(p.u);
          if (!p.arrive_sent && !p.has_release) {  // coordinator gone: the local rule rather than hang the job
            p.u.event.release_ns = p.u.event.arrival_ns + p.u.dur_ns;
            p.has_release = true;
          }
        }
        if (!p.has_release && !CoordActive()) {
          // The coordinator went away after the arrival was sent: the local rule, as for units sent after.
          p.u.event.release_ns = p.u.event.arrival_ns + p.u.dur_ns;
          p.has_release = true;
        }
      }
      if (p.has_release) {
        const int64_t lat = p.u.no_gate ? 0 : p.u.release_lat_ns;
        const int64_t target_host = static_cast<int64_t>(p.u.event.release_ns) - cal.gpu_minus_host_ns - lat;
        const int64_t wait = target_host - static_cast<int64_t>(now_host);
        if (wait <= 0) {
          now_host = Release(s, p);
          s.pending[i] = s.pending[--s.npending];
          continue;
        }
        min_wait = std::min(min_wait, wait);
      }
      ++i;
    }
    if (head_arrived) {  // the units behind an arrived one may have arrived too: read them now, not after a sleep
      arrivals_read_ns = 0;
      continue;
    }
    const bool opening = !s.opening.empty() && PollOpening(s);
    if (s.npending == 0 && opening) {
      SleepNs(2000);  // Why: only open stamps to wait for; they land microseconds after the release
      continue;
    }
    if (s.npending == 0) {
      // Why `w` is read before sleeping = 1: a push that reads 1 changes the word after this read (ProgressPush).
      uint32_t w = s.wake.load(std::memory_order_acquire);
      s.sleeping.store(1, std::memory_order_seq_cst);
      if (s.pushed.load(std::memory_order_seq_cst) == s.released.load(std::memory_order_seq_cst)) {
        timespec ts{0, 100000000};  // 100 ms: also bounds a lost wake-up
        Futex(&s.wake, FUTEX_WAIT_PRIVATE, w, &ts);
      }
      s.sleeping.store(0, std::memory_order_relaxed);
      continue;
    }
    // Next poll: soon enough to catch the nearest release, and to see an arrival well before a short op ends.
    int64_t poll = kMaxSleepNs;
    if (min_dur != INT64_MAX) poll = std::min<int64_t>(poll, std::max<int64_t>(2000, min_dur / 4));
    if (CoordActive()) poll = std::min<int64_t>(poll, 20000);
    if (min_wait != INT64_MAX) {
      if (min_wait <= kSpinWindowNs) continue;  // spin: re-check immediately
      poll = std::min(poll, min_wait - kSpinWindowNs);
    }
    SleepNs(poll);
  }
}

}  // namespace

void ProgressStart() {
  State& s = S();
  std::call_once(s.started, [] {
    try {
      std::thread(&Loop).detach();
    } catch (...) {
      Log("interpose")->error("cannot start the progress thread: gates will never open");
    }
  });
}

bool ProgressPush(const GateUnit& unit) {
  State& s = S();
  if (!s.queue.Push(unit)) return false;
  s.pushed.fetch_add(1, std::memory_order_seq_cst);
  // Why the wake word changes only when a push wakes the thread: a push that reads `sleeping` as 0 comes before the
  // thread marks itself asleep, and the thread checks `pushed` after that mark, so it sees the unit; a push that
  // reads 1 wakes it, and the changed word makes a futex wait that has not started yet return at once.
  if (s.sleeping.load(std::memory_order_seq_cst)) {
    s.wake.fetch_add(1, std::memory_order_seq_cst);
    Futex(&s.wake, FUTEX_WAKE_PRIVATE, 1, nullptr);
    s.wakes.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

uint64_t ProgressWakes() { return S().wakes.load(std::memory_order_relaxed); }

uint64_t ProgressPending() {
  State& s = S();
  return s.pushed.load() - s.released.load();
}

bool ProgressDrain(uint64_t timeout_ns) {
  uint64_t start = HostNowNs();
  while (ProgressPending() != 0) {
    if (HostNowNs() - start > timeout_ns) return false;
    SleepNs(50000);
  }
  return true;
}

uint32_t NextTicket() {
  uint32_t t = S().ticket.fetch_add(1, std::memory_order_relaxed) + 1;
  if (t == 0) t = S().ticket.fetch_add(1, std::memory_order_relaxed) + 1;
  return t;
}

uint32_t NextSlot() { return S().slot.fetch_add(1, std::memory_order_relaxed) % (kGateSlots - kReservedSlots); }

}  // namespace prism::interpose
