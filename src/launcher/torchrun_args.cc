#include "launcher/torchrun_args.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <map>
#include <set>

namespace prism::launcher {
namespace {

// One torchrun option: its spellings (as in torch/distributed/run.py), argparse's dest, and whether it takes
// a value. `env` is whether run.py declares it with the env/check_env action (PET_<DEST> default).
struct OptSpec {
  std::vector<std::string> names;
  std::string dest;
  bool takes_value;
  bool env;
  bool launch_only = false;  // torch.distributed.launch's --use-env
};

const std::vector<OptSpec>& Specs() {
  static const std::vector<OptSpec> kSpecs = {
      {{"--nnodes"}, "nnodes", true, true},
      {{"--nproc-per-node", "--nproc_per_node"}, "nproc_per_node", true, true},
      {{"--rdzv-backend", "--rdzv_backend"}, "rdzv_backend", true, true},
      {{"--rdzv-endpoint", "--rdzv_endpoint"}, "rdzv_endpoint", true, true},
      {{"--rdzv-id", "--rdzv_id"}, "rdzv_id", true, true},
      {{"--rdzv-conf", "--rdzv_conf"}, "rdzv_conf", true, true},
      {{"--standalone"}, "standalone", false, true},
      {{"--max-restarts", "--max_restarts"}, "max_restarts", true, true},
      {{"--monitor-interval", "--monitor_interval"}, "monitor_interval", true, true},
      {{"--start-method", "--start_method"}, "start_method", true, true},
      {{"--event-log-handler", "--event_log_handler"}, "event_log_handler", true, true},
      {{"--role"}, "role", true, true},
      {{"-m", "--module"}, "module", false, true},
      {{"--no-python", "--no_python"}, "no_python", false, true},
      {{"--run-path", "--run_path"}, "run_path", false, true},
      {{"--log-dir", "--log_dir"}, "log_dir", true, true},
      {{"-r", "--redirects"}, "redirects", true, true},
      {{"-t", "--tee"}, "tee", true, true},
      {{"--local-ranks-filter", "--local_ranks_filter"}, "local_ranks_filter", true, true},
      {{"--node-rank", "--node_rank"}, "node_rank", true, true},
      {{"--master-addr", "--master_addr"}, "master_addr", true, true},
      {{"--master-port", "--master_port"}, "master_port", true, true},
      {{"--local-addr", "--local_addr"}, "local_addr", true, true},
      {{"--logs-specs", "--logs_specs"}, "logs_specs", true, false},
      {{"--numa-binding", "--numa_binding"}, "numa_binding", true, false},
      {{"--signals-to-handle", "--signals_to_handle"}, "signals_to_handle", true, true},
      {{"--use-env", "--use_env"}, "use_env", false, false, true},
  };
  return kSpecs;
}

bool ParseIntStrict(const std::string& s, int* out) {
  if (s.empty()) return false;
  const char* b = s.data();
  if (*b == '+') ++b;  // Python's int() accepts a leading '+'
  auto [p, ec] = std::from_chars(b, s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

bool ParseFloat(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(s.c_str(), &end);
  return errno == 0 && end == s.c_str() + s.size();
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string Basename(const std::string& p) {
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

bool IsPython(const std::string& word) {
  std::string b = Basename(word);
  if (b == "python" || b == "python3") return true;
  // python3.11 and the like
  if (StartsWith(b, "python3.")) {
    return b.size() > 8 && std::all_of(b.begin() + 8, b.end(), [](char c) { return c >= '0' && c <= '9'; });
  }
  return false;
}

// Matches argparse: a word is an option if it starts with '-' and is not a negative number and not "-" alone.
bool LooksLikeOption(const std::string& w) {
  if (w.size() < 2 || w[0] != '-') return false;
  int n;
  double d;
  if (ParseIntStrict(w, &n) || ParseFloat(w, &d)) return false;
  return true;
}

// Splits off the launcher words. Returns the index of the first torchrun option, or -1 with *error set.
int SplitLauncher(const std::vector<std::string>& argv, TorchrunArgs* out, std::string* error) {
  if (argv.empty()) {
    *error = "no command given (expected: torchrun [OPTIONS] SCRIPT [ARGS])";
    return -1;
  }
  const std::string& first = argv[0];
  std::string base = Basename(first);
  if (base == "torchrun") {
    out->launcher = {first};
    return 1;
  }
  if (IsPython(first)) {
    // python [interpreter flags without values] -m torch.distributed.run|launch
    size_t i = 1;
    while (i < argv.size()) {
      const std::string& w = argv[i];
      std::string module;
      if (w == "-m" && i + 1 < argv.size()) {
        module = argv[i + 1];
      } else if (StartsWith(w, "-m") && w.size() > 2) {
        module = w.substr(2);
      } else if (w == "-u" || w == "-B" || w == "-O" || w == "-OO" || w == "-s" || w == "-E" || w == "-I") {
        ++i;
        continue;
      } else {
        break;
      }
      if (module == "torch.distributed.run" || module == "torch.distributed.launch") {
        size_t next = (w == "-m") ? i + 2 : i + 1;
        out->launcher.assign(argv.begin(), argv.begin() + next);
        out->python = first;
        out->legacy_launch = module == "torch.distributed.launch";
        return static_cast<int>(next);
      }
      *error = "\"" + first + " -m " + module +
               "\" is not a torchrun launcher (expected torchrun, python -m torch.distributed.run or "
               "python -m torch.distributed.launch)";
      return -1;
    }
    *error = "\"" + first + "\" without -m torch.distributed.run: prism-run needs the torchrun line of the job "
             "(torchrun [OPTIONS] SCRIPT [ARGS])";
    return -1;
  }
  *error = "\"" + first + "\" is not torchrun: prism-run [OPTIONS] torchrun [TORCHRUN OPTIONS] SCRIPT [ARGS] "
           "(or python -m torch.distributed.run ...)";
  return -1;
}

// The field of an option whose value is kept as given; nullptr for the others.
std::string TorchrunArgs::*VerbatimField(const std::string& dest) {
  static const std::pair<const char*, std::string TorchrunArgs::*> kVerbatim[] = {
      {"nproc_per_node", &TorchrunArgs::nproc_per_node},
      {"rdzv_backend", &TorchrunArgs::rdzv_backend},
      {"rdzv_endpoint", &TorchrunArgs::rdzv_endpoint},
      {"rdzv_id", &TorchrunArgs::rdzv_id},
      {"rdzv_conf", &TorchrunArgs::rdzv_conf},
      {"event_log_handler", &TorchrunArgs::event_log_handler},
      {"role", &TorchrunArgs::role},
      {"log_dir", &TorchrunArgs::log_dir},
      {"redirects", &TorchrunArgs::redirects},
      {"tee", &TorchrunArgs::tee},
      {"local_ranks_filter", &TorchrunArgs::local_ranks_filter},
      {"master_addr", &TorchrunArgs::master_addr},
      {"local_addr", &TorchrunArgs::local_addr},
      {"logs_specs", &TorchrunArgs::logs_specs},
      {"signals_to_handle", &TorchrunArgs::signals_to_handle},
  };
  for (const auto& [name, field] : kVerbatim) {
    if (dest == name) return field;
  }
  return nullptr;
}

// Applies one value to the destination field; returns false with *error naming the option.
bool Apply(TorchrunArgs* a, const std::string& dest, const std::string& value, const std::string& shown,
           std::string* error) {
  auto bad = [&](const std::string& what) {
    *error = "torchrun option " + shown + ": " + what + ", got \"" + value + "\"";
    return false;
  };
  if (std::string TorchrunArgs::*field = VerbatimField(dest)) {
    a->*field = value;
  } else if (dest == "nnodes") {
    a->nnodes = value;
    size_t colon = value.find(':');
    int lo = 0, hi = 0;
    if (colon == std::string::npos) {
      if (!ParseIntStrict(value, &lo)) return bad("expected N or MIN:MAX");
      hi = lo;
    } else {
      if (value.find(':', colon + 1) != std::string::npos || !ParseIntStrict(value.substr(0, colon), &lo) ||
          !ParseIntStrict(value.substr(colon + 1), &hi))
        return bad("expected N or MIN:MAX");
    }
    if (lo <= 0 || lo > hi) return bad("need 0 < MIN <= MAX");
    a->min_nodes = lo;
    a->max_nodes = hi;
  } else if (dest == "max_restarts") {
    if (!ParseIntStrict(value, &a->max_restarts) || a->max_restarts < 0) return bad("expected an integer >= 0");
  } else if (dest == "monitor_interval") {
    if (!ParseFloat(value, &a->monitor_interval)) return bad("expected a number");
  } else if (dest == "start_method") {
    if (value != "spawn" && value != "fork" && value != "forkserver") return bad("choose from spawn, fork, forkserver");
    a->start_method = value;
  } else if (dest == "node_rank") {
    if (!ParseIntStrict(value, &a->node_rank) || a->node_rank < 0) return bad("expected an integer >= 0");
  } else if (dest == "master_port") {
    if (!ParseIntStrict(value, &a->master_port) || a->master_port < 0 || a->master_port > 65535)
      return bad("expected a port number");
  } else if (dest == "numa_binding") {
    if (value != "node" && value != "socket" && value != "exclusive" && value != "core-complex")
      return bad("choose from node, socket, exclusive, core-complex");
    a->numa_binding = value;
  } else {
    *error = "internal: unhandled torchrun option " + dest;
    return false;
  }
  return true;
}

bool ApplyFlag(TorchrunArgs* a, const std::string& dest, bool v) {
  if (dest == "standalone") a->standalone = v;
  else if (dest == "module") a->module = v;
  else if (dest == "no_python") a->no_python = v;
  else if (dest == "run_path") a->run_path = v;
  else if (dest == "use_env") a->use_env = v;
  else return false;
  return true;
}

// Finds the option spec of a long option word ("--nproc" may abbreviate "--nproc-per-node", as argparse allows).
const OptSpec* FindLong(const std::string& name, bool legacy, std::string* error) {
  std::vector<const OptSpec*> hits;
  for (const OptSpec& s : Specs()) {
    if (s.launch_only && !legacy) continue;
    for (const std::string& n : s.names)
      if (n == name) return &s;
  }
  std::set<std::string> matched_names;
  for (const OptSpec& s : Specs()) {
    if (s.launch_only && !legacy) continue;
    for (const std::string& n : s.names) {
      if (StartsWith(n, "--") && StartsWith(n, name)) {
        if (std::find(hits.begin(), hits.end(), &s) == hits.end()) hits.push_back(&s);
        matched_names.insert(n);
      }
    }
  }
  if (hits.size() == 1) return hits[0];
  if (hits.size() > 1) {
    std::string list;
    for (const std::string& n : matched_names) list += (list.empty() ? "" : ", ") + n;
    *error = "ambiguous torchrun option " + name + " could match " + list;
  }
  return nullptr;
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

bool LooksLikeTorchrun(const std::vector<std::string>& argv) {
  TorchrunArgs a;
  std::string err;
  return SplitLauncher(argv, &a, &err) >= 0;
}

std::optional<TorchrunArgs> ParseTorchrun(const std::vector<std::string>& argv, const EnvLookup& env,
                                          std::string* error) {
  TorchrunArgs a;
  int start = SplitLauncher(argv, &a, error);
  if (start < 0) return std::nullopt;

  // Environment defaults first (PET_<DEST>), as torch's env/check_env actions do; the command line wins.
  for (const OptSpec& s : Specs()) {
    if (!s.env || (s.launch_only && !a.legacy_launch)) continue;
    std::string var = "PET_";
    for (char c : s.dest) var += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    std::optional<std::string> v = env ? env(var) : std::nullopt;
    if (!v) continue;
    if (s.takes_value) {
      if (v->empty()) continue;  // argparse: an empty default is no default
      if (!Apply(&a, s.dest, *v, var, error)) return std::nullopt;
    } else {
      int iv = 0;
      if (!ParseIntStrict(*v, &iv)) {
        *error = "environment variable " + var + " must be an integer (torchrun reads it as a flag), got \"" + *v +
                 "\"";
        return std::nullopt;
      }
      ApplyFlag(&a, s.dest, iv != 0);
    }
    a.from_env.push_back(var + "=" + *v);
  }

  std::vector<std::string> unknown;
  size_t i = static_cast<size_t>(start);
  bool have_script = false;
  while (i < argv.size()) {
    const std::string& w = argv[i];
    if (w == "--") {
      a.options.push_back(w);
      ++i;
      if (i < argv.size()) {
        a.script = argv[i++];
        have_script = true;
      }
      break;
    }
    if (!LooksLikeOption(w)) {
      a.script = w;
      have_script = true;
      ++i;
      break;
    }
    std::string name = w;
    std::optional<std::string> inline_value;
    const OptSpec* spec = nullptr;
    if (StartsWith(w, "--")) {
      size_t eq = w.find('=');
      if (eq != std::string::npos) {
        name = w.substr(0, eq);
        inline_value = w.substr(eq + 1);
      }
      std::string amb;
      spec = FindLong(name, a.legacy_launch, &amb);
      if (!spec && !amb.empty()) {
        *error = amb;
        return std::nullopt;
      }
    } else {
      // Short options: -m, -r VALUE / -rVALUE / -r=VALUE, -t likewise.
      std::string shorty = w.substr(0, 2);
      for (const OptSpec& s : Specs())
        for (const std::string& n : s.names)
          if (n == shorty) spec = &s;
      if (spec) {
        name = shorty;
        if (w.size() > 2) {
          if (!spec->takes_value) {
            spec = nullptr;  // e.g. "-mfoo": not a torchrun option
          } else {
            inline_value = w[2] == '=' ? w.substr(3) : w.substr(2);
          }
        }
      }
    }
    if (!spec) {
      unknown.push_back(w);
      ++i;
      // Why: argparse would also fail here; keep scanning so the error names every unknown option, and do
      // not take the next word as the script if it is this unknown option's value.
      if (i < argv.size() && !LooksLikeOption(argv[i]) && w.find('=') == std::string::npos) {
        unknown.back() += " " + argv[i];
        ++i;
      }
      continue;
    }
    a.options.push_back(w);
    ++i;
    if (!spec->takes_value) {
      if (inline_value) {
        *error = "torchrun option " + name + " takes no value, got \"" + *inline_value + "\"";
        return std::nullopt;
      }
      ApplyFlag(&a, spec->dest, true);
      continue;
    }
    std::string value;
    if (inline_value) {
      value = *inline_value;
    } else {
      if (i >= argv.size() || LooksLikeOption(argv[i])) {
        *error = "torchrun option " + name + " expects a value";
        return std::nullopt;
      }
      value = argv[i++];
      a.options.push_back(value);
    }
    if (!Apply(&a, spec->dest, value, name, error)) return std::nullopt;
  }
  if (!unknown.empty()) {
    std::string list;
    for (const std::string& u : unknown) list += (list.empty() ? "" : ", ") + u;
    *error = "unknown torchrun option" + std::string(unknown.size() > 1 ? "s: " : ": ") + list +
             " (see torchrun --help; prism-run's own options go before \"torchrun\")";
    return std::nullopt;
  }
  if (!have_script) {
    *error = "no training script in the torchrun command (expected torchrun [OPTIONS] SCRIPT [ARGS])";
    return std::nullopt;
  }
  a.script_args.assign(argv.begin() + static_cast<long>(i), argv.end());
  // torchrun's own consistency checks (run.py config_from_args / launch.py).
  if (a.no_python && a.module && !a.run_path) {
    *error = "torchrun: don't use both --no-python and --module (-m)";
    return std::nullopt;
  }
  if (a.legacy_launch && a.no_python && !a.use_env) {
    *error = "torch.distributed.launch: --no-python needs --use-env";
    return std::nullopt;
  }
  return a;
}

std::optional<int> ResolveNprocPerNode(const std::string& value, int visible_gpus, int cpu_count,
                                       std::string* error) {
  int n = 0;
  if (ParseIntStrict(value, &n)) {
    if (n <= 0) {
      *error = "--nproc-per-node must be >= 1, got " + value;
      return std::nullopt;
    }
    return n;
  }
  if (value == "gpu" || value == "auto") {
    if (visible_gpus <= 0) {
      if (value == "auto") return cpu_count > 0 ? cpu_count : 1;
      *error = "--nproc-per-node gpu: no GPU visible on this host; give the target's GPUs per node as a number";
      return std::nullopt;
    }
    return visible_gpus;
  }
  if (value == "cpu") return cpu_count > 0 ? cpu_count : 1;
  *error = "--nproc-per-node \"" + value + "\" is not supported (expected an integer, gpu, cpu or auto)";
  return std::nullopt;
}

}  // namespace prism::launcher
