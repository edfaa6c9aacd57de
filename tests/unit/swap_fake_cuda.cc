// A fake libcuda.so.1 for the context-switching tests (swap_driver_test, swap_e2e_test): the checkpoint entry points
// the coordinator's driver resolves, over a "GPU" that is a directory shared with the fake ranks
// (tests/data/swap/swap_shim.py). FAKE_GPU_DIR holds one file per process on the GPU, named by its pid, holding
// "<bytes> <state>" (running, locked, checkpointed); FAKE_GPU_DIR/lock serialises every reader and writer (flock).
//  - Lock: running -> locked, and SIGSTOP to the process (a locked process makes no CUDA progress; a stopped one makes
//    none at all). Checkpoint: locked -> checkpointed (its bytes leave the GPU). Restore: checkpointed -> locked, only
//    when the GPU (FAKE_GPU_BYTES) has room for its bytes besides every running or locked process, else
//    CUDA_ERROR_OUT_OF_MEMORY, as the real restore fails. Unlock: locked -> running, SIGCONT.
//  - A call in the wrong state returns CUDA_ERROR_ILLEGAL_STATE (401), an unknown pid CUDA_ERROR_INVALID_VALUE (1).
//  - FAKE_CKPT_MS: each checkpoint and restore takes this long (default 20). FAKE_CUDA_LOG: one line per call
//    ("checkpoint <pid> <bytes> resident <sum>"). FAKE_CUDA_INIT_ERROR: cuInit fails.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace {

constexpr int kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kNotInitialized = 3, kNoDevice = 100,
              kIllegalState = 401;
bool g_init = false;

std::string Dir() {
  const char* d = std::getenv("FAKE_GPU_DIR");
  return d ? d : "";
}

uint64_t GpuBytes() {
  const char* b = std::getenv("FAKE_GPU_BYTES");
  return b ? std::strtoull(b, nullptr, 10) : (80ull << 30);
}

struct Locked {
  int fd = -1;
  Locked() {
    fd = ::open((Dir() + "/lock").c_str(), O_RDWR | O_CREAT, 0644);
    if (fd >= 0) ::flock(fd, LOCK_EX);
  }
  ~Locked() {
    if (fd >= 0) {
      ::flock(fd, LOCK_UN);
      ::close(fd);
    }
  }
};

bool Read(int pid, uint64_t* bytes, std::string* state) {
  std::ifstream f(Dir() + "/" + std::to_string(pid));
  return static_cast<bool>(f >> *bytes >> *state);
}

void Write(int pid, uint64_t bytes, const std::string& state) {
  std::string path = Dir() + "/" + std::to_string(pid);
  {
    std::ofstream f(path + ".tmp", std::ios::trunc);
    f << bytes << " " << state << "\n";
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

// Bytes of every process on the GPU (running or locked).
uint64_t Resident() {
  uint64_t sum = 0;
  DIR* d = ::opendir(Dir().c_str());
  if (!d) return 0;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    uint64_t b = 0;
    std::string st;
    if (Read(static_cast<int>(pid), &b, &st) && (st == "running" || st == "locked")) sum += b;
  }
  ::closedir(d);
  return sum;
}

void Log(const char* call, int pid, uint64_t bytes) {
  const char* path = std::getenv("FAKE_CUDA_LOG");
  if (!path) return;
  std::ofstream f(path, std::ios::app);
  f << call << " " << pid << " " << bytes << " resident " << Resident() << "\n";
}

void Work() {
  const char* ms = std::getenv("FAKE_CKPT_MS");
  std::this_thread::sleep_for(std::chrono::milliseconds(ms ? std::atoi(ms) : 20));
}

// from -> to for `pid`; the error code, or kSuccess. `signal` (SIGSTOP on lock, SIGCONT on unlock) is sent under
// the GPU's lock, before the new state is visible, so the process never sees itself locked while it still runs.
int Transition(const char* call, int pid, const char* from, const char* to, bool check_room, int signal = 0) {
  if (!g_init) return kNotInitialized;
  Locked lock;
  uint64_t bytes = 0;
  std::string state;
  if (!Read(pid, &bytes, &state)) return kInvalidValue;
  if (state != from) return kIllegalState;
  if (check_room && Resident() + bytes > GpuBytes()) {
    Log("restore-oom", pid, bytes);
    return kOutOfMemory;
  }
  if (signal == SIGSTOP) ::kill(pid, SIGSTOP);
  Write(pid, bytes, to);
  if (signal == SIGCONT) ::kill(pid, SIGCONT);
  Log(call, pid, bytes);
  return kSuccess;
}

}  // namespace

extern "C" {

int cuInit(unsigned int) {
  if (std::getenv("FAKE_CUDA_INIT_ERROR")) return kNoDevice;
  g_init = true;
  return kSuccess;
}

int cuDeviceGet(int* dev, int ordinal) {
  *dev = ordinal;
  return kSuccess;
}

int cuDeviceTotalMem_v2(size_t* bytes, int) {
  *bytes = GpuBytes();
  return kSuccess;
}

int cuGetErrorName(int rc, const char** name) {
  switch (rc) {
    case kInvalidValue: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case kOutOfMemory: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case kNotInitialized: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case kIllegalState: *name = "CUDA_ERROR_ILLEGAL_STATE"; break;
    default: *name = "CUDA_ERROR_UNKNOWN"; break;
  }
  return kSuccess;
}

int cuGetErrorString(int rc, const char** text) {
  *text = rc == kOutOfMemory ? "out of memory" : rc == kIllegalState ? "illegal state" : "fake error";
  return kSuccess;
}

int cuCheckpointProcessGetState(int pid, int* state) {
  Locked lock;
  uint64_t bytes = 0;
  std::string st;
  if (!Read(pid, &bytes, &st)) return kInvalidValue;
  *state = st == "running" ? 0 : st == "locked" ? 1 : st == "checkpointed" ? 2 : 3;
  return kSuccess;
}

int cuCheckpointProcessLock(int pid, void* args) {
  if (args == nullptr) return kInvalidValue;  // the driver always passes its timeout
  return Transition("lock", pid, "running", "locked", false, SIGSTOP);
}

int cuCheckpointProcessCheckpoint(int pid, void*) {
  Work();
  return Transition("checkpoint", pid, "locked", "checkpointed", false);
}

int cuCheckpointProcessRestore(int pid, void*) {
  Work();
  return Transition("restore", pid, "checkpointed", "locked", true);
}

int cuCheckpointProcessUnlock(int pid, void*) {
  return Transition("unlock", pid, "locked", "running", false, SIGCONT);
}

}  // extern "C"
