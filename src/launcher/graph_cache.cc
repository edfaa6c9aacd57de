#include "launcher/graph_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "common/atomic_file.h"
#include "prism/trace.h"

namespace prism::launcher {
namespace fs = std::filesystem;

namespace {

// FNV-1a, 64 bits; two differently seeded streams make the 128-bit digest (a cache key, not a security property).
struct Digest {
  uint64_t a = 1469598103934665603ull, b = 0x84222325cbf29ce4ull;
  void Add(const void* p, size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      a = (a ^ c[i]) * 1099511628211ull;
      b = (b ^ c[i]) * 0x100000001b3ull;
      b ^= b >> 29;
    }
  }
  void Add(const std::string& s) {
    Add(s.data(), s.size());
    const char sep = 0;
    Add(&sep, 1);
  }
  std::string Hex() const {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(a),
                  static_cast<unsigned long long>(b));
    return buf;
  }
};

bool KeyedVariable(const std::string& name) {
  if (name == "CUDA_VISIBLE_DEVICES") return false;
  static const char* prefixes[] = {"NCCL_", "TORCH_", "PYTORCH_", "CUDA_", "NVTE_", "MEGATRON_", "CUBLAS_", "CUDNN_"};
  for (const char* p : prefixes)
    if (name.rfind(p, 0) == 0) return true;
  static const char* names[] = {"PYTHONPATH", "PYTHONHASHSEED", "LD_LIBRARY_PATH", "LD_PRELOAD", "OMP_NUM_THREADS"};
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

bool SkippedDir(const std::string& name) {
  return name.empty() || name[0] == '.' || name == "__pycache__" || name == "node_modules" ||
         name.rfind("prism-", 0) == 0;
}

// The *.py files under `root` (sorted), their content digest within the bounds, then sizes and times.
nlohmann::ordered_json HashSources(const std::string& root) {
  std::vector<std::string> files;
  std::error_code ec;
  bool listing_cut = false;
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (it->is_directory(ec)) {
      if (SkippedDir(p.filename().string())) it.disable_recursion_pending();
      continue;
    }
    if (p.extension() != ".py" || !it->is_regular_file(ec)) continue;
    if (files.size() >= kMaxHashedFiles * 4) {
      listing_cut = true;
      break;
    }
    files.push_back(p.string());
  }
  std::sort(files.begin(), files.end());
  Digest d;
  uint64_t read = 0;
  size_t by_content = 0;
  std::vector<char> buf(1 << 16);
  for (const std::string& f : files) {
    d.Add(f.substr(root.size()));
    std::error_code e2;
    const uint64_t size = fs::file_size(f, e2);
    if (by_content < kMaxHashedFiles && read + size <= kMaxHashedBytes) {
      std::ifstream in(f, std::ios::binary);
      while (in) {
        in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        d.Add(buf.data(), static_cast<size_t>(in.gcount()));
      }
      read += size;
      ++by_content;
      continue;
    }
    const auto t = fs::last_write_time(f, e2).time_since_epoch().count();
    d.Add(std::to_string(size) + ":" + std::to_string(t));
  }
  nlohmann::ordered_json j = {{"root", root},
                              {"py_files", files.size()},
                              {"by_content", by_content},
                              {"bytes_read", read},
                              {"digest", d.Hex()}};
  if (listing_cut || by_content < files.size()) j["bounded"] = true;
  return j;
}

nlohmann::json ReadJsonFile(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return nlohmann::json();
  return nlohmann::json::parse(in, nullptr, false);
}

}  // namespace

std::vector<std::string> HostGpuModels() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    std::ifstream in(d.path() / "information");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("Model:", 0) != 0) continue;
      size_t b = line.find_first_not_of(" \t", 6);
      out.push_back(b == std::string::npos ? "" : line.substr(b));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

GraphKey MakeGraphKey(const GraphKeyInput& in) {
  GraphKey k;
  nlohmann::ordered_json& m = k.material;
  m["key_version"] = kGraphKeyVersion;
  m["trace_schema"] = trace::kSchemaVersion;
  m["world_size"] = in.world_size;
  m["gpus_per_node"] = in.gpus_per_node;
  m["layout"] = in.layout_spec;
  m["job"] = in.script_key;
  m["cwd"] = in.cwd;
  if (!in.script_path.empty()) {
    m["sources"] = HashSources(fs::path(in.script_path).parent_path().string());
  } else {
    m["sources"] = nullptr;
  }
  nlohmann::ordered_json env = nlohmann::ordered_json::object();
  std::vector<std::string> vars = in.environment;
  std::sort(vars.begin(), vars.end());
  for (const std::string& kv : vars) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = kv.substr(0, eq);
    if (KeyedVariable(name)) env[name] = kv.substr(eq + 1);
  }
  m["environment"] = env;
  m["options"] = {{"topology", in.topology},
                  {"gpus", in.gpus},
                  {"payload_max_bytes", in.payload_max_bytes},
                  {"iterations", in.iterations}};
  std::vector<std::string> models;
  for (const auto& g : in.gpu_models)
    if (!g.empty()) models.push_back(g);
  m["gpu_models"] = models;
  Digest d;
  d.Add(m.dump());
  k.digest = d.Hex();
  return k;
}

std::string GraphCacheRoot(const std::string& flag) {
  std::error_code ec;
  if (!flag.empty()) return fs::absolute(flag, ec).string();
  auto env = [](const char* n) -> std::string {
    const char* v = std::getenv(n);
    return v ? v : "";
  };
  if (!env("PRISM_GRAPH_CACHE").empty()) return fs::absolute(env("PRISM_GRAPH_CACHE"), ec).string();
  if (!env("XDG_CACHE_HOME").empty()) return (fs::path(env("XDG_CACHE_HOME")) / "prism" / "graphs").string();
  if (!env("HOME").empty()) return (fs::path(env("HOME")) / ".cache" / "prism" / "graphs").string();
  return fs::absolute("prism-graph-cache", ec).string();
}

CacheEntry LookupEntry(const std::string& root, const GraphKey& key) {
  CacheEntry e;
  const fs::path dir = fs::path(root) / key.digest;
  e.dir = dir.string();
  e.collect_dir = (dir / "collect").string();
  e.fill_dir = (dir / "fill").string();
  e.graph = (dir / "fill" / "filled.prism").string();
  nlohmann::json st = ReadJsonFile(dir / "entry.json");
  if (!st.is_object()) return e;
  e.state = st;
  std::error_code ec;
  e.collected = st.contains("collect") && fs::is_regular_file(dir / "collect" / "observed.prism", ec);
  e.filled = e.collected && st.contains("fill") && fs::is_regular_file(e.graph, ec);
  return e;
}

bool RecordStage(CacheEntry* entry, const GraphKey& key, const std::string& stage, const nlohmann::json& info,
                 std::string* error) {
  std::error_code ec;
  fs::create_directories(entry->dir, ec);
  if (ec) {
    *error = "cannot create " + entry->dir + ": " + ec.message();
    return false;
  }
  const fs::path dir(entry->dir);
  if (!fs::exists(dir / "key.json", ec)) {
    nlohmann::ordered_json k = {{"digest", key.digest}, {"material", key.material}};
    if (!WriteFileAtomic((dir / "key.json").string(), k.dump(2) + "\n", error)) return false;
  }
  nlohmann::json st = entry->state.is_object() ? entry->state : nlohmann::json::object();
  nlohmann::json rec = info;
  rec["finished_at"] = static_cast<int64_t>(std::time(nullptr));
  st[stage] = rec;
  st["digest"] = key.digest;
  if (!WriteFileAtomic((dir / "entry.json").string(), st.dump(2) + "\n", error)) return false;
  entry->state = st;
  entry->collected = st.contains("collect");
  entry->filled = entry->collected && st.contains("fill");
  return true;
}

bool ResetEntry(CacheEntry* entry, std::string* error) {
  std::error_code ec;
  const fs::path dir(entry->dir);
  fs::create_directories(dir, ec);
  if (!WriteFileAtomic((dir / "entry.json").string(), "{}\n", error)) return false;
  fs::remove_all(dir / "collect", ec);
  fs::remove_all(dir / "fill", ec);
  entry->state = nlohmann::json::object();
  entry->collected = entry->filled = false;
  return true;
}

EntryLock::~EntryLock() {
  if (fd_ >= 0) close(fd_);  // releases the flock
}

bool EntryLock::Acquire(const std::string& entry_dir, const std::function<void()>& waiting, std::string* error) {
  std::error_code ec;
  fs::create_directories(entry_dir, ec);
  const std::string path = (fs::path(entry_dir) / "lock").string();
  fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    *error = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  if (flock(fd_, LOCK_EX | LOCK_NB) == 0) return true;
  if (waiting) waiting();
  if (flock(fd_, LOCK_EX) != 0) {
    *error = (errno == EINTR ? "interrupted while waiting for " : "cannot lock ") + path;
    return false;
  }
  return true;
}

}  // namespace prism::launcher
