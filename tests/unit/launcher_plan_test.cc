// The emulation plan: target world, layout, real ranks and their GPUs, the command and environment each worker
// gets. With a fake host (no GPU needed), then through the real prism-run --dry-run --json.
#include "launcher/plan.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "model/megatron_membership.h"
#include "analysis/observed_trace.h"

namespace prism::launcher {
using analysis::CoversEveryClass;
using analysis::CoversEveryClassOrEpStandIn;
using world::MegatronMembership;
namespace {

std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

HostInfo FakeHost(std::map<std::string, std::string> env = {}, int gpus = 8) {
  HostInfo h;
  h.env = [env](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  h.count_gpus = [gpus] { return gpus; };
  h.cpu_count = 32;
  h.libprism = "/opt/prism/lib/libprism.so";
  h.python_hook_dir = "/opt/prism/lib/python";
  h.which = [](const std::string& name) -> std::optional<std::string> {
    if (name == "torchrun") return "/venv/bin/torchrun";
    return std::nullopt;
  };
  h.shebang = [](const std::string& file) -> std::optional<std::string> {
    if (file == "/venv/bin/torchrun") return "/venv/bin/python3";
    return std::nullopt;
  };
  h.cwd = "/work";
  return h;
}

PlanRequest Request(const std::string& cmd, const std::string& ranks = "") {
  PlanRequest r;
  r.command = Words(cmd);
  r.ranks = ranks;
  r.out_dir = "/tmp/out";
  return r;
}

Plan Build(const PlanRequest& req, const HostInfo& host) {
  std::string err;
  auto p = BuildPlan(req, host, &err);
  EXPECT_TRUE(p) << err;
  return p ? *p : Plan{};
}

std::string BuildError(const PlanRequest& req, const HostInfo& host) {
  std::string err;
  auto p = BuildPlan(req, host, &err);
  EXPECT_FALSE(p);
  return err;
}

std::map<std::string, std::string> EnvMap(const EnvList& l) { return {l.begin(), l.end()}; }

const char* kMegatron64 =
    "torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --tensor-model-parallel-size 2 "
    "--pipeline-model-parallel-size 2 --disable-gloo-process-groups";

TEST(Plan, Megatron64RankZero) {
  Plan p = Build(Request(kMegatron64), FakeHost());
  EXPECT_EQ(p.world_size, 64);
  EXPECT_EQ(p.nnodes, 8);
  EXPECT_EQ(p.nproc_per_node, 8);
  EXPECT_EQ(p.layout.tp, 2);
  EXPECT_EQ(p.layout.pp, 2);
  EXPECT_EQ(p.layout.dp, 16);
  EXPECT_EQ(p.layout_source, "Megatron arguments");
  ASSERT_EQ(p.real.size(), 1u);
  EXPECT_EQ(p.real[0].rank, 0);
  EXPECT_EQ(p.real[0].gpu, 0);
  ASSERT_EQ(p.workers.size(), 1u);
  // The job's command, run as torchrun would: the interpreter torchrun runs under, -u, script, args untouched.
  std::vector<std::string> want = {"/venv/bin/python3", "-u", "pretrain_gpt.py"};
  std::vector<std::string> args = Words(kMegatron64);
  want.insert(want.end(), args.begin() + 6, args.end());
  EXPECT_EQ(p.workers[0].argv, want);

  auto env = EnvMap(p.env);
  EXPECT_EQ(env["WORLD_SIZE"], "64");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "8");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "8");
  EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29500");
  EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
  EXPECT_EQ(env["TORCH_NCCL_ENABLE_MONITORING"], "0");
  EXPECT_EQ(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "0");
  EXPECT_EQ(env["TORCH_NCCL_DUMP_ON_TIMEOUT"], "0");
  EXPECT_GE(std::stoi(env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]), 86400);
  EXPECT_GE(std::stoi(env["TORCH_NCCL_RANKS_PER_ROOT"]), 64);
  EXPECT_EQ(env.count("CUDA_MODULE_LOADING"), 0u);  // one rank on its GPU keeps lazy loading
  EXPECT_EQ(env["NCCL_NVLS_ENABLE"], "0");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(env["PRISM_WORLD_SIZE"], "64");
  EXPECT_EQ(env["PRISM_GPUS_PER_NODE"], "8");
  EXPECT_EQ(env["PRISM_OUT_DIR"], "/tmp/out");
  EXPECT_EQ(env["PRISM_COORD_SOCKET"], "/tmp/out/coord.sock");
  EXPECT_EQ(env["PRISM_PAYLOAD"], "mirror");
  EXPECT_EQ(env["PRISM_LAYOUT"], p.layout.ToSpec());
  EXPECT_EQ(env["LD_PRELOAD"], "/opt/prism/lib/libprism.so");
  EXPECT_EQ(env["PYTHONPATH"], "/opt/prism/lib/python");
  auto wenv = EnvMap(p.workers[0].env);
  EXPECT_EQ(wenv["RANK"], "0");
  EXPECT_EQ(wenv["LOCAL_RANK"], "0");
  EXPECT_EQ(wenv["GROUP_RANK"], "0");
  EXPECT_EQ(wenv["CUDA_VISIBLE_DEVICES"], "0");
  EXPECT_EQ(wenv["PRISM_RANK"], "0");
  EXPECT_TRUE(p.warnings.empty()) << p.warnings.front();
}

TEST(Plan, LastRankAndTwoRanksOnOneGpu) {
  Plan p = Build(Request(kMegatron64, "63"), FakeHost({}, 1));
  ASSERT_EQ(p.real.size(), 1u);
  EXPECT_EQ(p.real[0].node, 7);
  EXPECT_EQ(p.real[0].local_rank, 7);
  EXPECT_EQ(p.real[0].coords.tp, 1);
  EXPECT_EQ(p.real[0].coords.pp, 1);
  EXPECT_EQ(p.real[0].coords.dp, 15);
  auto wenv = EnvMap(p.workers[0].env);
  EXPECT_EQ(wenv["RANK"], "63");
  EXPECT_EQ(wenv["LOCAL_RANK"], "7");  // within its virtual node
  EXPECT_EQ(wenv["GROUP_RANK"], "7");
  EXPECT_EQ(wenv["CUDA_VISIBLE_DEVICES"], "0");  // the one physical GPU

  p = Build(Request(kMegatron64, "0,1"), FakeHost({}, 1));
  ASSERT_EQ(p.real.size(), 2u);
  EXPECT_EQ(p.real[1].gpu, 0);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_NE(p.warnings[0].find("share GPU 0"), std::string::npos) << p.warnings[0];
  EXPECT_EQ(EnvMap(p.env)["PRISM_REAL_RANKS"], "0,1");
}

TEST(Plan, GpusFromCudaVisibleDevices) {
  Plan p = Build(Request(kMegatron64, "0-3"), FakeHost({{"CUDA_VISIBLE_DEVICES", "4,5"}}, 8));
  EXPECT_EQ(p.gpus, 2);
  std::vector<std::string> devices;
  for (const Worker& w : p.workers) devices.push_back(EnvMap(w.env)["CUDA_VISIBLE_DEVICES"]);
  EXPECT_EQ(devices, (std::vector<std::string>{"4", "5", "4", "5"}));
  EXPECT_EQ(p.warnings.size(), 2u);  // two GPUs shared by two ranks each

  PlanRequest req = Request(kMegatron64, "0-3");
  req.gpus = 3;
  EXPECT_NE(BuildError(req, FakeHost({{"CUDA_VISIBLE_DEVICES", "4,5"}})).find("CUDA_VISIBLE_DEVICES"),
            std::string::npos);
  req.gpus = 4;
  p = Build(req, FakeHost({}, 8));
  EXPECT_EQ(p.gpus, 4);
  EXPECT_TRUE(p.warnings.empty());
  // No GPU at all: plan for one, say so.
  p = Build(Request(kMegatron64), FakeHost({}, -1));
  EXPECT_EQ(p.gpus, 1);
  EXPECT_EQ(p.warnings.size(), 1u);
}

TEST(Plan, RankListsOutsideTheWorldAreRefused) {
  // The parser itself: rank_list_test.cc.
  EXPECT_NE(BuildError(Request(kMegatron64, "64"), FakeHost()).find("outside the world"), std::string::npos);
}

TEST(Plan, NodeRankPicksAVirtualNode) {
  PlanRequest req = Request(kMegatron64);
  req.node_rank = 3;
  Plan p = Build(req, FakeHost());
  ASSERT_EQ(p.real.size(), 8u);
  EXPECT_EQ(p.real.front().rank, 24);
  EXPECT_EQ(p.real.back().rank, 31);
  EXPECT_EQ(p.real.back().local_rank, 7);
  EXPECT_EQ(p.real.back().gpu, 7);
  req.ranks = "0";
  EXPECT_NE(BuildError(req, FakeHost()).find("not both"), std::string::npos);
  req.ranks = "";
  req.node_rank = 8;
  EXPECT_NE(BuildError(req, FakeHost()).find("--node-rank 8"), std::string::npos);
}

TEST(Plan, LayoutErrorsSayWhichSizesDisagree) {
  std::string err =
      BuildError(Request("torchrun --nnodes 2 --nproc-per-node 3 pretrain_gpt.py --tensor-model-parallel-size 4"),
                 FakeHost());
  EXPECT_NE(err.find("6"), std::string::npos) << err;
  EXPECT_NE(err.find("2 nodes x 3 processes"), std::string::npos) << err;
  EXPECT_NE(err.find("tp(4)"), std::string::npos) << err;
  PlanRequest req = Request(kMegatron64);
  req.layout = "tp=8,pp=4,dp=32";
  err = BuildError(req, FakeHost());
  EXPECT_NE(err.find("1024"), std::string::npos) << err;
  EXPECT_NE(err.find("64"), std::string::npos) << err;
}

TEST(Plan, LayoutOptionAndWarnings) {
  PlanRequest req = Request("torchrun --nnodes 4 --nproc-per-node 8 train.py");
  Plan p = Build(req, FakeHost());
  EXPECT_EQ(p.layout.dp, 32);
  EXPECT_EQ(p.layout_source, "none found: pure data parallel");
  req.layout = "tp=8,pp=2,order=tp-cp-ep-pp-dp";
  p = Build(req, FakeHost());
  EXPECT_EQ(p.layout.dp, 2);
  EXPECT_EQ(p.layout.order, "tp-cp-ep-pp-dp");
  EXPECT_EQ(p.layout_source, "--layout");

  // --layout contradicting the job's arguments: allowed, with a warning.
  req = Request(kMegatron64);
  req.layout = "tp=4,pp=2";
  p = Build(req, FakeHost());
  EXPECT_EQ(p.layout.tp, 4);
  ASSERT_FALSE(p.warnings.empty());
  EXPECT_NE(p.warnings[0].find("differs"), std::string::npos);

  // Megatron with Gloo groups on: warn.
  p = Build(Request("torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2"),
            FakeHost());
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_NE(p.warnings[0].find("--disable-gloo-process-groups"), std::string::npos);
  // --use-tp-pp-dp-mapping changes the order.
  p = Build(Request(std::string(kMegatron64) + " --use-tp-pp-dp-mapping"), FakeHost());
  EXPECT_EQ(p.layout.order, "tp-cp-ep-pp-dp");
}

TEST(Plan, CommandsAsTorchrunBuildsThem) {
  Plan p = Build(Request("torchrun --nproc-per-node 2 -m pkg.train --x 1"), FakeHost());
  EXPECT_EQ(p.workers[0].argv, (std::vector<std::string>{"/venv/bin/python3", "-u", "-m", "pkg.train", "--x", "1"}));
  p = Build(Request("torchrun --nproc-per-node 2 --no-python ./run.sh --x"), FakeHost());
  EXPECT_EQ(p.workers[0].argv, (std::vector<std::string>{"./run.sh", "--x"}));
  EXPECT_EQ(p.python, "");
  p = Build(Request("torchrun --run-path /abs/train.py --x"), FakeHost());
  ASSERT_EQ(p.workers[0].argv.size(), 6u);
  EXPECT_EQ(p.workers[0].argv[2], "-c");
  EXPECT_NE(p.workers[0].argv[3].find("runpy.run_path"), std::string::npos);
  EXPECT_EQ(p.workers[0].argv[4], "/abs/train.py");
  EXPECT_EQ(p.workers[0].argv[5], "--x");
  // python -m torch.distributed.run: that interpreter.
  p = Build(Request("/usr/bin/python3.11 -m torch.distributed.run --nproc-per-node 2 train.py"), FakeHost());
  EXPECT_EQ(p.workers[0].argv[0], "/usr/bin/python3.11");
  // PYTHON_EXEC wins (torchrun honours it too).
  p = Build(Request("torchrun train.py"), FakeHost({{"PYTHON_EXEC", "/my/python"}}));
  EXPECT_EQ(p.workers[0].argv[0], "/my/python");
  // torchrun not on PATH: python3, with a warning.
  HostInfo h = FakeHost();
  h.which = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  p = Build(Request("torchrun train.py"), h);
  EXPECT_EQ(p.workers[0].argv[0], "python3");
  EXPECT_EQ(p.warnings.size(), 1u);
  // torch.distributed.launch without --use-env: --local-rank=N after the script, N within the virtual node.
  p = Build(Request("python -m torch.distributed.launch --nnodes 2 --nproc_per_node 4 train.py --lr 1", "0,6"),
            FakeHost());
  EXPECT_EQ(p.workers[1].argv,
            (std::vector<std::string>{"python", "-u", "train.py", "--local-rank=2", "--lr", "1"}));
}

// Every worker compiles cold (its own empty torch.compile and Triton caches under the run's output), unless the
// user named a cache: then theirs is kept and nothing of prism's is removed.
TEST(Plan, EachWorkerGetsItsOwnCompileCacheUnlessTheUserNamedOne) {
  Plan p = Build(Request(kMegatron64, "0,9"), FakeHost());
  EXPECT_EQ(p.compile_cache_dir, "/tmp/out/compile-cache");
  ASSERT_EQ(p.workers.size(), 2u);
  auto w9 = EnvMap(p.workers[1].env);
  EXPECT_EQ(w9["TORCHINDUCTOR_CACHE_DIR"], "/tmp/out/compile-cache/rank9/inductor");
  EXPECT_EQ(w9["TRITON_CACHE_DIR"], "/tmp/out/compile-cache/rank9/triton");
  EXPECT_EQ(EnvMap(p.workers[0].env)["TORCHINDUCTOR_CACHE_DIR"], "/tmp/out/compile-cache/rank0/inductor");
  for (const char* mine : {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}) {
    Plan q = Build(Request(kMegatron64, "0"), FakeHost({{mine, "/shared/cache"}}));
    EXPECT_EQ(q.compile_cache_dir, "") << mine;
    auto w = EnvMap(q.workers[0].env);
    EXPECT_EQ(w.count("TORCHINDUCTOR_CACHE_DIR") + w.count("TRITON_CACHE_DIR"), 0u) << mine;
  }
}

// Eager module loading only where a lazy first launch behind a held gate could deadlock: real ranks sharing a GPU,
// or context switched; a user's own setting is kept (with a warning where it is risky).
TEST(Plan, EagerModuleLoadingOnlyWhereRanksShareAGpu) {
  auto loading = [](const Plan& p) {
    auto env = EnvMap(p.env);
    return env.count("CUDA_MODULE_LOADING") ? env["CUDA_MODULE_LOADING"] : std::string("(unset)");
  };
  EXPECT_EQ(loading(Build(Request(kMegatron64, "0,9"), FakeHost())), "(unset)");  // two GPUs, one rank each
  EXPECT_EQ(loading(Build(Request(kMegatron64, "0,1"), FakeHost({}, 1))), "EAGER");
  PlanRequest swap = Request(kMegatron64, "0");
  swap.swap.enabled = true;
  EXPECT_EQ(loading(Build(swap, FakeHost())), "EAGER");

  Plan mine = Build(Request(kMegatron64, "0,1"), FakeHost({{"CUDA_MODULE_LOADING", "LAZY"}}, 1));
  EXPECT_EQ(loading(mine), "(unset)");  // theirs passes through the worker's inherited environment
  bool warned = false;
  for (const std::string& w : mine.warnings) warned |= w.find("CUDA_MODULE_LOADING=LAZY kept") != std::string::npos;
  EXPECT_TRUE(warned);
  Plan alone = Build(Request(kMegatron64, "0"), FakeHost({{"CUDA_MODULE_LOADING", "LAZY"}}));
  for (const std::string& w : alone.warnings) EXPECT_EQ(w.find("CUDA_MODULE_LOADING"), std::string::npos) << w;
}

TEST(Plan, UserEnvironmentKeptAndPrepended) {
  Plan p = Build(Request(kMegatron64),
                 FakeHost({{"LD_PRELOAD", "/usr/lib/libtcmalloc.so"}, {"PYTHONPATH", "/src/megatron"},
                           {"OMP_NUM_THREADS", "4"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}}));
  auto env = EnvMap(p.env);
  EXPECT_EQ(env["LD_PRELOAD"], "/opt/prism/lib/libprism.so:/usr/lib/libtcmalloc.so");
  EXPECT_EQ(env["PYTHONPATH"], "/opt/prism/lib/python:/src/megatron");
  EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u);  // the user's value stays
  bool noted = false;
  for (const std::string& n : p.notes) noted |= n.find("TORCH_NCCL_ASYNC_ERROR_HANDLING=1") != std::string::npos;
  EXPECT_TRUE(noted);

  std::vector<std::string> full =
      WorkerEnvironment(p, p.workers[0], {"HOME=/root", "RANK=99", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "X=a=b"});
  std::map<std::string, std::string> m;
  for (const std::string& kv : full) m[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  EXPECT_EQ(m["HOME"], "/root");
  EXPECT_EQ(m["X"], "a=b");
  EXPECT_EQ(m["RANK"], "0");
  EXPECT_EQ(m["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "0");
  EXPECT_EQ(full.size(), m.size());  // no duplicates

  SetStorePort(&p, 41234);
  EXPECT_EQ(EnvMap(p.env)["MASTER_PORT"], "41234");

  // Without libprism.so the plan refuses, unless the launch alone is wanted.
  HostInfo h = FakeHost();
  h.libprism.clear();
  EXPECT_NE(BuildError(Request(kMegatron64), h).find("libprism.so"), std::string::npos);
  PlanRequest req = Request(kMegatron64);
  req.preload = false;
  p = Build(req, h);
  EXPECT_EQ(EnvMap(p.env).count("LD_PRELOAD"), 0u);
}

TEST(Plan, JoinACoordinator) {
  PlanRequest req = Request(kMegatron64);
  req.coordinator = "node0:7000";
  Plan p = Build(req, FakeHost());
  EXPECT_FALSE(p.start_coordinator);
  auto env = EnvMap(p.env);
  EXPECT_EQ(env["MASTER_ADDR"], "node0");
  EXPECT_EQ(env["MASTER_PORT"], "7000");
  EXPECT_EQ(env.count("PRISM_COORD_SOCKET"), 0u);
  EXPECT_EQ(p.warnings.size(), 1u);  // no event bus address
  req.coordinator = "node0";
  EXPECT_NE(BuildError(req, FakeHost()).find("HOST:PORT"), std::string::npos);

  // A coordinator.json (prism-run coordinator --out DIR): store and event bus.
  std::string dir = ::testing::TempDir() + "/prism-join-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/coordinator.json");
    f << R"({"version":1,"store_host":"node0","store_port":7001,"socket":"/tmp/c/coord.sock","bus_tcp":"node0:7002"})";
  }
  req.coordinator = dir;
  p = Build(req, FakeHost());
  env = EnvMap(p.env);
  EXPECT_EQ(env["MASTER_ADDR"], "node0");
  EXPECT_EQ(env["MASTER_PORT"], "7001");
  EXPECT_EQ(env["PRISM_COORD_ADDR"], "node0:7002");
  EXPECT_EQ(env.count("PRISM_COORD_SOCKET"), 0u);
  {
    std::ofstream f(dir + "/coordinator.json");
    f << R"({"version":1,"store_host":"127.0.0.1","store_port":7001,"socket":"/tmp/c/coord.sock","bus_tcp":""})";
  }
  req.coordinator = dir + "/coordinator.json";
  p = Build(req, FakeHost());
  EXPECT_EQ(EnvMap(p.env)["PRISM_COORD_SOCKET"], "/tmp/c/coord.sock");
  {
    std::ofstream f(dir + "/coordinator.json");
    f << "{}";
  }
  EXPECT_NE(BuildError(req, FakeHost()).find("not a coordinator.json"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Plan, JsonDocument) {
  Plan p = Build(Request(kMegatron64, "0,63"), FakeHost());
  auto j = PlanToJson(p);
  EXPECT_EQ(j["world_size"], 64);
  EXPECT_EQ(j["gpus_per_node"], 8);
  EXPECT_EQ(j["layout"]["tp"], 2);
  EXPECT_EQ(j["layout"]["pp"], 2);
  EXPECT_EQ(j["layout"]["dp"], 16);
  EXPECT_EQ(j["layout"]["cp"], 1);
  EXPECT_EQ(j["layout"]["ep"], 1);
  EXPECT_EQ(j["layout"]["order"], "tp-cp-ep-dp-pp");
  ASSERT_EQ(j["real_ranks"].size(), 2u);
  EXPECT_EQ(j["real_ranks"][1]["rank"], 63);
  EXPECT_EQ(j["real_ranks"][1]["gpu"], 1);
  EXPECT_EQ(j["real_ranks"][1]["node"], 7);
  EXPECT_EQ(j["real_ranks"][1]["local_rank"], 7);
  EXPECT_EQ(j["command"][2], "pretrain_gpt.py");
  EXPECT_EQ(j["env"]["WORLD_SIZE"], "64");
  EXPECT_EQ(j["workers"][1]["env"]["RANK"], "63");
  std::string text = PlanToText(p);
  EXPECT_NE(text.find("64 ranks = 8 nodes x 8"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 63"), std::string::npos) << text;
}

TEST(Plan, MegatronMembershipNamesGroupsInCreationOrder) {
  std::string err;
  auto l = world::ParseLayout("tp=2,pp=2,gloo=0", &err);
  ASSERT_TRUE(l && world::ResolveLayout(&*l, 8, "", &err));
  auto w = world::World::Make(*l, 8, &err);
  ASSERT_TRUE(w);
  MegatronMembership m(*w);
  // Group "1" is Megatron's first new_group: GTP_WEIGHT_REMAT_GROUP of rank 0 (a singleton).
  EXPECT_EQ(*m.Members("1"), (std::vector<int>{0}));
  EXPECT_EQ(m.Desc("1"), "GTP_WEIGHT_REMAT_GROUP");
  // 8 GTP singletons, then DATA_PARALLEL_GROUP_WITH_CP [0, 2] as "9".
  EXPECT_EQ(*m.Members("9"), (std::vector<int>{0, 2}));
  EXPECT_EQ(m.Desc("9"), "DATA_PARALLEL_GROUP_WITH_CP");
  EXPECT_FALSE(m.Members("0"));  // the default group is not Megatron's
  EXPECT_FALSE(m.Members("x"));
  EXPECT_FALSE(m.Members("100000"));
}

// The real binary, as a user (or CI) calls it.
TEST(Plan, PrismRunDryRunJson1024) {
  const char* bin = std::getenv("PRISM_RUN");
  ASSERT_NE(bin, nullptr) << "PRISM_RUN is not set (ctest sets it)";
  std::string cmd = std::string(bin) +
                    " --dry-run --json --out /tmp/prism-plan-test torchrun --nnodes 128 --nproc-per-node 8 "
                    "pretrain_gpt.py --num-layers 2 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
                    "--disable-gloo-process-groups 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  int rc = pclose(f);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["world_size"], 1024);
  EXPECT_EQ(j["gpus_per_node"], 8);
  EXPECT_EQ(j["layout"]["tp"], 2);
  EXPECT_EQ(j["layout"]["pp"], 2);
  EXPECT_EQ(j["layout"]["dp"], 256);
  EXPECT_EQ(j["layout"]["cp"], 1);
  EXPECT_EQ(j["layout"]["ep"], 1);
  EXPECT_EQ(j["layout"]["order"], "tp-cp-ep-dp-pp");
  ASSERT_EQ(j["real_ranks"].size(), 1u);
  EXPECT_EQ(j["real_ranks"][0]["rank"], 0);
  EXPECT_EQ(j["real_ranks"][0]["gpu"], 0);
  // The script and its arguments, untouched, at the end of the command.
  auto c = j["command"].get<std::vector<std::string>>();
  ASSERT_GE(c.size(), 10u);
  EXPECT_EQ(std::vector<std::string>(c.end() - 8, c.end()),
            (std::vector<std::string>{"pretrain_gpt.py", "--num-layers", "2", "--tensor-model-parallel-size", "2",
                                      "--pipeline-model-parallel-size", "2", "--disable-gloo-process-groups"}));
  EXPECT_EQ(j["env"]["WORLD_SIZE"], "1024");
  EXPECT_EQ(j["env"]["TORCHELASTIC_USE_AGENT_STORE"], "True");
  EXPECT_EQ(j["env"]["TORCH_NCCL_RANKS_PER_ROOT"], "1024");
  EXPECT_EQ(j["workers"][0]["env"]["RANK"], "0");

  // A torchrun line prism cannot understand: exit 2 and a message naming the option.
  cmd = std::string(bin) + " --dry-run torchrun --nproc-per-node 8 --bogus-flag train.py 2>&1";
  f = popen(cmd.c_str(), "r");
  out.clear();
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  rc = pclose(f);
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  EXPECT_NE(out.find("--bogus-flag"), std::string::npos) << out;
}

// ---- collect's real ranks for expert-parallel (MoE) jobs: replica 0, and its ep peers with --real-routing ----

const char* kMoe64 =
    "torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --tensor-model-parallel-size 2 "
    "--pipeline-model-parallel-size 2 --expert-model-parallel-size 2 --num-experts 4 --disable-gloo-process-groups";
const char* kMoe8 =
    "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --expert-model-parallel-size 4 "
    "--num-experts 8 --disable-gloo-process-groups";

std::vector<int> RealRanks(const Plan& p) {
  std::vector<int> out;
  for (const RealRank& r : p.real) out.push_back(r.rank);
  return out;
}

world::World WorldOf(const Plan& p) {
  std::string err;
  auto w = world::World::Make(p.layout, p.nproc_per_node, &err);
  EXPECT_TRUE(w) << err;
  return *w;
}

bool AnyContains(const std::vector<std::string>& lines, const std::string& part) {
  for (const std::string& l : lines)
    if (l.find(part) != std::string::npos) return true;
  return false;
}

// Megatron carves ep out of dp: replica 0 of world 64 tp 2 pp 2 ep 2 holds ep 0 only, so it does not cover the
// ep-1 classes; the plan says the graph will assume EP symmetry for them and names --real-routing.
TEST(Plan, CollectOfAnExpertParallelJobRunsReplicaZeroAndWarnsOfEpSymmetry) {
  PlanRequest req = Request(kMoe64);
  req.one_replica = true;
  Plan p = Build(req, FakeHost());
  EXPECT_EQ(p.layout.ep, 2);
  EXPECT_EQ(p.layout.dp, 16);
  EXPECT_EQ(RealRanks(p), (std::vector<int>{0, 1, 32, 33}));
  for (const RealRank& r : p.real) {
    EXPECT_EQ(r.coords.dp, 0);
    EXPECT_EQ(r.coords.ep, 0);
    EXPECT_EQ(r.why, "replica 0");
  }
  const world::World w = WorldOf(p);
  size_t covered = 0, classes = 0, mirrored = 0;
  EXPECT_FALSE(CoversEveryClass(w, RealRanks(p), &covered, &classes));
  EXPECT_EQ(covered, 4u);
  EXPECT_EQ(classes, 8u);
  EXPECT_TRUE(CoversEveryClassOrEpStandIn(w, RealRanks(p), &mirrored));
  EXPECT_EQ(mirrored, 4u);
  EXPECT_TRUE(AnyContains(p.warnings, "EP symmetry assumed")) << PlanToText(p);
  EXPECT_TRUE(AnyContains(p.warnings, "--real-routing")) << PlanToText(p);
  EXPECT_FALSE(PlanToJson(p).at("real_routing").get<bool>());

  // world 8, tp 1, ep 4: replica 0 is rank 0 alone.
  PlanRequest req8 = Request(kMoe8);
  req8.one_replica = true;
  Plan p8 = Build(req8, FakeHost());
  EXPECT_EQ(p8.layout.ep, 4);
  EXPECT_EQ(RealRanks(p8), std::vector<int>{0});
  EXPECT_TRUE(AnyContains(p8.warnings, "EP symmetry assumed"));
}

// --real-routing: each replica-0 rank's EXPERT_MODEL_PARALLEL_GROUP joins, sorted, each rank once; every class is
// then covered by a real rank, and the plan says why each rank runs.
TEST(Plan, CollectRealRoutingAddsTheExpertParallelPeers) {
  PlanRequest req = Request(kMoe64);
  req.one_replica = true;
  req.real_routing = true;
  Plan p = Build(req, FakeHost());
  EXPECT_EQ(RealRanks(p), (std::vector<int>{0, 1, 2, 3, 32, 33, 34, 35}));
  const world::World w = WorldOf(p);
  for (const RealRank& r : p.real) {
    if (r.coords.dp == 0) {
      EXPECT_EQ(r.why, "replica 0") << r.rank;
    } else {
      EXPECT_EQ(r.coords.ep, 1) << r.rank;
      EXPECT_EQ(r.why, "real_routing: expert-parallel peer of rank " + std::to_string(r.rank - 2)) << r.rank;
      EXPECT_EQ(w.GroupOf("ep", r.rank), (std::vector<int>{r.rank - 2, r.rank}));
    }
  }
  EXPECT_TRUE(CoversEveryClass(w, RealRanks(p)));
  EXPECT_FALSE(AnyContains(p.warnings, "EP symmetry"));
  EXPECT_EQ(p.workers.size(), 8u);
  EXPECT_EQ(EnvMap(p.env)["PRISM_REAL_RANKS"], "0,1,2,3,32,33,34,35");
  auto j = PlanToJson(p);
  EXPECT_TRUE(j.at("real_routing").get<bool>());
  EXPECT_EQ(j.at("real_ranks").at(2).at("why"), "real_routing: expert-parallel peer of rank 0");
  EXPECT_EQ(j.at("real_ranks").at(2).at("coords").at("ep"), 1);
  std::string text = PlanToText(p);
  EXPECT_NE(text.find("real routing   on"), std::string::npos) << text;
  EXPECT_NE(text.find("(real_routing: expert-parallel peer of rank 33)"), std::string::npos) << text;

  // world 8, tp 1, ep 4: rank 0 and its expert-parallel group, ranks 0-3.
  PlanRequest req8 = Request(kMoe8);
  req8.one_replica = true;
  req8.real_routing = true;
  Plan p8 = Build(req8, FakeHost());
  EXPECT_EQ(RealRanks(p8), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(CoversEveryClass(WorldOf(p8), RealRanks(p8)));

  // A job without expert parallelism: replica 0 as before, and a note.
  PlanRequest dense = Request(kMegatron64);
  dense.one_replica = true;
  dense.real_routing = true;
  Plan pd = Build(dense, FakeHost());
  EXPECT_EQ(RealRanks(pd), (std::vector<int>{0, 1, 32, 33}));
  EXPECT_TRUE(AnyContains(pd.notes, "no expert parallelism"));
  EXPECT_TRUE(pd.warnings.empty()) << pd.warnings.front();

  // Not collect: refused.
  PlanRequest emulate = Request(kMoe64);
  emulate.real_routing = true;
  EXPECT_NE(BuildError(emulate, FakeHost()).find("--real-routing belongs to collect"), std::string::npos);
}

// --payload recorded after a collect of an ep 2 job: a rank replays its own payloads when it ran, else those of a
// collected rank of its class (--real-routing ran the ep-1 ranks), else its replica-0 rank (ep 0, as the graph).
TEST(Plan, RecordedPayloadsOfExpertParallelRanks) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("prism_plan_ep_payloads_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "payloads");
  for (int r : {0, 2}) std::ofstream(dir / "payloads" / ("rank" + std::to_string(r) + ".bin")) << "PRSMPAY1";
  auto file_of = [&](const std::string& ranks) {
    PlanRequest req = Request(kMoe64, ranks);
    req.payload = "recorded";
    req.payload_dir = dir.string();
    Plan p = Build(req, FakeHost());
    return p.workers.empty() ? std::string() : EnvMap(p.workers[0].env)["PRISM_PAYLOAD_FILE"];
  };
  const std::string p0 = (dir / "payloads" / "rank0.bin").string(), p2 = (dir / "payloads" / "rank2.bin").string();
  EXPECT_EQ(file_of("2"), p2);  // its own
  EXPECT_EQ(file_of("6"), p2);  // tp 0 pp 0 ep 1, like rank 2
  EXPECT_EQ(file_of("4"), p0);  // ep 0, like rank 0
  fs::remove(dir / "payloads" / "rank2.bin");
  EXPECT_EQ(file_of("6"), p0);  // no ep-1 rank collected: the ep-0 rank, as the graph's class
  fs::remove_all(dir);
}

}  // namespace
}  // namespace prism::launcher
