// A torchrun command line, parsed the way torch/distributed/run.py parses it (argparse, option names checked
// against pytorch's run.py): "--opt value" and "--opt=value", dash and underscore spellings, unambiguous
// prefixes of long options (argparse's allow_abbrev), PET_<NAME> environment defaults (torch's `env` and
// `check_env` actions), "--" ending the options. The training script and its own arguments are kept untouched.
// Launchers recognised: `torchrun`, `.../torchrun`, `python[3[.X]] [-u] -m torch.distributed.run` and
// `python -m torch.distributed.launch` (which adds --use-env and, without it, passes --local-rank=N).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace prism::launcher {

// Looks up an environment variable; std::nullopt when unset. Injected so tests do not touch the real one.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup ProcessEnv();

struct TorchrunArgs {
  // How torchrun was invoked: {"torchrun"} or {"python3", "-m", "torch.distributed.run"}.
  std::vector<std::string> launcher;
  std::string python;          // the interpreter named in a `python -m ...` launcher; empty for torchrun
  bool legacy_launch = false;  // torch.distributed.launch

  std::string nnodes = "1:1";  // as given: "N" or "MIN:MAX"
  int min_nodes = 1;
  int max_nodes = 1;
  std::string nproc_per_node = "1";  // as given: int, gpu, cpu, auto, xpu
  int node_rank = 0;
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_id = "none";
  std::string rdzv_conf;
  bool standalone = false;
  int max_restarts = 0;
  double monitor_interval = 0.1;
  std::string start_method = "spawn";
  std::string event_log_handler = "null";
  std::string role = "default";
  bool module = false;     // -m: the script is a module name
  bool no_python = false;  // execute the script directly
  bool run_path = false;   // runpy.run_path in the worker's interpreter
  bool use_env = false;    // torch.distributed.launch only
  std::string log_dir;
  std::string redirects = "0";
  std::string tee = "0";
  std::string local_ranks_filter;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string local_addr;
  std::string logs_specs;
  std::string numa_binding;
  std::string signals_to_handle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";

  std::string script;                     // training_script
  std::vector<std::string> script_args;   // training_script_args, untouched
  std::vector<std::string> options;       // the torchrun options as written (between launcher and script)
  std::vector<std::string> from_env;      // PET_* variables that supplied a value
};

// Parses `argv` (the whole job command: launcher, options, script, script args). On error returns nullopt and
// sets *error to a message that names the offending option or value.
std::optional<TorchrunArgs> ParseTorchrun(const std::vector<std::string>& argv, const EnvLookup& env,
                                          std::string* error);

// Resolves --nproc-per-node: an integer, or gpu/auto (visible_gpus, as torchrun would on this host), or cpu
// (cpu_count). xpu and others are errors.
std::optional<int> ResolveNprocPerNode(const std::string& value, int visible_gpus, int cpu_count,
                                       std::string* error);

// True when argv[0..] starts like a torchrun launcher (used to tell a job command from a typo).
bool LooksLikeTorchrun(const std::vector<std::string>& argv);

}  // namespace prism::launcher
