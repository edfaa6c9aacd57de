// Two "hosts" as two network namespaces joined by a veth pair (no other network): on host A the first prism-run
// starts the coordinator (--listen A's address, --remote-ranks 5) and runs rank 0; on host B a second prism-run joins
// it (--coordinator A:PORT --ranks 5 --node-rank 1) and runs rank 5. The workers are tests/data/launcher/fake_shim.py,
// speaking the real store and event-bus protocols: B's reach A's store and A's event bus over TCP. Checks a healthy
// run (both exit 0, every operation released by the coordinator) and a planted skip (both stop with exit 4, B's
// output holds hang.json and its rank's Flight Recorder dump).
//
// Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN) and iproute2's `ip`; without them the test is skipped and says why.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json ReadJson(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str(), nullptr, false);
}

std::string ReadText(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int Sh(const std::string& cmd) {
  int st = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

// Two namespaces and the veth pair between them; removed on destruction.
class Hosts {
 public:
  Hosts() {
    int id = static_cast<int>(getpid() % 100000);
    a_ = "prism-a-" + std::to_string(id);
    b_ = "prism-b-" + std::to_string(id);
    std::string va = "pra" + std::to_string(id), vb = "prb" + std::to_string(id);  // IFNAMSIZ: 15 characters
    int net = 16 + id % 200;
    addr_a_ = "10.231." + std::to_string(net) + ".1";
    addr_b_ = "10.231." + std::to_string(net) + ".2";
    if (Sh("ip netns add " + a_) != 0) {
      why_ = "cannot create a network namespace (`ip netns add` failed: needs root, or CAP_SYS_ADMIN in a container "
             "that allows it)";
      return;
    }
    created_a_ = true;
    if (Sh("ip netns add " + b_) != 0) {
      why_ = "cannot create a second network namespace";
      return;
    }
    created_b_ = true;
    const std::string steps[] = {
        "ip link add " + va + " type veth peer name " + vb,
        "ip link set " + va + " netns " + a_,
        "ip link set " + vb + " netns " + b_,
        "ip -n " + a_ + " addr add " + addr_a_ + "/24 dev " + va,
        "ip -n " + b_ + " addr add " + addr_b_ + "/24 dev " + vb,
        "ip -n " + a_ + " link set " + va + " up",
        "ip -n " + b_ + " link set " + vb + " up",
        "ip -n " + a_ + " link set lo up",
        "ip -n " + b_ + " link set lo up",
    };
    for (const std::string& s : steps) {
      if (Sh(s) != 0) {
        why_ = "cannot set up the veth pair (`" + s + "` failed)";
        return;
      }
    }
    ok_ = true;
  }
  ~Hosts() {
    // Deleting a namespace removes its end of the veth pair, and with it the other end.
    if (created_a_) Sh("ip netns del " + a_);
    if (created_b_) Sh("ip netns del " + b_);
  }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  const std::string& addr_a() const { return addr_a_; }

 private:
  std::string a_, b_, addr_a_, addr_b_, why_;
  bool ok_ = false, created_a_ = false, created_b_ = false;
};

// A prism-run inside namespace `ns`, output to `log`.
class PrismProc {
 public:
  PrismProc(const std::string& ns, std::vector<std::string> args, const std::vector<std::string>& env, const fs::path& log) {
    std::vector<std::string> argv = {"ip", "netns", "exec", ns, std::getenv("PRISM_RUN")};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> av;
    for (auto& a : argv) av.push_back(a.data());
    av.push_back(nullptr);
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
    env_s.insert(env_s.end(), env.begin(), env.end());
    env_s.emplace_back("PYTHON_EXEC=python3");
    std::vector<char*> ev;
    for (auto& e : env_s) ev.push_back(e.data());
    ev.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawnp(&pid_, "ip", &fa, nullptr, av.data(), ev.data()) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~PrismProc() {
    if (pid_ > 0 && !done_) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  // Exit status, or -1 after `seconds`.
  int Wait(int seconds) {
    for (int i = 0; i < seconds * 20 && pid_ > 0; ++i) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        done_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool done_ = false;
};

class TwoNodes : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(std::getenv("PRISM_RUN"), nullptr) << "PRISM_RUN is not set (ctest sets it)";
    if (Sh("python3 -c 'import json, socket, struct'") != 0) GTEST_SKIP() << "python3 is needed for the fake shim";
    if (Sh("command -v ip") != 0) GTEST_SKIP() << "iproute2's `ip` is not installed: two-host test skipped";
    hosts_ = std::make_unique<Hosts>();
    if (!hosts_->ok()) GTEST_SKIP() << "two-host test skipped: " << hosts_->why();
    out_ = fs::temp_directory_path() / ("prism-2node-" + std::to_string(getpid()));
    fs::remove_all(out_);
    fs::create_directories(out_);
  }
  void TearDown() override {
    if (!out_.empty()) fs::remove_all(out_);
  }

  // Starts host A (coordinator + rank 0), waits for its coordinator, then host B (rank 5); returns both statuses.
  std::pair<int, int> RunBoth(const std::vector<std::string>& env) {
    std::string shim = std::string(PRISM_SOURCE_DIR) + "/tests/data/launcher/fake_shim.py";
    PrismProc a(hosts_->a(),
          {"--out", (out_ / "a").string(), "--ranks", "0", "--remote-ranks", "5", "--listen", hosts_->addr_a(),
           "--gpus", "1", "--no-preload", "--hang-timeout", "1", "torchrun", "--nnodes", "2", "--nproc-per-node", "4",
           "--master-port", "29500", shim},
          env, out_ / "a.log");
    for (int i = 0; i < 200 && !fs::exists(out_ / "a" / "coordinator.json"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    PrismProc b(hosts_->b(),
          {"--out", (out_ / "b").string(), "--coordinator", hosts_->addr_a() + ":29500", "--ranks", "5", "--node-rank",
           "1", "--gpus", "1", "--no-preload", "torchrun", "--nnodes", "2", "--nproc-per-node", "4", shim},
          env, out_ / "b.log");
    int rb = b.Wait(25);
    int ra = a.Wait(25);
    return {ra, rb};
  }

  std::unique_ptr<Hosts> hosts_;
  fs::path out_;
};

TEST_F(TwoNodes, HealthyRunAcrossTwoHosts) {
  auto [ra, rb] = RunBoth({"FAKE_ITERS=4"});
  std::string logs = ReadText(out_ / "a.log") + "\n---- host B ----\n" + ReadText(out_ / "b.log");
  EXPECT_EQ(ra, 0) << logs;
  EXPECT_EQ(rb, 0) << logs;
  // B's workers were told A's store and A's TCP event bus, on A's address.
  json cmd = ReadJson(out_ / "b" / "command.json");
  ASSERT_FALSE(cmd.is_discarded()) << logs;
  EXPECT_EQ(cmd["workers"][0]["env"]["MASTER_ADDR"], hosts_->addr_a());
  std::string bus = cmd["workers"][0]["env"]["PRISM_COORD_ADDR"].get<std::string>();
  EXPECT_EQ(bus.rfind(hosts_->addr_a() + ":", 0), 0u) << bus;
  EXPECT_EQ(cmd["workers"][0]["env"]["PRISM_REAL_RANKS"], "0,5");
  // The coordinator (on A) saw both ranks and released every operation they shared: 4 iterations x 2 operations.
  json st = ReadJson(out_ / "a" / "status.json");
  EXPECT_EQ(st["releases"], 8) << st.dump(2);
  ASSERT_EQ(st["ranks"].size(), 2u);
  EXPECT_EQ(st["ranks"][1]["rank"], 5);
  EXPECT_EQ(st["ranks"][1]["state"], "bye");
  EXPECT_EQ(st["ranks"][1]["ops_recorded"], 8);
  // Each host's report holds its own rank.
  json ra_rep = ReadJson(out_ / "a" / "report.json"), rb_rep = ReadJson(out_ / "b" / "report.json");
  EXPECT_EQ(ra_rep["status"], "finished");
  EXPECT_EQ(rb_rep["status"], "finished");
  ASSERT_EQ(rb_rep["ranks"].size(), 1u);
  EXPECT_EQ(rb_rep["ranks"][0]["rank"], 5);
  EXPECT_NE(ReadText(out_ / "b" / "logs" / "rank5.log").find("iteration 3 done"), std::string::npos) << logs;
}

TEST_F(TwoNodes, HangAcrossTwoHostsStopsBoth) {
  auto [ra, rb] = RunBoth({"FAKE_ITERS=50", "FAKE_SKIP_RANK=5", "FAKE_SKIP_ITER=2"});
  std::string logs = ReadText(out_ / "a.log") + "\n---- host B ----\n" + ReadText(out_ / "b.log");
  EXPECT_EQ(ra, 4) << logs;
  EXPECT_EQ(rb, 4) << logs;
  EXPECT_NE(ReadText(out_ / "a.log").find("op, size mismatch at comm 1 (default_pg) seq 4"), std::string::npos)
      << logs;
  json h = ReadJson(out_ / "b" / "hang.json");
  ASSERT_FALSE(h.is_discarded()) << logs;
  ASSERT_EQ(h["mismatches"].size(), 1u);
  EXPECT_EQ(h["mismatches"][0]["ops"][1]["rank"], 5);
  EXPECT_TRUE(fs::exists(out_ / "b" / "flight_recorder" / "nccl_trace_rank_5")) << logs;
  EXPECT_TRUE(fs::exists(out_ / "a" / "flight_recorder" / "nccl_trace_rank_0")) << logs;
  EXPECT_EQ(ReadJson(out_ / "b" / "report.json")["status"], "hang");
}

}  // namespace
