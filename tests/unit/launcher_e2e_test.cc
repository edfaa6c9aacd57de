// prism-run end to end without a GPU: the job is tests/data/launcher/fake_worker.py, which records the environment
// it was given, joins the coordinator's store like torch's TCPStore client, and writes the rank event file libprism
// would write. Checks the launch (commands, env, logs), the coordinator's stand-in for virtual ranks, progress
// lines, report.json, a failing rank (exit status and log tail) and Ctrl-C (clean stop, report kept).
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
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "e2e_harness.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Worker() { return std::string(PRISM_SOURCE_DIR) + "/tests/data/launcher/fake_worker.py"; }

fs::path FreshDir(const std::string& name) { return prism::test_util::FreshDir("e2e", name); }

using prism::test_util::ReadJson;
using prism::test_util::ReadText;
int RunPrism(const std::string& env_prefix, const std::string& args, std::string* out) {
  return prism::test_util::RunPrismWithEnv(env_prefix, args, out);
}

class LauncherE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(std::getenv("PRISM_RUN"), nullptr) << "PRISM_RUN is not set (ctest sets it)";
    if (std::system("python3 -c 'import json, socket, struct' >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "python3 is needed for the fake worker";
  }
};

TEST_F(LauncherE2E, TwoRealRanksOfEight) {
  fs::path out = FreshDir("ok");
  std::string log;
  int rc = RunPrism("FAKE_ITERS=4 FAKE_ITER_MS=20 FAKE_USER_VAR=kept",
                    "--out " + out.string() + " --ranks 0,5 --gpus 2 --policy mirror --no-preload torchrun --nnodes 2 "
                    "--nproc-per-node 4 " + Worker() + " --tensor-model-parallel-size 2 --lr 0.1",
                    &log);
  ASSERT_EQ(rc, 0) << log;

  // Each worker got the environment of its logical rank, the user's own variables, and the script arguments.
  json w0 = ReadJson(out / "fake_rank0.json"), w5 = ReadJson(out / "fake_rank5.json");
  ASSERT_FALSE(w0.is_discarded() || w5.is_discarded()) << log;
  EXPECT_EQ(w0["env"]["RANK"], "0");
  EXPECT_EQ(w5["env"]["RANK"], "5");
  EXPECT_EQ(w5["env"]["WORLD_SIZE"], "8");
  EXPECT_EQ(w5["env"]["LOCAL_RANK"], "1");  // 5 % 4
  EXPECT_EQ(w5["env"]["GROUP_RANK"], "1");  // 5 / 4
  EXPECT_EQ(w5["env"]["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(w5["env"]["CUDA_VISIBLE_DEVICES"], "1");
  EXPECT_EQ(w0["env"]["CUDA_VISIBLE_DEVICES"], "0");
  EXPECT_EQ(w5["env"]["TORCHELASTIC_USE_AGENT_STORE"], "True");
  EXPECT_EQ(w5["env"]["TORCH_NCCL_ENABLE_MONITORING"], "0");
  EXPECT_EQ(w5["env"]["PRISM_RANK"], "5");
  EXPECT_EQ(w5["env"]["PRISM_LAYOUT"], "tp=2,pp=1,dp=4,cp=1,ep=1,etp=2,order=tp-cp-ep-dp-pp");
  EXPECT_EQ(w5["env"]["FAKE_USER_VAR"], "kept");
  EXPECT_TRUE(w5["env"]["LD_PRELOAD"].is_null());  // --no-preload
  EXPECT_EQ(w5["argv"].back(), "0.1");
  EXPECT_EQ(w5["argv"][1], "--tensor-model-parallel-size");
  // Each worker compiles with its own empty torch.compile/Triton cache, removed when the run ends.
  if (!std::getenv("TORCHINDUCTOR_CACHE_DIR") && !std::getenv("TRITON_CACHE_DIR")) {
    EXPECT_EQ(w5["env"]["TORCHINDUCTOR_CACHE_DIR"], (out / "compile-cache/rank5/inductor").string());
    EXPECT_EQ(w0["env"]["TRITON_CACHE_DIR"], (out / "compile-cache/rank0/triton").string());
    EXPECT_FALSE(fs::exists(out / "compile-cache")) << "the workers' compile caches outlived the run";
  }

  // The coordinator's store stood in for the 6 virtual ranks: the init/ count reached the world size.
  EXPECT_EQ(w0["ping_ok"], true);
  std::set<int> counts = {w0["init_count"].get<int>(), w5["init_count"].get<int>()};
  EXPECT_EQ(counts, (std::set<int>{7, 8})) << log;

  // One progress line per iteration, from the event files.
  for (int it = 0; it < 4; ++it)
    EXPECT_NE(log.find("iter " + std::to_string(it) + " | rank 0: "), std::string::npos) << log;
  EXPECT_NE(log.find("[rank 5] iteration 3 done"), std::string::npos) << log;

  // report.json
  json rep = ReadJson(out / "report.json");
  ASSERT_FALSE(rep.is_discarded());
  EXPECT_EQ(rep["world_size"], 8);
  EXPECT_EQ(rep["mode"], "emulate");
  EXPECT_EQ(rep["status"], "finished");
  EXPECT_EQ(rep["exit_code"], 0);
  EXPECT_EQ(rep["iterations"], 4);
  // Iterations 1-3: rank 0 takes 20 ms, rank 5 (local rank 1) 40 ms; the first (5x, warm-up) is left out.
  EXPECT_NEAR(rep["iteration_time_s"].get<double>(), 0.040, 1e-9);
  ASSERT_EQ(rep["ranks"].size(), 2u);
  EXPECT_EQ(rep["ranks"][0]["rank"], 0);
  EXPECT_NEAR(rep["ranks"][0]["iteration_time_s"].get<double>(), 0.020, 1e-9);
  EXPECT_NEAR(rep["ranks"][1]["iteration_time_s"].get<double>(), 0.040, 1e-9);
  EXPECT_EQ(rep["ranks"][1]["peak_memory_bytes"], 150000000);
  EXPECT_EQ(rep["ranks"][1]["torch_max_allocated_bytes"], 93000000);
  EXPECT_NEAR(rep["ranks"][0]["wait_s"]["TENSOR_MODEL_PARALLEL_GROUP"].get<double>(), 0.002, 1e-9);
  EXPECT_EQ(rep["ranks"][1]["exit_code"], 0);
  EXPECT_GT(rep["wall_s"].get<double>(), 0.0);
  EXPECT_EQ(rep["layout"]["tp"], 2);
  std::string warnings = rep["warnings"].dump();
  EXPECT_NE(warnings.find("--no-preload"), std::string::npos) << warnings;

  // command.json holds the exact command lines; logs hold each rank's output; trace.json is there.
  json cmd = ReadJson(out / "command.json");
  ASSERT_EQ(cmd["workers"].size(), 2u);
  EXPECT_EQ(cmd["workers"][1]["rank"], 5);
  EXPECT_EQ(cmd["workers"][1]["argv"][0], "python3");
  EXPECT_EQ(cmd["workers"][1]["env"]["RANK"], "5");
  EXPECT_NE(ReadText(out / "logs" / "rank5.log").find("iteration 3 done"), std::string::npos);
  EXPECT_FALSE(ReadJson(out / "trace.json").is_discarded());
  fs::remove_all(out);
}

// Issue 8: with --graph the run ends with every real rank compared to `simulate` of the graph (same what-ifs), in
// the output and in report.json; --what-if is checked before anything starts.
TEST_F(LauncherE2E, GraphRunIsComparedWithSimulateOfTheGraph) {
  const std::string graph = std::string(PRISM_SOURCE_DIR) + "/examples/graphs/gpt-tp2-pp2-dp2.prism.json";
  const std::string job = " --no-preload torchrun --nnodes 2 --nproc-per-node 4 " + Worker() +
                          " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2";
  fs::path out = FreshDir("graph");
  std::string log;
  int rc = RunPrism("FAKE_ITERS=4 FAKE_ITER_MS=20",
                    "--out " + out.string() + " --ranks 0 --gpus 1 --graph " + graph +
                        " --what-if straggler=4:1.5" + job,
                    &log);
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("prism: rank 0: emulated vs simulate(graph): median error"), std::string::npos) << log;
  // How the virtual ranks answered, said once (not a fill slice: no lockstep releases).
  const size_t said = log.find("prism: graph replay: ");
  ASSERT_NE(said, std::string::npos) << log;
  EXPECT_EQ(log.find("prism: graph replay: ", said + 1), std::string::npos) << log;
  EXPECT_NE(log.find("(0 on the real rank's own arrival, lockstep)", said), std::string::npos) << log;
  json rep = ReadJson(out / "report.json");
  ASSERT_TRUE(rep.contains("graph_comparison")) << rep.dump(1);
  EXPECT_EQ(rep["graph_comparison"]["graph"], graph);
  ASSERT_EQ(rep["graph_comparison"]["ranks"].size(), 1u);
  EXPECT_EQ(rep["graph_comparison"]["ranks"][0]["rank"], 0);
  EXPECT_FALSE(rep["graph_comparison"]["ranks"][0]["iterations"].empty());
  EXPECT_GT(rep["graph_comparison"]["simulated_iteration_time_s"].get<double>(), 0.0);
  // Beside it, simulate with the real rank's compute at what it measured in this run: the fake job's 20 ms
  // iterations hold one 2 ms operation (tests/data/launcher/fake_worker.py), so 18 ms of compute per iteration.
  const json& own = rep["graph_comparison"]["ranks"][0]["own_speed"];
  ASSERT_TRUE(own.is_object()) << rep["graph_comparison"].dump(1);
  EXPECT_NEAR(own["run_compute_per_iteration_s"].get<double>(), 0.018, 1e-6);
  EXPECT_GT(own["graph_compute_per_iteration_s"].get<double>(), 0.0);
  EXPECT_NEAR(own["compute_scale"].get<double>(),
              own["run_compute_per_iteration_s"].get<double>() / own["graph_compute_per_iteration_s"].get<double>(),
              1e-9);
  EXPECT_TRUE(own.contains("median_error_pct"));
  EXPECT_NE(log.find("prism: at rank 0's own speed (compute 18.0 ms per iteration in this run"), std::string::npos)
      << log;
  json cmd = ReadJson(out / "command.json");
  EXPECT_EQ(cmd["workers"][0]["env"]["PRISM_WHAT_IF"], "straggler=4:1.5");
  fs::remove_all(out);

  // Refused up front (exit 2): a real rank as the straggler, no graph, a network what-if.
  out = FreshDir("graph-bad");
  rc = RunPrism("FAKE_ITERS=1", "--out " + out.string() + " --ranks 0 --gpus 1 --graph " + graph +
                                    " --what-if straggler=0:1.5" + job, &log);
  EXPECT_EQ(rc, 2) << log;
  EXPECT_NE(log.find("runs for real"), std::string::npos) << log;
  rc = RunPrism("FAKE_ITERS=1", "--out " + out.string() + " --ranks 0 --gpus 1 --policy mirror --what-if straggler=4:1.5" + job, &log);
  EXPECT_EQ(rc, 2) << log;
  EXPECT_NE(log.find("--what-if needs a graph"), std::string::npos) << log;
  rc = RunPrism("FAKE_ITERS=1", "--out " + out.string() + " --ranks 0 --gpus 1 --graph " + graph +
                                    " --what-if bw-scale=2" + job, &log);
  EXPECT_EQ(rc, 2) << log;
  EXPECT_NE(log.find("only straggler="), std::string::npos) << log;
  fs::remove_all(out);
}

TEST_F(LauncherE2E, FailingRankGivesItsStatusAndLogTail) {
  fs::path out = FreshDir("fail");
  std::string log;
  int rc = RunPrism("FAKE_ITERS=200 FAKE_ITER_MS=20 FAKE_FAIL_RANK=5 FAKE_FAIL_AFTER=2",
                    "--out " + out.string() + " --ranks 0,5 --gpus 2 --policy mirror --no-preload torchrun --nnodes 2 "
                    "--nproc-per-node 4 " + Worker(),
                    &log);
  EXPECT_EQ(rc, 3) << log;  // the job's own status
  EXPECT_NE(log.find("rank 5 failed (exit 3)"), std::string::npos) << log;
  EXPECT_NE(log.find("| boom: rank 5 fails on purpose"), std::string::npos) << log;
  json rep = ReadJson(out / "report.json");
  EXPECT_EQ(rep["status"], "failed");
  EXPECT_EQ(rep["failed_rank"], 5);
  EXPECT_EQ(rep["exit_code"], 3);
  EXPECT_EQ(rep["ranks"][1]["status"], "failed");
  EXPECT_EQ(rep["ranks"][0]["status"], "stopped");  // rank 0 was stopped, not failed
  EXPECT_GE(rep["iterations"].get<int>(), 2);       // what was measured before the failure is kept
  EXPECT_NE(ReadText(out / "logs" / "rank5.log").find("boom"), std::string::npos);
  fs::remove_all(out);
}

// --iterations K: a job that would run 100000 iterations (a production command) is stopped once every real rank
// completed K, and the run counts as finished (exit 0) with the K iterations in the report.
TEST_F(LauncherE2E, IterationsStopsTheJobAfterKIterations) {
  fs::path out = FreshDir("iters");
  std::string log;
  const auto t0 = std::chrono::steady_clock::now();
  int rc = RunPrism("FAKE_ITERS=100000 FAKE_ITER_MS=20",
                    "--out " + out.string() + " --ranks 0,1 --gpus 1 --policy mirror --no-preload --iterations 5 torchrun "
                    "--nproc-per-node 2 " + Worker(),
                    &log);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(rc, 0) << log;
  EXPECT_LT(wall, 60.0) << log;  // 100000 iterations of 20 ms would take half an hour
  EXPECT_NE(log.find("5 iteration(s) complete on every real rank (--iterations): stopping the workers"),
            std::string::npos) << log;
  json rep = ReadJson(out / "report.json");
  ASSERT_FALSE(rep.is_discarded()) << log;
  EXPECT_EQ(rep["status"], "finished");
  EXPECT_EQ(rep["exit_code"], 0);
  EXPECT_EQ(rep["stopped_after_iterations"], 5);
  EXPECT_GE(rep["iterations"].get<int>(), 5);
  EXPECT_LT(rep["iterations"].get<int>(), 100);
  EXPECT_EQ(rep["ranks"][0]["status"], "stopped");
  fs::remove_all(out);
  // A job that ends by itself before K iterations is not "stopped after K".
  rc = RunPrism("FAKE_ITERS=3 FAKE_ITER_MS=5",
                "--out " + out.string() + " --ranks 0,1 --gpus 1 --policy mirror --no-preload --iterations 10 torchrun "
                "--nproc-per-node 2 " + Worker(),
                &log);
  ASSERT_EQ(rc, 0) << log;
  rep = ReadJson(out / "report.json");
  EXPECT_FALSE(rep.contains("stopped_after_iterations")) << rep.dump();
  EXPECT_EQ(rep["ranks"][0]["status"], "exited");
  fs::remove_all(out);
}

TEST_F(LauncherE2E, CtrlCStopsCleanlyAndKeepsTheReport) {
  fs::path out = FreshDir("int");
  std::vector<std::string> args = {std::getenv("PRISM_RUN"), "--out", out.string(), "--ranks", "0,1", "--gpus", "1",
                                   "--policy", "mirror", "--no-preload", "--quiet", "torchrun", "--nproc-per-node", "2", Worker()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  env_s.push_back("FAKE_ITERS=100000");
  env_s.push_back("FAKE_ITER_MS=20");
  env_s.push_back("PYTHON_EXEC=python3");
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, (out.string() + ".stdout").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&fa);

  // Wait until both ranks measured a few iterations.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  bool running = false;
  while (std::chrono::steady_clock::now() < deadline && !running) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    json rep = ReadJson(out / "report.json");
    running = !rep.is_discarded() && rep["iterations"].is_number() && rep["iterations"].get<int>() >= 3 &&
              rep["ranks"][1]["iterations"].get<int>() >= 3;
  }
  ASSERT_TRUE(running) << ReadText(out.string() + ".stdout");
  kill(pid, SIGINT);
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st)) << ReadText(out.string() + ".stdout");
  EXPECT_EQ(WEXITSTATUS(st), 130);
  std::string log = ReadText(out.string() + ".stdout");
  EXPECT_NE(log.find("Ctrl-C"), std::string::npos) << log;
  json rep = ReadJson(out / "report.json");
  EXPECT_EQ(rep["status"], "interrupted");
  EXPECT_GE(rep["iterations"].get<int>(), 3);
  EXPECT_TRUE(rep["iteration_time_s"].is_number());
  EXPECT_EQ(rep["ranks"][0]["status"], "interrupted");
  // No worker is left behind: the pids of their hello lines are gone.
  for (const char* f : {"rank0.events.jsonl", "rank1.events.jsonl"}) {
    std::ifstream in(out / f);
    std::string first;
    std::getline(in, first);
    json hello = json::parse(first, nullptr, false);
    ASSERT_TRUE(!hello.is_discarded() && hello["pid"].is_number()) << first;
    EXPECT_NE(kill(hello["pid"].get<int>(), 0), 0) << "worker " << hello["pid"] << " still runs";
  }
  fs::remove_all(out);
  fs::remove(out.string() + ".stdout");
}

TEST_F(LauncherE2E, CommandThatCannotStart) {
  fs::path out = FreshDir("nostart");
  std::string log;
  int rc = RunPrism("", "--out " + out.string() + " --policy mirror --no-preload torchrun --no-python /nonexistent/job.sh", &log);
  EXPECT_EQ(rc, 127) << log;
  EXPECT_NE(log.find("cannot start rank 0"), std::string::npos) << log;
  json rep = ReadJson(out / "report.json");
  EXPECT_EQ(rep["status"], "failed");
  fs::remove_all(out);
}

}  // namespace
