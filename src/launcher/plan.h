// The emulation plan: what `prism-run [OPTIONS] torchrun ...` will run. Built from the job's torchrun line, the
// prism options and what this host offers; printed by --dry-run (for people, or as JSON), then executed by
// launcher/launch.h.
//
// Decision (docs/cli.md, "How the job is launched"): prism starts the workers itself, one process per real rank,
// without torchrun's elastic agent. torchrun's agent numbers its workers 0..nproc-1 on each node and runs its own
// rendezvous; prism needs each worker to be an arbitrary logical rank of the target world (e.g. 517 of 1024)
// talking to the coordinator's store. Each worker gets exactly the command torchrun would have run
// (python -u [-m] SCRIPT ARGS, or the script itself with --no-python, runpy for --run-path, --local-rank=N for
// torch.distributed.launch without --use-env) and the environment torchrun's agent would have given it, plus
// prism's own variables.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/coordinator.h"
#include "coordinator/swap/swap_scheduler.h"
#include "model/world.h"
#include "launcher/torchrun_args.h"

namespace prism::launcher {

using EnvList = std::vector<std::pair<std::string, std::string>>;

// What the host offers. DetectHost fills it from the real machine; tests fill it by hand.
struct HostInfo {
  EnvLookup env;                     // the user's environment
  std::function<int()> count_gpus;   // GPUs nvidia-smi lists; -1 when unknown
  int cpu_count = 1;
  std::string libprism;              // absolute path of libprism.so, "" when not found
  std::string python_hook_dir;       // <dir of libprism.so>/python (sitecustomize.py)
  // PATH lookup of an executable name: absolute path or nullopt.
  std::function<std::optional<std::string>(const std::string&)> which;
  // The interpreter named on line 1 of a script ("#!/usr/bin/python3" -> "/usr/bin/python3"), or nullopt.
  std::function<std::optional<std::string>(const std::string&)> shebang;
  std::string cwd;
};

// `prism_exe`: path of the running prism-run (libprism.so is looked up in ../lib and next to it, or PRISM_LIBPRISM).
HostInfo DetectHost(const std::string& prism_exe);

struct PlanRequest {
  std::vector<std::string> command;  // the job's torchrun line
  std::string ranks;                 // --ranks ("" = default "0", or the node of --node-rank)
  std::string layout;                // --layout ("" = from Megatron's arguments)
  int gpus = 0;                      // --gpus (0 = detect)
  int node_rank = -1;                // --node-rank: real ranks = that virtual node's ranks
  std::string out_dir;               // absolute
  // --coordinator: join a running coordinator instead of starting one. HOST:PORT of its store, or its
  // coordinator.json (or the directory holding it: `prism-run coordinator --out DIR`), which also gives the event
  // bus (Unix socket, or TCP for another host). "" = start one here.
  std::string coordinator;
  std::string payload = "mirror";
  // --payload recorded: directory of a collect run; each real rank gets payloads/rank<C>.bin of its class C (the
  // rank of data-parallel replica 0 with its other coordinates) as PRISM_PAYLOAD_FILE.
  std::string payload_dir;
  bool one_replica = false;      // collect: the real ranks are data-parallel replica 0 (every rank with dp == 0)
  // collect --real-routing: also every member of each replica-0 rank's EXPERT_MODEL_PARALLEL_GROUP (sorted, without
  // repeats), so that MoE routing comes from real data on every expert-parallel rank instead of mirrored data.
  bool real_routing = false;
  bool record_payloads = false;  // collect: PRISM_RECORD_PAYLOADS=<out>/payloads/rank<R>.bin per real rank
  std::optional<uint64_t> payload_max_bytes;  // PRISM_PAYLOAD_MAX_BYTES (unset: libprism's default, 4 MiB)
  bool all_real = false;         // record: every rank of the world real, each on its own GPU, every communicator
                                 // on the real NCCL (passthrough, one-member communicators too)
  std::string topology;
  std::string graph;
  bool preload = true;               // false (--no-preload): run without libprism.so, for launch debugging only
  std::string run_id;                // TORCHELASTIC_RUN_ID when the job's --rdzv-id is "none"
  // Hang diagnosis of the coordinator started here (docs/hang.md): seconds without progress of any real rank while
  // some wait (<= 0: off), and whether prism stops the job after the diagnosis ("stop") or lets it run ("wait").
  double hang_timeout_s = coord::kDefaultHangTimeoutS;
  std::string on_hang = "stop";
  // Passthrough: a communicator whose members are all real, each on its own GPU, runs on the real NCCL (ipc.h).
  // false (--no-passthrough): libprism handles it (exchange through the coordinator, or the gate).
  bool passthrough = true;
  // --kernels (1) / --kernels-nvtx (2): libprism records the real ranks' kernels with CUPTI (PRISM_KERNELS=1|nvtx;
  // docs/kernels.md). 0: off.
  int kernels = 0;
  // Several hosts (docs/hang.md, "Two nodes"). On the host that starts the coordinator: `listen`, the address its
  // store and TCP event bus bind ("0.0.0.0" or this host's address; "" = loopback and a Unix socket only), and
  // `remote_ranks`, the real ranks prism-runs on other hosts will run (the coordinator must know every real rank).
  std::string listen;
  std::string remote_ranks;
  // On a joining host, with `coordinator` = HOST:PORT: the coordinator's published coordinator.json (the store's
  // key coord::kInfoKey, fetched by the caller), which gives the event bus port and the real ranks; "" = unknown.
  std::string coordinator_doc;
  // collect --swap: context switching (swap_scheduler.h); rank_gpu is filled when the coordinator starts.
  coord::SwapConfig swap;
};

struct RealRank {
  int rank = 0;        // logical (global) rank in the target world
  int gpu = 0;         // index among this host's GPUs used by prism (0 .. gpus-1)
  int node = 0;        // virtual node of the target world (rank / gpus_per_node)
  int local_rank = 0;  // within that virtual node (rank % gpus_per_node)
  std::string device;  // what CUDA_VISIBLE_DEVICES gets (the user's entry, e.g. "3" or a GPU UUID)
  world::Coords coords;
  // collect: why this rank is real: "replica 0", or "real_routing: expert-parallel peer of rank R" (--real-routing).
  // Empty for other modes (the ranks the user asked for).
  std::string why;
};

struct Worker {
  int rank = 0;
  std::vector<std::string> argv;
  EnvList env;  // what prism sets for this worker only (RANK, LOCAL_RANK, CUDA_VISIBLE_DEVICES, ...)
};

struct Plan {
  TorchrunArgs torchrun;
  world::Layout layout;
  std::string layout_source;  // "--layout", "Megatron arguments", "none (pure data parallel)"
  int world_size = 0;
  int nnodes = 0;
  int nproc_per_node = 0;     // the target's GPUs per node
  int gpus = 0;               // GPUs of this host prism uses
  std::vector<RealRank> real;
  bool start_coordinator = true;
  std::string store_addr;     // MASTER_ADDR the workers get
  int store_port = 0;         // MASTER_PORT the workers get (the coordinator's store)
  std::string coord_socket;   // PRISM_COORD_SOCKET (local coordinator)
  std::string out_dir;
  std::string python;         // interpreter the workers run under ("" with --no-python)
  // Each worker's own empty torch.compile/Triton cache (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) under here,
  // removed when the run ends; empty when the user set either variable (theirs is kept). Why: a compile with a cold
  // cache allocates tensors that a warm one does not (the MoE job's weighted SwiGLU: 62.9 MB once in iteration 1),
  // and the collect warms the host's shared cache for every later stage; every stage compiling cold is what a job
  // on fresh nodes does. docs/cli.md "Environment".
  std::string compile_cache_dir;
  EnvList env;                // variables every worker gets
  std::vector<Worker> workers;
  std::vector<std::string> warnings;
  std::vector<std::string> notes;  // e.g. which user variables prism replaced
  double hang_timeout_s = coord::kDefaultHangTimeoutS;  // from PlanRequest
  bool stop_on_hang = true;        // --on-hang stop
  bool passthrough = true;         // from PlanRequest
  int passthrough_min_members = 2; // the coordinator's (1 for record: every communicator passes through)
  std::string listen;              // PlanRequest::listen
  std::vector<int> remote_ranks;   // real ranks run by prism-runs on other hosts (coordinator started here)
  int host_index = -1;             // --node-rank together with --ranks when joining: this host among the hosts
  coord::SwapConfig swap;          // from PlanRequest (collect --swap)
  bool real_routing = false;       // from PlanRequest (collect --real-routing)
};

std::optional<Plan> BuildPlan(const PlanRequest& req, const HostInfo& host, std::string* error);

// After the coordinator started: rewrites MASTER_PORT (and PRISM_COORD_SOCKET when `socket` is not empty).
void SetStorePort(Plan* plan, int port, const std::string& socket = "");

// The --dry-run --json document: world_size, layout {tp,pp,dp,cp,ep,etp,vpp,order}, real_ranks
// [{rank,gpu,node,local_rank,device,coords[,why]}], real_routing (collect), gpus_per_node, nnodes, gpus, command,
// env, workers, warnings.
nlohmann::ordered_json PlanToJson(const Plan& plan);
// The same for people.
std::string PlanToText(const Plan& plan);

// The complete environment of a worker: the user's (`base`, "NAME=value" strings), then plan.env, then
// worker.env, each replacing earlier values of the same name.
std::vector<std::string> WorkerEnvironment(const Plan& plan, const Worker& worker,
                                           const std::vector<std::string>& base);

// Shell-quoted command line ("a 'b c'"), for people and command.json.
std::string ShellJoin(const std::vector<std::string>& argv);

}  // namespace prism::launcher
