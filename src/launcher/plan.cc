#include "launcher/plan.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "analysis/observed_trace.h"
#include "common/rank_list.h"

namespace prism::launcher {
using namespace ::prism::analysis;  // the post-run analysis (src/analysis) this file calls
namespace {

namespace fs = std::filesystem;

// Why these values: a real rank waits on virtual peers as long as the emulation needs (the coordinator, not
// torch's watchdog, decides when an operation completes). docs/cli.md "Environment prism sets" explains each.
constexpr const char* kHeartbeatTimeoutSec = "604800";  // one week

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

bool ToInt(const std::string& s, int* out) {
  if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), ::isdigit)) return false;
  *out = std::stoi(s);
  return true;
}

void Set(EnvList* env, const std::string& k, const std::string& v) {
  for (auto& [name, value] : *env)
    if (name == k) {
      value = v;
      return;
    }
  env->emplace_back(k, v);
}

std::string Join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::string FindLibprism(const std::string& prism_exe) {
  std::error_code ec;
  fs::path exe = fs::weakly_canonical(prism_exe, ec);
  fs::path dir = exe.parent_path();
  for (fs::path cand : {dir / ".." / "lib" / "libprism.so", dir / "libprism.so", dir / ".." / "lib64" / "libprism.so"}) {
    if (fs::exists(cand, ec)) return fs::weakly_canonical(cand, ec).string();
  }
  return "";
}

// The interpreter torchrun itself runs under: workers inherit it (torchrun uses sys.executable).
std::string WorkerPython(const TorchrunArgs& t, const HostInfo& host, std::vector<std::string>* warnings) {
  if (auto exec = host.env ? host.env("PYTHON_EXEC") : std::nullopt; exec && !exec->empty()) return *exec;
  if (!t.python.empty()) return t.python;
  std::optional<std::string> torchrun;
  if (t.launcher.front().find('/') != std::string::npos) torchrun = t.launcher.front();
  else if (host.which) torchrun = host.which(t.launcher.front());
  if (torchrun && host.shebang) {
    if (auto interp = host.shebang(*torchrun)) return *interp;
  }
  warnings->push_back("could not read the interpreter of " + (torchrun ? *torchrun : t.launcher.front()) +
                      " (not on PATH?); workers run under python3 from PATH (set PYTHON_EXEC to choose)");
  return "python3";
}

}  // namespace

std::string ShellJoin(const std::vector<std::string>& argv) {
  std::string out;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (i) out += ' ';
    bool plain = !a.empty() && std::all_of(a.begin(), a.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("-_./=:,+@%").find(c) != std::string_view::npos;
    });
    if (plain) {
      out += a;
      continue;
    }
    out += '\'';
    for (char c : a) {
      if (c == '\'') out += "'\\''";
      else out += c;
    }
    out += '\'';
  }
  return out;
}

HostInfo DetectHost(const std::string& prism_exe) {
  HostInfo h;
  h.env = ProcessEnv();
  h.count_gpus = [] {
    FILE* p = popen("nvidia-smi -L 2>/dev/null", "r");
    if (!p) return -1;
    int n = 0;
    char line[512];
    while (fgets(line, sizeof line, p))
      if (std::string_view(line).substr(0, 4) == "GPU ") ++n;
    int rc = pclose(p);
    return rc == 0 ? n : -1;
  };
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  h.cpu_count = cpus > 0 ? static_cast<int>(cpus) : 1;
  if (const char* lib = std::getenv("PRISM_LIBPRISM"); lib && *lib) {
    std::error_code ec;
    h.libprism = fs::weakly_canonical(lib, ec).string();
  } else {
    h.libprism = FindLibprism(prism_exe);
  }
  if (!h.libprism.empty()) h.python_hook_dir = (fs::path(h.libprism).parent_path() / "python").string();
  h.which = [](const std::string& name) -> std::optional<std::string> {
    const char* path = std::getenv("PATH");
    if (!path) return std::nullopt;
    std::string dirs(path);
    std::replace(dirs.begin(), dirs.end(), ':', ',');
    for (const std::string& dir : SplitComma(dirs)) {
      if (dir.empty()) continue;
      fs::path cand = fs::path(dir) / name;
      if (access(cand.c_str(), X_OK) == 0) return cand.string();
    }
    return std::nullopt;
  };
  h.shebang = [](const std::string& file) -> std::optional<std::string> {
    std::ifstream in(file);
    std::string line;
    if (!in || !std::getline(in, line) || line.rfind("#!", 0) != 0) return std::nullopt;
    std::istringstream words(line.substr(2));
    std::string interp, arg;
    words >> interp >> arg;
    if (interp.empty()) return std::nullopt;
    // "#!/usr/bin/env python3" names the interpreter by PATH lookup.
    if (fs::path(interp).filename() == "env" && !arg.empty()) return arg;
    return interp;
  };
  std::error_code ec;
  h.cwd = fs::current_path(ec).string();
  return h;
}


std::optional<Plan> BuildPlan(const PlanRequest& req, const HostInfo& host, std::string* error) {
  Plan p;
  auto parsed = ParseTorchrun(req.command, host.env, error);
  if (!parsed) return std::nullopt;
  p.torchrun = std::move(*parsed);
  const TorchrunArgs& t = p.torchrun;
  p.out_dir = req.out_dir;

  // GPUs of this host.
  std::optional<std::string> cvd = host.env ? host.env("CUDA_VISIBLE_DEVICES") : std::nullopt;
  std::vector<std::string> devices;
  if (cvd) {
    for (const std::string& d : SplitComma(*cvd))
      if (!Trim(d).empty()) devices.push_back(Trim(d));
  }
  int detected = cvd ? static_cast<int>(devices.size()) : (host.count_gpus ? host.count_gpus() : -1);
  if (req.gpus > 0) {
    if (cvd && req.gpus > static_cast<int>(devices.size())) {
      *error = "--gpus " + std::to_string(req.gpus) + " but CUDA_VISIBLE_DEVICES=\"" + *cvd + "\" lists " +
               std::to_string(devices.size());
      return std::nullopt;
    }
    p.gpus = req.gpus;
  } else if (detected > 0) {
    p.gpus = detected;
  } else {
    p.gpus = 1;
    p.warnings.push_back(cvd ? "CUDA_VISIBLE_DEVICES=\"" + *cvd + "\" names no GPU; planning for 1 GPU"
                             : "no GPU found (nvidia-smi -L); planning for 1 GPU (use --gpus N)");
  }
  if (!cvd)
    for (int g = 0; g < p.gpus; ++g) devices.push_back(std::to_string(g));
  while (static_cast<int>(devices.size()) < p.gpus) devices.push_back(std::to_string(devices.size()));

  // Target world.
  p.nnodes = t.max_nodes;
  if (t.min_nodes != t.max_nodes)
    p.warnings.push_back("elastic --nnodes " + t.nnodes + ": emulating the largest world (" +
                         std::to_string(t.max_nodes) + " nodes)");
  auto nproc = ResolveNprocPerNode(t.nproc_per_node, detected > 0 ? detected : 0, host.cpu_count, error);
  if (!nproc) return std::nullopt;
  p.nproc_per_node = *nproc;
  if (t.nproc_per_node == "gpu" || t.nproc_per_node == "auto" || t.nproc_per_node == "cpu")
    p.warnings.push_back("--nproc-per-node " + t.nproc_per_node + " resolved on this host to " +
                         std::to_string(p.nproc_per_node) + "; give the target's number to emulate other nodes");
  long long world = static_cast<long long>(p.nnodes) * p.nproc_per_node;
  if (world > (1 << 20)) {
    *error = "world of " + std::to_string(world) + " ranks is larger than prism supports (2^20)";
    return std::nullopt;
  }
  p.world_size = static_cast<int>(world);
  std::string origin = std::to_string(p.nnodes) + " nodes x " + std::to_string(p.nproc_per_node) + " processes";

  // Layout.
  bool megatron_found = false;
  auto from_args = world::LayoutFromMegatronArgs(t.script_args, error, &megatron_found);
  if (!from_args) return std::nullopt;
  if (!req.layout.empty()) {
    auto l = world::ParseLayout(req.layout, error);
    if (!l) return std::nullopt;
    p.layout = *l;
    p.layout_source = "--layout";
    if (megatron_found && (l->tp != from_args->tp || l->pp != from_args->pp || l->cp != from_args->cp ||
                           l->ep != from_args->ep))
      p.warnings.push_back("--layout " + req.layout + " differs from the job's own Megatron arguments (tp " +
                           std::to_string(from_args->tp) + ", pp " + std::to_string(from_args->pp) + ", cp " +
                           std::to_string(from_args->cp) + ", ep " + std::to_string(from_args->ep) +
                           "): the job will build its groups from its arguments");
  } else {
    p.layout = *from_args;
    p.layout_source = megatron_found ? "Megatron arguments" : "none found: pure data parallel";
  }
  if (!world::ResolveLayout(&p.layout, p.world_size, origin, error)) return std::nullopt;
  auto w = world::World::Make(p.layout, p.nproc_per_node, error);
  if (!w) return std::nullopt;
  if (megatron_found && p.layout.gloo)
    p.warnings.push_back("the job creates Gloo process groups (Megatron's default): Gloo connects ranks directly "
                         "over TCP, which virtual ranks cannot answer; add --disable-gloo-process-groups to the job");

  if (req.on_hang != "stop" && req.on_hang != "wait") {
    *error = "--on-hang " + req.on_hang + ": expected stop or wait";
    return std::nullopt;
  }
  p.hang_timeout_s = req.hang_timeout_s;
  p.stop_on_hang = req.on_hang == "stop";
  p.passthrough = req.passthrough;
  p.swap = req.swap;

  // Real ranks.
  std::vector<int> ranks;
  std::map<int, std::string> why;  // collect: why a rank is real (RealRank::why)
  if (req.real_routing && !req.one_replica) {
    *error = "--real-routing belongs to collect (data-parallel replica 0 and its expert-parallel peers)";
    return std::nullopt;
  }
  p.real_routing = req.real_routing;
  if (req.node_rank >= 0 && !req.ranks.empty() && !req.coordinator.empty()) {
    // Joining a coordinator: --node-rank names this host among the hosts (as torchrun's does); --ranks picks.
    p.host_index = req.node_rank;
    auto r = prism::ParseRankList(req.ranks, p.world_size, "--ranks", error);
    if (!r) return std::nullopt;
    ranks = *r;
  } else if (req.node_rank >= 0) {
    if (!req.ranks.empty()) {
      *error = "give --ranks or --node-rank, not both (both only with --coordinator, where --node-rank numbers this "
               "host)";
      return std::nullopt;
    }
    if (req.node_rank >= p.nnodes) {
      *error = "--node-rank " + std::to_string(req.node_rank) + " is outside the target's " +
               std::to_string(p.nnodes) + " nodes";
      return std::nullopt;
    }
    for (int i = 0; i < p.nproc_per_node; ++i) ranks.push_back(req.node_rank * p.nproc_per_node + i);
  } else if (req.all_real) {
    if (!req.ranks.empty()) {
      *error = "record runs every rank of the world; --ranks does not apply";
      return std::nullopt;
    }
    if (p.world_size > p.gpus) {
      *error = "record runs every rank on its own GPU: the job's world of " + std::to_string(p.world_size) +
               " ranks needs " + std::to_string(p.world_size) + " GPUs here, " + std::to_string(p.gpus) +
               " are visible (record on several hosts is not built yet)";
      return std::nullopt;
    }
    for (int r = 0; r < p.world_size; ++r) ranks.push_back(r);
    p.passthrough_min_members = 1;
  } else if (req.one_replica) {
    if (!req.ranks.empty()) {
      *error = "collect runs data-parallel replica 0; --ranks does not apply";
      return std::nullopt;
    }
    for (int r = 0; r < p.world_size; ++r)
      if (w->CoordsOf(r).dp == 0) ranks.push_back(r);
    for (int r : ranks) why[r] = "replica 0";
    if (req.real_routing && p.layout.ep > 1) {
      // Why the expert-parallel groups: Megatron carves ep out of dp, so replica 0 holds ep 0 only (with the default
      // orders); the members of each of its ranks' EXPERT_MODEL_PARALLEL_GROUP are the ranks that exchange tokens
      // with it in the MoE all-to-all, one of each ep coordinate.
      for (int r : std::vector<int>(ranks)) {
        for (int m : w->GroupOf("ep", r))
          if (!why.count(m)) why[m] = "real_routing: expert-parallel peer of rank " + std::to_string(r);
      }
      ranks.clear();
      for (const auto& [r, reason] : why) ranks.push_back(r);  // sorted, each once
    } else if (req.real_routing) {
      p.notes.push_back("--real-routing: the job has no expert parallelism (ep 1): data-parallel replica 0 is every "
                        "class already");
    } else if (p.layout.ep > 1 && !CoversEveryClass(*w, ranks)) {
      p.warnings.push_back(
          "the job is expert-parallel (ep " + std::to_string(p.layout.ep) + ") and data-parallel replica 0 holds "
          "only some of its expert-parallel coordinates: the other ranks run virtual with mirrored data, and the "
          "graph gives their classes the nodes of the real rank that differs from them only in ep (EP symmetry "
          "assumed: every expert-parallel rank routes tokens like it); add --real-routing to run them for real");
    }
  } else {
    auto r = prism::ParseRankList(req.ranks.empty() ? "0" : req.ranks, p.world_size, "--ranks", error);
    if (!r) return std::nullopt;
    ranks = *r;
  }
  std::map<int, std::vector<int>> by_gpu;
  for (size_t i = 0; i < ranks.size(); ++i) {
    RealRank rr;
    rr.rank = ranks[i];
    rr.gpu = static_cast<int>(i % p.gpus);
    rr.node = w->NodeOf(rr.rank);
    rr.local_rank = w->LocalRankOf(rr.rank);
    rr.device = devices[rr.gpu];
    rr.coords = w->CoordsOf(rr.rank);
    if (auto it = why.find(rr.rank); it != why.end()) rr.why = it->second;
    by_gpu[rr.gpu].push_back(rr.rank);
    p.real.push_back(rr);
  }
  for (const auto& [gpu, rs] : by_gpu)
    if (rs.size() > 1)
      p.warnings.push_back("ranks " + Join(rs) + " share GPU " + std::to_string(gpu) + " (" + devices[gpu] +
                           "): functional and memory results hold, their timings do not");

  // Coordinator endpoint.
  std::string join_bus;  // PRISM_COORD_ADDR when joining over TCP
  std::vector<int> all_real;  // when joining: every host's real ranks, from the coordinator's document
  if (!req.coordinator.empty()) {
    p.start_coordinator = false;
    fs::path info = req.coordinator;
    std::error_code fec;
    if (fs::is_directory(info, fec)) info /= "coordinator.json";
    bool is_file = fs::is_regular_file(info, fec);
    if (is_file || req.coordinator.find('/') != std::string::npos || req.coordinator.ends_with(".json")) {
      std::ifstream in(info);
      nlohmann::json j = in ? nlohmann::json::parse(in, nullptr, false) : nlohmann::json();
      if (!in || j.is_discarded() || !j.is_object() || !j.contains("store_host") || !j.contains("store_port")) {
        *error = "--coordinator " + req.coordinator + ": " + info.string() +
                 (in ? " is not a coordinator.json (store_host, store_port)" : " cannot be read");
        return std::nullopt;
      }
      p.store_addr = j.value("store_host", "");
      p.store_port = j.value("store_port", 0);
      join_bus = j.value("bus_tcp", "");
      if (join_bus.empty()) p.coord_socket = j.value("socket", "");
      if (j.contains("real_ranks") && j["real_ranks"].is_array()) all_real = j["real_ranks"].get<std::vector<int>>();
    } else {
      size_t colon = req.coordinator.rfind(':');
      int port = 0;
      if (colon == std::string::npos || colon == 0 || !ToInt(req.coordinator.substr(colon + 1), &port) || port <= 0 ||
          port > 65535) {
        *error = "--coordinator \"" + req.coordinator + "\" is not HOST:PORT or a coordinator.json";
        return std::nullopt;
      }
      p.store_addr = req.coordinator.substr(0, colon);
      p.store_port = port;
      nlohmann::json doc = req.coordinator_doc.empty() ? nlohmann::json()
                                                        : nlohmann::json::parse(req.coordinator_doc, nullptr, false);
      if (!doc.is_object()) {
        p.warnings.push_back("--coordinator HOST:PORT: the store there does not say where its event bus is (not a "
                             "prism coordinator?): libprism gets no event bus address");
      } else {
        // Why HOST and not the document's host names: HOST is the address this host reached the store at.
        std::string bus = doc.value("bus_tcp", "");
        size_t bc = bus.rfind(':');
        if (bus.empty() || bc == std::string::npos) {
          p.warnings.push_back("the coordinator at " + req.coordinator + " serves its event bus on a Unix socket "
                               "only: start it with --listen (first prism-run) or --bus-tcp (prism-run coordinator)");
        } else {
          join_bus = p.store_addr + ":" + bus.substr(bc + 1);
        }
        int doc_world = doc.value("world_size", 0);
        if (doc_world != 0 && doc_world != p.world_size) {
          *error = "the coordinator at " + req.coordinator + " emulates a world of " + std::to_string(doc_world) +
                   " ranks, this job's torchrun line gives " + std::to_string(p.world_size);
          return std::nullopt;
        }
        std::vector<int> doc_real = doc.value("real_ranks", std::vector<int>{});
        all_real = doc_real;
        std::vector<int> not_real;
        for (int r : ranks) {
          if (!doc_real.empty() && std::find(doc_real.begin(), doc_real.end(), r) == doc_real.end())
            not_real.push_back(r);
        }
        if (!not_real.empty()) {
          *error = "rank(s) " + Join(not_real) + " are virtual in the coordinator at " + req.coordinator +
                   " (its real ranks: " + Join(doc_real) + "); list them in --remote-ranks of the prism-run that "
                   "starts it, or --ranks of prism-run coordinator";
          return std::nullopt;
        }
      }
    }
    if (!req.listen.empty() || !req.remote_ranks.empty()) {
      *error = "--listen and --remote-ranks belong to the prism-run that starts the coordinator, not to one that "
               "joins it (--coordinator)";
      return std::nullopt;
    }
  } else {
    p.start_coordinator = true;
    p.listen = req.listen;
    // Workers here reach the store on loopback, or on the listen address when it is a specific one.
    p.store_addr = req.listen.empty() || req.listen == "0.0.0.0" || req.listen == "::" ? "127.0.0.1" : req.listen;
    if (!req.remote_ranks.empty()) {
      auto rr = prism::ParseRankList(req.remote_ranks, p.world_size, "--remote-ranks", error);
      if (!rr) {
        return std::nullopt;
      }
      for (int r : *rr) {
        if (std::find(ranks.begin(), ranks.end(), r) != ranks.end()) {
          *error = "--remote-ranks " + req.remote_ranks + ": rank " + std::to_string(r) + " also runs here (--ranks)";
          return std::nullopt;
        }
      }
      p.remote_ranks = *rr;
      if (req.listen.empty())
        p.warnings.push_back("--remote-ranks without --listen: the coordinator listens on loopback only, so other "
                             "hosts cannot join it");
    }
    p.store_port = t.master_port;  // Why: the port the job asked for; the coordinator falls back to a free one
    std::string sock = (fs::path(req.out_dir) / "coord.sock").string();
    // Why: a Unix socket path must fit sockaddr_un (108 bytes); the coordinator makes the same choice.
    if (sock.size() >= 100) sock = "(chosen by the coordinator under /tmp)";
    p.coord_socket = sock;
  }

  // Torchrun options that mean nothing here (prism replaces the agent and its rendezvous).
  for (const std::string& opt : t.options) {
    static const std::map<std::string, std::string> kIgnored = {
        {"--rdzv", "rendezvous options: the coordinator is the store"},
        {"--standalone", "rendezvous options: the coordinator is the store"},
        {"--master", "--master-addr/--master-port: the coordinator is the store"},
        {"--node", "--node-rank: prism picks the real ranks with --ranks / --node-rank"},
        {"--max", "--max-restarts: prism does not restart workers"},
        {"--redirects", "--redirects/--tee/--log-dir: every worker's output goes to <out>/logs/rank<R>.log"},
        {"-r", "--redirects/--tee/--log-dir: every worker's output goes to <out>/logs/rank<R>.log"},
        {"--tee", "--redirects/--tee/--log-dir: every worker's output goes to <out>/logs/rank<R>.log"},
        {"-t", "--redirects/--tee/--log-dir: every worker's output goes to <out>/logs/rank<R>.log"},
        {"--log", "--redirects/--tee/--log-dir: every worker's output goes to <out>/logs/rank<R>.log"},
        {"--numa", "--numa-binding: not applied"},
        {"--local-ranks", "--local-ranks-filter: every real rank's output is shown"},
        {"--local_ranks", "--local-ranks-filter: every real rank's output is shown"},
    };
    for (const auto& [prefix, why] : kIgnored) {
      if (opt.rfind(prefix, 0) == 0) {
        std::string note = "ignored torchrun " + why;
        if (std::find(p.notes.begin(), p.notes.end(), note) == p.notes.end()) p.notes.push_back(note);
      }
    }
  }

  // The command each worker runs (torch/distributed/run.py config_from_args).
  std::vector<std::string> head;
  if (t.run_path) {
    p.python = WorkerPython(t, host, &p.warnings);
    head = {p.python, "-u", "-c",
            "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
            t.script};
  } else if (!t.no_python) {
    p.python = WorkerPython(t, host, &p.warnings);
    head = {p.python, "-u"};
    if (t.module) head.push_back("-m");
    head.push_back(t.script);
  } else {
    head = {t.script};
  }

  // Environment every worker gets: torchrun agent's variables, the watchdog settings, prism's own.
  EnvList& env = p.env;
  std::string run_id = t.rdzv_id != "none" ? t.rdzv_id : (req.run_id.empty() ? "prism" : req.run_id);
  Set(&env, "WORLD_SIZE", std::to_string(p.world_size));
  Set(&env, "LOCAL_WORLD_SIZE", std::to_string(p.nproc_per_node));
  Set(&env, "GROUP_WORLD_SIZE", std::to_string(p.nnodes));
  Set(&env, "ROLE_WORLD_SIZE", std::to_string(p.world_size));
  Set(&env, "ROLE_NAME", t.role);
  Set(&env, "MASTER_ADDR", p.store_addr);
  Set(&env, "MASTER_PORT", std::to_string(p.store_port));
  Set(&env, "TORCHELASTIC_USE_AGENT_STORE", "True");
  Set(&env, "TORCHELASTIC_RUN_ID", run_id);
  Set(&env, "TORCHELASTIC_RESTART_COUNT", "0");
  Set(&env, "TORCHELASTIC_MAX_RESTARTS", std::to_string(t.max_restarts));
  if (p.nproc_per_node > 1 && !(host.env && host.env("OMP_NUM_THREADS")))
    Set(&env, "OMP_NUM_THREADS", "1");  // torchrun does this for nproc > 1
  Set(&env, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "0");
  Set(&env, "TORCH_NCCL_ENABLE_MONITORING", "0");
  Set(&env, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", kHeartbeatTimeoutSec);
  Set(&env, "TORCH_NCCL_DUMP_ON_TIMEOUT", "0");
  Set(&env, "TORCH_NCCL_RANKS_PER_ROOT", std::to_string(std::max(p.world_size, 128)));
  Set(&env, "CUDA_MODULE_LOADING", "EAGER");
  Set(&env, "NCCL_NVLS_ENABLE", "0");
  Set(&env, "PRISM_WORLD_SIZE", std::to_string(p.world_size));
  Set(&env, "PRISM_GPUS_PER_NODE", std::to_string(p.nproc_per_node));
  Set(&env, "PRISM_OUT_DIR", p.out_dir);
  if (!p.coord_socket.empty()) Set(&env, "PRISM_COORD_SOCKET", p.coord_socket);
  if (!join_bus.empty()) Set(&env, "PRISM_COORD_ADDR", join_bus);
  Set(&env, "PRISM_PAYLOAD", req.payload);
  if (!req.payload_max_bytes.empty()) Set(&env, "PRISM_PAYLOAD_MAX_BYTES", req.payload_max_bytes);
  if (!req.topology.empty()) Set(&env, "PRISM_TOPOLOGY", req.topology);
  if (!req.graph.empty()) Set(&env, "PRISM_GRAPH", req.graph);
  if (!req.passthrough) Set(&env, "PRISM_PASSTHROUGH", "0");
  if (req.kernels > 0) Set(&env, "PRISM_KERNELS", req.kernels == 2 ? "nvtx" : "1");
  Set(&env, "PRISM_LAYOUT", p.layout.ToSpec());
  std::vector<int> real_ranks;
  for (const RealRank& r : p.real) real_ranks.push_back(r.rank);
  // Why every host's: libprism counts a communicator's real members from this list (several real members: it
  // waits for the coordinator's release).
  real_ranks.insert(real_ranks.end(), p.remote_ranks.begin(), p.remote_ranks.end());
  for (int r : all_real) {
    if (std::find(real_ranks.begin(), real_ranks.end(), r) == real_ranks.end()) real_ranks.push_back(r);
  }
  std::sort(real_ranks.begin(), real_ranks.end());
  Set(&env, "PRISM_REAL_RANKS", Join(real_ranks));
  if (req.preload) {
    if (host.libprism.empty()) {
      *error = "libprism.so not found next to prism-run (../lib/libprism.so) and PRISM_LIBPRISM is not set; "
               "build the 'prism' target (it needs the CUDA headers), or use --no-preload to test the launch only";
      return std::nullopt;
    }
    std::optional<std::string> user_preload = host.env ? host.env("LD_PRELOAD") : std::nullopt;
    Set(&env, "LD_PRELOAD", host.libprism + (user_preload && !user_preload->empty() ? ":" + *user_preload : ""));
    std::optional<std::string> user_pp = host.env ? host.env("PYTHONPATH") : std::nullopt;
    // Why first: Python imports only the first sitecustomize on sys.path (a user's own one later on the path is
    // then not imported; docs/cli.md says so).
    Set(&env, "PYTHONPATH", host.python_hook_dir + (user_pp && !user_pp->empty() ? ":" + *user_pp : ""));
  } else {
    p.warnings.push_back("--no-preload: libprism.so is not loaded, so the job's NCCL calls are not emulated");
    if (req.kernels > 0) p.warnings.push_back("--kernels with --no-preload: no kernels are recorded (libprism does it)");
  }
  // Tell people which of their own settings prism replaced.
  if (host.env) {
    for (const auto& [k, v] : env) {
      if (k == "LD_PRELOAD" || k == "PYTHONPATH") continue;
      auto mine = host.env(k);
      if (mine && *mine != v) p.notes.push_back("replaced " + k + "=" + *mine + " with " + v);
    }
  }

  std::vector<int> recorded;  // --payload-dir: ranks with payloads/rank<R>.bin, ascending
  if (!req.payload_dir.empty()) {
    std::error_code ec;
    static const std::regex kName(R"(rank(\d{1,9})\.bin)");
    for (const auto& e : fs::directory_iterator(fs::path(req.payload_dir) / "payloads", ec)) {
      std::smatch m;
      std::string name = e.path().filename().string();
      if (std::regex_match(name, m, kName) && e.is_regular_file(ec)) {
        const int q = std::stoi(m[1].str());  // Why safe: at most 9 digits
        if (q < p.world_size) recorded.push_back(q);
      }
    }
    std::sort(recorded.begin(), recorded.end());
  }
  for (const RealRank& r : p.real) {
    Worker wk;
    wk.rank = r.rank;
    wk.argv = head;
    if (t.legacy_launch && !t.use_env) wk.argv.push_back("--local-rank=" + std::to_string(r.local_rank));
    wk.argv.insert(wk.argv.end(), t.script_args.begin(), t.script_args.end());
    Set(&wk.env, "RANK", std::to_string(r.rank));
    Set(&wk.env, "LOCAL_RANK", std::to_string(r.local_rank));
    Set(&wk.env, "GROUP_RANK", std::to_string(r.node));
    Set(&wk.env, "ROLE_RANK", std::to_string(r.rank));
    Set(&wk.env, "CUDA_VISIBLE_DEVICES", r.device);
    Set(&wk.env, "PRISM_RANK", std::to_string(r.rank));
    if (!req.payload_dir.empty()) {
      // Which collected rank's payloads: the rank's own (it ran in the collect), else the lowest collected rank of
      // its class (collect --real-routing recorded the expert-parallel peers), else the rank of replica 0 with its
      // dense coordinates (for a rank whose ep coordinate ran virtual: the ep-0 rank, as the graph's class does).
      const world::Coords& c = r.coords;
      int cls = -1;
      for (int q : recorded)
        if (q == r.rank || (cls < 0 && SameClass(*w, q, r.rank))) cls = q;
      if (cls < 0) cls = w->RankOf(c.tp, c.cp, 0, c.pp, c.gtp);
      std::string file = req.payload_dir + "/payloads/rank" + std::to_string(cls) + ".bin";
      std::error_code ec;
      if (!std::filesystem::is_regular_file(file, ec)) {
        *error = "--payload-dir " + req.payload_dir + ": no payloads/rank" + std::to_string(cls) + ".bin for rank " +
                 std::to_string(r.rank) + " (its class is rank " + std::to_string(cls) +
                 " of replica 0); run `prism-run collect --out " + req.payload_dir + " torchrun ...` with the same job";
        return std::nullopt;
      }
      Set(&wk.env, "PRISM_PAYLOAD_FILE", file);
    }
    if (req.record_payloads) {
      Set(&wk.env, "PRISM_RECORD_PAYLOADS", p.out_dir + "/payloads/rank" + std::to_string(r.rank) + ".bin");
    }
    p.workers.push_back(std::move(wk));
  }
  return p;
}

void SetStorePort(Plan* plan, int port, const std::string& socket) {
  plan->store_port = port;
  Set(&plan->env, "MASTER_PORT", std::to_string(port));
  if (!socket.empty()) {
    plan->coord_socket = socket;
    Set(&plan->env, "PRISM_COORD_SOCKET", socket);
  }
}

std::vector<std::string> WorkerEnvironment(const Plan& plan, const Worker& worker,
                                           const std::vector<std::string>& base) {
  std::vector<std::string> out;
  std::map<std::string, size_t> index;
  auto put = [&](const std::string& k, const std::string& v) {
    auto it = index.find(k);
    if (it != index.end()) {
      out[it->second] = k + "=" + v;
    } else {
      index[k] = out.size();
      out.push_back(k + "=" + v);
    }
  };
  for (const std::string& kv : base) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    put(kv.substr(0, eq), kv.substr(eq + 1));
  }
  for (const auto& [k, v] : plan.env) put(k, v);
  for (const auto& [k, v] : worker.env) put(k, v);
  return out;
}

nlohmann::ordered_json PlanToJson(const Plan& p) {
  using json = nlohmann::ordered_json;
  json j;
  j["world_size"] = p.world_size;
  j["nnodes"] = p.nnodes;
  j["gpus_per_node"] = p.nproc_per_node;
  j["gpus"] = p.gpus;
  const world::Layout& l = p.layout;
  j["layout"] = {{"tp", l.tp},   {"pp", l.pp},         {"dp", l.dp},       {"cp", l.cp},
                 {"ep", l.ep},   {"etp", l.ExpertTp()}, {"vpp", l.vpp},     {"edp", l.ExpertDp()},
                 {"order", l.order}, {"spec", l.ToSpec()}, {"source", p.layout_source}};
  json reals = json::array();
  for (const RealRank& r : p.real) {
    reals.push_back({{"rank", r.rank},
                     {"gpu", r.gpu},
                     {"node", r.node},
                     {"local_rank", r.local_rank},
                     {"device", r.device},
                     {"coords",
                      {{"tp", r.coords.tp}, {"cp", r.coords.cp}, {"dp", r.coords.dp}, {"pp", r.coords.pp},
                       {"ep", r.coords.ep}, {"etp", r.coords.etp}, {"edp", r.coords.edp}}}});
    if (!r.why.empty()) reals.back()["why"] = r.why;
  }
  j["real_ranks"] = reals;
  if (std::any_of(p.real.begin(), p.real.end(), [](const RealRank& r) { return !r.why.empty(); }))
    j["real_routing"] = p.real_routing;
  j["command"] = p.workers.empty() ? json::array() : json(p.workers.front().argv);
  json env = json::object();
  for (const auto& [k, v] : p.env) env[k] = v;
  j["env"] = env;
  json workers = json::array();
  for (const Worker& w : p.workers) {
    json wenv = json::object();
    for (const auto& [k, v] : w.env) wenv[k] = v;
    workers.push_back({{"rank", w.rank}, {"command", w.argv}, {"env", wenv}});
  }
  j["workers"] = workers;
  j["coordinator"] = {{"start", p.start_coordinator},
                      {"store", p.store_addr + ":" + std::to_string(p.store_port)},
                      {"socket", p.coord_socket}};
  j["hang"] = {{"timeout_s", p.hang_timeout_s}, {"on_hang", p.stop_on_hang ? "stop" : "wait"}};
  j["passthrough"] = p.passthrough;
  j["passthrough_min_members"] = p.passthrough_min_members;
  if (!p.listen.empty() || !p.remote_ranks.empty() || p.host_index >= 0) {
    j["hosts"] = {{"listen", p.listen}, {"remote_ranks", p.remote_ranks}, {"host_index", p.host_index}};
  }
  j["out_dir"] = p.out_dir;
  j["job_command"] = [&] {
    std::vector<std::string> all = p.torchrun.launcher;
    all.insert(all.end(), p.torchrun.options.begin(), p.torchrun.options.end());
    all.push_back(p.torchrun.script);
    all.insert(all.end(), p.torchrun.script_args.begin(), p.torchrun.script_args.end());
    return all;
  }();
  j["warnings"] = p.warnings;
  j["notes"] = p.notes;
  return j;
}

std::string PlanToText(const Plan& p) {
  std::ostringstream o;
  const world::Layout& l = p.layout;
  o << "prism-run plan\n";
  o << "  target world   " << p.world_size << " ranks = " << p.nnodes << " nodes x " << p.nproc_per_node
    << " GPUs per node\n";
  o << "  layout         tp " << l.tp << ", pp " << l.pp << ", dp " << l.dp << ", cp " << l.cp << ", ep " << l.ep
    << ", etp " << l.ExpertTp() << (l.vpp ? ", vpp " + std::to_string(l.vpp) : std::string()) << ", order "
    << l.order << "  (" << p.layout_source << ")\n";
  o << "  this host      " << p.gpus << " GPU" << (p.gpus == 1 ? "" : "s") << ", " << p.real.size() << " real rank"
    << (p.real.size() == 1 ? "" : "s") << "\n";
  for (const RealRank& r : p.real) {
    o << "    rank " << r.rank << ": GPU " << r.gpu << " (CUDA_VISIBLE_DEVICES=" << r.device << "), node " << r.node
      << " local rank " << r.local_rank << ", tp " << r.coords.tp << " pp " << r.coords.pp << " dp " << r.coords.dp;
    if (l.cp > 1) o << " cp " << r.coords.cp;
    if (l.ep > 1) o << " ep " << r.coords.ep;
    if (!r.why.empty()) o << "  (" << r.why << ")";
    o << "\n";
  }
  if (p.real_routing) {
    o << "  real routing   "
      << (l.ep > 1 ? "on: replica 0 and its expert-parallel peers run for real (MoE routing from real data)"
                   : "asked for, but the job has no expert parallelism")
      << "\n";
  }
  o << "  coordinator    " << (p.start_coordinator ? "started here, store " : "joined at ") << p.store_addr << ":"
    << p.store_port;
  if (!p.coord_socket.empty()) o << ", socket " << p.coord_socket;
  if (!p.listen.empty()) o << "; listening on " << p.listen << " for other hosts";
  if (!p.remote_ranks.empty()) o << "; ranks " << Join(p.remote_ranks) << " run on other hosts";
  if (p.host_index >= 0) o << "; this is host " << p.host_index;
  o << "\n  hang diagnosis ";
  if (p.hang_timeout_s > 0) {
    o << "after " << p.hang_timeout_s << " s without progress, then " << (p.stop_on_hang ? "stop" : "keep running");
  } else {
    o << "off";
  }
  o << "\n  passthrough    ";
  if (!p.passthrough) {
    o << "off (--no-passthrough)";
  } else {
    std::set<std::string> gpus;
    for (const RealRank& r : p.real) gpus.insert(r.device);
    if (p.passthrough_min_members <= 1 && gpus.size() == p.real.size()) {
      o << "every communicator runs on the real NCCL (record: every rank real, each on its own GPU)";
    } else {
      o << (gpus.size() > 1 ? "on: communicators of real ranks on distinct GPUs only run on the real NCCL"
                            : "on, but every real rank here shares one GPU: none runs on the real NCCL");
    }
  }
  o << "\n  output         " << p.out_dir << "\n";
  o << "  each worker runs\n";
  for (const Worker& w : p.workers) {
    o << "    rank " << w.rank << ":";
    for (const auto& [k, v] : w.env) o << " " << k << "=" << v;
    o << "\n      " << ShellJoin(w.argv) << "\n";
  }
  o << "  environment of every worker (on top of yours)\n";
  for (const auto& [k, v] : p.env) o << "    " << k << "=" << v << "\n";
  for (const std::string& n : p.notes) o << "  note: " << n << "\n";
  for (const std::string& w : p.warnings) o << "  warning: " << w << "\n";
  return o.str();
}

}  // namespace prism::launcher
