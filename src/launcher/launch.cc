#include "launcher/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <functional>

#include "model/world.h"
#include "analysis/observed_trace.h"
#include "analysis/run_report.h"
#include "prism/report.h"

extern char** environ;

namespace prism::launcher {
using namespace ::prism::analysis;  // the post-run analysis (src/analysis) this file calls
namespace {

// Labels a communicator by the Megatron groups (of the plan's layout) with exactly its members, in order;
// several groups can share members (PIPELINE and EMBEDDING for pp=2), then they are joined with '|'.
std::function<std::string(const std::vector<int>&)> MegatronGroupLabeler(const Plan& plan) {
  std::string err;
  auto world = world::World::Make(plan.layout, plan.nproc_per_node, &err);
  if (!world) return nullptr;
  auto by_members = std::make_shared<std::map<std::vector<int>, std::string>>();
  for (const world::Group& g : world->MegatronGroups()) {
    if (g.backend != "nccl") continue;
    std::string& label = (*by_members)[g.members];
    std::string name = g.desc.empty() ? g.kind : g.desc;
    if (label.find(name) == std::string::npos) label += (label.empty() ? "" : "|") + name;
  }
  return [by_members](const std::vector<int>& members) {
    auto it = by_members->find(members);
    return it == by_members->end() ? std::string() : it->second;
  };
}

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  unsigned char b = static_cast<unsigned char>(sig);
  if (g_signal_pipe[1] >= 0) (void)!write(g_signal_pipe[1], &b, 1);
}

// Installs handlers for SIGINT/SIGTERM/SIGHUP that only write to a pipe; restores the old ones on destruction.
class SignalCatcher {
 public:
  SignalCatcher() {
    if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) g_signal_pipe[0] = g_signal_pipe[1] = -1;
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, &old_[s]);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &old_[SIGPIPE]);  // Why: a closed terminal pipe must not kill the run mid-report
  }
  ~SignalCatcher() {
    for (auto& [s, sa] : old_) sigaction(s, &sa, nullptr);
    for (int& fd : g_signal_pipe) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  }
  int fd() const { return g_signal_pipe[0]; }

 private:
  std::map<int, struct sigaction> old_;
};

struct Stream {
  int fd = -1;
  bool to_stderr = false;
  std::string partial;  // for the "[rank R] " prefix on the terminal
};

struct Proc {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  bool reaped = false;
  int status = 0;
  Clock::time_point reaped_at;
  Stream out, err;
  std::ofstream log;
  std::string log_path;
};

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = strsignal(WTERMSIG(status));
    return "signal " + std::to_string(WTERMSIG(status)) + " (" + (name ? name : "?") + ")";
  }
  return "status " + std::to_string(status);
}

std::vector<std::string> TailLines(const std::string& path, int n) {
  std::ifstream in(path);
  std::deque<std::string> q;
  for (std::string line; std::getline(in, line);) {
    q.push_back(line);
    if (static_cast<int>(q.size()) > n) q.pop_front();
  }
  return {q.begin(), q.end()};
}

json EnvJson(const EnvList& a, const EnvList& b) {
  json j = json::object();
  for (const auto& [k, v] : a) j[k] = v;
  for (const auto& [k, v] : b) j[k] = v;
  return j;
}

// One run of a plan. RunPlan calls the steps in order; Watch is the loop that runs until every worker ended,
// each turn made of the steps below it.
class PlanRun {
 public:
  PlanRun(Plan& plan, CoordinatorLink* coordinator, const LaunchOptions& opts);

  // A step that returns false has set result() (error and exit code): the run ends there.
  bool CreateLogDir();
  bool StartCoordinator();
  void WriteCommandJson();
  void StartReport();
  void StartWorkers();
  void Watch(const SignalCatcher& signals);
  void Finish();
  const LaunchResult& result() const { return res_; }

 private:
  // The report.
  json Extra();
  void WriteReport();
  // The workers.
  void SignalAll(int sig);
  void BeginStop(double grace);
  bool Spawn(const Worker& w);
  void Echo(Proc& p, Stream& s, const char* data, size_t n);
  void Drain(Proc& p, Stream& s);
  void Progress();
  // One turn of Watch.
  void SpawnAdmitted();
  void DropDeferred();
  void PollOutputAndSignals(const SignalCatcher& signals);
  void Reap();
  void EndLingeringPipes();
  void Escalate();
  void TakeHangs();
  bool AllDone() const;
  // Finish.
  void SettleExitCode();
  void WriteTraces();
  void PrintFailedRankLog();

  Plan& plan_;
  CoordinatorLink* coordinator_;
  const LaunchOptions& opts_;
  LaunchResult res_;
  Clock::time_point t0_;
  std::function<void(const std::string&)> print_;
  std::vector<int> ranks_;
  std::optional<RunReport> report_;
  std::string status_ = "running";
  std::vector<std::unique_ptr<Proc>> procs_;
  std::vector<std::string> base_env_;
  bool stopping_ = false;  // a rank failed or Ctrl-C: the others are being stopped
  Clock::time_point term_at_{}, kill_at_{};
  bool termed_ = false, killed_ = false;
  // Context switching (collect --swap): a rank starts only when the coordinator admits it (its GPU has room); the
  // others wait here and are started from Watch.
  std::vector<const Worker*> deferred_;
  bool spawn_failed_ = false;
  Clock::time_point last_report_;
};

PlanRun::PlanRun(Plan& plan, CoordinatorLink* coordinator, const LaunchOptions& opts)
    : plan_(plan),
      coordinator_(coordinator),
      opts_(opts),
      t0_(Clock::now()),
      print_(opts.print ? opts.print : [](const std::string& s) {
        std::fprintf(stdout, "%s\n", s.c_str());
        std::fflush(stdout);
      }) {}

bool PlanRun::CreateLogDir() {
  std::error_code ec;
  fs::create_directories(fs::path(plan_.out_dir) / "logs", ec);
  if (ec) {
    res_.error = "cannot create " + plan_.out_dir + "/logs: " + ec.message();
    res_.exit_code = 1;
    return false;
  }
  return true;
}

bool PlanRun::StartCoordinator() {
  if (plan_.start_coordinator) {
    if (!coordinator_) {
      res_.error = "no coordinator to start";
      res_.exit_code = 1;
      return false;
    }
    std::string err;
    if (!coordinator_->Start(&plan_, &err)) {
      res_.error = "could not start the coordinator: " + err;
      res_.exit_code = 1;
      return false;
    }
    print_("prism: " + coordinator_->Describe());
  }
  return true;
}

// command.json: exactly what runs.
void PlanRun::WriteCommandJson() {
  std::error_code ec;
  json cmd;
  cmd["prism"] = opts_.prism_argv;
  cmd["job"] = PlanToJson(plan_)["job_command"];
  cmd["cwd"] = fs::current_path(ec).string();
  json workers = json::array();
  for (const Worker& w : plan_.workers)
    workers.push_back({{"rank", w.rank}, {"argv", w.argv}, {"shell", ShellJoin(w.argv)},
                       {"env", EnvJson(plan_.env, w.env)}});
  cmd["workers"] = workers;
  cmd["store"] = plan_.store_addr + ":" + std::to_string(plan_.store_port);
  std::string err;
  if (!WriteJsonAtomic((fs::path(plan_.out_dir) / "command.json").string(), cmd, &err)) print_("prism: " + err);
}

void PlanRun::StartReport() {
  for (const RealRank& r : plan_.real) ranks_.push_back(r.rank);
  report_.emplace(plan_.out_dir, plan_.world_size, ranks_);
  report_->SetCommLabeler(MegatronGroupLabeler(plan_));
  WriteReport();
}

json PlanRun::Extra() {
  json e;
  e["status"] = status_;
  e["exit_code"] = status_ == "running" ? json(nullptr) : json(res_.exit_code);
  if (res_.failed_rank >= 0) e["failed_rank"] = res_.failed_rank;
  if (res_.stopped_after_iterations) e["stopped_after_iterations"] = opts_.stop_after_iterations;
  if (!res_.hang_json.empty()) {
    // Why the whole diagnosis: report.json is what people and CI read first; hang.json stays the full record.
    std::ifstream hin(res_.hang_json);
    json h = hin ? json::parse(hin, nullptr, false) : json();
    e["hang"] = {{"file", res_.hang_json}, {"stopped", res_.stopped_on_hang},
                 {"diagnosis", h.is_discarded() ? json() : h}};
  }
  json l = PlanToJson(plan_);
  e["layout"] = l["layout"];
  e["real_ranks"] = l["real_ranks"];
  e["gpus_per_node"] = plan_.nproc_per_node;
  e["command"] = l["command"];
  e["out_dir"] = plan_.out_dir;
  e["iteration_time_note"] = "median over iterations excluding the first (warm-up)";
  return e;
}

void PlanRun::WriteReport() {
  double wall = std::chrono::duration<double>(Clock::now() - t0_).count();
  std::string err;
  if (!WriteJsonAtomic((fs::path(plan_.out_dir) / std::string(report::kFileName)).string(),
                       report_->Build(wall, plan_.warnings, Extra()), &err))
    print_("prism: " + err);
}

void PlanRun::SignalAll(int sig) {
  for (auto& p : procs_)
    if (p->pid > 0 && !p->reaped) kill(-p->pid, sig);
}

void PlanRun::BeginStop(double grace) {
  stopping_ = true;
  term_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace));
  kill_at_ = term_at_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace));
}

// Returns false when the worker could not be started (the rest are not started either).
bool PlanRun::Spawn(const Worker& w) {
  auto p = std::make_unique<Proc>();
  p->rank = w.rank;
  p->log_path = (fs::path(plan_.out_dir) / "logs" / ("rank" + std::to_string(w.rank) + ".log")).string();
  p->log.open(p->log_path, std::ios::trunc);
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    res_.error = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  std::vector<std::string> env = WorkerEnvironment(plan_, w, base_env_);
  std::vector<char*> argv_c, env_c;
  for (const std::string& a : w.argv) argv_c.push_back(const_cast<char*>(a.c_str()));
  argv_c.push_back(nullptr);
  for (const std::string& e : env) env_c.push_back(const_cast<char*>(e.c_str()));
  env_c.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t def, none;
  sigemptyset(&def);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaddset(&def, s);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &def);
  posix_spawnattr_setsigmask(&attr, &none);
  // Why its own process group: Ctrl-C reaches prism only, which then stops every worker (and its children)
  // in order and still writes the report.
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  // Why posix_spawnp: prism-run has threads (the coordinator's store); fork+exec in a threaded process is
  // only safe with async-signal-safe calls in between.
  int rc = posix_spawnp(&pid, w.argv[0].c_str(), &fa, &attr, argv_c.data(), env_c.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(out[1]);
  close(err[1]);
  p->out.fd = out[0];
  p->err.fd = err[0];
  p->err.to_stderr = true;
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  if (rc != 0) {
    std::string msg = "cannot start rank " + std::to_string(w.rank) + ": " + w.argv[0] + ": " + std::strerror(rc);
    print_("prism: " + msg);
    p->log << msg << "\n";
    p->log.flush();
    p->reaped = true;
    p->status = 127 << 8;  // as a shell reports "command not found"
    report_->rank(w.rank).status = "failed";
    report_->rank(w.rank).exit_code = 127;
    if (res_.failed_rank < 0) {
      res_.failed_rank = w.rank;
      res_.exit_code = 127;
    }
    procs_.push_back(std::move(p));
    return false;  // do not start the rest
  }
  p->pid = pid;
  p->running = true;
  report_->rank(w.rank).status = "running";
  print_("prism: rank " + std::to_string(w.rank) + " started (pid " + std::to_string(pid) + "), log " + p->log_path);
  procs_.push_back(std::move(p));
  return true;
}

void PlanRun::StartWorkers() {
  for (char** e = environ; e && *e; ++e) base_env_.emplace_back(*e);
  for (const Worker& w : plan_.workers) {
    if (spawn_failed_) break;
    if (coordinator_ && !coordinator_->Admitted(w.rank)) {
      deferred_.push_back(&w);
      continue;
    }
    if (!Spawn(w)) spawn_failed_ = true;
  }
  if (!deferred_.empty()) {
    print_("prism: " + std::to_string(deferred_.size()) + " rank(s) wait for room on their GPU before they start");
  }
  if (res_.failed_rank >= 0 || !res_.error.empty()) {
    SignalAll(SIGTERM);
    BeginStop(opts_.failure_grace_s);
    termed_ = true;
  }
}

void PlanRun::Echo(Proc& p, Stream& s, const char* data, size_t n) {
  p.log.write(data, static_cast<std::streamsize>(n));
  p.log.flush();
  if (!opts_.echo_output) return;
  s.partial.append(data, n);
  size_t start = 0;
  FILE* f = s.to_stderr ? stderr : stdout;
  while (true) {
    size_t nl = s.partial.find('\n', start);
    if (nl == std::string::npos) break;
    std::fprintf(f, "[rank %d] %.*s\n", p.rank, static_cast<int>(nl - start), s.partial.data() + start);
    start = nl + 1;
  }
  s.partial.erase(0, start);
  std::fflush(f);
}

void PlanRun::Drain(Proc& p, Stream& s) {
  char buf[65536];
  while (s.fd >= 0) {
    ssize_t n = read(s.fd, buf, sizeof buf);
    if (n > 0) {
      Echo(p, s, buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      if (!s.partial.empty() && opts_.echo_output) {
        std::fprintf(s.to_stderr ? stderr : stdout, "[rank %d] %s\n", p.rank, s.partial.c_str());
        s.partial.clear();
      }
      close(s.fd);
      s.fd = -1;
    }
    break;
  }
}

void PlanRun::Progress() {
  report_->Poll();
  auto done = [&](int rank) {
    for (auto& p : procs_)
      if (p->rank == rank) return p->reaped;
    return true;  // never started
  };
  for (int64_t it : report_->NewCompleteIterations(done)) {
    print_(report_->ProgressLine(it));
    // Iteration marks count from 0: mark K-1 ends the K-th iteration. Only while ranks still run (a job that
    // ended by itself was not stopped) and every rank has started (one waiting for room on its GPU under
    // collect --swap has not done its K iterations).
    bool running = false;
    for (auto& p : procs_) running = running || !p->reaped;
    if (opts_.stop_after_iterations > 0 && it + 1 >= opts_.stop_after_iterations && !stopping_ && running &&
        deferred_.empty()) {
      print_("prism: " + std::to_string(opts_.stop_after_iterations) +
             " iteration(s) complete on every real rank (--iterations): stopping the workers");
      res_.stopped_after_iterations = true;
      SignalAll(SIGTERM);
      termed_ = true;
      BeginStop(opts_.iterations_grace_s);
    }
  }
}

void PlanRun::Watch(const SignalCatcher& signals) {
  last_report_ = Clock::now();
  while (true) {
    SpawnAdmitted();
    DropDeferred();
    PollOutputAndSignals(signals);
    Reap();
    EndLingeringPipes();
    Escalate();
    TakeHangs();
    Progress();
    if (Clock::now() - last_report_ > std::chrono::duration<double>(opts_.report_interval_s)) {
      WriteReport();
      last_report_ = Clock::now();
    }
    if (AllDone()) break;
  }
}

void PlanRun::SpawnAdmitted() {
  if (!deferred_.empty() && !stopping_ && !spawn_failed_) {
    for (auto it = deferred_.begin(); it != deferred_.end();) {
      if (!coordinator_->Admitted((*it)->rank)) {
        ++it;
        continue;
      }
      const Worker& w = **it;
      it = deferred_.erase(it);
      if (!Spawn(w)) {
        spawn_failed_ = true;
        SignalAll(SIGTERM);
        BeginStop(opts_.failure_grace_s);
        termed_ = true;
        break;
      }
    }
  }
}

void PlanRun::DropDeferred() {
  if (stopping_ && !deferred_.empty()) {
    for (const Worker* w : deferred_) {
      report_->rank(w->rank).status = "not started";
      print_("prism: rank " + std::to_string(w->rank) + " not started (the run is stopping)");
    }
    deferred_.clear();
  }
}

void PlanRun::PollOutputAndSignals(const SignalCatcher& signals) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Proc*, Stream*>> owners;
  if (signals.fd() >= 0) {
    fds.push_back({signals.fd(), POLLIN, 0});
    owners.push_back({nullptr, nullptr});
  }
  for (auto& p : procs_)
    for (Stream* s : {&p->out, &p->err})
      if (s->fd >= 0) {
        fds.push_back({s->fd, POLLIN, 0});
        owners.push_back({p.get(), s});
      }
  poll(fds.data(), fds.size(), 100);
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    if (!owners[i].first) {
      unsigned char sig[16];
      ssize_t n = read(signals.fd(), sig, sizeof sig);
      for (ssize_t k = 0; k < n; ++k) {
        if (res_.interrupted) {
          print_("prism: second signal: killing every worker now");
          SignalAll(SIGKILL);
          killed_ = true;
        } else {
          res_.interrupted = true;
          print_(std::string("prism: ") + (sig[k] == SIGINT ? "Ctrl-C" : strsignal(sig[k])) +
                 ": stopping the workers (again to kill them), the report is kept");
          SignalAll(SIGINT);
          BeginStop(opts_.interrupt_grace_s);
        }
      }
      continue;
    }
    Drain(*owners[i].first, *owners[i].second);
  }
}

// Reaps the workers that ended; the first that failed stops the others.
void PlanRun::Reap() {
  for (auto& p : procs_) {
    if (p->reaped || p->pid <= 0) continue;
    int st = 0;
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r != p->pid) continue;
    p->reaped = true;
    p->running = false;
    p->status = st;
    p->reaped_at = Clock::now();
    int code = ExitCodeOf(st);
    RankEvents& ev = report_->rank(p->rank);
    ev.exit_code = code;
    if (code == 0) {
      ev.status = "exited";
    } else if (stopping_) {
      ev.status = res_.interrupted ? "interrupted" : "stopped";
    } else {
      ev.status = "failed";
    }
    print_("prism: rank " + std::to_string(p->rank) + " ended with " + DescribeStatus(st));
    if (coordinator_) coordinator_->RankExited(p->rank);
    if (code != 0 && !stopping_ && res_.failed_rank < 0) {
      res_.failed_rank = p->rank;
      res_.exit_code = code;
      print_("prism: rank " + std::to_string(p->rank) + " failed; stopping the other workers");
      SignalAll(SIGTERM);
      termed_ = true;
      BeginStop(opts_.failure_grace_s);
    }
  }
}

// A worker's children may keep its pipes open after it exited: give them 2 s, then end them.
void PlanRun::EndLingeringPipes() {
  for (auto& p : procs_) {
    if (!p->reaped || (p->out.fd < 0 && p->err.fd < 0)) continue;
    if (Clock::now() - p->reaped_at > std::chrono::seconds(2)) {
      if (p->pid > 0) kill(-p->pid, SIGKILL);
      Drain(*p, p->out);
      Drain(*p, p->err);
      for (Stream* s : {&p->out, &p->err})
        if (s->fd >= 0) {
          close(s->fd);
          s->fd = -1;
        }
    }
  }
}

void PlanRun::Escalate() {
  if (stopping_) {
    auto now = Clock::now();
    if (!termed_ && now >= term_at_) {
      SignalAll(SIGTERM);
      termed_ = true;
    }
    if (!killed_ && now >= kill_at_) {
      SignalAll(SIGKILL);
      killed_ = true;
    }
  }
}

void PlanRun::TakeHangs() {
  if (coordinator_) {
    while (std::optional<std::string> hang = coordinator_->TakeHang()) {
      res_.hang_json = *hang;
      if (plan_.stop_on_hang && !stopping_) {
        print_("prism: hang diagnosed (" + *hang + "); --on-hang stop: stopping the workers, the report is kept");
        res_.stopped_on_hang = true;
        SignalAll(SIGTERM);
        termed_ = true;
        BeginStop(opts_.failure_grace_s);
      } else if (!plan_.stop_on_hang) {
        print_("prism: hang diagnosed (" + *hang + "); --on-hang wait: the job keeps running");
      }
      WriteReport();
    }
  }
}

bool PlanRun::AllDone() const {
  bool all_done = deferred_.empty();
  for (auto& p : procs_)
    if (!p->reaped || p->out.fd >= 0 || p->err.fd >= 0) all_done = false;
  return all_done;
}

void PlanRun::Finish() {
  if (coordinator_ && plan_.start_coordinator) {
    print_("prism: " + coordinator_->Describe());
    coordinator_->Stop();
  }
  Progress();

  SettleExitCode();
  WriteReport();
  WriteTraces();
  PrintFailedRankLog();
  if (!plan_.compile_cache_dir.empty()) {
    std::error_code ec;  // Why ignored: a cache left behind costs disk only; the run's result stands
    fs::remove_all(plan_.compile_cache_dir, ec);
  }
}

void PlanRun::SettleExitCode() {
  if (res_.interrupted) {
    status_ = "interrupted";
    res_.exit_code = 130;
  } else if (res_.stopped_on_hang) {
    status_ = "hang";
    res_.exit_code = kExitHang;
  } else if (res_.stopped_after_iterations) {
    // Why success: the ranks were stopped on purpose once they had done what was asked; their exit codes are ours.
    status_ = "finished";
    res_.exit_code = 0;
  } else if (res_.failed_rank >= 0) {
    status_ = "failed";
  } else if (!res_.error.empty()) {
    status_ = "failed";
    res_.exit_code = 1;
  } else {
    status_ = "finished";
    res_.exit_code = 0;
    for (auto& p : procs_)
      if (ExitCodeOf(p->status) != 0) res_.exit_code = ExitCodeOf(p->status);
  }
}

void PlanRun::WriteTraces() {
  std::string err;
  if (!WriteJsonAtomic((fs::path(plan_.out_dir) / "trace.json").string(), report_->BuildTrace(), &err))
    print_("prism: " + err);
  // The observed PrismTrace of the real ranks (docs/collect.md), when they cover every class.
  if (auto w = world::World::Make(plan_.layout, plan_.nproc_per_node, &err))
    print_("prism: " + WriteObservedTrace(plan_.out_dir, *w, ranks_));
}

void PlanRun::PrintFailedRankLog() {
  if (res_.failed_rank >= 0) {
    std::string log =
        (fs::path(plan_.out_dir) / "logs" / ("rank" + std::to_string(res_.failed_rank) + ".log")).string();
    std::fprintf(stderr, "prism: rank %d failed (exit %d); last lines of %s:\n", res_.failed_rank, res_.exit_code,
                 log.c_str());
    for (const std::string& line : TailLines(log, opts_.log_tail_lines)) std::fprintf(stderr, "  | %s\n", line.c_str());
    std::fflush(stderr);
  }
}

}  // namespace

LaunchResult RunPlan(Plan& plan, CoordinatorLink* coordinator, const LaunchOptions& opts) {
  PlanRun run(plan, coordinator, opts);
  if (!run.CreateLogDir()) return run.result();
  SignalCatcher signals;
  if (!run.StartCoordinator()) return run.result();
  run.WriteCommandJson();
  run.StartReport();
  run.StartWorkers();
  run.Watch(signals);
  run.Finish();
  return run.result();
}

}  // namespace prism::launcher
