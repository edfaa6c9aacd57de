#include "calibrate/measure.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>

#include <cuda.h>
#include <nccl.h>

#include "calibrate/fit.h"  // FormatBytes

extern char** environ;

namespace prism::calibrate {

std::vector<uint64_t> SizeLadder(uint64_t min_bytes, uint64_t max_bytes, int step) {
  std::vector<uint64_t> out;
  if (min_bytes == 0 || min_bytes > max_bytes || step < 2) return out;
  for (uint64_t s = min_bytes; s < max_bytes; s *= static_cast<uint64_t>(step)) {
    out.push_back(s);
    if (s > max_bytes / static_cast<uint64_t>(step)) break;
  }
  out.push_back(max_bytes);
  return out;
}

uint64_t RoundBytes(MeasuredOp op, uint64_t bytes, int nranks, int elem_size) {
  const uint64_t e = static_cast<uint64_t>(std::max(elem_size, 1));
  uint64_t unit = e;
  if (op == MeasuredOp::kAllGather || op == MeasuredOp::kReduceScatter || op == MeasuredOp::kAllToAll) {
    unit = e * static_cast<uint64_t>(std::max(nranks, 1));
  }
  return std::max<uint64_t>(1, bytes / unit) * unit;
}

std::vector<int> DefaultCommSizes(int gpus) {
  std::vector<int> out;
  for (int n = 2; n < gpus; n *= 2) out.push_back(n);
  if (gpus >= 2) out.push_back(gpus);
  return out;
}

bool ParseByteSize(const std::string& text, uint64_t* out, std::string* error) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = -1;
  if (unit.empty() || unit == "B") shift = 0;
  if (unit == "K" || unit == "KB" || unit == "KIB") shift = 10;
  if (unit == "M" || unit == "MB" || unit == "MIB") shift = 20;
  if (unit == "G" || unit == "GB" || unit == "GIB") shift = 30;
  if (i == 0 || i > 12 || shift < 0) {
    if (error) *error = "\"" + text + "\" is not a size (examples: 8, 64K, 256M, 1G)";
    return false;
  }
  uint64_t v = std::stoull(text.substr(0, i));
  if (v == 0 || v > (uint64_t{1} << 40) >> shift) {
    if (error) *error = "\"" + text + "\" is out of range (1 B .. 1 TiB)";
    return false;
  }
  *out = v << shift;
  return true;
}

namespace {

// The lib/ folder of the nvidia.nccl Python package, asked of `python`. "" when the interpreter or package is absent.
std::string WheelNcclDir(const std::string& python) {
  if (python.empty() || python.find('\'') != std::string::npos) return "";
  // Why both: a regular package has __file__; a namespace package only __path__ (already the package folder).
  std::string cmd = "'" + python +
                    "' -c 'import os, nvidia.nccl as m; print(os.path.dirname(m.__file__) if getattr(m, \"__file__\", "
                    "None) else list(m.__path__)[0])' 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return "";
  char buf[4096];
  std::string out;
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  if (pclose(f) != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "" : out + "/lib";
}

}  // namespace

std::vector<std::string> NcclCandidates(const std::string& explicit_path) {
  if (!explicit_path.empty()) return {explicit_path};
  // Why the wheel first: the jobs prism models load PyTorch's NCCL; on the GPU machine the loader's libnccl.so.2
  // was the system's 2.28.3 while torch's wheel is 2.28.9 (found by the first calibration there).
  std::vector<std::string> out;
  std::vector<std::string> pythons;
  for (const char* var : {"PRISM_PYTHON", "PYTHON"}) {
    if (const char* v = std::getenv(var); v && *v) pythons.emplace_back(v);
  }
  pythons.emplace_back("python3");
  for (const std::string& py : pythons) {
    std::string dir = WheelNcclDir(py);
    if (dir.empty()) continue;
    std::string p = dir + "/libnccl.so.2";
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  out.emplace_back("libnccl.so.2");                        // the loader's search path
  out.emplace_back("/usr/local/cuda/lib64/libnccl.so.2");  // the toolkit's, where it is not in the loader's path
  return out;
}

namespace {

#define PRISM_CAL_STR2(x) #x
#define PRISM_CAL_STR(x) PRISM_CAL_STR2(x)

// Driver entry points, resolved by the names cuda.h maps them to (cuMemAlloc -> "cuMemAlloc_v2").
struct CudaApi {
  void* lib = nullptr;
  decltype(&::cuInit) Init = nullptr;
  decltype(&::cuDriverGetVersion) DriverGetVersion = nullptr;
  decltype(&::cuDeviceGetCount) DeviceGetCount = nullptr;
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDeviceGetName) DeviceGetName = nullptr;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
  decltype(&::cuDeviceCanAccessPeer) DeviceCanAccessPeer = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) PrimaryCtxRetain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) PrimaryCtxRelease = nullptr;
  decltype(&::cuCtxSetCurrent) CtxSetCurrent = nullptr;
  decltype(&::cuMemAlloc) MemAlloc = nullptr;
  decltype(&::cuMemFree) MemFree = nullptr;
  decltype(&::cuMemsetD8) MemsetD8 = nullptr;
  decltype(&::cuStreamCreate) StreamCreate = nullptr;
  decltype(&::cuStreamDestroy) StreamDestroy = nullptr;
  decltype(&::cuStreamSynchronize) StreamSynchronize = nullptr;
  decltype(&::cuEventCreate) EventCreate = nullptr;
  decltype(&::cuEventRecord) EventRecord = nullptr;
  decltype(&::cuEventSynchronize) EventSynchronize = nullptr;
  decltype(&::cuEventElapsedTime) EventElapsedTime = nullptr;
  decltype(&::cuEventDestroy) EventDestroy = nullptr;
  decltype(&::cuGetErrorString) GetErrorString = nullptr;

  bool Load(const std::string& path, std::string* error) {
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      *error = "no NVIDIA driver here: dlopen(" + path + ") failed (" + std::string(e ? e : "?") +
               "). calibrate measures on a machine with NVIDIA GPUs; elsewhere fit a measurement file with "
               "`prism-run calibrate --from FILE`";
      return false;
    }
    bool ok = true;
    std::string missing;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn) {
        ok = false;
        missing += std::string(missing.empty() ? "" : ", ") + name;
      }
    };
#define PRISM_CAL_SYM(field, fn) sym(field, PRISM_CAL_STR(fn))
    PRISM_CAL_SYM(Init, cuInit);
    PRISM_CAL_SYM(DriverGetVersion, cuDriverGetVersion);
    PRISM_CAL_SYM(DeviceGetCount, cuDeviceGetCount);
    PRISM_CAL_SYM(DeviceGet, cuDeviceGet);
    PRISM_CAL_SYM(DeviceGetName, cuDeviceGetName);
    PRISM_CAL_SYM(DeviceGetAttribute, cuDeviceGetAttribute);
    PRISM_CAL_SYM(DeviceCanAccessPeer, cuDeviceCanAccessPeer);
    PRISM_CAL_SYM(PrimaryCtxRetain, cuDevicePrimaryCtxRetain);
    PRISM_CAL_SYM(PrimaryCtxRelease, cuDevicePrimaryCtxRelease);
    PRISM_CAL_SYM(CtxSetCurrent, cuCtxSetCurrent);
    PRISM_CAL_SYM(MemAlloc, cuMemAlloc);
    PRISM_CAL_SYM(MemFree, cuMemFree);
    PRISM_CAL_SYM(MemsetD8, cuMemsetD8);
    PRISM_CAL_SYM(StreamCreate, cuStreamCreate);
    PRISM_CAL_SYM(StreamDestroy, cuStreamDestroy);
    PRISM_CAL_SYM(StreamSynchronize, cuStreamSynchronize);
    PRISM_CAL_SYM(EventCreate, cuEventCreate);
    PRISM_CAL_SYM(EventRecord, cuEventRecord);
    PRISM_CAL_SYM(EventSynchronize, cuEventSynchronize);
    PRISM_CAL_SYM(EventElapsedTime, cuEventElapsedTime);
    PRISM_CAL_SYM(EventDestroy, cuEventDestroy);
    PRISM_CAL_SYM(GetErrorString, cuGetErrorString);
#undef PRISM_CAL_SYM
    if (!ok) *error = path + ": missing driver entry points " + missing + " (driver too old?)";
    return ok;
  }

  std::string Err(CUresult r, const char* what) const {
    const char* s = nullptr;
    if (GetErrorString) GetErrorString(r, &s);
    return std::string(what) + " failed: " + (s ? s : "CUDA error") + " (" + std::to_string(static_cast<int>(r)) + ")";
  }
};

struct NcclApi {
  void* lib = nullptr;
  std::string path;
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclCommInitAll) CommInitAll = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclAllGather) AllGather = nullptr;
  decltype(&::ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&::ncclBroadcast) Broadcast = nullptr;
  decltype(&::ncclAlltoAll) AlltoAll = nullptr;  // optional: NCCL before 2.28 has none (grouped send/recv then)
  decltype(&::ncclSend) Send = nullptr;
  decltype(&::ncclRecv) Recv = nullptr;
  decltype(&::ncclGroupStart) GroupStart = nullptr;
  decltype(&::ncclGroupEnd) GroupEnd = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;

  bool Load(const std::vector<std::string>& candidates, std::string* error) {
    std::string tried;
    for (const std::string& c : candidates) {
      lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib) {
        path = c;
        break;
      }
      const char* e = dlerror();
      tried += "\n  " + c + ": " + (e ? e : "?");
    }
    if (!lib) {
      *error = "cannot load NCCL (pass --nccl PATH, or set PYTHON to an interpreter with torch). Tried:" + tried;
      return false;
    }
    // The file the dynamic loader actually picked, for the record.
    if (void* addr = dlsym(lib, "ncclGetVersion")) {
      Dl_info info;
      if (dladdr(addr, &info) && info.dli_fname) path = info.dli_fname;
    }
    bool ok = true;
    std::string missing;
    auto sym = [&](auto& fn, const char* name, bool required) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && required) {
        ok = false;
        missing += std::string(missing.empty() ? "" : ", ") + name;
      }
    };
    sym(GetVersion, "ncclGetVersion", true);
    sym(CommInitAll, "ncclCommInitAll", true);
    sym(CommDestroy, "ncclCommDestroy", true);
    sym(AllReduce, "ncclAllReduce", true);
    sym(AllGather, "ncclAllGather", true);
    sym(ReduceScatter, "ncclReduceScatter", true);
    sym(Broadcast, "ncclBroadcast", true);
    sym(AlltoAll, "ncclAlltoAll", false);
    sym(Send, "ncclSend", true);
    sym(Recv, "ncclRecv", true);
    sym(GroupStart, "ncclGroupStart", true);
    sym(GroupEnd, "ncclGroupEnd", true);
    sym(GetErrorString, "ncclGetErrorString", true);
    if (!ok) *error = path + ": not an NCCL library (missing " + missing + ")";
    return ok;
  }

  std::string Err(ncclResult_t r, const char* what) const {
    const char* s = GetErrorString ? GetErrorString(r) : nullptr;
    return std::string(what) + " failed: " + (s ? s : "NCCL error") + " (" + std::to_string(static_cast<int>(r)) + ")";
  }
};

struct Gpu {
  int index = 0;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr send = 0, recv = 0;
  CUevent start = nullptr, stop = nullptr;
};

// Runs `body(i)` on one thread per entry of `idx` and waits; a point that takes longer than timeout_s means a hung
// NCCL, which no call can cancel: say so and end the process.
void RunThreads(const std::vector<int>& idx, const std::function<void(int)>& body, double timeout_s,
                const std::string& what) {
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0;
  std::vector<std::thread> threads;
  threads.reserve(idx.size());
  for (int i : idx) {
    threads.emplace_back([&, i] {
      body(i);
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return done == idx.size(); })) {
      std::fprintf(stderr, "prism-run calibrate: %s did not finish within %.0f s (NCCL hung?); giving up\n",
                   what.c_str(), timeout_s);
      std::fflush(stderr);
      std::_Exit(1);
    }
  }
  for (std::thread& t : threads) t.join();
}

class Measurer {
 public:
  Measurer(const MeasureOptions& o, std::ostream& log) : o_(o), log_(log) {}
  ~Measurer() { Cleanup(); }

  bool Run(MeasurementSet* out, std::string* error);

 private:
  bool Setup(MeasurementSet* out, std::string* error);
  void Cleanup();
  // One phase of one point: an aligning call, then `iters` calls between the events, on every GPU of `members`.
  // The slowest GPU's time in ms.
  bool Phase(const std::vector<int>& members, ncclComm_t* comms, MeasuredOp op, uint64_t bytes, int src, int dst,
             int iters, double* ms, std::string* error);
  ncclResult_t Launch(MeasuredOp op, const Gpu& g, ncclComm_t comm, int rank, int nranks, uint64_t bytes, int src,
                      int dst) const;
  bool Point(const std::vector<int>& members, ncclComm_t* comms, MeasuredOp op, uint64_t bytes, int src, int dst,
             Measurement* m, std::string* error);
  bool Wanted(MeasuredOp op) const {
    return o_.ops.empty() || std::find(o_.ops.begin(), o_.ops.end(), op) != o_.ops.end();
  }

  const MeasureOptions& o_;
  std::ostream& log_;
  CudaApi cu_;
  NcclApi nccl_;
  std::vector<Gpu> gpus_;
  uint64_t max_bytes_ = 0;
};

bool Measurer::Setup(MeasurementSet* out, std::string* error) {
  if (!cu_.Load(o_.cuda_path, error)) return false;
  CUresult r = cu_.Init(0);
  if (r != CUDA_SUCCESS) {
    *error = cu_.Err(r, "cuInit") + ": no usable NVIDIA GPU or driver";
    return false;
  }
  int count = 0;
  if ((r = cu_.DeviceGetCount(&count)) != CUDA_SUCCESS) {
    *error = cu_.Err(r, "cuDeviceGetCount");
    return false;
  }
  int g = o_.gpus > 0 ? o_.gpus : count;
  if (count < 2 || g < 2) {
    *error = "calibrate measures collectives between GPUs: " + std::to_string(count) + " visible GPU(s)" +
             (o_.gpus > 0 ? ", --gpus " + std::to_string(o_.gpus) : std::string()) + " (at least 2 needed)";
    return false;
  }
  if (g > count) {
    *error = "--gpus " + std::to_string(g) + ": only " + std::to_string(count) + " visible GPU(s)";
    return false;
  }
  cu_.DriverGetVersion(&out->cuda_driver_version);

  // Why before NCCL is loaded: NCCL reads its variables at initialisation; NVLS must never be switched on here.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  setenv("NCCL_NVLINK_SHARP_ENABLE", "0", 0);
  if (!nccl_.Load(NcclCandidates(o_.nccl_path), error)) return false;
  int v = 0;
  nccl_.GetVersion(&v);
  out->nccl_version = NcclVersionString(v);
  out->nccl_library = nccl_.path;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "NCCL_", 5) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    if (eq) out->nccl_env[std::string(*e, eq - *e)] = eq + 1;
  }

  max_bytes_ = o_.max_bytes;
  gpus_.resize(g);
  for (int i = 0; i < g; ++i) {
    Gpu& d = gpus_[i];
    d.index = i;
    if ((r = cu_.DeviceGet(&d.dev, i)) != CUDA_SUCCESS || (r = cu_.PrimaryCtxRetain(&d.ctx, d.dev)) != CUDA_SUCCESS) {
      *error = cu_.Err(r, ("GPU " + std::to_string(i) + ": cuDeviceGet/cuDevicePrimaryCtxRetain").c_str());
      return false;
    }
    cu_.CtxSetCurrent(d.ctx);
    if ((r = cu_.StreamCreate(&d.stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS ||
        (r = cu_.EventCreate(&d.start, CU_EVENT_DEFAULT)) != CUDA_SUCCESS ||
        (r = cu_.EventCreate(&d.stop, CU_EVENT_DEFAULT)) != CUDA_SUCCESS) {
      *error = cu_.Err(r, ("GPU " + std::to_string(i) + ": stream/event creation").c_str());
      return false;
    }
    if ((r = cu_.MemAlloc(&d.send, max_bytes_)) != CUDA_SUCCESS ||
        (r = cu_.MemAlloc(&d.recv, max_bytes_)) != CUDA_SUCCESS) {
      *error = cu_.Err(r, ("GPU " + std::to_string(i) + ": cuMemAlloc of 2 x " + FormatBytes(max_bytes_)).c_str());
      return false;
    }
    cu_.MemsetD8(d.send, 0, max_bytes_);
    cu_.MemsetD8(d.recv, 0, max_bytes_);
    cu_.StreamSynchronize(nullptr);  // Why: the memsets ran on the legacy stream, which ours do not wait for
  }
  char name[256] = {0};
  cu_.DeviceGetName(name, sizeof name - 1, gpus_[0].dev);
  int major = 0, minor = 0;
  cu_.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, gpus_[0].dev);
  cu_.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, gpus_[0].dev);
  out->gpu_name = name;
  out->compute_capability = major * 10 + minor;
  out->gpu_count = g;
  for (int i = 1; i < g; ++i) {
    char other[256] = {0};
    cu_.DeviceGetName(other, sizeof other - 1, gpus_[i].dev);
    if (out->gpu_name != other) log_ << "warning: GPU " << i << " is a " << other << ", GPU 0 a " << name << "\n";
  }
  for (int i = 0; i < g; ++i) {
    for (int j = 0; j < g; ++j) {
      int can = 1;
      if (i != j && cu_.DeviceCanAccessPeer(&can, gpus_[i].dev, gpus_[j].dev) == CUDA_SUCCESS && !can) {
        log_ << "warning: GPU " << i << " cannot access GPU " << j
             << " directly (no NVLink/PCIe peer access): NCCL goes through host memory\n";
      }
    }
  }
  return true;
}

void Measurer::Cleanup() {
  for (Gpu& d : gpus_) {
    if (!d.ctx) continue;
    cu_.CtxSetCurrent(d.ctx);
    if (d.stream) cu_.StreamSynchronize(d.stream);
    if (d.send) cu_.MemFree(d.send);
    if (d.recv) cu_.MemFree(d.recv);
    if (d.start) cu_.EventDestroy(d.start);
    if (d.stop) cu_.EventDestroy(d.stop);
    if (d.stream) cu_.StreamDestroy(d.stream);
    cu_.PrimaryCtxRelease(d.dev);
    d = Gpu{};
  }
  gpus_.clear();
}

ncclResult_t Measurer::Launch(MeasuredOp op, const Gpu& g, ncclComm_t comm, int rank, int nranks, uint64_t bytes,
                              int src, int dst) const {
  void* sb = reinterpret_cast<void*>(g.send);
  void* rb = reinterpret_cast<void*>(g.recv);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(g.stream);
  const size_t count = bytes / 4;  // f32 elements of S
  const size_t per_rank = count / static_cast<size_t>(nranks);
  switch (op) {
    case MeasuredOp::kAllReduce: return nccl_.AllReduce(sb, rb, count, ncclFloat32, ncclSum, comm, s);
    case MeasuredOp::kAllGather: return nccl_.AllGather(sb, rb, per_rank, ncclFloat32, comm, s);
    case MeasuredOp::kReduceScatter: return nccl_.ReduceScatter(sb, rb, per_rank, ncclFloat32, ncclSum, comm, s);
    case MeasuredOp::kBroadcast: return nccl_.Broadcast(sb, rb, count, ncclFloat32, 0, comm, s);
    case MeasuredOp::kAllToAll: {
      if (nccl_.AlltoAll) return nccl_.AlltoAll(sb, rb, per_rank, ncclFloat32, comm, s);
      ncclResult_t r = nccl_.GroupStart();
      for (int p = 0; p < nranks && r == ncclSuccess; ++p) {
        size_t off = static_cast<size_t>(p) * per_rank * 4;
        r = nccl_.Send(static_cast<char*>(sb) + off, per_rank, ncclFloat32, p, comm, s);
        if (r == ncclSuccess) r = nccl_.Recv(static_cast<char*>(rb) + off, per_rank, ncclFloat32, p, comm, s);
      }
      ncclResult_t e = nccl_.GroupEnd();
      return r != ncclSuccess ? r : e;
    }
    case MeasuredOp::kSendRecv:
      if (rank == src) return nccl_.Send(sb, count, ncclFloat32, dst, comm, s);
      if (rank == dst) return nccl_.Recv(rb, count, ncclFloat32, src, comm, s);
      return ncclSuccess;
    default: return ncclInvalidArgument;
  }
}

bool Measurer::Phase(const std::vector<int>& members, ncclComm_t* comms, MeasuredOp op, uint64_t bytes, int src,
                     int dst, int iters, double* ms, std::string* error) {
  const int n = static_cast<int>(members.size());
  std::vector<double> elapsed(gpus_.size(), 0.0);
  std::vector<std::string> errors(gpus_.size());
  // Send/receive: only the two GPUs take part; `members` are then the whole communicator's ranks.
  std::vector<int> active;
  for (int rank = 0; rank < n; ++rank) {
    if (op != MeasuredOp::kSendRecv || rank == src || rank == dst) active.push_back(rank);
  }
  RunThreads(
      active,
      [&](int rank) {
        const Gpu& g = gpus_[members[rank]];
        std::string& err = errors[g.index];
        cu_.CtxSetCurrent(g.ctx);
        ncclResult_t nr = Launch(op, g, comms[rank], rank, n, bytes, src, dst);  // aligns the GPUs
        if (nr != ncclSuccess) {
          err = nccl_.Err(nr, ToString(op));
          return;
        }
        CUresult r = cu_.EventRecord(g.start, g.stream);
        for (int i = 0; i < iters && nr == ncclSuccess; ++i) nr = Launch(op, g, comms[rank], rank, n, bytes, src, dst);
        if (nr != ncclSuccess) {
          err = nccl_.Err(nr, ToString(op));
          return;
        }
        if (r == CUDA_SUCCESS) r = cu_.EventRecord(g.stop, g.stream);
        if (r == CUDA_SUCCESS) r = cu_.EventSynchronize(g.stop);
        float t = 0;
        if (r == CUDA_SUCCESS) r = cu_.EventElapsedTime(&t, g.start, g.stop);
        if (r != CUDA_SUCCESS) {
          err = cu_.Err(r, "timing events");
          return;
        }
        elapsed[g.index] = t;
      },
      o_.timeout_s, std::string(ToString(op)) + " of " + FormatBytes(bytes));
  *ms = 0;
  for (size_t i = 0; i < gpus_.size(); ++i) {
    if (!errors[i].empty()) {
      *error = "GPU " + std::to_string(i) + ": " + errors[i];
      return false;
    }
    *ms = std::max(*ms, elapsed[i]);
  }
  return true;
}

bool Measurer::Point(const std::vector<int>& members, ncclComm_t* comms, MeasuredOp op, uint64_t bytes, int src,
                     int dst, Measurement* m, std::string* error) {
  double ms = 0;
  const int warm = std::max(o_.warmup, 1);
  if (!Phase(members, comms, op, bytes, src, dst, warm, &ms, error)) return false;
  double per_call_ms = std::max(ms / warm, 1e-6);
  int iters = static_cast<int>(std::ceil(o_.target_ms / per_call_ms));
  iters = std::clamp(iters, std::max(o_.min_iters, 1), std::max(o_.max_iters, o_.min_iters));
  if (!Phase(members, comms, op, bytes, src, dst, iters, &ms, error)) return false;
  m->op = op;
  m->nranks = op == MeasuredOp::kSendRecv ? 2 : static_cast<int>(members.size());
  m->src = op == MeasuredOp::kSendRecv ? src : -1;
  m->dst = op == MeasuredOp::kSendRecv ? dst : -1;
  m->bytes = bytes;
  m->iterations = iters;
  m->time_us = ms * 1e3 / iters;
  FillBandwidth(m);
  char line[256];
  std::string what = ToString(op);
  if (op == MeasuredOp::kSendRecv) what += " " + std::to_string(src) + ">" + std::to_string(dst);
  std::snprintf(line, sizeof line, "%-15s %3d %10s %7d %12.2f %10.2f %10.2f\n", what.c_str(), m->nranks,
                FormatBytes(bytes).c_str(), iters, m->time_us, m->algbw_GBps, m->busbw_GBps);
  log_ << line << std::flush;
  return true;
}

bool Measurer::Run(MeasurementSet* out, std::string* error) {
  out->created = UtcNow();
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) == 0) out->host = host;
  out->dtype = "f32";
  if (!Setup(out, error)) return false;
  const int g = static_cast<int>(gpus_.size());
  log_ << "measuring on " << g << " x " << out->gpu_name << " (compute capability " << out->compute_capability
       << "), NCCL " << out->nccl_version << " from " << out->nccl_library << "; NCCL_NVLS_ENABLE="
       << out->Env("NCCL_NVLS_ENABLE") << "\n";
  std::vector<uint64_t> sizes = SizeLadder(o_.min_bytes, std::min(o_.max_bytes, max_bytes_), o_.step);
  if (sizes.empty()) {
    *error = "no message sizes (--min-bytes must be at most --max-bytes, --step at least 2)";
    return false;
  }
  std::vector<int> comm_sizes = o_.comm_sizes.empty() ? DefaultCommSizes(g) : o_.comm_sizes;
  for (int n : comm_sizes) {
    if (n < 2 || n > g) {
      *error = "communicator size " + std::to_string(n) + " is outside 2.." + std::to_string(g);
      return false;
    }
  }
  char header[256];
  std::snprintf(header, sizeof header, "%-15s %3s %10s %7s %12s %10s %10s\n", "op", "n", "bytes", "iters", "time us",
                "algbw GB/s", "busbw GB/s");
  log_ << header;

  const MeasuredOp colls[] = {MeasuredOp::kAllReduce, MeasuredOp::kAllGather, MeasuredOp::kReduceScatter,
                              MeasuredOp::kBroadcast, MeasuredOp::kAllToAll};
  bool any_coll = false;
  for (MeasuredOp op : colls) any_coll = any_coll || Wanted(op);
  bool p2p_done = !Wanted(MeasuredOp::kSendRecv);
  if (!any_coll) comm_sizes.clear();
  if (!p2p_done && std::find(comm_sizes.begin(), comm_sizes.end(), g) == comm_sizes.end()) comm_sizes.push_back(g);
  for (int n : comm_sizes) {
    std::vector<int> members(n);
    for (int i = 0; i < n; ++i) members[i] = i;
    std::vector<ncclComm_t> comms(n, nullptr);
    ncclResult_t nr = nccl_.CommInitAll(comms.data(), n, members.data());
    if (nr != ncclSuccess) {
      *error = nccl_.Err(nr, ("ncclCommInitAll on " + std::to_string(n) + " GPUs").c_str());
      return false;
    }
    bool ok = true;
    for (MeasuredOp op : colls) {
      if (!Wanted(op) || !ok) continue;
      uint64_t last = 0;
      for (uint64_t s : sizes) {
        uint64_t b = RoundBytes(op, s, n, 4);
        if (b == last || b > max_bytes_) continue;
        last = b;
        Measurement m;
        if (!(ok = Point(members, comms.data(), op, b, -1, -1, &m, error))) break;
        out->results.push_back(m);
      }
    }
    // Send/receive on the communicator of every GPU (the others stay idle).
    if (ok && !p2p_done && n == g) {
      p2p_done = true;
      for (int src = 0; src < g && ok; ++src) {
        for (int dst = 0; dst < g && ok; ++dst) {
          if (src == dst || (!o_.all_pairs && src != 0)) continue;
          uint64_t last = 0;
          for (uint64_t s : sizes) {
            uint64_t b = RoundBytes(MeasuredOp::kSendRecv, s, 2, 4);
            if (b == last || b > max_bytes_) continue;
            last = b;
            Measurement m;
            if (!(ok = Point(members, comms.data(), MeasuredOp::kSendRecv, b, src, dst, &m, error))) break;
            out->results.push_back(m);
          }
        }
      }
    }
    for (ncclComm_t c : comms) {
      if (c) nccl_.CommDestroy(c);
    }
    if (!ok) return false;
  }
  if (out->results.empty()) {
    *error = "nothing measured (check --ops)";
    return false;
  }
  return true;
}

}  // namespace

bool Measure(const MeasureOptions& options, MeasurementSet* out, std::ostream& log, std::string* error) {
  MeasurementSet set;
  Measurer m(options, log);
  std::string err;
  if (!m.Run(&set, &err)) {
    if (error) *error = err;
    return false;
  }
  *out = std::move(set);
  return true;
}

}  // namespace prism::calibrate
