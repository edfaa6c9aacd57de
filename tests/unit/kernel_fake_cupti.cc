// A fake libcupti for the kernel-trace tests (no GPU): the activity API functions libprism's tracer calls
// (core/kernel_trace.cc), with records the test adds through fake_cupti_* and delivers at cuptiActivityFlushAll,
// in the real record structs of the CUPTI headers. Knobs (environment, read at each call):
//   FAKE_CUPTI_VERSION      what cuptiGetVersion reports (default: the headers' CUPTI_API_VERSION)
//   FAKE_CUPTI_FAIL_ENABLE  an activity kind number whose cuptiActivityEnable fails (NOT_COMPATIBLE)
//   FAKE_CUPTI_SKEW_NS      cuptiGetTimestamp = CLOCK_REALTIME + this
//   FAKE_CUPTI_DROPPED      records reported dropped (once)
#include <cupti_activity.h>
#include <cupti_result.h>
#include <cupti_version.h>
#include <time.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kStride = 512;  // every record at a fixed stride (the real buffer packs them by kind)
static_assert(sizeof(CUpti_ActivityKernel10) <= kStride, "kernel record larger than the stride");

std::mutex g_mu;
CUpti_BuffersCallbackRequestFunc g_request = nullptr;
CUpti_BuffersCallbackCompleteFunc g_complete = nullptr;
std::vector<std::vector<uint8_t>> g_pending;  // one record each
std::vector<int> g_enabled;
std::vector<char*> g_names;  // kept alive: records point at them, as CUPTI's do
bool g_dropped_reported = false;
int g_flushes = 0;

long long EnvInt(const char* name, long long dflt) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 10) : dflt;
}

const char* Keep(const char* s) {
  if (s == nullptr) return nullptr;
  for (char* n : g_names)
    if (std::strcmp(n, s) == 0) return n;
  g_names.push_back(strdup(s));
  return g_names.back();
}

template <typename T>
void Push(const T& rec) {
  std::vector<uint8_t> b(kStride, 0);
  std::memcpy(b.data(), &rec, sizeof rec);
  std::lock_guard<std::mutex> lock(g_mu);
  g_pending.push_back(std::move(b));
}

}  // namespace

extern "C" {

CUptiResult CUPTIAPI cuptiGetVersion(uint32_t* version) {
  *version = static_cast<uint32_t>(EnvInt("FAKE_CUPTI_VERSION", CUPTI_API_VERSION));
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char** str) {
  *str = result == CUPTI_ERROR_NOT_COMPATIBLE ? "CUPTI_ERROR_NOT_COMPATIBLE (fake)" : "fake CUPTI result";
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                    CUpti_BuffersCallbackCompleteFunc complete) {
  if (request == nullptr || complete == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  std::lock_guard<std::mutex> lock(g_mu);
  g_request = request;
  g_complete = complete;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind) {
  if (EnvInt("FAKE_CUPTI_FAIL_ENABLE", -1) == static_cast<long long>(kind)) return CUPTI_ERROR_NOT_COMPATIBLE;
  std::lock_guard<std::mutex> lock(g_mu);
  g_enabled.push_back(static_cast<int>(kind));
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = g_enabled.begin(); it != g_enabled.end();) {
    if (*it == static_cast<int>(kind)) it = g_enabled.erase(it);
    else ++it;
  }
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityFlushPeriod(uint32_t) { return CUPTI_SUCCESS; }

CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t) {
  std::vector<std::vector<uint8_t>> recs;
  CUpti_BuffersCallbackRequestFunc request;
  CUpti_BuffersCallbackCompleteFunc complete;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    recs.swap(g_pending);
    request = g_request;
    complete = g_complete;
    ++g_flushes;
  }
  if (request == nullptr) return CUPTI_ERROR_INVALID_OPERATION;
  size_t i = 0;
  while (i < recs.size()) {
    uint8_t* buf = nullptr;
    size_t size = 0, max_records = 0;
    request(&buf, &size, &max_records);
    if (buf == nullptr || size < kStride) return CUPTI_SUCCESS;  // records dropped
    size_t used = 0;
    while (i < recs.size() && used + kStride <= size) {
      std::memcpy(buf + used, recs[i].data(), kStride);
      used += kStride;
      ++i;
    }
    complete(nullptr, 0, buf, size, used);
  }
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid, CUpti_Activity** record) {
  if (buffer == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  uint8_t* next = *record == nullptr ? buffer : reinterpret_cast<uint8_t*>(*record) + kStride;
  if (next + kStride > buffer + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<CUpti_Activity*>(next);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext, uint32_t, size_t* dropped) {
  std::lock_guard<std::mutex> lock(g_mu);
  *dropped = g_dropped_reported ? 0 : static_cast<size_t>(EnvInt("FAKE_CUPTI_DROPPED", 0));
  g_dropped_reported = true;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetTimestamp(uint64_t* timestamp) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  *timestamp = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec) +
               static_cast<uint64_t>(EnvInt("FAKE_CUPTI_SKEW_NS", 0));
  return CUPTI_SUCCESS;
}

// ---- Test controls -------------------------------------------------------------------------------------------

uint64_t fake_cupti_now() {
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  return t;
}

int fake_cupti_enabled(int kind) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (int k : g_enabled)
    if (k == kind) return 1;
  return 0;
}

int fake_cupti_flushes() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_flushes;
}

void fake_cupti_reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_pending.clear();
  g_enabled.clear();
  g_dropped_reported = false;
  g_flushes = 0;
}

void fake_cupti_add_kernel(const char* name, uint64_t start, uint64_t end, uint32_t stream, uint32_t graph,
                           uint64_t graph_node, uint32_t correlation) {
  CUpti_ActivityKernel10 k;
  std::memset(&k, 0, sizeof k);
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.start = start;
  k.end = end;
  k.deviceId = 0;
  k.contextId = 1;
  k.streamId = stream;
  k.gridX = 108;
  k.gridY = 1;
  k.gridZ = 1;
  k.blockX = 256;
  k.blockY = 1;
  k.blockZ = 1;
  k.correlationId = correlation;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    k.name = Keep(name);
  }
  k.graphId = graph;
  k.graphNodeId = graph_node;
  Push(k);
}

void fake_cupti_add_memcpy(uint64_t start, uint64_t end, uint32_t stream, uint64_t bytes, int copy_kind) {
  CUpti_ActivityMemcpy6 m;
  std::memset(&m, 0, sizeof m);
  m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  m.copyKind = static_cast<uint8_t>(copy_kind);
  m.bytes = bytes;
  m.start = start;
  m.end = end;
  m.contextId = 1;
  m.streamId = stream;
  m.correlationId = 7;
  Push(m);
}

void fake_cupti_add_memset(uint64_t start, uint64_t end, uint32_t stream, uint64_t bytes) {
  CUpti_ActivityMemset4 m;
  std::memset(&m, 0, sizeof m);
  m.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  m.bytes = bytes;
  m.start = start;
  m.end = end;
  m.contextId = 1;
  m.streamId = stream;
  Push(m);
}

void fake_cupti_add_marker(uint64_t t, uint32_t id, uint32_t flags, const char* name, uint32_t thread) {
  CUpti_ActivityMarker2 m;
  std::memset(&m, 0, sizeof m);
  m.kind = CUPTI_ACTIVITY_KIND_MARKER;
  m.flags = static_cast<CUpti_ActivityFlag>(flags);
  m.timestamp = t;
  m.id = id;
  m.objectKind = CUPTI_ACTIVITY_OBJECT_THREAD;
  m.objectId.pt.processId = 1;
  m.objectId.pt.threadId = thread;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    m.name = Keep(name);
    m.domain = nullptr;
  }
  Push(m);
}

}  // extern "C"
