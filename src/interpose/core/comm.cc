#include "interpose/core/comm.h"

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <random>

#include "common/ipc_io.h"
#include "common/log.h"
#include "interpose/core/config.h"
#include "interpose/core/coord_client.h"
#include "interpose/core/device_map.h"
#include "interpose/core/event_log.h"
#include "interpose/core/gpu.h"
#include "interpose/core/progress.h"
#include "interpose/core/real_symbols.h"
#include "interpose/core/runtime.h"

namespace prism::interpose {
namespace {

constexpr uint32_t kConfigMagic = 0xcafebeef;
std::atomic<int> g_passthrough{0};  // live communicators with a real NCCL communicator
constexpr char kRealIdMagic[8] = {'P', 'R', 'I', 'S', 'M', 'R', 'I', 'D'};

struct Group {
  std::string name;
  std::string desc;
  std::vector<int32_t> ranks;
  bool bound = false;
};

}  // namespace

// Every communicator and registered group (a part of the runtime, runtime.h).
struct CommRegistry {
  std::mutex mu;
  std::vector<Comm*> comms;   // every communicator ever created (never freed: handles stay valid to check)
  std::vector<Group> groups;  // registered by the Python hook
  uint32_t next_id = 0;
  std::atomic<bool> coord_comm_init_broken{false};
};

// Why the communicators are never freed, not even with their runtime: handles are checked until the process ends.
CommRegistry* NewCommRegistry() { return new CommRegistry(); }
void DestroyPart(CommRegistry* p) { delete p; }

namespace {

using Registry = CommRegistry;

Registry& R() { return Rt().comms(); }

struct Scope {
  const Registry* registry = nullptr;  // the runtime's registry it was opened in
  bool active = false;
  std::vector<int32_t> ranks;
  std::vector<Comm*> created;
};
thread_local Scope tls_scope;

// The calling thread's group scope in the current runtime (one opened under another runtime is gone).
Scope& ThisScope() {
  const Registry* r = &R();
  if (tls_scope.registry != r) {
    tls_scope = Scope();
    tls_scope.registry = r;
  }
  return tls_scope;
}
thread_local std::string tls_last_error;

CommEvent EventOf(const Comm& c) {
  return CommEvent{.comm_id = c.id, .key = c.key, .desc = c.desc, .name = c.name, .nranks = c.nranks,
                   .rank = c.rank, .members = c.members, .real_members = c.real_members, .origin = c.origin};
}

int CountReal(const std::vector<int32_t>& members) {
  const Config& cfg = Cfg();
  if (members.empty()) return cfg.real_ranks.size() == 1 ? 1 : -1;
  int n = 0;
  for (int32_t m : members) n += cfg.IsReal(m) ? 1 : 0;
  return n;
}

int CurrentDevice() {
  if (devices::Virtualized()) return devices::Current();
  const CudartFns& rt = Cudart();
  int d = 0;
  if (rt.cudaGetDevice != nullptr && rt.cudaGetDevice(&d) == cudaSuccess) return d;
  return 0;
}

// Reads ncclConfig_t fields that exist in the caller's struct version (NCCL's own rule: `size` says how much).
template <typename T>
bool ConfigField(const ncclConfig_t* cfg, size_t offset, T* out) {
  if (cfg == nullptr || cfg->size < offset + sizeof(T)) return false;
  std::memcpy(out, reinterpret_cast<const char*>(cfg) + offset, sizeof(T));
  return true;
}

ncclResult_t CheckConfig(const ncclConfig_t* cfg, int* blocking, std::string* comm_name) {
  if (cfg == nullptr) return ncclSuccess;
  if (cfg->magic != kConfigMagic || cfg->size < offsetof(ncclConfig_t, blocking) + sizeof(int)) {
    SetLastError("ncclConfig_t was not initialized with NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  int b = NCCL_CONFIG_UNDEF_INT;
  ConfigField(cfg, offsetof(ncclConfig_t, blocking), &b);
  if (b != NCCL_CONFIG_UNDEF_INT) {
    if (b != 0 && b != 1) {
      SetLastError("ncclConfig_t.blocking must be 0 or 1");
      return ncclInvalidArgument;
    }
    *blocking = b;
  }
  const char* name = nullptr;
  if (ConfigField(cfg, offsetof(ncclConfig_t, commName), &name) && name != nullptr) *comm_name = name;
  return ncclSuccess;
}

// Members from what this thread/process knows (see comm.h). Caller holds R().mu.
std::vector<int32_t> ResolveMembers(Registry& r, int nranks, int rank, const std::string& name, std::string* desc,
                                    std::string* bound_name) {
  const Config& cfg = Cfg();
  if (nranks == cfg.world_size) {
    std::vector<int32_t> all(nranks);
    std::iota(all.begin(), all.end(), 0);
    for (Group& g : r.groups) {  // the default group (or another whole-world group) names it
      if (g.ranks == all && (name.empty() || g.name == name)) {
        *desc = g.desc;
        *bound_name = g.name;
        break;
      }
    }
    return all;
  }
  auto fits = [&](const std::vector<int32_t>& ranks) {
    return static_cast<int>(ranks.size()) == nranks && ranks[rank] == cfg.rank;
  };
  if (ThisScope().active && fits(ThisScope().ranks)) return ThisScope().ranks;
  if (!name.empty()) {
    for (Group& g : r.groups) {
      if (g.name == name && fits(g.ranks)) {
        g.bound = true;
        *desc = g.desc;
        *bound_name = g.name;
        return g.ranks;
      }
    }
  }
  Group* match = nullptr;
  int matches = 0;
  for (Group& g : r.groups) {
    if (!g.bound && fits(g.ranks)) {
      match = &g;
      ++matches;
    }
  }
  if (matches == 1) {
    match->bound = true;
    *desc = match->desc;
    *bound_name = match->name;
    return match->ranks;
  }
  return {};
}

// Returns whether the coordinator made this a passthrough communicator that still needs its real NCCL communicator
// (SetupPassthrough, called without the registry lock: it waits for the other members).
bool FinishComm(Registry& r, Comm* c, int blocking, const std::string& coord_key, bool send_members = false) {
  const Config& cfg = Cfg();
  bool want_passthrough = false;
  c->real_members = CountReal(c->members);
  if ((!cfg.coord_socket.empty() || !cfg.coord_addr.empty()) && !r.coord_comm_init_broken.load()) {
    CoordCommInfo info;
    CoordReply reply =
        CoordCommInit(coord_key.empty() ? c->key : coord_key, c->nranks, c->rank, c->desc, c->name, -1, 0, 5000, &info,
                      send_members ? &c->members : nullptr);
    if (reply == CoordReply::kOk) {
      c->coord_comm_id = info.comm_id;
      if (static_cast<int>(info.members.size()) == c->nranks) c->members = info.members;
      // Why adopt: a communicator whose unique id this rank generated has no description of its own, while its
      // peers (virtual leader) learn it from the coordinator; graphs built from both must name it alike.
      if (c->desc.empty()) c->desc = info.desc;
      if (c->name.empty()) c->name = info.group;
      want_passthrough = info.passthrough;
      if (!info.real.empty()) {
        c->real_members = static_cast<int>(std::count(info.real.begin(), info.real.end(), true));
        if (static_cast<int>(info.real.size()) == c->nranks) c->member_real.assign(info.real.begin(), info.real.end());
      } else {
        c->real_members = CountReal(c->members);
      }
    } else if (reply == CoordReply::kNoAnswer && CoordActive()) {
      r.coord_comm_init_broken.store(true);  // Why: do not wait 5 s for every later communicator
    }
  }
  if (c->real_members < 0) {
    Log("nccl")->warn("communicator {} ({} ranks): members unknown and several real ranks in this run; treating "
                      "it as having one real member (mirror arrivals)",
                      c->id, c->nranks);
    c->real_members = 1;
  }
  if (c->member_real.empty() && static_cast<int>(c->members.size()) == c->nranks) {
    for (int32_t m : c->members) c->member_real.push_back(cfg.IsReal(m) ? 1 : 0);
  }
  // Why also with a graph: the coordinator then replays the virtual members (GraphRelease) and decides every
  // release, also on communicators where this rank is the only real member.
  c->use_coordinator = (c->real_members > 1 || (!cfg.graph.empty() && c->coord_comm_id != 0)) && CoordActive();
  if (c->real != nullptr || want_passthrough) {
    // Why no coordinator: the real NCCL synchronises the members and moves the data itself.
    c->use_coordinator = false;
    if (c->real == nullptr && !cfg.passthrough) want_passthrough = false;  // the coordinator asked only if we could
  }
  if (c->real_members > 1 && !c->use_coordinator && c->real == nullptr && !want_passthrough) {
    Log("nccl")->warn("communicator {} has {} real members but no coordinator: each real rank mirrors the others",
                      c->id, c->real_members);
  }
  c->cost = MakeCommCost(c->members, c->nranks);
  c->spin_ctas = cfg.spin_ctas > 0 ? cfg.spin_ctas : (CommChannels(c->cost.get()) > 0 ? CommChannels(c->cost.get()) : 16);
  c->blocking = blocking;
  c->async_error.store(blocking ? ncclSuccess : ncclInProgress);
  r.comms.push_back(c);
  if (ThisScope().active) ThisScope().created.push_back(c);
  LogComm(EventOf(*c));
  Log("nccl")->debug("comm {} {} rank {}/{} name '{}' members {}", c->id, c->origin, c->rank, c->nranks, c->name,
                     c->members.empty() ? "unknown" : std::to_string(c->members.size()));
  if (c->real != nullptr) g_passthrough.fetch_add(1);
  return want_passthrough && c->real == nullptr;
}

// The job's config for the real NCCL, made blocking. Why: libprism answers the job's readiness polls
// (ncclCommGetAsyncError) and the first operation may follow at once; a real communicator still initialising in the
// background makes that operation fail with ncclInvalidArgument (seen on the H200 with torch's lazy init).
ncclConfig_t RealConfig(const ncclConfig_t* config) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  if (config != nullptr) c = *config;
  c.blocking = 1;
  return c;
}

// Builds the real NCCL communicator of a passthrough communicator: rank 0 takes a real unique id and posts it through
// the coordinator, the others fetch it; then every member calls the real ncclCommInitRankConfig (a collective).
ncclResult_t SetupPassthrough(Comm* c, const ncclConfig_t* config) {
  const NcclFns& real = RealNccl();
  const Config& cfg = Cfg();
  ncclUniqueId id{};
  std::string hex, error;
  if (c->rank == 0) {
    if (ncclResult_t e = real.ncclGetUniqueId(&id); e != ncclSuccess) {
      error = std::string("real ncclGetUniqueId: ") + real.ncclGetErrorString(e);
    } else if (!CoordRealNcclId(c->coord_comm_id, ipc::HexEncode(std::string_view(id.internal, sizeof(id.internal))),
                                cfg.passthrough_timeout_s * 1000, &hex, &error)) {
      error = "posting the real unique id: " + error;
    }
  } else {
    std::string bytes;
    if (!CoordRealNcclId(c->coord_comm_id, std::string(), cfg.passthrough_timeout_s * 1000, &hex, &error)) {
      error = "waiting for the real unique id: " + error;
    } else if (!ipc::HexDecode(hex, &bytes) || bytes.size() != sizeof(id.internal)) {
      error = "malformed real unique id from the coordinator";
    } else {
      std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
    }
  }
  if (error.empty()) {
    ncclConfig_t cfg_copy = RealConfig(config);
    ncclComm_t rc = nullptr;
    ncclResult_t e = real.ncclCommInitRankConfig(&rc, c->nranks, id, c->rank, &cfg_copy);
    if (e == ncclSuccess || e == ncclInProgress) {
      c->real = rc;
      g_passthrough.fetch_add(1);
      Log("nccl")->info("comm {} ({} ranks, '{}'): passthrough, real NCCL communicator {}", c->id, c->nranks,
                        !c->desc.empty() ? c->desc : c->name, static_cast<void*>(rc));
      return ncclSuccess;
    }
    error = std::string("real ncclCommInitRankConfig: ") + real.ncclGetErrorString(e);
  }
  SetLastError("passthrough communicator " + std::to_string(c->id) + ": " + error);
  Log("nccl")->error("{}", LastError());
  return ncclSystemError;
}

// Starts what every communicator needs: the event file, the GPU (own kernels loaded and warmed before the first
// gate), the progress thread.
bool StartRuntime() {
  EventLogStart();
  static std::once_flag once;
  std::call_once(once, [] {
    for (const std::string& e : Cfg().errors) Log("interpose")->error("bad setting: {}", e);
    Log("interpose")->info("libprism: rank {} of {}, gate {}, payload {}, durations: {}", Cfg().rank,
                           Cfg().world_size,
                           Cfg().gate == GateKind::kSpin ? "spin" : (Cfg().gate == GateKind::kNone ? "none" : "wait"),
                           Cfg().payload, CostModelDescription());
  });
  if (!TheGpu().EnsureReady()) {
    SetLastError("libprism could not set up its GPU work (see the log)");
    return false;
  }
  ProgressStart();
  return true;
}

std::string HexPrefix(const void* p, size_t n) {
  return ipc::HexEncode(std::string_view(static_cast<const char*>(p), n));
}

}  // namespace

int32_t Comm::GlobalRank(int comm_rank) const {
  if (comm_rank < 0 || static_cast<size_t>(comm_rank) >= members.size()) return -1;
  return members[comm_rank];
}

uint64_t Fnv1a64(const void* data, size_t len, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < len; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

const char* LastError() { return tls_last_error.c_str(); }
void SetLastError(const std::string& what) {
  try {
    tls_last_error = what;
  } catch (...) {
  }
}

// Wire keys (torch 2.11): the default group "/default_pg/0//cuda//<k>", new_group G "/default_pg/0//G//cuda//<k>"
// (PrefixStore nesting joins with "/"). The group is the last "//"-separated segment before the device.
std::string GroupNameFromStoreKey(std::string_view key) {
  constexpr std::string_view kPrefix = "default_pg/";
  size_t p = key.find(kPrefix);
  if (p == std::string_view::npos) return {};
  std::string_view rest = key.substr(p + kPrefix.size());
  size_t dev = std::string_view::npos;
  for (std::string_view d : {"//cuda//", "//cpu//"}) {
    size_t q = rest.rfind(d);
    if (q != std::string_view::npos && (dev == std::string_view::npos || q > dev)) dev = q;
  }
  if (dev == std::string_view::npos || dev == 0) return {};
  std::string_view head = rest.substr(0, dev);
  size_t sep = head.rfind("//");
  std::string_view group = sep == std::string_view::npos ? head : head.substr(sep + 2);
  if (group.empty() || group.find('/') != std::string_view::npos) return {};
  return std::string(group);
}

std::string GroupNameFromCommName(std::string_view name) {
  size_t p = name.rfind(':');
  return std::string(p == std::string_view::npos ? name : name.substr(p + 1));
}

std::string StoreKeyFromVirtualId(const ncclUniqueId& id) {
  if (!ipc::IsVirtualNcclId(id.internal, sizeof(id.internal))) return {};
  const char* tail = id.internal + 32;
  size_t n = strnlen(tail, 96);
  return std::string(tail, n);
}

Comm* ToComm(ncclComm_t handle) {
  auto* c = reinterpret_cast<Comm*>(handle);
  if (c == nullptr) return nullptr;
  // Why no lookup: every handle we hand out is a Comm we never free; a foreign pointer fails the magic check.
  if (c->magic != Comm::kMagic || c->destroyed.load(std::memory_order_relaxed)) return nullptr;
  return c;
}

ncclResult_t GetUniqueId(ncclUniqueId* out) {
  if (out == nullptr) return ncclInvalidArgument;
  std::memset(out, 0, sizeof(*out));
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}() ^ (HostNowNs() << 16);
  std::memcpy(out->internal, kRealIdMagic, 8);
  int32_t rank = Cfg().rank;
  uint32_t pid = static_cast<uint32_t>(getpid());
  uint64_t n = counter.fetch_add(1);
  uint64_t mix = salt ^ (n * 0x9e3779b97f4a7c15ull);
  std::memcpy(out->internal + 8, &rank, 4);
  std::memcpy(out->internal + 12, &pid, 4);
  std::memcpy(out->internal + 16, &n, 8);
  std::memcpy(out->internal + 24, &mix, 8);
  EventLogStart();
  return ncclSuccess;
}

ncclResult_t CommInit(const InitArgs& a, Comm** out) {
  if (out == nullptr || a.ids == nullptr || a.nids < 1 || a.nranks < 1 || a.rank < 0 || a.rank >= a.nranks) {
    SetLastError("invalid communicator arguments (nranks, rank, unique id or output pointer)");
    return ncclInvalidArgument;
  }
  int blocking = 1;
  std::string comm_name;
  if (ncclResult_t r = CheckConfig(a.config, &blocking, &comm_name); r != ncclSuccess) return r;
  if (!StartRuntime()) return ncclUnhandledCudaError;
  auto* c = new (std::nothrow) Comm();
  if (c == nullptr) return ncclSystemError;
  Registry& r = R();
  bool passthrough = false;
  try {
    std::lock_guard<std::mutex> lock(r.mu);
    c->id = r.next_id++;
    c->nranks = a.nranks;
    c->rank = a.rank;
    c->device = CurrentDevice();
    c->origin = a.origin;
    c->stable_id = Fnv1a64(a.ids[0].internal, sizeof(a.ids[0].internal));
    std::string store_key = StoreKeyFromVirtualId(a.ids[0]);
    std::string name = !store_key.empty() ? GroupNameFromStoreKey(store_key) : std::string();
    if (name.empty() && !comm_name.empty()) name = GroupNameFromCommName(comm_name);
    c->key = !store_key.empty() ? store_key : HexPrefix(a.ids[0].internal, 32);
    std::string desc, bound;
    c->members = ResolveMembers(r, a.nranks, a.rank, name, &desc, &bound);
    c->name = !bound.empty() ? bound : name;
    c->desc = !desc.empty() ? desc : comm_name;
    if (c->members.empty() && a.nranks > 1) {
      Log("nccl")->info("comm {} ({} ranks, rank {}): members not known yet{}", c->id, a.nranks, a.rank,
                        name.empty() ? "" : " (group " + name + ")");
    }
    // The coordinator keys communicators by the full unique id (it saw the same bytes in its store).
    passthrough =
        FinishComm(r, c, blocking, ipc::HexEncode(std::string_view(a.ids[0].internal, sizeof(a.ids[0].internal))));
  } catch (...) {
    return ncclSystemError;
  }
  if (passthrough) {
    if (ncclResult_t e = SetupPassthrough(c, a.config); e != ncclSuccess) {
      c->destroyed.store(true);
      return e;
    }
  }
  *out = c;
  return blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t CommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1) return ncclInvalidArgument;
  ncclUniqueId id;
  GetUniqueId(&id);
  for (int i = 0; i < ndev; ++i) {
    InitArgs a;
    a.nranks = ndev;
    a.rank = i;
    a.ids = &id;
    a.origin = "initall";
    Comm* c = nullptr;
    ncclResult_t r = CommInit(a, &c);
    if (r != ncclSuccess) return r;
    c->device = devlist != nullptr ? devlist[i] : i;
    comms[i] = reinterpret_cast<ncclComm_t>(c);
  }
  return ncclSuccess;
}

ncclResult_t CommSplit(Comm* parent, int color, int key, ncclComm_t* out, const ncclConfig_t* config) {
  if (out == nullptr) return ncclInvalidArgument;
  *out = nullptr;
  ncclComm_t real_child = nullptr;
  if (parent->real != nullptr) {
    // Why first, also for NCCL_SPLIT_NOCOLOR: a real split is a collective over every member of the real parent.
    // A split of a passthrough communicator is one too (its members are all real, on distinct GPUs).
    ncclConfig_t cfg_copy = RealConfig(config);
    ncclResult_t e = RealNccl().ncclCommSplit(parent->real, color, key, &real_child, &cfg_copy);
    if (e != ncclSuccess && e != ncclInProgress) {
      SetLastError(std::string("real ncclCommSplit: ") + RealNccl().ncclGetErrorString(e));
      return e;
    }
  }
  // Why count NOCOLOR calls too: a split is a collective over the whole parent, so every member counts every split
  // alike and the child's stable id (hence its coordinator key) agrees on all members whichever groups they join.
  uint32_t n = parent->splits.fetch_add(1);
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;  // this rank joins no communicator
  if (color < 0) {
    SetLastError("ncclCommSplit: color must be >= 0 or NCCL_SPLIT_NOCOLOR");
    return ncclInvalidArgument;
  }
  int blocking = parent->blocking;
  std::string comm_name;
  if (ncclResult_t r = CheckConfig(config, &blocking, &comm_name); r != ncclSuccess) return r;
  if (!StartRuntime()) return ncclUnhandledCudaError;
  const Config& cfg = Cfg();
  Registry& r = R();
  auto* c = new (std::nothrow) Comm();
  if (c == nullptr) return ncclSystemError;
  bool passthrough = false;
  try {
    std::lock_guard<std::mutex> lock(r.mu);
    std::vector<int32_t> members;
    if (ThisScope().active) {
      members = ThisScope().ranks;
    } else if (!comm_name.empty()) {
      std::string name = GroupNameFromCommName(comm_name);
      for (Group& g : r.groups) {
        if (g.name == name) members = g.ranks;
      }
    }
    auto me = std::find(members.begin(), members.end(), cfg.rank);
    if (members.empty() || me == members.end()) {
      // Why fail: the new size depends on every rank's color; with virtual peers only the hook's scope (or the
      // group registry via commName) can tell it. Guessing would make ncclCommCount lie to torch's all_to_all.
      SetLastError("ncclCommSplit: the members of the new communicator are unknown (load the Prism Python hook, "
                   "lib/python/sitecustomize.py, so new_group registers its ranks)");
      Log("nccl")->error("{}", tls_last_error);
      delete c;
      return ncclInvalidUsage;
    }
    c->id = r.next_id++;
    c->members = members;
    c->nranks = static_cast<int>(members.size());
    c->rank = static_cast<int>(me - members.begin());
    c->device = parent->device;
    c->origin = "split";
    uint64_t mix[3] = {parent->stable_id, static_cast<uint64_t>(color), n};
    c->stable_id = Fnv1a64(mix, sizeof(mix));
    c->key = "split:" + std::to_string(parent->id) + ":" + std::to_string(color) + ":" + std::to_string(key);
    c->name = comm_name.empty() ? std::string() : GroupNameFromCommName(comm_name);
    c->desc = comm_name;
    c->real = real_child;
    // Why a key of its own and the members: the coordinator cannot derive a split's members (no unique id went
    // through the store); this rank knows them from the hook's scope, and the stable id names the split alike on
    // every member (the local key holds this process's parent id and torch's per-rank split key).
    passthrough = FinishComm(r, c, blocking, fmt::format("split:{:016x}", c->stable_id), true);
  } catch (...) {
    return ncclSystemError;
  }
  if (passthrough) {  // a split of a communicator that is not passthrough, whose new members all are real
    if (ncclResult_t e = SetupPassthrough(c, config); e != ncclSuccess) {
      c->destroyed.store(true);
      return e;
    }
  }
  *out = reinterpret_cast<ncclComm_t>(c);
  return blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t CommShrink(Comm* parent, const int* exclude, int nexclude, ncclComm_t* out, const ncclConfig_t* config,
                        int flags) {
  if (out == nullptr || nexclude < 0 || (nexclude > 0 && exclude == nullptr)) return ncclInvalidArgument;
  *out = nullptr;
  int blocking = parent->blocking;
  std::string comm_name;
  if (ncclResult_t r = CheckConfig(config, &blocking, &comm_name); r != ncclSuccess) return r;
  std::vector<bool> gone(parent->nranks, false);
  for (int i = 0; i < nexclude; ++i) {
    if (exclude[i] < 0 || exclude[i] >= parent->nranks) return ncclInvalidArgument;
    gone[exclude[i]] = true;
  }
  if (gone[parent->rank]) {
    SetLastError("ncclCommShrink: this rank is in the exclusion list");
    return ncclInvalidArgument;
  }
  (void)flags;
  if (!StartRuntime()) return ncclUnhandledCudaError;
  Registry& r = R();
  auto* c = new (std::nothrow) Comm();
  if (c == nullptr) return ncclSystemError;
  try {
    std::lock_guard<std::mutex> lock(r.mu);
    int new_rank = 0, n = 0;
    for (int i = 0; i < parent->nranks; ++i) {
      if (gone[i]) continue;
      if (i == parent->rank) new_rank = n;
      if (!parent->members.empty()) c->members.push_back(parent->members[i]);
      ++n;
    }
    uint32_t k = parent->splits.fetch_add(1);
    c->id = r.next_id++;
    c->nranks = n;
    c->rank = new_rank;
    c->device = parent->device;
    c->origin = "shrink";
    uint64_t mix[3] = {parent->stable_id, 0xffffffffull, k};
    c->stable_id = Fnv1a64(mix, sizeof(mix));
    c->key = "shrink:" + std::to_string(parent->id) + ":" + std::to_string(k);
    c->name = parent->name;
    c->desc = comm_name.empty() ? parent->desc : comm_name;
    // Why no passthrough: shrinking a real communicator would need the real ncclCommShrink on every survivor;
    // the shrunk communicator is libprism's own (docs/libprism.md, passthrough).
    const bool known = static_cast<int>(c->members.size()) == c->nranks;
    if (FinishComm(r, c, blocking, known ? fmt::format("shrink:{:016x}", c->stable_id) : std::string(), known))
      c->use_coordinator = c->real_members > 1 && CoordActive();
  } catch (...) {
    return ncclSystemError;
  }
  *out = reinterpret_cast<ncclComm_t>(c);
  return blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t CommFinalize(Comm* c) {
  if (c->finalized.exchange(true)) {
    SetLastError("ncclCommFinalize: communicator already finalized");
    return ncclInvalidUsage;
  }
  if (c->real != nullptr) return RealNccl().ncclCommFinalize(c->real);
  if (!c->blocking) {
    c->async_error.store(ncclInProgress);
    return ncclInProgress;
  }
  return ncclSuccess;
}

namespace {
ncclResult_t ReleaseReal(Comm* c, bool abort) {
  ncclComm_t rc = nullptr;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    std::swap(rc, c->real);
  }
  if (rc == nullptr) return ncclSuccess;
  g_passthrough.fetch_sub(1);
  return abort ? RealNccl().ncclCommAbort(rc) : RealNccl().ncclCommDestroy(rc);
}
}  // namespace

ncclResult_t CommDestroy(Comm* c) {
  c->destroyed.store(true);
  return ReleaseReal(c, false);
}

ncclResult_t CommAbort(Comm* c) {
  c->destroyed.store(true);
  return ReleaseReal(c, true);
}

int PassthroughComms() { return g_passthrough.load(std::memory_order_relaxed); }

ncclResult_t CommRevoke(Comm* c, int flags) {
  if (flags != NCCL_REVOKE_DEFAULT) return ncclInvalidArgument;
  c->revoked.store(true);
  c->async_error.store(ncclInProgress);
  return ncclSuccess;
}

ncclResult_t CommGetAsyncError(Comm* c, ncclResult_t* out) {
  if (out == nullptr) return ncclInvalidArgument;
  if (c->real != nullptr) return RealNccl().ncclCommGetAsyncError(c->real, out);
  int e = c->async_error.load();
  // Why: nonblocking init/finalize/revoke report ncclInProgress once, then complete (nothing is pending in
  // libprism's communicators), as NCCL documents for a quick completion.
  if (e == ncclInProgress) c->async_error.store(ncclSuccess);
  *out = static_cast<ncclResult_t>(e);
  return ncclSuccess;
}

void BeginGroupScope(const std::vector<int32_t>& ranks) {
  ThisScope().active = true;
  ThisScope().ranks = ranks;
  std::sort(ThisScope().ranks.begin(), ThisScope().ranks.end());  // torch's new_group sorts its ranks
  ThisScope().created.clear();
}

void EndGroupScope() {
  ThisScope().active = false;
  ThisScope().ranks.clear();
  ThisScope().created.clear();
}

void RegisterGroup(const std::string& name, const std::vector<int32_t>& ranks, const std::string& desc) {
  Registry& r = R();
  std::vector<CommEvent> updated;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    Group g;
    g.name = name;
    g.desc = desc;
    g.ranks = ranks;
    for (Comm* c : ThisScope().created) {
      std::lock_guard<std::mutex> cl(c->mu);
      if (c->name.empty()) c->name = name;
      if (c->desc.empty()) c->desc = desc;
      if (c->members.empty() && static_cast<int>(ranks.size()) == c->nranks) c->members = ranks;
      g.bound = true;
      updated.push_back(EventOf(*c));
    }
    for (Comm* c : r.comms) {
      if (c->name != name || !c->members.empty() || static_cast<int>(ranks.size()) != c->nranks) continue;
      std::lock_guard<std::mutex> cl(c->mu);
      c->members = ranks;
      if (c->desc.empty()) c->desc = desc;
      g.bound = true;
      updated.push_back(EventOf(*c));
    }
    for (Group& old : r.groups) {
      if (old.name == name) old.name.clear();  // a re-used name (group destroyed and recreated) wins
    }
    r.groups.push_back(std::move(g));
  }
  EndGroupScope();
  for (const CommEvent& e : updated) LogComm(e);
}

void InvalidateP2pRange(uint64_t addr, uint64_t bytes) {
  Registry& r = R();
  std::vector<Comm*> comms;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    comms = r.comms;
  }
  for (Comm* c : comms) {
    std::lock_guard<std::mutex> cl(c->mu);
    c->history.InvalidateRange(addr, bytes);
  }
}

std::vector<Comm*> AllComms() {
  Registry& r = R();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.comms;
}

}  // namespace prism::interpose
