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

namespace {

// BuildPlan's steps, in its order. A step that returns false has set *error: there is no plan.
class PlanBuilder {
 public:
  PlanBuilder(const PlanRequest& req, const HostInfo& host, std::string* error)
      : req_(req), host_(host), error_(error) {}

  bool ParseJob();
  bool FindGpus();
  bool TargetWorld();
  bool ChooseLayout();
  bool HangAndPassthrough();
  bool ChooseRealRanks();
  void PlaceRealRanks();
  bool CoordinatorEndpoint();
  void NoteIgnoredOptions();
  void WorkerCommand();
  void SetWorkerEnvironment();
  bool NeedsEagerModuleLoading();
  bool Preload();
  void NoteReplacedSettings();
  void FindRecordedPayloads();
  bool AddWorkers();
  Plan TakePlan() { return std::move(p_); }

 private:
  bool JoinCoordinator();
  bool StartCoordinatorHere();

  const PlanRequest& req_;
  const HostInfo& host_;
  std::string* error_;
  Plan p_;
  const TorchrunArgs& t_ = p_.torchrun;
  std::vector<std::string> devices_;  // per GPU index of this host: the device it names (CUDA_VISIBLE_DEVICES)
  int detected_ = -1;                 // GPUs found here (-1: none could be counted)
  std::string origin_;                // where the world size came from, for messages
  std::optional<world::World> w_;
  std::vector<int> ranks_;
  std::map<int, std::string> why_;  // collect: why a rank is real (RealRank::why)
  std::string join_bus_;  // PRISM_COORD_ADDR when joining over TCP
  std::vector<int> all_real_;  // when joining: every host's real ranks, from the coordinator's document
  std::vector<std::string> head_;  // the command each worker runs, before its arguments
  std::vector<int> recorded_;  // --payload-dir: ranks with payloads/rank<R>.bin, ascending
};

bool PlanBuilder::ParseJob() {
  auto parsed = ParseTorchrun(req_.command, host_.env, error_);
  if (!parsed) return false;
  p_.torchrun = std::move(*parsed);
  p_.out_dir = req_.out_dir;
  return true;
}

// GPUs of this host.
bool PlanBuilder::FindGpus() {
  std::optional<std::string> cvd = host_.env ? host_.env("CUDA_VISIBLE_DEVICES") : std::nullopt;
  if (cvd) {
    for (const std::string& d : SplitComma(*cvd))
      if (!Trim(d).empty()) devices_.push_back(Trim(d));
  }
  detected_ = cvd ? static_cast<int>(devices_.size()) : (host_.count_gpus ? host_.count_gpus() : -1);
  if (req_.gpus > 0) {
    if (cvd && req_.gpus > static_cast<int>(devices_.size())) {
      *error_ = "--gpus " + std::to_string(req_.gpus) + " but CUDA_VISIBLE_DEVICES=\"" + *cvd + "\" lists " +
                std::to_string(devices_.size());
      return false;
    }
    p_.gpus = req_.gpus;
  } else if (detected_ > 0) {
    p_.gpus = detected_;
  } else {
    p_.gpus = 1;
    p_.warnings.push_back(cvd ? "CUDA_VISIBLE_DEVICES=\"" + *cvd + "\" names no GPU; planning for 1 GPU"
                              : "no GPU found (nvidia-smi -L); planning for 1 GPU (use --gpus N)");
  }
  if (!cvd)
    for (int g = 0; g < p_.gpus; ++g) devices_.push_back(std::to_string(g));
  while (static_cast<int>(devices_.size()) < p_.gpus) devices_.push_back(std::to_string(devices_.size()));
  return true;
}

// Target world.
bool PlanBuilder::TargetWorld() {
  p_.nnodes = t_.max_nodes;
  if (t_.min_nodes != t_.max_nodes)
    p_.warnings.push_back("elastic --nnodes " + t_.nnodes + ": emulating the largest world (" +
                          std::to_string(t_.max_nodes) + " nodes)");
  auto nproc = ResolveNprocPerNode(t_.nproc_per_node, detected_ > 0 ? detected_ : 0, host_.cpu_count, error_);
  if (!nproc) return false;
  p_.nproc_per_node = *nproc;
  if (t_.nproc_per_node == "gpu" || t_.nproc_per_node == "auto" || t_.nproc_per_node == "cpu")
    p_.warnings.push_back("--nproc-per-node " + t_.nproc_per_node + " resolved on this host to " +
                          std::to_string(p_.nproc_per_node) + "; give the target's number to emulate other nodes");
  long long world = static_cast<long long>(p_.nnodes) * p_.nproc_per_node;
  if (world > (1 << 20)) {
    *error_ = "world of " + std::to_string(world) + " ranks is larger than prism supports (2^20)";
    return false;
  }
  p_.world_size = static_cast<int>(world);
  origin_ = std::to_string(p_.nnodes) + " nodes x " + std::to_string(p_.nproc_per_node) + " processes";
  return true;
}

// Layout.
bool PlanBuilder::ChooseLayout() {
  bool megatron_found = false;
  auto from_args = world::LayoutFromMegatronArgs(t_.script_args, error_, &megatron_found);
  if (!from_args) return false;
  if (!req_.layout.empty()) {
    auto l = world::ParseLayout(req_.layout, error_);
    if (!l) return false;
    p_.layout = *l;
    p_.layout_source = "--layout";
    if (megatron_found && (l->tp != from_args->tp || l->pp != from_args->pp || l->cp != from_args->cp ||
                           l->ep != from_args->ep))
      p_.warnings.push_back("--layout " + req_.layout + " differs from the job's own Megatron arguments (tp " +
                            std::to_string(from_args->tp) + ", pp " + std::to_string(from_args->pp) + ", cp " +
                            std::to_string(from_args->cp) + ", ep " + std::to_string(from_args->ep) +
                            "): the job will build its groups from its arguments");
  } else {
    p_.layout = *from_args;
    p_.layout_source = megatron_found ? "Megatron arguments" : "none found: pure data parallel";
  }
  if (!world::ResolveLayout(&p_.layout, p_.world_size, origin_, error_)) return false;
  w_ = world::World::Make(p_.layout, p_.nproc_per_node, error_);
  if (!w_) return false;
  if (megatron_found && p_.layout.gloo)
    p_.warnings.push_back("the job creates Gloo process groups (Megatron's default): Gloo connects ranks directly "
                          "over TCP, which virtual ranks cannot answer; add --disable-gloo-process-groups to the job");
  return true;
}

bool PlanBuilder::HangAndPassthrough() {
  if (req_.on_hang != "stop" && req_.on_hang != "wait") {
    *error_ = "--on-hang " + req_.on_hang + ": expected stop or wait";
    return false;
  }
  p_.hang_timeout_s = req_.hang_timeout_s;
  p_.stop_on_hang = req_.on_hang == "stop";
  p_.passthrough = req_.passthrough;
  p_.swap = req_.swap;
  return true;
}

// Real ranks.
bool PlanBuilder::ChooseRealRanks() {
  if (req_.real_routing && !req_.one_replica) {
    *error_ = "--real-routing belongs to collect (data-parallel replica 0 and its expert-parallel peers)";
    return false;
  }
  p_.real_routing = req_.real_routing;
  if (req_.node_rank >= 0 && !req_.ranks.empty() && !req_.coordinator.empty()) {
    // Joining a coordinator: --node-rank names this host among the hosts (as torchrun's does); --ranks picks.
    p_.host_index = req_.node_rank;
    auto r = prism::ParseRankList(req_.ranks, p_.world_size, "--ranks", error_);
    if (!r) return false;
    ranks_ = *r;
  } else if (req_.node_rank >= 0) {
    if (!req_.ranks.empty()) {
      *error_ = "give --ranks or --node-rank, not both (both only with --coordinator, where --node-rank numbers this "
                "host)";
      return false;
    }
    if (req_.node_rank >= p_.nnodes) {
      *error_ = "--node-rank " + std::to_string(req_.node_rank) + " is outside the target's " +
                std::to_string(p_.nnodes) + " nodes";
      return false;
    }
    for (int i = 0; i < p_.nproc_per_node; ++i) ranks_.push_back(req_.node_rank * p_.nproc_per_node + i);
  } else if (req_.all_real) {
    if (!req_.ranks.empty()) {
      *error_ = "record runs every rank of the world; --ranks does not apply";
      return false;
    }
    if (p_.world_size > p_.gpus) {
      *error_ = "record runs every rank on its own GPU: the job's world of " + std::to_string(p_.world_size) +
                " ranks needs " + std::to_string(p_.world_size) + " GPUs here, " + std::to_string(p_.gpus) +
                " are visible (record on several hosts is not built yet)";
      return false;
    }
    for (int r = 0; r < p_.world_size; ++r) ranks_.push_back(r);
    p_.passthrough_min_members = 1;
  } else if (req_.one_replica) {
    if (!req_.ranks.empty()) {
      *error_ = "collect runs data-parallel replica 0; --ranks does not apply";
      return false;
    }
    for (int r = 0; r < p_.world_size; ++r)
      if (w_->CoordsOf(r).dp == 0) ranks_.push_back(r);
    for (int r : ranks_) why_[r] = "replica 0";
    if (req_.real_routing && p_.layout.ep > 1) {
      // Why the expert-parallel groups: Megatron carves ep out of dp, so replica 0 holds ep 0 only (with the default
      // orders); the members of each of its ranks' EXPERT_MODEL_PARALLEL_GROUP are the ranks that exchange tokens
      // with it in the MoE all-to-all, one of each ep coordinate.
      for (int r : std::vector<int>(ranks_)) {
        for (int m : w_->GroupOf("ep", r))
          if (!why_.count(m)) why_[m] = "real_routing: expert-parallel peer of rank " + std::to_string(r);
      }
      ranks_.clear();
      for (const auto& [r, reason] : why_) ranks_.push_back(r);  // sorted, each once
    } else if (req_.real_routing) {
      p_.notes.push_back("--real-routing: the job has no expert parallelism (ep 1): data-parallel replica 0 is every "
                         "class already");
    } else if (p_.layout.ep > 1 && !CoversEveryClass(*w_, ranks_)) {
      p_.warnings.push_back(
          "the job is expert-parallel (ep " + std::to_string(p_.layout.ep) + ") and data-parallel replica 0 holds "
          "only some of its expert-parallel coordinates: the other ranks run virtual with mirrored data, and the "
          "graph gives their classes the nodes of the real rank that differs from them only in ep (EP symmetry "
          "assumed: every expert-parallel rank routes tokens like it); add --real-routing to run them for real");
    }
  } else {
    auto r = prism::ParseRankList(req_.ranks.empty() ? "0" : req_.ranks, p_.world_size, "--ranks", error_);
    if (!r) return false;
    ranks_ = *r;
  }
  return true;
}

void PlanBuilder::PlaceRealRanks() {
  std::map<int, std::vector<int>> by_gpu;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    RealRank rr;
    rr.rank = ranks_[i];
    rr.gpu = static_cast<int>(i % p_.gpus);
    rr.node = w_->NodeOf(rr.rank);
    rr.local_rank = w_->LocalRankOf(rr.rank);
    rr.device = devices_[rr.gpu];
    rr.coords = w_->CoordsOf(rr.rank);
    if (auto it = why_.find(rr.rank); it != why_.end()) rr.why = it->second;
    by_gpu[rr.gpu].push_back(rr.rank);
    p_.real.push_back(rr);
  }
  for (const auto& [gpu, rs] : by_gpu)
    if (rs.size() > 1)
      p_.warnings.push_back("ranks " + Join(rs) + " share GPU " + std::to_string(gpu) + " (" + devices_[gpu] +
                            "): functional and memory results hold, their timings do not");
}

// Coordinator endpoint.
bool PlanBuilder::CoordinatorEndpoint() {
  if (!req_.coordinator.empty()) return JoinCoordinator();
  return StartCoordinatorHere();
}

bool PlanBuilder::JoinCoordinator() {
  p_.start_coordinator = false;
  fs::path info = req_.coordinator;
  std::error_code fec;
  if (fs::is_directory(info, fec)) info /= "coordinator.json";
  bool is_file = fs::is_regular_file(info, fec);
  if (is_file || req_.coordinator.find('/') != std::string::npos || req_.coordinator.ends_with(".json")) {
    std::ifstream in(info);
    nlohmann::json j = in ? nlohmann::json::parse(in, nullptr, false) : nlohmann::json();
    if (!in || j.is_discarded() || !j.is_object() || !j.contains("store_host") || !j.contains("store_port")) {
      *error_ = "--coordinator " + req_.coordinator + ": " + info.string() +
                (in ? " is not a coordinator.json (store_host, store_port)" : " cannot be read");
      return false;
    }
    p_.store_addr = j.value("store_host", "");
    p_.store_port = j.value("store_port", 0);
    join_bus_ = j.value("bus_tcp", "");
    if (join_bus_.empty()) p_.coord_socket = j.value("socket", "");
    if (j.contains("real_ranks") && j["real_ranks"].is_array()) all_real_ = j["real_ranks"].get<std::vector<int>>();
  } else {
    size_t colon = req_.coordinator.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 || !ToInt(req_.coordinator.substr(colon + 1), &port) || port <= 0 ||
        port > 65535) {
      *error_ = "--coordinator \"" + req_.coordinator + "\" is not HOST:PORT or a coordinator.json";
      return false;
    }
    p_.store_addr = req_.coordinator.substr(0, colon);
    p_.store_port = port;
    nlohmann::json doc = req_.coordinator_doc.empty() ? nlohmann::json()
                                                      : nlohmann::json::parse(req_.coordinator_doc, nullptr, false);
    if (!doc.is_object()) {
      p_.warnings.push_back("--coordinator HOST:PORT: the store there does not say where its event bus is (not a "
                            "prism coordinator?): libprism gets no event bus address");
    } else {
      // Why HOST and not the document's host names: HOST is the address this host reached the store at.
      std::string bus = doc.value("bus_tcp", "");
      size_t bc = bus.rfind(':');
      if (bus.empty() || bc == std::string::npos) {
        p_.warnings.push_back("the coordinator at " + req_.coordinator + " serves its event bus on a Unix socket "
                              "only: start it with --listen (first prism-run) or --bus-tcp (prism-run coordinator)");
      } else {
        join_bus_ = p_.store_addr + ":" + bus.substr(bc + 1);
      }
      int doc_world = doc.value("world_size", 0);
      if (doc_world != 0 && doc_world != p_.world_size) {
        *error_ = "the coordinator at " + req_.coordinator + " emulates a world of " + std::to_string(doc_world) +
                  " ranks, this job's torchrun line gives " + std::to_string(p_.world_size);
        return false;
      }
      std::vector<int> doc_real = doc.value("real_ranks", std::vector<int>{});
      all_real_ = doc_real;
      std::vector<int> not_real;
      for (int r : ranks_) {
        if (!doc_real.empty() && std::find(doc_real.begin(), doc_real.end(), r) == doc_real.end())
          not_real.push_back(r);
      }
      if (!not_real.empty()) {
        *error_ = "rank(s) " + Join(not_real) + " are virtual in the coordinator at " + req_.coordinator +
                  " (its real ranks: " + Join(doc_real) + "); list them in --remote-ranks of the prism-run that "
                  "starts it, or --ranks of prism-run coordinator";
        return false;
      }
    }
  }
  if (!req_.listen.empty() || !req_.remote_ranks.empty()) {
    *error_ = "--listen and --remote-ranks belong to the prism-run that starts the coordinator, not to one that "
              "joins it (--coordinator)";
    return false;
  }
  return true;
}

bool PlanBuilder::StartCoordinatorHere() {
  p_.start_coordinator = true;
  p_.listen = req_.listen;
  // Workers here reach the store on loopback, or on the listen address when it is a specific one.
  p_.store_addr = req_.listen.empty() || req_.listen == "0.0.0.0" || req_.listen == "::" ? "127.0.0.1" : req_.listen;
  if (!req_.remote_ranks.empty()) {
    auto rr = prism::ParseRankList(req_.remote_ranks, p_.world_size, "--remote-ranks", error_);
    if (!rr) {
      return false;
    }
    for (int r : *rr) {
      if (std::find(ranks_.begin(), ranks_.end(), r) != ranks_.end()) {
        *error_ = "--remote-ranks " + req_.remote_ranks + ": rank " + std::to_string(r) + " also runs here (--ranks)";
        return false;
      }
    }
    p_.remote_ranks = *rr;
    if (req_.listen.empty())
      p_.warnings.push_back("--remote-ranks without --listen: the coordinator listens on loopback only, so other "
                            "hosts cannot join it");
  }
  p_.store_port = t_.master_port;  // Why: the port the job asked for; the coordinator falls back to a free one
  std::string sock = (fs::path(req_.out_dir) / "coord.sock").string();
  // Why: a Unix socket path must fit sockaddr_un (108 bytes); the coordinator makes the same choice.
  if (sock.size() >= 100) sock = "(chosen by the coordinator under /tmp)";
  p_.coord_socket = sock;
  return true;
}

// Torchrun options that mean nothing here (prism replaces the agent and its rendezvous).
void PlanBuilder::NoteIgnoredOptions() {
  for (const std::string& opt : t_.options) {
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
        if (std::find(p_.notes.begin(), p_.notes.end(), note) == p_.notes.end()) p_.notes.push_back(note);
      }
    }
  }
}

// The command each worker runs (torch/distributed/run.py config_from_args).
void PlanBuilder::WorkerCommand() {
  if (t_.run_path) {
    p_.python = WorkerPython(t_, host_, &p_.warnings);
    head_ = {p_.python, "-u", "-c",
             "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
             t_.script};
  } else if (!t_.no_python) {
    p_.python = WorkerPython(t_, host_, &p_.warnings);
    head_ = {p_.python, "-u"};
    if (t_.module) head_.push_back("-m");
    head_.push_back(t_.script);
  } else {
    head_ = {t_.script};
  }
}

// CUDA_MODULE_LOADING=EAGER where a rank shares its GPU with another real rank or is context switched (--swap), and
// the user did not choose: with lazy loading, a kernel's first launch waits for its context to go idle, so a launch
// behind a held gate blocks the job's thread until the gate opens; cuCheckpointProcessLock waits for that launch
// (an API call in flight) while the gate waits for a rank that runs only once this one is switched out: a deadlock.
// A rank alone on its GPU keeps lazy loading: the wait then ends when the gate opens (libprism's progress thread
// opens gates without a CUDA call), as it would behind an NCCL kernel natively, and eager loading costs
// +3.0-3.7 % per iteration (docs/libprism.md "Cost on a real rank").
bool PlanBuilder::NeedsEagerModuleLoading() {
  bool shared = p_.swap.enabled;
  std::set<int> gpus;
  for (const RealRank& r : p_.real) shared = !gpus.insert(r.gpu).second || shared;
  std::optional<std::string> mine = host_.env ? host_.env("CUDA_MODULE_LOADING") : std::nullopt;
  if (!mine) return shared;
  if (shared && *mine != "EAGER")
    p_.warnings.push_back("CUDA_MODULE_LOADING=" + *mine + " kept, but real ranks share a GPU or are switched: a " +
                          "kernel's first launch behind a held gate can then deadlock; unset it to get EAGER");
  return false;
}

// Environment every worker gets: torchrun agent's variables, the watchdog settings, prism's own.
void PlanBuilder::SetWorkerEnvironment() {
  EnvList& env = p_.env;
  std::string run_id = t_.rdzv_id != "none" ? t_.rdzv_id : (req_.run_id.empty() ? "prism" : req_.run_id);
  Set(&env, "WORLD_SIZE", std::to_string(p_.world_size));
  Set(&env, "LOCAL_WORLD_SIZE", std::to_string(p_.nproc_per_node));
  Set(&env, "GROUP_WORLD_SIZE", std::to_string(p_.nnodes));
  Set(&env, "ROLE_WORLD_SIZE", std::to_string(p_.world_size));
  Set(&env, "ROLE_NAME", t_.role);
  Set(&env, "MASTER_ADDR", p_.store_addr);
  Set(&env, "MASTER_PORT", std::to_string(p_.store_port));
  Set(&env, "TORCHELASTIC_USE_AGENT_STORE", "True");
  Set(&env, "TORCHELASTIC_RUN_ID", run_id);
  Set(&env, "TORCHELASTIC_RESTART_COUNT", "0");
  Set(&env, "TORCHELASTIC_MAX_RESTARTS", std::to_string(t_.max_restarts));
  if (p_.nproc_per_node > 1 && !(host_.env && host_.env("OMP_NUM_THREADS")))
    Set(&env, "OMP_NUM_THREADS", "1");  // torchrun does this for nproc > 1
  Set(&env, "TORCH_NCCL_ASYNC_ERROR_HANDLING", "0");
  Set(&env, "TORCH_NCCL_ENABLE_MONITORING", "0");
  Set(&env, "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", kHeartbeatTimeoutSec);
  Set(&env, "TORCH_NCCL_DUMP_ON_TIMEOUT", "0");
  Set(&env, "TORCH_NCCL_RANKS_PER_ROOT", std::to_string(std::max(p_.world_size, 128)));
  if (NeedsEagerModuleLoading()) Set(&env, "CUDA_MODULE_LOADING", "EAGER");
  Set(&env, "NCCL_NVLS_ENABLE", "0");
  Set(&env, "PRISM_WORLD_SIZE", std::to_string(p_.world_size));
  Set(&env, "PRISM_GPUS_PER_NODE", std::to_string(p_.nproc_per_node));
  Set(&env, "PRISM_OUT_DIR", p_.out_dir);
  if (!p_.coord_socket.empty()) Set(&env, "PRISM_COORD_SOCKET", p_.coord_socket);
  if (!join_bus_.empty()) Set(&env, "PRISM_COORD_ADDR", join_bus_);
  Set(&env, "PRISM_PAYLOAD", req_.payload);
  if (req_.payload_max_bytes) Set(&env, "PRISM_PAYLOAD_MAX_BYTES", std::to_string(*req_.payload_max_bytes));
  if (!req_.topology.empty()) Set(&env, "PRISM_TOPOLOGY", req_.topology);
  if (!req_.graph.empty()) Set(&env, "PRISM_GRAPH", req_.graph);
  if (!req_.passthrough) Set(&env, "PRISM_PASSTHROUGH", "0");
  if (req_.kernels > 0) Set(&env, "PRISM_KERNELS", req_.kernels == 2 ? "nvtx" : "1");
  Set(&env, "PRISM_LAYOUT", p_.layout.ToSpec());
  std::vector<int> real_ranks;
  for (const RealRank& r : p_.real) real_ranks.push_back(r.rank);
  // Why every host's: libprism counts a communicator's real members from this list (several real members: it
  // waits for the coordinator's release).
  real_ranks.insert(real_ranks.end(), p_.remote_ranks.begin(), p_.remote_ranks.end());
  for (int r : all_real_) {
    if (std::find(real_ranks.begin(), real_ranks.end(), r) == real_ranks.end()) real_ranks.push_back(r);
  }
  std::sort(real_ranks.begin(), real_ranks.end());
  Set(&env, "PRISM_REAL_RANKS", Join(real_ranks));
}

bool PlanBuilder::Preload() {
  EnvList& env = p_.env;
  if (req_.preload) {
    if (host_.libprism.empty()) {
      *error_ = "libprism.so not found next to prism-run (../lib/libprism.so) and PRISM_LIBPRISM is not set; "
                "build the 'prism' target (it needs the CUDA headers), or use --no-preload to test the launch only";
      return false;
    }
    std::optional<std::string> user_preload = host_.env ? host_.env("LD_PRELOAD") : std::nullopt;
    Set(&env, "LD_PRELOAD", host_.libprism + (user_preload && !user_preload->empty() ? ":" + *user_preload : ""));
    std::optional<std::string> user_pp = host_.env ? host_.env("PYTHONPATH") : std::nullopt;
    // Why first: Python imports only the first sitecustomize on sys.path (a user's own one later on the path is
    // then not imported; docs/cli.md says so).
    Set(&env, "PYTHONPATH", host_.python_hook_dir + (user_pp && !user_pp->empty() ? ":" + *user_pp : ""));
  } else {
    p_.warnings.push_back("--no-preload: libprism.so is not loaded, so the job's NCCL calls are not emulated");
    if (req_.kernels > 0)
      p_.warnings.push_back("--kernels with --no-preload: no kernels are recorded (libprism does it)");
  }
  return true;
}

// Tell people which of their own settings prism replaced.
void PlanBuilder::NoteReplacedSettings() {
  const EnvList& env = p_.env;
  if (host_.env) {
    for (const auto& [k, v] : env) {
      if (k == "LD_PRELOAD" || k == "PYTHONPATH") continue;
      auto mine = host_.env(k);
      if (mine && *mine != v) p_.notes.push_back("replaced " + k + "=" + *mine + " with " + v);
    }
  }
}

void PlanBuilder::FindRecordedPayloads() {
  if (!req_.payload_dir.empty()) {
    std::error_code ec;
    static const std::regex kName(R"(rank(\d{1,9})\.bin)");
    for (const auto& e : fs::directory_iterator(fs::path(req_.payload_dir) / "payloads", ec)) {
      std::smatch m;
      std::string name = e.path().filename().string();
      if (std::regex_match(name, m, kName) && e.is_regular_file(ec)) {
        const int q = std::stoi(m[1].str());  // Why safe: at most 9 digits
        if (q < p_.world_size) recorded_.push_back(q);
      }
    }
    std::sort(recorded_.begin(), recorded_.end());
  }
}

bool PlanBuilder::AddWorkers() {
  const bool user_cache = host_.env && (host_.env("TORCHINDUCTOR_CACHE_DIR") || host_.env("TRITON_CACHE_DIR"));
  if (!user_cache) p_.compile_cache_dir = p_.out_dir + "/compile-cache";
  for (const RealRank& r : p_.real) {
    Worker wk;
    wk.rank = r.rank;
    wk.argv = head_;
    if (t_.legacy_launch && !t_.use_env) wk.argv.push_back("--local-rank=" + std::to_string(r.local_rank));
    wk.argv.insert(wk.argv.end(), t_.script_args.begin(), t_.script_args.end());
    Set(&wk.env, "RANK", std::to_string(r.rank));
    Set(&wk.env, "LOCAL_RANK", std::to_string(r.local_rank));
    Set(&wk.env, "GROUP_RANK", std::to_string(r.node));
    Set(&wk.env, "ROLE_RANK", std::to_string(r.rank));
    Set(&wk.env, "CUDA_VISIBLE_DEVICES", r.device);
    Set(&wk.env, "PRISM_RANK", std::to_string(r.rank));
    if (!p_.compile_cache_dir.empty()) {
      const std::string own = p_.compile_cache_dir + "/rank" + std::to_string(r.rank);
      Set(&wk.env, "TORCHINDUCTOR_CACHE_DIR", own + "/inductor");
      Set(&wk.env, "TRITON_CACHE_DIR", own + "/triton");
    }
    if (!req_.payload_dir.empty()) {
      // Which collected rank's payloads: the rank's own (it ran in the collect), else the lowest collected rank of
      // its class (collect --real-routing recorded the expert-parallel peers), else the rank of replica 0 with its
      // dense coordinates (for a rank whose ep coordinate ran virtual: the ep-0 rank, as the graph's class does).
      const world::Coords& c = r.coords;
      int cls = -1;
      for (int q : recorded_)
        if (q == r.rank || (cls < 0 && SameClass(*w_, q, r.rank))) cls = q;
      if (cls < 0) cls = w_->RankOf(c.tp, c.cp, 0, c.pp, c.gtp);
      std::string file = req_.payload_dir + "/payloads/rank" + std::to_string(cls) + ".bin";
      std::error_code ec;
      if (!std::filesystem::is_regular_file(file, ec)) {
        *error_ = "--payload-dir " + req_.payload_dir + ": no payloads/rank" + std::to_string(cls) +
                  ".bin for rank " + std::to_string(r.rank) + " (its class is rank " + std::to_string(cls) +
                  " of replica 0); run `prism-run collect --out " + req_.payload_dir +
                  " torchrun ...` with the same job";
        return false;
      }
      Set(&wk.env, "PRISM_PAYLOAD_FILE", file);
    }
    if (req_.record_payloads) {
      Set(&wk.env, "PRISM_RECORD_PAYLOADS", p_.out_dir + "/payloads/rank" + std::to_string(r.rank) + ".bin");
    }
    p_.workers.push_back(std::move(wk));
  }
  return true;
}

}  // namespace

std::optional<Plan> BuildPlan(const PlanRequest& req, const HostInfo& host, std::string* error) {
  PlanBuilder b(req, host, error);
  if (!b.ParseJob()) return std::nullopt;
  if (!b.FindGpus()) return std::nullopt;
  if (!b.TargetWorld()) return std::nullopt;
  if (!b.ChooseLayout()) return std::nullopt;
  if (!b.HangAndPassthrough()) return std::nullopt;
  if (!b.ChooseRealRanks()) return std::nullopt;
  b.PlaceRealRanks();
  if (!b.CoordinatorEndpoint()) return std::nullopt;
  b.NoteIgnoredOptions();
  b.WorkerCommand();
  b.SetWorkerEnvironment();
  if (!b.Preload()) return std::nullopt;
  b.NoteReplacedSettings();
  b.FindRecordedPayloads();
  if (!b.AddWorkers()) return std::nullopt;
  return b.TakePlan();
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
