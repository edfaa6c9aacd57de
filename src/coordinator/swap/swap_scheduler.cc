#include "coordinator/swap/swap_scheduler.h"

#include <algorithm>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "common/sizes.h"

namespace prism::coord {

const char* SwapPhaseName(SwapPhase p) {
  switch (p) {
    case SwapPhase::kUnstarted: return "unstarted";
    case SwapPhase::kAdmitted: return "admitted";
    case SwapPhase::kResident: return "resident";
    case SwapPhase::kSwappingOut: return "swapping out";
    case SwapPhase::kOut: return "swapped out";
    case SwapPhase::kSwappingIn: return "swapping in";
    case SwapPhase::kDone: return "done";
  }
  return "?";
}

const char* SwapActionName(SwapAction::Kind k) {
  switch (k) {
    case SwapAction::kAdmit: return "start";
    case SwapAction::kSwapOut: return "swap out";
    case SwapAction::kSwapIn: return "swap in";
  }
  return "?";
}

SwapScheduler::SwapScheduler(SwapConfig cfg) : cfg_(std::move(cfg)) {}

void SwapScheduler::AddRank(int rank, const std::string& gpu) {
  Rank& r = ranks_[rank];
  r.rank = rank;
  r.gpu = gpu;
}

void SwapScheduler::Started(int rank, int pid, const std::string& gpu, uint64_t now_ns) {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) {
    Rank& r = ranks_[rank];
    r.rank = rank;
    r.gpu = gpu;
    r.phase = SwapPhase::kResident;
    it = ranks_.find(rank);
  }
  Rank& r = it->second;
  if (r.gpu.empty()) r.gpu = gpu;
  r.pid = pid;
  r.last_activity_ns = now_ns;
  // Why also from kUnstarted: a rank started without asking (a second connection, another launcher) is on the GPU.
  if (r.phase == SwapPhase::kUnstarted || r.phase == SwapPhase::kAdmitted) r.phase = SwapPhase::kResident;
  UpdatePeaks();
}

void SwapScheduler::Memory(int rank, uint64_t peak_bytes) {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return;
  it->second.peak = std::max(it->second.peak, peak_bytes);
  it->second.sampled = true;
  UpdatePeaks();
}

void SwapScheduler::Measured(int rank, uint64_t bytes) {
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || bytes == 0) return;
  Rank& r = it->second;
  // Why only resident and sampled: a process being checkpointed or restored holds part of its memory, one swapped
  // out holds none; and before its first memory sample the tracked bytes the measurement contains are unknown, so
  // the overhead (measurement - tracked peak) would count them twice once the sample comes.
  if (r.phase != SwapPhase::kResident || !r.sampled) return;
  const int64_t over = static_cast<int64_t>(bytes) - static_cast<int64_t>(r.peak);
  r.overhead = r.measured ? std::max(r.overhead, over) : over;
  r.measured = true;
  UpdatePeaks();
}

bool SwapScheduler::IsMeasured(int rank) const {
  auto it = ranks_.find(rank);
  return it != ranks_.end() && it->second.measured;
}

void SwapScheduler::Activity(int rank, uint64_t now_ns) {
  auto it = ranks_.find(rank);
  if (it != ranks_.end()) it->second.last_activity_ns = std::max(it->second.last_activity_ns, now_ns);
}

void SwapScheduler::SetWaits(int rank, std::vector<int> waiting_for) {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return;
  std::sort(waiting_for.begin(), waiting_for.end());
  waiting_for.erase(std::unique(waiting_for.begin(), waiting_for.end()), waiting_for.end());
  Rank& r = it->second;
  const bool was = Blocked(r);
  if (r.waiting_for != waiting_for) r.out_failed = false;
  // Why here: a rank restored for room that blocks in an exchange has moved on since (it allocated and ran); it may
  // be swapped out for another's room again.
  if (!waiting_for.empty()) r.room_restored = false;
  r.waiting_for = std::move(waiting_for);
  if (was && !Blocked(r) && r.phase == SwapPhase::kOut) r.ready_since_ns = r.last_activity_ns;
}

void SwapScheduler::SetStoreWait(int rank, bool waiting) {
  auto it = ranks_.find(rank);
  if (it != ranks_.end()) it->second.store_wait = waiting;
}

void SwapScheduler::Done(int rank) {
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || it->second.phase == SwapPhase::kDone) return;
  // Why credited: a rank that ends frees its GPU memory, which is room for a rank that waits for it. (One being
  // swapped out is credited when its checkpoint finishes.) Its own request ends first: it frees for others.
  it->second.room = false;
  if (it->second.phase == SwapPhase::kResident) CreditRoom(it->second.gpu, Footprint(rank));
  it->second.phase = SwapPhase::kDone;
  it->second.waiting_for.clear();
  it->second.out_bytes = 0;
  ++stats_.finished;
}

bool SwapScheduler::RequestRoom(int rank, uint64_t id, uint64_t bytes, uint64_t current, uint64_t now_ns,
                                bool idle) {
  auto it = ranks_.find(rank);
  if (it == ranks_.end() || it->second.phase == SwapPhase::kDone) return false;
  Rank& r = it->second;
  // Why the footprint grows now: the rank needs this much to go on; admissions and restores on its GPU must count
  // it from here on, not only after its next memory sample.
  r.peak = std::max(r.peak, current + bytes);
  r.sampled = true;
  r.room = true;
  r.room_idle = idle;
  r.room_back = false;
  r.room_id = id;
  r.room_bytes = std::max<uint64_t>(bytes, 1);
  r.room_freed = 0;
  r.room_since_ns = now_ns;
  r.last_activity_ns = std::max(r.last_activity_ns, now_ns);
  return true;
}

bool SwapScheduler::WaitsForRoom(int rank) const {
  auto it = ranks_.find(rank);
  return it != ranks_.end() && it->second.room;
}

void SwapScheduler::CreditRoom(const std::string& gpu, uint64_t bytes) {
  // Oldest request first: one swap out of a rank smaller than two requests together satisfies only the first.
  // Why only ranks on the GPU: a rank that waits for room and is being swapped out (the victim whose checkpoint this
  // credit is) or is out gets no share of the bytes it freed itself; it is granted when it is restored.
  std::vector<Rank*> asking;
  for (auto& [k, r] : ranks_) {
    if (r.room && r.gpu == gpu && r.room_freed < r.room_bytes &&
        (r.phase == SwapPhase::kResident || r.phase == SwapPhase::kAdmitted))
      asking.push_back(&r);
  }
  std::sort(asking.begin(), asking.end(), [](const Rank* a, const Rank* b) {
    return std::tie(a->room_since_ns, a->rank) < std::tie(b->room_since_ns, b->rank);
  });
  for (Rank* r : asking) {
    const uint64_t take = std::min(bytes, r->room_bytes - r->room_freed);
    r->room_freed += take;
    bytes -= take;
    if (bytes == 0) break;
  }
}

std::vector<RoomAnswer> SwapScheduler::TakeRoomAnswers(uint64_t now_ns) {
  std::vector<RoomAnswer> out;
  const uint64_t wait_ns = static_cast<uint64_t>(std::max(cfg_.room_wait_s, 0.0) * 1e9);
  for (auto& [k, r] : ranks_) {
    if (!r.room) continue;
    if (r.phase == SwapPhase::kDone) {
      r.room = false;
      continue;
    }
    // Why no answer, not even a refusal after room_wait_s: it was swapped out for another's room while it waited;
    // its request stays pending until it is restored (Finished), and then is granted.
    if (r.phase == SwapPhase::kSwappingOut || r.phase == SwapPhase::kOut || r.phase == SwapPhase::kSwappingIn) continue;
    bool others = false, swapping = false;
    for (const auto& [k2, o] : ranks_) {
      if (k2 == k || o.gpu != r.gpu) continue;
      if (o.phase == SwapPhase::kResident || o.phase == SwapPhase::kSwappingIn || o.phase == SwapPhase::kSwappingOut)
        others = true;
      if (o.phase == SwapPhase::kSwappingOut) swapping = true;
    }
    RoomAnswer a;
    a.rank = k;
    a.id = r.room_id;
    a.bytes = r.room_bytes;
    a.freed = r.room_freed;
    if (r.room_back) {
      a.ok = true;
      a.why = fmt::format("restored on GPU {} with room for {}", r.gpu, FormatBytes(r.room_bytes));
    } else if (r.room_freed >= r.room_bytes) {
      a.ok = true;
      a.why = fmt::format("{} swapped out on GPU {}", FormatBytes(r.room_freed), r.gpu);
    } else if (!others && !swapping) {
      a.why = fmt::format("rank {} is alone on GPU {}: nothing can be swapped out for it", k, r.gpu);
    } else if (!swapping && now_ns >= r.room_since_ns + wait_ns) {
      a.why = fmt::format("no rank on GPU {} could be swapped out within {:.0f} s (none blocked in an exchange, or "
                          "the host budget is full); {} freed of {}",
                          r.gpu, cfg_.room_wait_s, FormatBytes(r.room_freed), FormatBytes(r.room_bytes));
      a.why += DoesNotFit();
    } else {
      continue;
    }
    r.room = false;
    r.room_back = false;
    ++(a.ok ? stats_.rooms_granted : stats_.rooms_refused);
    out.push_back(std::move(a));
  }
  return out;
}

std::string SwapScheduler::DoesNotFit() const {
  // What the started ranks hold (on a GPU: their footprints; swapped out: what they left in host RAM) against what the
  // GPUs' caps and the host budget hold together. Why: ranks that can never fit together, in any order, are otherwise
  // refused one request at a time without saying why (docs/collect.md, context switching).
  if (cfg_.host_cap_bytes == 0 || cfg_.gpu_cap_bytes == 0) return std::string();
  uint64_t need = 0;
  std::set<std::string> gpus;
  for (const auto& [k, q] : ranks_) {
    if (q.phase == SwapPhase::kUnstarted || q.phase == SwapPhase::kDone) continue;
    gpus.insert(q.gpu);
    need += q.phase == SwapPhase::kOut ? q.out_bytes : Footprint(k);
  }
  const uint64_t room = cfg_.gpu_cap_bytes * gpus.size() + cfg_.host_cap_bytes;
  if (need <= room) return std::string();
  return fmt::format("; the started ranks need {} together, more than the cap of their {} GPU(s) and the host budget "
                     "hold ({} + {}): the job does not fit this way (--host-mem-cap, more GPUs, or smaller ranks)",
                     FormatBytes(need), gpus.size(), FormatBytes(cfg_.gpu_cap_bytes * gpus.size()),
                     FormatBytes(cfg_.host_cap_bytes));
}

uint64_t SwapScheduler::Estimate() const {
  if (cfg_.rank_estimate_bytes > 0) return cfg_.rank_estimate_bytes;
  uint64_t best = 0;
  for (const auto& [k, r] : ranks_) {
    if (Known(r)) best = std::max(best, r.peak + Overhead(r));
  }
  return best;
}

uint64_t SwapScheduler::Footprint(int rank) const {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return 0;
  const Rank& r = it->second;
  // Why the tracked peak plus the overhead rather than the last measurement: the peak grows between measurements
  // (the first step's optimizer state), and each measurement is a moment, not a peak.
  if (Known(r)) return r.peak + Overhead(r);
  // Why --rank-mem as given, even below the context: it is the footprint the user says a rank has (docs/collect.md).
  if (cfg_.rank_estimate_bytes > 0) return cfg_.rank_estimate_bytes;
  return std::max(Estimate(), cfg_.context_bytes);
}

uint64_t SwapScheduler::GpuUsed(const std::string& gpu) const {
  uint64_t used = 0;
  for (const auto& [k, r] : ranks_) {
    if (r.gpu == gpu && OnGpu(r)) used += Footprint(k);
  }
  return used;
}

uint64_t SwapScheduler::HostUsed() const {
  uint64_t used = 0;
  for (const auto& [k, r] : ranks_) {
    if (r.phase == SwapPhase::kOut || r.phase == SwapPhase::kSwappingIn) used += r.out_bytes;
  }
  return used;
}

int SwapScheduler::Needers(int rank) const {
  int n = 0;
  for (const auto& [k, r] : ranks_) {
    if (k != rank && r.phase != SwapPhase::kDone &&
        std::binary_search(r.waiting_for.begin(), r.waiting_for.end(), rank))
      ++n;
  }
  return n;
}

bool SwapScheduler::Admitted(int rank) const {
  auto it = ranks_.find(rank);
  return it == ranks_.end() || it->second.phase != SwapPhase::kUnstarted;
}

std::vector<int> SwapScheduler::Starting() const {
  std::vector<int> out;
  for (const auto& [k, r] : ranks_) {
    if (r.phase == SwapPhase::kAdmitted) out.push_back(k);
  }
  return out;
}

SwapPhase SwapScheduler::phase(int rank) const {
  auto it = ranks_.find(rank);
  return it == ranks_.end() ? SwapPhase::kUnstarted : it->second.phase;
}

void SwapScheduler::Notice(const std::string& key, const std::string& text) {
  if (noticed_[key]) return;
  noticed_[key] = true;
  notices_.push_back(text);
}

std::vector<std::string> SwapScheduler::TakeNotices() {
  std::vector<std::string> out;
  out.swap(notices_);
  return out;
}

uint64_t SwapScheduler::GpuHeld(const std::string& gpu) const {
  uint64_t held = 0;
  for (const auto& [k, r] : ranks_) {
    if (r.gpu == gpu && OnGpu(r) && r.phase != SwapPhase::kAdmitted) {
      held += (r.sampled ? r.peak : 0) + Overhead(r);
    }
  }
  return held;
}

void SwapScheduler::UpdatePeaks() {
  std::set<std::string> gpus;
  for (const auto& [k, r] : ranks_) gpus.insert(r.gpu);
  // Why GpuHeld, not GpuUsed: the peak reports what the ranks held as far as they said, not the estimates that
  // admission planned with.
  for (const std::string& g : gpus) stats_.peak_gpu_bytes = std::max(stats_.peak_gpu_bytes, GpuHeld(g));
  stats_.peak_host_bytes = std::max(stats_.peak_host_bytes, HostUsed());
}

std::optional<SwapAction> SwapScheduler::Next(uint64_t now_ns) {
  if (in_flight_) return std::nullopt;
  std::set<std::string> gpus;
  for (const auto& [k, r] : ranks_) {
    if (r.phase != SwapPhase::kDone) gpus.insert(r.gpu);
  }
  for (const std::string& g : gpus) {
    if (auto a = DecideGpu(g, now_ns)) {
      if (a->kind != SwapAction::kAdmit) in_flight_ = true;
      Rank& r = ranks_[a->rank];
      if (a->kind == SwapAction::kAdmit) {
        r.phase = SwapPhase::kAdmitted;
        ++stats_.admits;
      } else if (a->kind == SwapAction::kSwapOut) {
        r.phase = SwapPhase::kSwappingOut;
        r.out_bytes = a->bytes;
      } else {
        r.phase = SwapPhase::kSwappingIn;
      }
      UpdatePeaks();
      return a;
    }
  }
  return std::nullopt;
}

void SwapScheduler::Finished(const SwapAction& a, bool ok, double seconds, uint64_t now_ns) {
  if (a.kind == SwapAction::kAdmit) return;
  in_flight_ = false;
  auto it = ranks_.find(a.rank);
  if (it == ranks_.end()) return;
  Rank& r = it->second;
  // Why counted before the check below: the rank may have left already (a restored rank resumes at the unlock and
  // can say goodbye before this runs); the swap happened all the same.
  if (ok && a.kind == SwapAction::kSwapOut) {
    ++stats_.swaps_out;
    stats_.bytes_out += a.bytes;
    stats_.seconds_out += seconds;
    if (r.room) ++stats_.room_swaps_out;
    CreditRoom(a.gpu, a.bytes);
  } else if (ok) {
    ++stats_.swaps_in;
    stats_.bytes_in += a.bytes;
    stats_.seconds_in += seconds;
  }
  if (r.phase == SwapPhase::kDone) return;
  if (a.kind == SwapAction::kSwapOut) {
    if (ok) {
      r.phase = SwapPhase::kOut;
      if (!Blocked(r)) r.ready_since_ns = now_ns;  // its wait ended while it was being swapped out
    } else {
      // Why resident again: a failed lock leaves the process running (driver API); a failed checkpoint is undone by
      // the driver wrapper's unlock. It stays on the GPU and is not picked again until it blocks anew.
      r.phase = SwapPhase::kResident;
      r.out_bytes = 0;
      r.out_failed = true;
      ++stats_.failures;
    }
  } else {
    if (ok) {
      r.phase = SwapPhase::kResident;
      r.out_bytes = 0;
      r.last_activity_ns = now_ns;
      if (r.room) {
        // It was swapped out while it waited for room. Why granted now: its footprint, which the restore fitted
        // within the cap, already holds the request (RequestRoom raised its peak to what it held plus the bytes).
        // Why room_restored: not swapped out for another's room again before it blocks in an exchange, so two ranks
        // that keep failing their allocations cannot swap each other out for ever.
        r.room_back = true;
        r.room_restored = true;
        r.room_freed = std::max(r.room_freed, r.room_bytes);
      }
    } else {
      // Why not retried: a failed restore leaves the process in an unknown state (the driver may have marked it
      // FAILED); the rank is reported and given up on, and the run continues with the others.
      r.phase = SwapPhase::kDone;
      r.out_bytes = 0;
      ++stats_.failures;
      ++stats_.finished;
    }
  }
  UpdatePeaks();
}

// DecideGpu's state and steps for one GPU: its ranks as they are now, and the rules that pick an action from them.
class SwapScheduler::GpuDecision {
 public:
  GpuDecision(SwapScheduler& s, const std::string& gpu, uint64_t now_ns)
      : s_(s), gpu_(gpu), now_ns_(now_ns), cap_(s.cfg_.gpu_cap_bytes),
        stall_ns_(static_cast<uint64_t>(std::max(s.cfg_.stall_s, 0.0) * 1e9)) {}

  void Survey();
  const Rank* RoomAsker() const;
  std::optional<SwapAction> MakeRoomFor(const Rank* asking);
  std::optional<SwapAction> OverCap();
  bool HasCandidates() const { return !candidates_.empty(); }
  void SortCandidates();
  std::optional<SwapAction> NextOnGpu();

 private:
  Rank* Pick(const Rank* keep, bool for_room);
  Rank* Victim(const Rank* keep) { return Pick(keep, false); }
  SwapAction Out(const Rank* v, const std::string& why) const;
  uint64_t Need(const Rank* r) const { return r->phase == SwapPhase::kOut ? r->out_bytes : s_.Footprint(r->rank); }
  std::string Reason(const Rank* r) const;
  SwapAction In(const Rank* r, const std::string& why) const;
  bool Fits(const Rank* r) const { return cap_ == 0 || used_ + Need(r) <= cap_; }
  bool MayStart(const Rank* r) const;
  std::optional<SwapAction> OverCapStart(const Rank* c);

  SwapScheduler& s_;
  const std::string& gpu_;
  const uint64_t now_ns_;
  const uint64_t cap_;
  const uint64_t stall_ns_;
  std::vector<Rank*> resident_, candidates_;
  bool stalled_ = true, unsampled_resident_ = false;
  uint64_t used_ = 0;
  uint64_t host_used_ = 0;
};

// The GPU's resident ranks, the ranks that want it, and whether it is stalled.
void SwapScheduler::GpuDecision::Survey() {
  for (auto& [k, r] : s_.ranks_) {
    if (r.gpu != gpu_) continue;
    if (s_.OnGpu(r)) {
      resident_.push_back(&r);
      if (r.phase == SwapPhase::kAdmitted || (!r.sampled && r.phase == SwapPhase::kResident))
        unsampled_resident_ = true;
      // Why silence counts after stall_s: a rank waiting outside an exchange and the store (its start-up, a file
      // lock) never says so; the GPU must not wait for it forever. A rank still starting (admitted, no hello) is
      // not stalled.
      const bool silent = r.phase == SwapPhase::kResident && now_ns_ > r.last_activity_ns + stall_ns_;
      if (!(r.phase == SwapPhase::kResident && (s_.Blocked(r) || r.store_wait || silent))) stalled_ = false;
    } else if (r.phase == SwapPhase::kUnstarted || (r.phase == SwapPhase::kOut && !s_.Blocked(r))) {
      candidates_.push_back(&r);
    }
  }
  used_ = s_.GpuUsed(gpu_);
  host_used_ = s_.HostUsed();
}

// for_room false: blocked residents; true: residents that wait for room with an idle GPU (RequestRoom's `idle`), for
// another rank's room request when no blocked one can go. Those fewest others wait for first, then those that do not
// wait for `keep` (the rank the room is for), then the largest (frees most), then the highest rank. Why the second
// key: a rank that waits for the incoming one would block it at once (a tensor-parallel pair swapped for each
// other, one swap per pair collective, when the pair are the largest ranks).
SwapScheduler::Rank* SwapScheduler::GpuDecision::Pick(const Rank* keep, bool for_room) {
  Rank* best = nullptr;
  std::tuple<int, bool, uint64_t, int> best_key{};
  for (Rank* r : resident_) {
    if (r == keep || r->phase != SwapPhase::kResident || r->pid <= 0 || r->out_failed) continue;
    if (!for_room) {
      // Why never a rank waiting for room here: its host thread waits in an allocation, not in an exchange; it
      // may have GPU work in flight unless it said idle, and then it is picked only as a last resort (below).
      if (!s_.Blocked(*r) || r->room) continue;
    } else {
      // Why idle only: libprism synchronised its device before asking, so the checkpoint lock finds no work in
      // flight, as with a rank blocked in an exchange. Why not one already granted (answer not yet taken): it is
      // about to retry. Why not one restored for room that has not blocked since: no livelock (Finished).
      if (!r->room || !r->room_idle || r->room_restored || r->room_freed >= r->room_bytes) continue;
    }
    const uint64_t fp = s_.Footprint(r->rank);
    if (s_.cfg_.host_cap_bytes > 0 && host_used_ + fp > s_.cfg_.host_cap_bytes) {
      s_.Notice("host:" + std::to_string(r->rank),
                fmt::format("swap: rank {} ({}) cannot be swapped out: the host budget {} holds {} already "
                            "(--host-mem-cap)",
                            r->rank, FormatBytes(fp), FormatBytes(s_.cfg_.host_cap_bytes), FormatBytes(host_used_)));
      continue;
    }
    const bool waits_for_keep =
        keep && std::binary_search(r->waiting_for.begin(), r->waiting_for.end(), keep->rank);
    auto key = std::make_tuple(-s_.Needers(r->rank), !waits_for_keep, fp, r->rank);
    if (!best || key > best_key) {
      best = r;
      best_key = key;
    }
  }
  return best;
}

SwapAction SwapScheduler::GpuDecision::Out(const Rank* v, const std::string& why) const {
  SwapAction a;
  a.kind = SwapAction::kSwapOut;
  a.rank = v->rank;
  a.pid = v->pid;
  a.bytes = s_.Footprint(v->rank);
  a.gpu = gpu_;
  a.why = why;
  return a;
}

// The resident rank that waits for room the longest (by request time, then rank), or null.
const SwapScheduler::Rank* SwapScheduler::GpuDecision::RoomAsker() const {
  const Rank* asking = nullptr;
  for (const Rank* r : resident_) {
    if (r->room && r->room_freed < r->room_bytes && r->phase == SwapPhase::kResident &&
        (!asking || std::tie(r->room_since_ns, r->rank) < std::tie(asking->room_since_ns, asking->rank)))
      asking = r;
  }
  return asking;
}

// Swap out blocked ranks until enough was freed for `asking`.
std::optional<SwapAction> SwapScheduler::GpuDecision::MakeRoomFor(const Rank* asking) {
  if (Rank* v = Victim(nullptr)) {
    return Out(v, fmt::format("rank {} waits for room for {} ({} freed so far)", asking->rank,
                              FormatBytes(asking->room_bytes), FormatBytes(asking->room_freed)));
  }
  // No rank blocked in an exchange can go (they all wait for room, as at the first optimizer step of the GPU case
  // swap_big, where 7 ranks' allocations failed at the same moment): swap out another rank that waits for room with
  // an idle GPU; it comes back with room for its own request once there is room for it.
  if (Rank* v = Pick(asking, true)) {
    return Out(v, fmt::format("rank {} waits for room for {} ({} freed so far) and no rank blocked in an "
                              "exchange can go; rank {} waits for room too, its GPU idle",
                              asking->rank, FormatBytes(asking->room_bytes), FormatBytes(asking->room_freed),
                              v->rank));
  }
  return std::nullopt;
}

// Over the cap (footprints grew after the ranks were placed): make room as soon as a rank blocks.
std::optional<SwapAction> SwapScheduler::GpuDecision::OverCap() {
  if (cap_ > 0 && used_ > cap_ && resident_.size() > 1) {
    if (Rank* v = Victim(nullptr)) {
      return Out(v, fmt::format("GPU {} holds {} of its {}", gpu_, FormatBytes(used_), FormatBytes(cap_)));
    }
  }
  return std::nullopt;
}

// Who goes on the GPU next: those most blocked ranks wait for, then swapped-out ranks before new ones, then the one
// that waited longest, then the lowest rank.
void SwapScheduler::GpuDecision::SortCandidates() {
  std::sort(candidates_.begin(), candidates_.end(), [&](const Rank* a, const Rank* b) {
    const int na = s_.Needers(a->rank), nb = s_.Needers(b->rank);
    if (na != nb) return na > nb;
    const bool oa = a->phase == SwapPhase::kOut, ob = b->phase == SwapPhase::kOut;
    if (oa != ob) return oa;
    if (oa && a->ready_since_ns != b->ready_since_ns) return a->ready_since_ns < b->ready_since_ns;
    return a->rank < b->rank;
  });
}

std::string SwapScheduler::GpuDecision::Reason(const Rank* r) const {
  const int n = s_.Needers(r->rank);
  return n > 0 ? fmt::format("{} blocked rank(s) wait for it", n)
               : (r->phase == SwapPhase::kOut ? std::string("its exchange completed") : std::string("not started"));
}

SwapAction SwapScheduler::GpuDecision::In(const Rank* r, const std::string& why) const {
  SwapAction a;
  a.kind = r->phase == SwapPhase::kOut ? SwapAction::kSwapIn : SwapAction::kAdmit;
  a.rank = r->rank;
  a.pid = r->pid;
  a.bytes = Need(r);
  a.gpu = gpu_;
  a.why = why;
  return a;
}

// Why one unsampled rank at a time (without --rank-mem): its footprint is unknown, so the next one's estimate
// would be a guess; once it reported memory or blocked, the next may follow.
bool SwapScheduler::GpuDecision::MayStart(const Rank* r) const {
  return r->phase != SwapPhase::kUnstarted || !unsampled_resident_ || s_.cfg_.rank_estimate_bytes > 0 || stalled_;
}

// The first candidate when it fits; else room made for it on a stalled GPU; else a later one that fits.
std::optional<SwapAction> SwapScheduler::GpuDecision::NextOnGpu() {
  Rank* c = candidates_.front();
  const uint64_t need = Need(c);
  if (Fits(c)) {
    if (!MayStart(c)) return std::nullopt;
    return In(c, Reason(c));
  }
  if (stalled_) {
    if (Rank* v = Victim(c)) {
      return Out(v, fmt::format("every rank on GPU {} is blocked; rank {} ({}) waits for the GPU: {}", gpu_,
                                c->rank, FormatBytes(need), Reason(c)));
    }
  }
  // The first in line does not fit and nothing makes room for it now: a later one that fits may use the room. Why:
  // with full GPUs and a full host budget, restoring a smaller rank is what frees host RAM for the next swap out.
  for (Rank* r : candidates_) {
    if (r != c && Fits(r) && MayStart(r)) {
      return In(r, Reason(r) + fmt::format("; rank {} ({}) does not fit yet", c->rank, FormatBytes(need)));
    }
  }
  if (!stalled_) return std::nullopt;  // a resident rank still works: its progress may free the GPU or unblock others
  return OverCapStart(c);
}

// Nothing can be swapped out (nothing resident, every resident waits outside an exchange, or the host budget is
// full): start or restore over the cap rather than deadlock, and say so -- except at a full host budget, where the
// notice was printed and the scheduler waits for a swapped-out rank to come back.
std::optional<SwapAction> SwapScheduler::GpuDecision::OverCapStart(const Rank* c) {
  const uint64_t need = Need(c);
  const bool host_full = std::any_of(resident_.begin(), resident_.end(), [&](const Rank* r) {
    return r->phase == SwapPhase::kResident && s_.Blocked(*r) && s_.cfg_.host_cap_bytes > 0 &&
           host_used_ + s_.Footprint(r->rank) > s_.cfg_.host_cap_bytes;
  });
  if (host_full) return std::nullopt;
  s_.Notice(fmt::format("over:{}:{}", gpu_, c->rank),
            resident_.empty()
                ? fmt::format("swap: rank {} needs {}, more than GPU {}'s cap {} alone; it runs alone there", c->rank,
                              FormatBytes(need), gpu_, FormatBytes(cap_))
                : fmt::format("swap: no rank on GPU {} can be swapped out (they wait outside an exchange -- store, "
                              "start-up -- or their swap out failed); rank {} goes on the GPU over the cap ({} + {} > "
                              "{})",
                              gpu_, c->rank, FormatBytes(used_), FormatBytes(need), FormatBytes(cap_)));
  return In(c, Reason(c) + "; over the cap");
}

std::optional<SwapAction> SwapScheduler::DecideGpu(const std::string& gpu, uint64_t now_ns) {
  GpuDecision d(*this, gpu, now_ns);
  d.Survey();
  // A rank waits for room for an allocation that failed: swap out blocked ranks until enough was freed, and start or
  // restore nothing here meanwhile (the room is that rank's).
  if (const Rank* asking = d.RoomAsker()) return d.MakeRoomFor(asking);
  if (auto a = d.OverCap()) return a;
  if (!d.HasCandidates()) return std::nullopt;
  d.SortCandidates();
  return d.NextOnGpu();
}

SwapStats SwapScheduler::Stats() const {
  SwapStats s = stats_;
  s.ranks = static_cast<int>(ranks_.size());
  s.resident = s.out = s.unstarted = 0;
  for (const auto& [k, r] : ranks_) {
    if (OnGpu(r)) ++s.resident;
    if (r.phase == SwapPhase::kOut) ++s.out;
    if (r.phase == SwapPhase::kUnstarted) ++s.unstarted;
    if (r.measured) ++s.measured;
  }
  return s;
}

}  // namespace prism::coord
