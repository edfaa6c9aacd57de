// The graph cache of the default procedure (launcher/stages.h; docs/cli.md "The graph cache"): a job's collect and
// fill results, stored under a key derived from what determines the job's graph, so that a second run of the same
// job goes straight to the emulation and a changed job misses.
//
// The key is a digest of a JSON document (key.json in the entry, for people):
//   prism's key version and PrismTrace schema version;
//   world size, GPUs per node, the layout (from Megatron's arguments or --layout);
//   how the script runs (-m, --no-python, --run-path), the interpreter, the script (absolute) and its arguments,
//   the working directory (relative paths in the arguments mean something else elsewhere) -- not torchrun's
//   rendezvous, port, log or restart options, which do not change the program;
//   the contents of every *.py file under the script's folder (Megatron's package beside pretrain_gpt.py), up to
//   kMaxHashedFiles files and kMaxHashedBytes bytes, then their sizes and modification times;
//   the environment that changes the program: variables starting NCCL_, TORCH_, PYTORCH_, CUDA_ (not
//   CUDA_VISIBLE_DEVICES), NVTE_, MEGATRON_, CUBLAS_, CUDNN_, and PYTHONPATH, PYTHONHASHSEED, LD_LIBRARY_PATH,
//   LD_PRELOAD, OMP_NUM_THREADS;
//   prism's options that change the graph (topology, GPUs used, --payload-max-bytes, the graph's iterations);
//   the GPU models of this host (/proc/driver/nvidia/gpus/*/information): a graph timed on one GPU kind is not
//   another's.
// The requested real ranks are not in it: one graph serves every rank of the job.
//
// An entry: ROOT/<key>/ holding key.json, entry.json (the stages done, atomically rewritten), collect/ (the
// collect run) and fill/ (the fill run). A run that builds an entry holds ROOT/<key>/lock (flock) so that a
// second prism-run of the same job waits for it instead of collecting twice.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/non_copyable.h"

namespace prism::launcher {

// Part of every key: raised whenever the graph a given job's collect and fill produce changes (the builder, the
// fill's rules), so that a cache written by an older prism misses instead of replaying a graph built the old way.
// 2: a slot's point-to-point nodes follow the communicator's sequence across streams (observed_trace.cc).
// 3: fill slices' virtual-only operations are priced by the cost model (GraphRelease::SetCostModel); the fill pools
//    a class's level across shape changes (FillSamples).
inline constexpr int kGraphKeyVersion = 3;
inline constexpr size_t kMaxHashedFiles = 20000;
inline constexpr uint64_t kMaxHashedBytes = 256ull << 20;

struct GraphKeyInput {
  int world_size = 0;
  int gpus_per_node = 0;
  std::string layout_spec;
  std::vector<std::string> script_key;  // launcher/emulate.h PlanSummary::script_key
  std::string script_path;              // absolute, "" when the job runs a module
  std::string cwd;
  std::vector<std::string> environment;  // the user's, NAME=value
  std::string topology;
  int gpus = 0;
  uint64_t payload_max_bytes = 0;  // what libprism will use, its default resolved (limits::kDefaultPayloadMaxBytes)
  int iterations = 0;
  std::vector<std::string> gpu_models;  // "" entries ignored
};

struct GraphKey {
  std::string digest;            // 32 hex digits
  nlohmann::ordered_json material;  // what went into it (key.json)
};

GraphKey MakeGraphKey(const GraphKeyInput& in);

// The GPU models /proc/driver/nvidia lists on this host (empty without the driver).
std::vector<std::string> HostGpuModels();

// ROOT: `flag` (--graph-cache) if given, else $PRISM_GRAPH_CACHE, else $XDG_CACHE_HOME/prism/graphs, else
// $HOME/.cache/prism/graphs, else ./prism-graph-cache.
std::string GraphCacheRoot(const std::string& flag);

struct CacheEntry {
  std::string dir;          // ROOT/<key>
  std::string collect_dir;  // dir/collect
  std::string fill_dir;     // dir/fill
  std::string graph;        // dir/fill/filled.prism
  bool collected = false;   // entry.json says the collect finished and its graph is there
  bool filled = false;      // entry.json says the fill finished and its graph is there: a hit
  nlohmann::json state = nlohmann::json::object();  // entry.json
};

CacheEntry LookupEntry(const std::string& root, const GraphKey& key);

// Records a finished stage in entry.json ("collect" or "fill", with what the caller says of it) and writes key.json
// the first time. False with *error.
bool RecordStage(CacheEntry* entry, const GraphKey& key, const std::string& stage, const nlohmann::json& info,
                 std::string* error);
// Forgets the entry's stages (--refresh-graph, or a collect that starts over): entry.json emptied, collect/ and
// fill/ removed.
bool ResetEntry(CacheEntry* entry, std::string* error);

// An exclusive lock on ROOT/<key>/lock, held while the object lives. `waiting` is called once if another process
// holds it (then this blocks until it is released).
class EntryLock : NonCopyable {
 public:
  EntryLock() = default;
  ~EntryLock();
  bool Acquire(const std::string& entry_dir, const std::function<void()>& waiting, std::string* error);

 private:
  int fd_ = -1;
};

}  // namespace prism::launcher
