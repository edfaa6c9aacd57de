// `prism-run --hang-timeout S --on-hang wait|stop torchrun ...` end to end without a GPU: the job is
// tests/data/launcher/fake_shim.py, which speaks the real store and event-bus protocols (what torch and libprism.so
// send), with planted bugs: a rank that skips a collective, a rank whose sizes differ, two ranks that both send
// first. Checks the printed diagnosis, hang.json, report.json, the exit status (4 under --on-hang stop) and that no
// worker is left behind.
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

#include "e2e_harness.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Shim() { return std::string(PRISM_SOURCE_DIR) + "/tests/data/launcher/fake_shim.py"; }

fs::path FreshDir(const std::string& name) { return prism::test_util::FreshDir("hang", name); }

using prism::test_util::ReadJson;
using prism::test_util::ReadText;
int RunPrism(const std::string& env_prefix, const std::string& args, std::string* out) {
  return prism::test_util::RunPrismWithEnv(env_prefix, args, out);
}

// Every worker that said hello to the coordinator is gone (their pids are in status.json).
void ExpectNoWorkerLeft(const fs::path& out) {
  json st = ReadJson(out / "status.json");
  ASSERT_FALSE(st.is_discarded());
  for (const json& r : st["ranks"]) {
    int pid = r.value("pid", 0);
    if (pid > 0) {
      EXPECT_NE(kill(pid, 0), 0) << "worker " << pid << " of rank " << r["rank"] << " still runs";
    }
  }
}

class HangE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(std::getenv("PRISM_RUN"), nullptr) << "PRISM_RUN is not set (ctest sets it)";
    if (std::system("python3 -c 'import json, socket, struct' >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "python3 is needed for the fake shim";
  }
};

// Rank 5 skips the all_reduce of iteration 2: at sequence 4 it issues the iteration's all_gather while rank 0
// issues the all_reduce. The coordinator holds that sequence, diagnoses after 1 s, and prism stops the job.
TEST_F(HangE2E, SkippedCollectiveIsAMismatchAndStopsTheJob) {
  fs::path out = FreshDir("skip");
  std::string log;
  int rc = RunPrism("FAKE_ITERS=50 FAKE_SKIP_RANK=5 FAKE_SKIP_ITER=2 FAKE_SKIP_OP=0",
                    "--out " + out.string() + " --ranks 0,5 --gpus 2 --policy mirror --no-preload --hang-timeout 1 torchrun "
                    "--nnodes 2 --nproc-per-node 4 " + Shim(),
                    &log);
  EXPECT_EQ(rc, 4) << log;
  EXPECT_NE(log.find("comm 1 (default_pg) seq 4: the real members disagree (op, size): rank 0 all_reduce 1 MiB; "
                     "rank 5 all_gather 4 KiB"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("prism: hang: no real rank made progress"), std::string::npos) << log;
  EXPECT_NE(log.find("op, size mismatch at comm 1"), std::string::npos) << log;
  EXPECT_NE(log.find("--on-hang stop: stopping the workers"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped after a hang diagnosis"), std::string::npos) << log;

  json h = ReadJson(out / "hang.json");
  ASSERT_FALSE(h.is_discarded()) << log;
  ASSERT_EQ(h["mismatches"].size(), 1u) << h.dump(2);
  const json& m = h["mismatches"][0];
  EXPECT_EQ(m["seq"], 4);
  EXPECT_EQ(m["differs"], "op, size");
  ASSERT_EQ(m["ops"].size(), 2u);
  EXPECT_EQ(m["ops"][0]["rank"], 0);
  EXPECT_EQ(m["ops"][0]["op"], "all_reduce");
  EXPECT_EQ(m["ops"][1]["rank"], 5);
  EXPECT_EQ(m["ops"][1]["op"], "all_gather");
  ASSERT_EQ(h["held"].size(), 1u);
  EXPECT_EQ(h["held"][0]["seq"], 4);
  EXPECT_EQ(h["waiting"].size(), 2u);

  json rep = ReadJson(out / "report.json");
  EXPECT_EQ(rep["status"], "hang");
  EXPECT_EQ(rep["exit_code"], 4);
  EXPECT_EQ(rep["hang"]["stopped"], true);
  EXPECT_EQ(rep["hang"]["diagnosis"]["mismatches"][0]["seq"], 4);
  EXPECT_EQ(rep["ranks"][0]["status"], "stopped");
  ExpectNoWorkerLeft(out);

  // `prism-run status` on the finished run: the diagnosis, and where each real rank stopped.
  std::string st;
  ASSERT_EQ(RunPrism("", "status " + out.string(), &st), 0) << st;
  EXPECT_NE(st.find("HANG diagnosed"), std::string::npos) << st;
  EXPECT_NE(st.find("held: comm 1 seq 4: its real members disagree (op, size)"), std::string::npos) << st;
  EXPECT_NE(st.find("done seq 3 all_gather 4 KiB"), std::string::npos) << st;
  EXPECT_NE(st.find("WAITING at seq 4 all_reduce 1 MiB"), std::string::npos) << st;
  EXPECT_NE(st.find("WAITING at seq 4 all_gather 4 KiB"), std::string::npos) << st;
  EXPECT_NE(st.find("1-4,6,7 (6 ranks):"), std::string::npos) << st;

  // Flight Recorder dumps of both real ranks, and prism's own reading of them.
  EXPECT_TRUE(fs::exists(out / "flight_recorder" / "nccl_trace_rank_0"));
  EXPECT_TRUE(fs::exists(out / "flight_recorder" / "nccl_trace_rank_5"));
  ASSERT_EQ(RunPrism("", "status --flight-recorder " + (out / "flight_recorder").string(), &st), 0) << st;
  EXPECT_NE(st.find("op, size mismatch at comm 1 (default_pg) seq 5: rank 0 all_reduce 1 MiB"), std::string::npos)
      << st;  // FR numbers collectives from 1
  EXPECT_NE(st.find("--ranks 0,5"), std::string::npos) << st;
  fs::remove_all(out);
}

// Rank 5 halves its sizes in iteration 1: a size mismatch at sequence 2.
TEST_F(HangE2E, SizeMismatch) {
  fs::path out = FreshDir("size");
  std::string log;
  int rc = RunPrism("FAKE_ITERS=50 FAKE_SIZE_RANK=5 FAKE_SIZE_ITER=1",
                    "--out " + out.string() + " --ranks 0,5 --gpus 2 --policy mirror --no-preload --hang-timeout 1 torchrun "
                    "--nnodes 2 --nproc-per-node 4 " + Shim(),
                    &log);
  EXPECT_EQ(rc, 4) << log;
  json h = ReadJson(out / "hang.json");
  ASSERT_EQ(h["mismatches"].size(), 1u) << log;
  EXPECT_EQ(h["mismatches"][0]["seq"], 2);
  EXPECT_EQ(h["mismatches"][0]["differs"], "size");
  EXPECT_EQ(h["mismatches"][0]["ops"][1]["bytes"], 524288);
  ExpectNoWorkerLeft(out);
  fs::remove_all(out);
}

// Ranks 0 and 5 both send to each other first on their 2-rank p2p communicator: a wait-for cycle.
TEST_F(HangE2E, P2pSendSendIsACycle) {
  fs::path out = FreshDir("p2p");
  std::string log;
  int rc = RunPrism("FAKE_COMM=p2p:0,5 FAKE_OPS=send:4096,recv:4096",
                    "--out " + out.string() + " --ranks 0,5 --gpus 2 --policy mirror --no-preload --hang-timeout 1 torchrun "
                    "--nnodes 2 --nproc-per-node 4 " + Shim(),
                    &log);
  EXPECT_EQ(rc, 4) << log;
  EXPECT_NE(log.find("wait-for cycle: 0 -> 5 -> 0"), std::string::npos) << log;
  json h = ReadJson(out / "hang.json");
  ASSERT_EQ(h["cycles"].size(), 1u) << h.dump(2);
  EXPECT_EQ(h["cycles"][0], json::array({0, 5}));
  ASSERT_EQ(h["mismatches"].size(), 1u) << h.dump(2);
  EXPECT_EQ(h["mismatches"][0]["differs"], "p2p direction");
  ExpectNoWorkerLeft(out);
  fs::remove_all(out);
}

// The same bug through libprism's exchange (FAKE_EXCHANGE=1, what a real send to a real peer does): each send posts
// its bytes and waits for the coordinator's acknowledgement, which needs the receive the other rank never posts.
// No kOpArrive is sent (an exchanged p2p unit is not released by the coordinator): the coordinator learns that
// both ranks wait from the exchange itself, and finds the cycle 0 -> 5 -> 0.
TEST_F(HangE2E, ExchangedSendSendIsACycle) {
  fs::path out = FreshDir("xp2p");
  std::string log;
  int rc = RunPrism("FAKE_COMM=p2p:0,5 FAKE_OPS=send:4096,recv:4096 FAKE_EXCHANGE=1 FAKE_WAIT_S=30",
                    "--out " + out.string() + " --ranks 0,5 --gpus 2 --policy mirror --no-preload --hang-timeout 1 torchrun "
                    "--nnodes 2 --nproc-per-node 4 " + Shim(),
                    &log);
  EXPECT_EQ(rc, 4) << log;
  EXPECT_NE(log.find("wait-for cycle: 0 -> 5 -> 0"), std::string::npos) << log;
  json h = ReadJson(out / "hang.json");
  ASSERT_FALSE(h.is_discarded()) << log;
  ASSERT_EQ(h["cycles"].size(), 1u) << h.dump(2);
  EXPECT_EQ(h["cycles"][0], json::array({0, 5}));
  ASSERT_EQ(h["waiting"].size(), 2u) << h.dump(2);
  for (const json& w : h["waiting"]) {
    EXPECT_EQ(w["op"]["op"], "send") << w.dump();
    EXPECT_EQ(w["op"]["seq"], 0) << w.dump();
    EXPECT_EQ(w["op"]["bytes"], 4096) << w.dump();
    EXPECT_EQ(w["op"]["peer"], w["rank"] == 0 ? 5 : 0) << w.dump();
    EXPECT_EQ(w["waiting_for"], json::array({w["rank"] == 0 ? 5 : 0})) << w.dump();
  }
  ASSERT_EQ(h["mismatches"].size(), 1u) << h.dump(2);
  EXPECT_EQ(h["mismatches"][0]["differs"], "p2p direction");
  ExpectNoWorkerLeft(out);
  fs::remove_all(out);
}

// The control: rank 5 receives before it sends, so every send finds its receive. No hang; the fake shim checks that
// each receive got the peer's bytes (exit 3 otherwise).
TEST_F(HangE2E, ExchangedSendAndReceiveInOrderDoNotHang) {
  fs::path out = FreshDir("xp2p-ok");
  std::string log;
  int rc = RunPrism("FAKE_COMM=p2p:0,5 FAKE_OPS=send:4096,recv:4096 FAKE_EXCHANGE=1 FAKE_RECV_FIRST_RANK=5 "
                    "FAKE_ITERS=3 FAKE_WAIT_S=30",
                    "--out " + out.string() + " --ranks 0,5 --gpus 2 --policy mirror --no-preload --hang-timeout 1 torchrun "
                    "--nnodes 2 --nproc-per-node 4 " + Shim(),
                    &log);
  EXPECT_EQ(rc, 0) << log;
  EXPECT_FALSE(fs::exists(out / "hang.json")) << log;
  EXPECT_NE(log.find("fake_shim rank 5: iteration 2 done"), std::string::npos) << log;
  EXPECT_NE(log.find("fake_shim rank 0: iteration 2 done"), std::string::npos) << log;
  fs::remove_all(out);
}

// An exchanged collective: rank 5 leaves before iteration 2, so rank 0 waits in the exchange of that iteration's
// all_reduce (its input posted, rank 5's never comes). The diagnosis names the member that never arrived.
TEST_F(HangE2E, ExchangedCollectiveWaitsForAMemberThatLeft) {
  fs::path out = FreshDir("xcoll");
  std::string log;
  int rc = RunPrism("FAKE_EXCHANGE=1 FAKE_ITERS=50 FAKE_STOP_RANK=5 FAKE_STOP_ITER=2 FAKE_WAIT_S=30",
                    "--out " + out.string() + " --ranks 0,5 --gpus 2 --policy mirror --no-preload --hang-timeout 1 torchrun "
                    "--nnodes 2 --nproc-per-node 4 " + Shim(),
                    &log);
  EXPECT_EQ(rc, 4) << log;
  json h = ReadJson(out / "hang.json");
  ASSERT_FALSE(h.is_discarded()) << log;
  ASSERT_EQ(h["waiting"].size(), 1u) << h.dump(2);
  const json& w = h["waiting"][0];
  EXPECT_EQ(w["rank"], 0);
  EXPECT_EQ(w["op"]["op"], "all_reduce");
  EXPECT_EQ(w["op"]["seq"], 4);
  EXPECT_EQ(w["op"]["bytes"], 1048576);
  EXPECT_EQ(w["waiting_for"], json::array({5}));
  EXPECT_EQ(w["held_up_by"], 5);
  ASSERT_EQ(h["never_arrived"].size(), 1u) << h.dump(2);
  EXPECT_EQ(h["never_arrived"][0]["never_arrived"][0]["rank"], 5);
  EXPECT_EQ(h["never_arrived"][0]["never_arrived"][0]["reached_seq"], 3);
  EXPECT_TRUE(h["mismatches"].empty()) << h.dump(2);
  ExpectNoWorkerLeft(out);
  fs::remove_all(out);
}

// --on-hang wait: the diagnosis is written and printed, the job keeps running until Ctrl-C (exit 130), and the
// report records the hang.
TEST_F(HangE2E, WaitKeepsTheJobRunning) {
  fs::path out = FreshDir("wait");
  fs::create_directories(out);
  std::vector<std::string> args = {std::getenv("PRISM_RUN"), "--out", out.string(), "--ranks", "0,5", "--gpus", "2",
                                   "--policy", "mirror", "--no-preload", "--hang-timeout", "1", "--on-hang", "wait", "torchrun",
                                   "--nnodes", "2", "--nproc-per-node", "4", Shim()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  for (const char* e : {"FAKE_ITERS=50", "FAKE_SKIP_RANK=5", "FAKE_SKIP_ITER=1", "PYTHON_EXEC=python3"})
    env_s.emplace_back(e);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string stdout_path = out.string() + ".stdout";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&fa);

  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool recorded = false;
  while (std::chrono::steady_clock::now() < deadline && !recorded) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    json rep = ReadJson(out / "report.json");
    recorded = !rep.is_discarded() && rep.contains("hang");
  }
  ASSERT_TRUE(recorded) << ReadText(stdout_path);
  // Still running a second later: nothing stopped the workers.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  int st = 0;
  EXPECT_EQ(waitpid(pid, &st, WNOHANG), 0) << ReadText(stdout_path);
  json rep = ReadJson(out / "report.json");
  EXPECT_EQ(rep["status"], "running");
  EXPECT_EQ(rep["hang"]["stopped"], false);
  // Live status from the coordinator's store, as from another host.
  json info = ReadJson(out / "coordinator.json");
  std::string text;
  ASSERT_EQ(RunPrism("", "status 127.0.0.1:" + std::to_string(info["store_port"].get<int>()), &text), 0) << text;
  EXPECT_NE(text.find("running (read from its store)"), std::string::npos) << text;
  EXPECT_NE(text.find("HANG diagnosed"), std::string::npos) << text;
  EXPECT_NE(text.find("WAITING at seq 2 all_gather 4 KiB"), std::string::npos) << text;
  kill(pid, SIGINT);
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 130) << ReadText(stdout_path);
  std::string log = ReadText(stdout_path);
  EXPECT_NE(log.find("--on-hang wait: the job keeps running"), std::string::npos) << log;
  EXPECT_NE(log.find("a hang was diagnosed during the run"), std::string::npos) << log;
  rep = ReadJson(out / "report.json");
  EXPECT_EQ(rep["status"], "interrupted");
  EXPECT_TRUE(fs::exists(out / "hang.json"));
  ExpectNoWorkerLeft(out);
  fs::remove_all(out);
  fs::remove(stdout_path);
}

TEST_F(HangE2E, DryRunShowsTheHangSettings) {
  std::string log;
  int rc = RunPrism("", "--dry-run --json --no-preload --hang-timeout 7.5 --on-hang wait torchrun --nproc-per-node 2 "
                    "x.py",
                    &log);
  ASSERT_EQ(rc, 0) << log;
  json j = json::parse(log, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << log;
  EXPECT_EQ(j["hang"]["timeout_s"], 7.5);
  EXPECT_EQ(j["hang"]["on_hang"], "wait");
  rc = RunPrism("", "--dry-run --no-preload --on-hang never torchrun --nproc-per-node 2 x.py", &log);
  EXPECT_EQ(rc, 2) << log;
}

}  // namespace
