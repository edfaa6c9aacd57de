#include "interpose/core/kernel_trace.h"

#include <cxxabi.h>
#include <errno.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "common/log.h"
#include "interpose/core/config.h"
#include "interpose/core/runtime.h"
#include "interpose/core/event_log.h"
#include "interpose/core/gpu.h"
#include "prism/kernels.h"
#include "interpose/core/real_symbols.h"

// Without the CUPTI headers (or with -DPRISM_NO_CUPTI, to check that build) tracing reports itself off.
#if __has_include(<cupti_activity.h>) && !defined(PRISM_NO_CUPTI)
#include <cupti_activity.h>
#include <cupti_result.h>
#include <cupti_version.h>
#define PRISM_HAVE_CUPTI 1
#else
#define PRISM_HAVE_CUPTI 0
#endif

namespace prism::interpose {

#if PRISM_HAVE_CUPTI
static constexpr uint32_t kBuiltCuptiVersion = CUPTI_API_VERSION;
#else
static constexpr uint32_t kBuiltCuptiVersion = 130000;
#endif

bool CuptiVersionCompatible(uint32_t built, uint32_t runtime) {
  // Why the major only: CUDA 13 numbers CUPTI's API 13xxxx; records keep their layout within a major (new fields
  // are appended) and we read no field added after CUDA 12.
  if (built >= 100000) return runtime / 10000 == built / 10000;
  return runtime == built;
}

std::vector<std::string> CuptiCandidates(const std::string& forced, const std::string& loaded_cupti,
                                         const std::vector<std::string>& loaded_library_dirs) {
  if (!forced.empty()) return {forced};
  // Why only the loaded one when there is one: two copies of CUPTI in a process would both hook the driver.
  if (!loaded_cupti.empty()) return {loaded_cupti};
  const std::string so = "libcupti.so." + std::to_string(kBuiltCuptiVersion >= 100000 ? kBuiltCuptiVersion / 10000 : 12);
  std::vector<std::string> out;
  auto add = [&](const std::string& p) {
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  };
  for (const std::string& d : loaded_library_dirs) {
    if (d.empty()) continue;
    add(d + "/" + so);                                    // nvidia/cu13/lib holds cudart and cupti together
    add(d + "/../../cuda_cupti/lib/" + so);               // nvidia/cuda_runtime/lib -> nvidia/cuda_cupti/lib
    add(d + "/../../nvidia/cu13/lib/" + so);              // torch/lib -> nvidia/cu13/lib
    add(d + "/../../nvidia/cuda_cupti/lib/" + so);        // torch/lib -> nvidia/cuda_cupti/lib
  }
  add(so);
  add("libcupti.so");
  add("/usr/local/cuda/extras/CUPTI/lib64/" + so);
  add("/usr/local/cuda/extras/CUPTI/lib64/libcupti.so");
  add("/usr/local/cuda/lib64/" + so);
  add("/usr/local/cuda/lib/" + so);
  return out;
}

std::string DemangleKernelName(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? std::string(d) : std::string(mangled);
  std::free(d);
  return out;
}

namespace {

constexpr size_t kBufferBytes = 4u << 20;  // per CUPTI buffer
constexpr int kMaxBuffers = 64;            // 256 MiB at most; beyond that CUPTI drops records (counted)
constexpr uint64_t kSyncEveryNs = 1000000000ull;

enum State : int { kNotStarted = 0, kOn = 1, kOff = 2 };

#if PRISM_HAVE_CUPTI
struct CuptiFns {
  CUptiResult (*getVersion)(uint32_t*) = nullptr;
  CUptiResult (*getResultString)(CUptiResult, const char**) = nullptr;
  CUptiResult (*registerCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flushAll)(uint32_t) = nullptr;
  CUptiResult (*flushPeriod)(uint32_t) = nullptr;  // optional
  CUptiResult (*getNextRecord)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*getDropped)(CUcontext, uint32_t, size_t*) = nullptr;
  CUptiResult (*getTimestamp)(uint64_t*) = nullptr;
};
#endif

struct Buffer {
  uint8_t* data = nullptr;
  size_t valid = 0;
};

}  // namespace

// The rank's kernel trace (a part of the runtime, runtime.h).
struct KernelTracer {
  std::atomic<bool> tried{false};  // KernelTraceAtCudaInit ran (once per runtime)
  int kernels = 0;  // Config::kernels when it started (Finish disables what was enabled)
  std::mutex mu;  // ready, free_bufs, allocated, stop
  std::condition_variable cv;
  std::deque<Buffer> ready;
  std::vector<uint8_t*> free_bufs;
  int allocated = 0;
  bool stop = false;
  std::thread writer;

  int state = kNotStarted;
  bool finished = false;
  pid_t pid = 0;
  FILE* file = nullptr;
  std::string path, why, cupti_path;
  uint32_t cupti_version = 0;
  std::vector<int> enabled_kinds;
  bool active = true;  // PRISM_KERNELS_TOGGLE: the kinds are enabled now (touched by the iteration-mark thread only)
#if PRISM_HAVE_CUPTI
  CuptiFns f;
#endif
  // Writer-thread state (Start and Finish touch it only while the writer is not running).
  uint64_t records = 0, dropped = 0, buffers = 0, incomplete = 0;
  uint64_t last_sync_ns = 0;
  std::unordered_map<const void*, std::pair<std::string, uint32_t>> kernel_names;  // CUPTI's name pointer
  std::unordered_map<std::string, uint32_t> name_ids;
  std::mutex err_mu;
  std::vector<std::string> pending_errors;  // for the event file (report.json warnings), once it is open
};

namespace {

using Tracer = KernelTracer;

Tracer& T() { return Rt().kernel_tracer(); }

// The tracer CUPTI delivers buffers to (its callbacks take no context; CUPTI is one per process): the one that
// enabled it.
std::atomic<Tracer*> g_cupti_tracer{nullptr};
std::mutex g_start_mu;
bool g_atexit_registered = false;

void AddPendingError(Tracer& t, const std::string& e) {
  std::lock_guard<std::mutex> lock(t.err_mu);
  t.pending_errors.push_back(e);
}

// Hands queued messages to the event file once it is open (its writer turns them into report.json warnings).
void DeliverPendingErrors(Tracer& t) {
  std::lock_guard<std::mutex> lock(t.err_mu);
  if (t.pending_errors.empty() || EventLogPath().empty()) return;
  for (const std::string& e : t.pending_errors) LogError("kernels: " + e);
  t.pending_errors.clear();
}

void WriteHeader(Tracer& t, const char* status) {
  static const char* const kKindNames[] = {"kernel", "memcpy", "memset", "nvtx"};
  std::string kinds = "[";
  for (size_t i = 0; i < t.enabled_kinds.size(); ++i) {
    kinds += (i ? ",\"" : "\"") + std::string(kKindNames[t.enabled_kinds[i]]) + "\"";
  }
  kinds += "]";
  const Config& c = Cfg();
  std::fprintf(t.file,
               "{\"type\":\"kernels\",\"v\":%d,\"rank\":%d,\"pid\":%d,\"status\":\"%s\",\"why\":\"%s\",\"cupti\":\"%s\","
               "\"cupti_version\":%u,\"built_version\":%u,\"kinds\":%s,\"toggle\":%d,\"t_host_ns\":%llu}\n",
               kernels::kFormatVersion, c.rank, static_cast<int>(getpid()), status, JsonEscape(t.why).c_str(),
               JsonEscape(t.cupti_path).c_str(), t.cupti_version, kBuiltCuptiVersion, kinds.c_str(),
               c.kernels_toggle, static_cast<unsigned long long>(HostNowNs()));
  std::fflush(t.file);
}

#if PRISM_HAVE_CUPTI

std::string ResultString(const Tracer& t, CUptiResult r) {
  const char* s = nullptr;
  if (t.f.getResultString != nullptr) t.f.getResultString(r, &s);
  return std::string(s != nullptr ? s : "CUPTI error") + " (" + std::to_string(static_cast<int>(r)) + ")";
}

// One clock point: the CUPTI clock against the host clock (the tightest of 5 brackets) and libprism's last
// measured GPU-host offset (0 = not measured yet).
void WriteSync(Tracer& t) {
  uint64_t best_err = UINT64_MAX, host = 0;
  int64_t cmh = 0;
  for (int i = 0; i < 5; ++i) {
    uint64_t c = 0;
    const uint64_t h0 = HostNowNs();
    if (t.f.getTimestamp(&c) != CUPTI_SUCCESS) return;
    const uint64_t h1 = HostNowNs();
    if (h1 - h0 < best_err) {
      best_err = h1 - h0;
      host = h0 + (h1 - h0) / 2;
      cmh = static_cast<int64_t>(c) - static_cast<int64_t>(host);
    }
  }
  const int64_t gmh = TheGpu().Calibration().gpu_minus_host_ns;
  std::fprintf(t.file,
               "{\"type\":\"sync\",\"host_ns\":%llu,\"cupti_minus_host_ns\":%lld,\"err_ns\":%llu,"
               "\"gpu_minus_host_ns\":%lld,\"gpu\":%s}\n",
               static_cast<unsigned long long>(host), static_cast<long long>(cmh),
               static_cast<unsigned long long>(best_err / 2), static_cast<long long>(gmh), gmh != 0 ? "true" : "false");
  t.last_sync_ns = HostNowNs();
}

uint32_t NameIdOf(Tracer& t, const std::string& name) {
  auto it = t.name_ids.find(name);
  if (it != t.name_ids.end()) return it->second;
  const uint32_t id = static_cast<uint32_t>(t.name_ids.size());
  t.name_ids.emplace(name, id);
  std::fprintf(t.file, "{\"type\":\"name\",\"id\":%u,\"name\":\"%s\"}\n", id, JsonEscape(name).c_str());
  return id;
}

// Kernel names: CUPTI shares one string per kernel across records, so the pointer is a cache key (checked
// against the text, in case a module was unloaded and the address reused).
uint32_t KernelNameId(Tracer& t, const char* mangled) {
  if (mangled == nullptr) return NameIdOf(t, "?");
  auto it = t.kernel_names.find(mangled);
  if (it != t.kernel_names.end() && it->second.first == mangled) return it->second.second;
  const uint32_t id = NameIdOf(t, DemangleKernelName(mangled));
  t.kernel_names[mangled] = {mangled, id};
  return id;
}

void WriteGraph(FILE* f, uint32_t graph, uint64_t node) {
  if (graph != 0 || node != 0) {
    std::fprintf(f, ",\"g\":%u,\"gn\":%llu", graph, static_cast<unsigned long long>(node));
  }
}

void WriteRecord(Tracer& t, const CUpti_Activity* rec) {
  FILE* f = t.file;
  switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      if (k->start == 0 || k->end < k->start) {
        ++t.incomplete;
        return;
      }
      const uint32_t id = KernelNameId(t, k->name);
      std::fprintf(f,
                   "{\"type\":\"k\",\"s\":%llu,\"e\":%llu,\"dev\":%u,\"ctx\":%u,\"st\":%u,\"n\":%u,\"c\":%u,"
                   "\"grid\":[%d,%d,%d],\"block\":[%d,%d,%d]",
                   static_cast<unsigned long long>(k->start), static_cast<unsigned long long>(k->end), k->deviceId,
                   k->contextId, k->streamId, id, k->correlationId, k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY,
                   k->blockZ);
      WriteGraph(f, k->graphId, k->graphNodeId);
      std::fputs("}\n", f);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      if (m->start == 0 || m->end < m->start) {
        ++t.incomplete;
        return;
      }
      std::fprintf(f,
                   "{\"type\":\"m\",\"s\":%llu,\"e\":%llu,\"dev\":%u,\"ctx\":%u,\"st\":%u,\"c\":%u,\"b\":%llu,"
                   "\"kind\":%u",
                   static_cast<unsigned long long>(m->start), static_cast<unsigned long long>(m->end), m->deviceId,
                   m->contextId, m->streamId, m->correlationId, static_cast<unsigned long long>(m->bytes),
                   static_cast<unsigned>(m->copyKind));
      WriteGraph(f, m->graphId, m->graphNodeId);
      std::fputs("}\n", f);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      if (m->start == 0 || m->end < m->start) {
        ++t.incomplete;
        return;
      }
      std::fprintf(f, "{\"type\":\"ms\",\"s\":%llu,\"e\":%llu,\"dev\":%u,\"ctx\":%u,\"st\":%u,\"c\":%u,\"b\":%llu",
                   static_cast<unsigned long long>(m->start), static_cast<unsigned long long>(m->end), m->deviceId,
                   m->contextId, m->streamId, m->correlationId, static_cast<unsigned long long>(m->bytes));
      WriteGraph(f, m->graphId, m->graphNodeId);
      std::fputs("}\n", f);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MARKER: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMarker2*>(rec);
      const uint32_t tid = m->objectKind == CUPTI_ACTIVITY_OBJECT_THREAD ? m->objectId.pt.threadId : 0;
      // Why the ids first: a new name writes its own line, which must not land inside this one.
      const int64_t name = m->name != nullptr ? NameIdOf(t, m->name) : -1;
      const int64_t domain = m->domain != nullptr ? NameIdOf(t, m->domain) : -1;
      std::fprintf(f, "{\"type\":\"nvtx\",\"t\":%llu,\"id\":%u,\"f\":%u,\"tid\":%u",
                   static_cast<unsigned long long>(m->timestamp), m->id, static_cast<unsigned>(m->flags), tid);
      if (name >= 0) std::fprintf(f, ",\"n\":%lld", static_cast<long long>(name));
      if (domain >= 0) std::fprintf(f, ",\"dm\":%lld", static_cast<long long>(domain));
      std::fputs("}\n", f);
      break;
    }
    default:
      return;  // kinds we did not enable (CUPTI may add bookkeeping records)
  }
  ++t.records;
}

void Process(Tracer& t, const Buffer& b) {
  ++t.buffers;
  CUpti_Activity* rec = nullptr;
  while (b.valid > 0 && t.f.getNextRecord(b.data, b.valid, &rec) == CUPTI_SUCCESS) WriteRecord(t, rec);
  size_t dropped = 0;
  if (t.f.getDropped(nullptr, 0, &dropped) == CUPTI_SUCCESS) t.dropped += dropped;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *max_records = 0;
  Tracer* tp = g_cupti_tracer.load(std::memory_order_acquire);
  if (tp == nullptr) {
    *buffer = nullptr;
    *size = 0;
    return;
  }
  Tracer& t = *tp;
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.free_bufs.empty()) {
    *buffer = t.free_bufs.back();
    t.free_bufs.pop_back();
    *size = kBufferBytes;
    return;
  }
  void* p = t.allocated < kMaxBuffers ? std::aligned_alloc(8, kBufferBytes) : nullptr;
  if (p != nullptr) ++t.allocated;
  *buffer = static_cast<uint8_t*>(p);
  *size = p != nullptr ? kBufferBytes : 0;  // none: CUPTI drops records (counted)
}

// On CUPTI's worker thread (or the thread that forces a flush): only queue the buffer.
void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Tracer* tp = g_cupti_tracer.load(std::memory_order_acquire);
  if (tp == nullptr) return;
  Tracer& t = *tp;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    t.ready.push_back(Buffer{buffer, valid});
  }
  t.cv.notify_one();
}

void WriterLoop(Tracer* tp) {
  Tracer& t = *tp;
  while (true) {
    std::deque<Buffer> work;
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(t.mu);
      t.cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return t.stop || !t.ready.empty(); });
      work.swap(t.ready);
      stopping = t.stop;
    }
    for (const Buffer& b : work) {
      Process(t, b);
      std::lock_guard<std::mutex> lock(t.mu);
      t.free_bufs.push_back(b.data);
    }
    if (HostNowNs() - t.last_sync_ns >= kSyncEveryNs) WriteSync(t);
    std::fflush(t.file);
    DeliverPendingErrors(t);
    if (stopping) {
      std::lock_guard<std::mutex> lock(t.mu);
      if (t.ready.empty()) break;
    }
  }
}

// dlopens the first usable libcupti. False with *why listing what was tried.
bool LoadCupti(Tracer& t, std::string* why) {
  const char* forced_env = std::getenv("PRISM_CUPTI_LIBRARY");
  const std::string forced = forced_env != nullptr ? forced_env : "";
  std::vector<std::string> dirs;
  for (const char* part : {"libcudart.so", "libtorch_cuda.so", "libtorch.so"}) {
    std::string p = FindLoadedObject(part);
    size_t slash = p.rfind('/');
    if (slash != std::string::npos) dirs.push_back(p.substr(0, slash));
  }
  std::string tried;
  for (const std::string& cand : CuptiCandidates(forced, FindLoadedObject("libcupti.so"), dirs)) {
    // Why skip missing absolute paths quietly: most candidates do not exist on a given machine.
    if (cand[0] == '/' && access(cand.c_str(), F_OK) != 0) {
      if (!forced.empty()) tried += cand + ": no such file; ";
      continue;
    }
    void* h = dlopen(cand.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = dlerror();
      tried += cand + ": " + (e != nullptr ? e : "dlopen failed") + "; ";
      continue;
    }
    CuptiFns f;
    bool ok = true;
    auto get = [&](auto* fn, const char* name, bool required) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(RealDlsym(h, name));
      if (*fn == nullptr && required) {
        ok = false;
        tried += cand + ": no " + name + "; ";
      }
    };
    get(&f.getVersion, "cuptiGetVersion", true);
    get(&f.getResultString, "cuptiGetResultString", true);
    get(&f.registerCallbacks, "cuptiActivityRegisterCallbacks", true);
    get(&f.enable, "cuptiActivityEnable", true);
    get(&f.disable, "cuptiActivityDisable", true);
    get(&f.flushAll, "cuptiActivityFlushAll", true);
    get(&f.flushPeriod, "cuptiActivityFlushPeriod", false);
    get(&f.getNextRecord, "cuptiActivityGetNextRecord", true);
    get(&f.getDropped, "cuptiActivityGetNumDroppedRecords", true);
    get(&f.getTimestamp, "cuptiGetTimestamp", true);
    if (!ok) continue;
    uint32_t v = 0;
    if (f.getVersion(&v) != CUPTI_SUCCESS || !CuptiVersionCompatible(kBuiltCuptiVersion, v)) {
      tried += cand + ": CUPTI API version " + std::to_string(v) + ", libprism reads version " +
               std::to_string(kBuiltCuptiVersion) + " records; ";
      continue;
    }
    Dl_info info{};
    t.cupti_path = dladdr(reinterpret_cast<void*>(f.getVersion), &info) != 0 && info.dli_fname != nullptr
                       ? std::string(info.dli_fname)
                       : cand;
    t.cupti_version = v;
    t.f = f;
    return true;
  }
  *why = "no usable libcupti (" + (tried.empty() ? std::string("none found") : tried.substr(0, tried.size() - 2)) +
         "); set PRISM_CUPTI_LIBRARY to one";
  return false;
}

// Enables the activity kinds. False with *why when not even kernels can be recorded.
bool Enable(Tracer& t, std::string* why) {
  g_cupti_tracer.store(&t, std::memory_order_release);
  CUptiResult r = t.f.registerCallbacks(&BufferRequested, &BufferCompleted);
  if (r != CUPTI_SUCCESS) {
    *why = "cuptiActivityRegisterCallbacks: " + ResultString(t, r);
    return false;
  }
  if (Cfg().kernels == 2 && std::getenv("NVTX_INJECTION64_PATH") == nullptr) {
    // Why here and not earlier: the library path is known only now. NVTX reads the variable at its first call, so
    // ranges a job opened before CUDA initialisation are not seen (docs/kernels.md).
    setenv("NVTX_INJECTION64_PATH", t.cupti_path.c_str(), 0);
  }
  r = t.f.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (r != CUPTI_SUCCESS) {
    *why = "cuptiActivityEnable(CONCURRENT_KERNEL): " + ResultString(t, r) +
           " (another profiler, e.g. torch.profiler or Nsight, may hold CUPTI)";
    return false;
  }
  t.enabled_kinds.push_back(0);
  const std::pair<CUpti_ActivityKind, int> optional[] = {
      {CUPTI_ACTIVITY_KIND_MEMCPY, 1}, {CUPTI_ACTIVITY_KIND_MEMSET, 2}, {CUPTI_ACTIVITY_KIND_MARKER, 3}};
  for (const auto& [kind, idx] : optional) {
    if (idx == 3 && Cfg().kernels != 2) continue;
    r = t.f.enable(kind);
    if (r == CUPTI_SUCCESS) {
      t.enabled_kinds.push_back(idx);
    } else {
      const std::string msg = std::string("cannot record ") + (idx == 1 ? "memcpy" : idx == 2 ? "memset" : "NVTX") +
                              ": " + ResultString(t, r);
      Log("interpose")->warn("kernels: {}", msg);
      AddPendingError(t, msg);
    }
  }
  if (t.f.flushPeriod != nullptr) t.f.flushPeriod(1000);  // completed buffers at least every second
  return true;
}

#endif  // PRISM_HAVE_CUPTI

void Start() {
  Tracer& t = T();
  const Config& c = Cfg();
  t.kernels = c.kernels;
  if (c.kernels == 0) {
    t.state = kOff;
    t.why = "not requested (PRISM_KERNELS unset)";
    return;
  }
  if (c.out_dir.empty()) {
    t.state = kOff;
    t.why = "PRISM_OUT_DIR is not set: nowhere to write kernel records";
    Log("interpose")->warn("kernels: {}", t.why);
    return;
  }
  mkdir(c.out_dir.c_str(), 0777);  // Why ignore the result: it usually exists (the launcher made it).
  t.path = c.out_dir + "/" + kernels::FileName(c.rank);
  const int fd = open(t.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    t.state = kOff;
    t.why = "cannot open " + t.path + ": " + std::strerror(errno);
    Log("interpose")->warn("kernels: {}; running without kernel records", t.why);
    AddPendingError(t, t.why);
    return;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    // Another process of this rank (the job itself, when we are a child that also uses CUDA) already traces.
    close(fd);
    t.state = kOff;
    t.why = "another process of rank " + std::to_string(c.rank) + " records into " + t.path;
    Log("interpose")->info("kernels: {}", t.why);
    return;
  }
  if (ftruncate(fd, 0) != 0 || (t.file = fdopen(fd, "w")) == nullptr) {
    close(fd);
    t.state = kOff;
    t.why = "cannot write " + t.path;
    Log("interpose")->warn("kernels: {}; running without kernel records", t.why);
    AddPendingError(t, t.why);
    return;
  }
  t.pid = getpid();
  std::string why;
#if PRISM_HAVE_CUPTI
  const bool on = LoadCupti(t, &why) && Enable(t, &why);
#else
  why = "libprism was built without the CUPTI headers (cupti_activity.h)";
  const bool on = false;
#endif
  if (!on) {
    t.state = kOff;
    t.why = why;
    WriteHeader(t, "off");
    Log("interpose")->warn("kernels: {}; running without kernel records", why);
    AddPendingError(t, why + "; ran without kernel records");
  } else {
    t.state = kOn;
    WriteHeader(t, "on");
#if PRISM_HAVE_CUPTI
    WriteSync(t);
    std::fflush(t.file);
    t.stop = false;
    try {
      t.writer = std::thread(&WriterLoop, &t);
    } catch (...) {
      // Why no way back: CUPTI is enabled; its buffers pile up in the queue and are written at exit.
      Log("interpose")->warn("kernels: cannot start the writer thread; records are written at exit");
    }
#endif
    Log("interpose")->info("kernels: recording with {} (CUPTI {}) into {}", t.cupti_path, t.cupti_version, t.path);
  }
  // Why registered last: atexit handlers run in reverse order, so ours runs before any CUPTI registered while
  // loading, and before the CUDA runtime's teardown.
  if (!g_atexit_registered) {
    g_atexit_registered = true;
    std::atexit(&KernelTraceFinish);
  }
}

}  // namespace

void KernelTraceAtIteration(uint32_t iteration) {
  const int n = Cfg().kernels_toggle;
  if (n <= 0) return;
  Tracer& t = T();
  if (t.state != kOn || t.finished) return;
  const bool want = (iteration / static_cast<uint32_t>(n)) % 2 == 0;
  if (want == t.active) return;
#if PRISM_HAVE_CUPTI
  static const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                              CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_MARKER};
  for (int idx : t.enabled_kinds) {
    const CUptiResult r = want ? t.f.enable(kKinds[idx]) : t.f.disable(kKinds[idx]);
    if (r != CUPTI_SUCCESS) {
      static std::atomic<bool> warned{false};
      if (!warned.exchange(true)) {
        Log("interpose")->warn("kernels: PRISM_KERNELS_TOGGLE: cupti{}: {}", want ? "ActivityEnable" : "ActivityDisable",
                               ResultString(t, r));
      }
    }
  }
#endif
  t.active = want;
}

void KernelTraceAtCudaInit() {
  Tracer& t = T();
  if (t.tried.load(std::memory_order_acquire)) return;
  // Why: should loading or enabling CUPTI call cudaGetDeviceCount on this thread, it must not wait for itself.
  thread_local bool starting = false;
  if (starting) return;
  starting = true;
  struct Reset {
    bool* flag;
    ~Reset() { *flag = false; }
  } reset{&starting};
  std::lock_guard<std::mutex> lock(g_start_mu);
  if (t.tried.load(std::memory_order_relaxed)) return;
  try {
    Start();
  } catch (...) {
    t.state = kOff;
    t.why = "internal error while starting";
  }
  t.tried.store(true, std::memory_order_release);
}

namespace {

void Finish(Tracer& t) {
  // Why before the lock: a child forked while the parent held it would wait forever at its exit.
  if (t.pid != getpid()) return;
  std::lock_guard<std::mutex> lock(g_start_mu);
  if (t.pid != getpid() || t.finished) return;  // never started here, or a forked child: the parent's file
  t.finished = true;
#if PRISM_HAVE_CUPTI
  if (t.state == kOn) {
    t.f.flushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    t.f.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    t.f.disable(CUPTI_ACTIVITY_KIND_MEMCPY);
    t.f.disable(CUPTI_ACTIVITY_KIND_MEMSET);
    if (t.kernels == 2) t.f.disable(CUPTI_ACTIVITY_KIND_MARKER);
    {
      std::lock_guard<std::mutex> l(t.mu);
      t.stop = true;
    }
    t.cv.notify_one();
    if (t.writer.joinable()) {
      t.writer.join();
    } else {
      std::deque<Buffer> work;
      {
        std::lock_guard<std::mutex> l(t.mu);
        work.swap(t.ready);
      }
      for (const Buffer& b : work) Process(t, b);
    }
    WriteSync(t);
    std::fprintf(t.file, "{\"type\":\"end\",\"records\":%llu,\"dropped\":%llu,\"buffers\":%llu,\"incomplete\":%llu}\n",
                 static_cast<unsigned long long>(t.records), static_cast<unsigned long long>(t.dropped),
                 static_cast<unsigned long long>(t.buffers), static_cast<unsigned long long>(t.incomplete));
    if (t.dropped > 0) {
      AddPendingError(t, std::to_string(t.dropped) + " records dropped by CUPTI (buffers full)");
    }
  }
#endif
  DeliverPendingErrors(t);
  if (t.file != nullptr) {
    std::fclose(t.file);  // also releases the lock
    t.file = nullptr;
  }
}

}  // namespace

void KernelTraceFinish() { Finish(T()); }

KernelTracer* NewKernelTracer() { return new KernelTracer(); }

// Why a tracer that enabled CUPTI is not freed: CUPTI keeps our callbacks, and its thread may still call them
// (they find no tracer then).
void DestroyPart(KernelTracer* p) {
  Finish(*p);
  Tracer* expected = p;
  if (g_cupti_tracer.compare_exchange_strong(expected, nullptr)) return;
  delete p;
}

std::string KernelTraceState() {
  std::lock_guard<std::mutex> lock(g_start_mu);
  switch (T().state) {
    case kOn: return "on";
    case kOff: return "off";
    default: return "";
  }
}

std::string KernelTraceWhy() {
  std::lock_guard<std::mutex> lock(g_start_mu);
  return T().why;
}

std::string KernelTracePath() {
  std::lock_guard<std::mutex> lock(g_start_mu);
  return T().path;
}

}  // namespace prism::interpose
