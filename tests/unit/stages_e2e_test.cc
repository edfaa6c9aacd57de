// The default procedure (launcher/stages.h) at the user's level, without a GPU: `prism-run --ranks 0 torchrun ...`
// collects, fills and emulates; the graph cache makes a second run of the same job skip to the emulation, a changed
// job miss, --refresh-graph start over; --policy mirror is one emulation. The job is
// tests/data/launcher/fake_worker.py replaying the event files of a real Megatron collect
// (tests/data/graph/megatron_w64_collect: world 64, tp 2, pp 2), so every stage's graph is a real one.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "e2e_harness.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kSource = PRISM_SOURCE_DIR;
const std::string kRecorded = kSource + "/tests/data/graph/megatron_w64_collect";

fs::path FreshDir(const std::string& name) { return prism::test_util::FreshDir("stages", name); }

using prism::test_util::ReadJson;
int RunPrism(const std::string& env_prefix, const std::string& args, std::string* out) {
  return prism::test_util::RunPrismWithEnv(env_prefix, args, out);
}

class StagesE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(std::getenv("PRISM_RUN"), nullptr) << "PRISM_RUN is not set (ctest sets it)";
    if (std::system("python3 -c 'import json, socket, struct' >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "python3 is needed for the fake worker";
    cache_ = FreshDir("cache-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    job_dir_ = FreshDir("job-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::create_directories(job_dir_);
    // The job's script in a folder of its own: its *.py files are part of the cache key.
    fs::copy_file(kSource + "/tests/data/launcher/fake_worker.py", job_dir_ / "pretrain_fake.py");
  }
  void TearDown() override {
    fs::remove_all(cache_);
    fs::remove_all(job_dir_);
  }
  std::string Job(const std::string& extra = "") const {
    return "torchrun --nnodes 8 --nproc-per-node 8 " + (job_dir_ / "pretrain_fake.py").string() +
           " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2" + extra;
  }
  std::string Common(const fs::path& out) const {
    return "--graph-cache " + cache_.string() + " --out " + out.string() + " --gpus 1 --no-preload --quiet ";
  }
  json DryRun(const std::string& args) const {
    std::string log;
    int rc = RunPrism("", "--dry-run --json --graph-cache " + cache_.string() + " " + args, &log);
    EXPECT_EQ(rc, 0) << log;
    const size_t at = log.find('{');
    return at == std::string::npos ? json() : json::parse(log.substr(at), nullptr, false);
  }
  fs::path cache_, job_dir_;
};

TEST_F(StagesE2E, DryRunSaysThePolicyTheStagesAndTheCache) {
  json j = DryRun("--ranks 0 " + Job());
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["policy"], "graph");
  ASSERT_EQ(j["stages"].size(), 3u);
  EXPECT_EQ(j["stages"][0]["name"], "collect");
  EXPECT_EQ(j["stages"][1]["name"], "fill");
  EXPECT_EQ(j["stages"][2]["name"], "emulate");
  EXPECT_EQ(j["stages"][0]["ranks"], json({0, 1, 32, 33}));  // replica 0 of tp2 pp2 at world 64
  EXPECT_EQ(j["stages"][0]["real_routing"], false);
  EXPECT_EQ(j["stages"][1]["tolerance_pct"], 0.5);
  EXPECT_EQ(j["stages"][1]["max_rounds"], 4);
  EXPECT_EQ(j["stages"][2]["ranks"], json({0}));
  EXPECT_EQ(j["graph_cache"]["root"], cache_.string());
  EXPECT_EQ(j["graph_cache"]["hit"], false);
  EXPECT_EQ(j["graph_cache"]["dir"].get<std::string>().rfind(cache_.string(), 0), 0u);
  // --policy mirror: one emulation, no cache.
  json m = DryRun("--policy mirror --ranks 0 " + Job());
  EXPECT_EQ(m["policy"], "mirror");
  ASSERT_EQ(m["stages"].size(), 1u);
  EXPECT_EQ(m["stages"][0]["name"], "emulate");
  EXPECT_FALSE(m.contains("graph_cache"));
  // A given graph: one emulation against it.
  json g = DryRun("--graph " + kSource + "/examples/graphs/gpt-tp2-pp2-dp2.prism.json --ranks 0 " + Job());
  EXPECT_EQ(g["policy"], "graph");
  ASSERT_EQ(g["stages"].size(), 1u);
  // ep > 1: the collect runs the expert-parallel peers too (real routing).
  json e = DryRun("--ranks 0 " + Job(" --expert-model-parallel-size 2 --num-experts 4"));
  EXPECT_EQ(e["stages"][0]["real_routing"], true);
  EXPECT_GT(e["stages"][0]["ranks"].size(), 4u);
  // The text form says it in words.
  std::string log;
  ASSERT_EQ(RunPrism("", "--dry-run --graph-cache " + cache_.string() + " --ranks 0 " + Job(), &log), 0) << log;
  EXPECT_NE(log.find("policy graph (the faithful default"), std::string::npos) << log;
  EXPECT_NE(log.find("1. collect: ranks 0,1,32,33 (data-parallel replica 0) for real"), std::string::npos) << log;
  // A what-if applies to the emulation against the filled graph: checked before anything runs.
  EXPECT_EQ(DryRun("--what-if straggler=4:1.5 --ranks 0 " + Job())["policy"], "graph");
  EXPECT_EQ(RunPrism("", "--dry-run --graph-cache " + cache_.string() + " --what-if straggler=0:1.5 --ranks 0 " + Job(),
                     &log), 2) << log;
  EXPECT_NE(log.find("runs for real"), std::string::npos) << log;
  // Values are checked where they are parsed, the same under both policies: a topology that is no preset and no
  // file, an empty rank list.
  for (const char* policy : {"", "--policy mirror "}) {
    EXPECT_EQ(RunPrism("", std::string("--dry-run ") + policy + "--topology nosuch " + Job(), &log), 2) << log;
    EXPECT_NE(log.find("--topology nosuch"), std::string::npos) << log;
    EXPECT_EQ(RunPrism("", std::string("--dry-run ") + policy + "--ranks '' " + Job(), &log), 2) << log;
    EXPECT_NE(log.find("no rank given"), std::string::npos) << log;
  }
  // Contradictions and multi-host are refused or said.
  EXPECT_EQ(RunPrism("", "--dry-run --policy mirror --graph " + kSource +
                             "/examples/graphs/gpt-tp2-pp2-dp2.prism.json " + Job(), &log), 2) << log;
  EXPECT_EQ(RunPrism("", "--dry-run --policy graph --listen 0.0.0.0 " + Job(), &log), 2) << log;
  EXPECT_EQ(RunPrism("", "--dry-run --policy nosuch " + Job(), &log), 2) << log;
}

TEST_F(StagesE2E, TheCacheKeyFollowsWhatDeterminesTheGraph) {
  const std::string key = DryRun("--ranks 0 " + Job())["graph_cache"]["key"];
  ASSERT_EQ(key.size(), 32u);
  // Not in it: which ranks run for real, torchrun's rendezvous options.
  EXPECT_EQ(DryRun("--ranks 5 " + Job())["graph_cache"]["key"], key);
  EXPECT_EQ(DryRun("--ranks 0 torchrun --master-port 29999 --nnodes 8 --nproc-per-node 8 " +
                   (job_dir_ / "pretrain_fake.py").string() +
                   " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2")["graph_cache"]["key"], key);
  // In it: an argument of the script, the layout, the world, the script's files, the environment, the topology.
  EXPECT_NE(DryRun("--ranks 0 " + Job(" --lr 0.1"))["graph_cache"]["key"], key);
  EXPECT_NE(DryRun("--ranks 0 torchrun --nnodes 16 --nproc-per-node 8 " + (job_dir_ / "pretrain_fake.py").string() +
                   " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2")["graph_cache"]["key"], key);
  EXPECT_NE(DryRun("--ranks 0 --topology h100-8x400g " + Job())["graph_cache"]["key"], key);
  std::string log;
  RunPrism("NCCL_ALGO=Ring", "--dry-run --json --graph-cache " + cache_.string() + " --ranks 0 " + Job(), &log);
  EXPECT_EQ(log.find(key), std::string::npos) << "NCCL_ALGO must change the key";
  RunPrism("SOME_UNRELATED_VAR=1", "--dry-run --json --graph-cache " + cache_.string() + " --ranks 0 " + Job(), &log);
  EXPECT_NE(log.find(key), std::string::npos) << "an unrelated variable must not change the key";
  std::ofstream(job_dir_ / "model.py") << "# a module the script imports\n";
  EXPECT_NE(DryRun("--ranks 0 " + Job())["graph_cache"]["key"], key);
}

// One job spelled several ways is one cache entry: sizes are keyed as bytes (the default as the size libprism uses),
// a script's "--opt=v" as "--opt v", prism's own "--opt=v" as "--opt v", torchrun's dashes as underscores.
TEST_F(StagesE2E, EquivalentSpellingsShareAKey) {
  const std::string key = DryRun("--ranks 0 " + Job())["graph_cache"]["key"];
  ASSERT_EQ(key.size(), 32u);
  for (const char* size : {"4M", "4194304", "4m", "4MiB", "4096K", "4mb"})
    EXPECT_EQ(DryRun(std::string("--payload-max-bytes ") + size + " --ranks 0 " + Job())["graph_cache"]["key"], key)
        << "--payload-max-bytes " << size;
  EXPECT_EQ(DryRun("--payload-max-bytes=4M --ranks 0 " + Job())["graph_cache"]["key"], key);
  EXPECT_NE(DryRun("--payload-max-bytes 8M --ranks 0 " + Job())["graph_cache"]["key"], key);
  EXPECT_NE(DryRun("--payload-max-bytes 0 --ranks 0 " + Job())["graph_cache"]["key"], key);
  const std::string lr = DryRun("--ranks 0 " + Job(" --lr 0.1"))["graph_cache"]["key"];
  EXPECT_NE(lr, key);
  EXPECT_EQ(DryRun("--ranks 0 " + Job(" --lr=0.1"))["graph_cache"]["key"], lr);
  EXPECT_EQ(DryRun("--ranks 0 torchrun --nnodes=8 --nproc_per_node=8 " + (job_dir_ / "pretrain_fake.py").string() +
                   " --tensor-model-parallel-size=2 --pipeline-model-parallel-size 2")["graph_cache"]["key"], key);
  EXPECT_EQ(DryRun("--topology=h100-8x400g --ranks 0 " + Job())["graph_cache"]["key"],
            DryRun("--topology h100-8x400g --ranks 0 " + Job())["graph_cache"]["key"]);
  // A size that is none is refused where it is parsed, naming the flag.
  std::string log;
  EXPECT_EQ(RunPrism("", "--dry-run --payload-max-bytes 4Q " + Job(), &log), 2) << log;
  EXPECT_NE(log.find("--payload-max-bytes"), std::string::npos) << log;
  EXPECT_NE(log.find("4Q"), std::string::npos) << log;
  EXPECT_EQ(RunPrism("", "--dry-run --payload-max-bytes 1e300 " + Job(), &log), 2) << log;
}

TEST_F(StagesE2E, CollectsFillsEmulatesThenHitsTheCache) {
  const fs::path out = FreshDir("run1"), out2 = FreshDir("run2");
  const std::string env = "FAKE_EVENTS_FROM=" + kRecorded;
  std::string log;
  int rc = RunPrism(env, Common(out) + "--ranks 0 " + Job(), &log);
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("prism: policy graph (the faithful default): collect -> fill -> emulate; graph cache"),
            std::string::npos) << log;
  EXPECT_NE(log.find("(miss)"), std::string::npos) << log;
  EXPECT_NE(log.find("prism: stage 1/3 collect: ranks 0,1,32,33 (data-parallel replica 0) for real"),
            std::string::npos) << log;
  EXPECT_NE(log.find("prism: stage 2/3 fill:"), std::string::npos) << log;
  // The same recorded compute in every slice: the second round moves nothing.
  EXPECT_NE(log.find("converged after 2 round(s)"), std::string::npos) << log;
  // Each slice says its rank's compute per iteration and the class's earlier slices (two rounds: two samples).
  EXPECT_NE(log.find("prism fill: rank 0: compute "), std::string::npos) << log;
  EXPECT_NE(log.find(" ms per iteration in this slice (its class's slices so far: "), std::string::npos) << log;
  // The tensor-parallel positions 1 and 33 take the slices of 0 and 32 (same operations in the same order).
  EXPECT_NE(log.find("2 symmetric tensor-parallel position(s)"), std::string::npos) << log;
  EXPECT_NE(log.find("prism: stage 3/3 emulate: rank(s) 0 against"), std::string::npos) << log;
  EXPECT_NE(log.find("policy graph: virtual ranks replayed from"), std::string::npos) << log;
  EXPECT_NE(log.find("fill converged after 2 round(s)"), std::string::npos) << log;
  json rep = ReadJson(out / "report.json");
  ASSERT_TRUE(rep.is_object()) << log;
  EXPECT_EQ(rep["policy"], "graph");
  EXPECT_EQ(rep["graph_cache"]["hit"], false);
  const std::string graph = rep["graph"];
  EXPECT_TRUE(fs::exists(graph)) << graph;
  EXPECT_EQ(graph.rfind(cache_.string(), 0), 0u) << graph;
  EXPECT_EQ(rep["fill"]["converged"], true);
  EXPECT_EQ(rep["fill"]["rounds"], 2);
  EXPECT_LE(rep["fill"]["last_moved_pct"].get<double>(), 0.5);
  ASSERT_EQ(rep["stages"].size(), 3u);
  for (const auto& st : rep["stages"]) EXPECT_GT(st["wall_s"].get<double>(), 0.0) << st.dump();
  EXPECT_EQ(rep["stages"][0]["cached"], false);
  // The emulation ran against the filled graph with the collect's recorded payloads of rank 0's class.
  json cmd = ReadJson(out / "command.json");
  EXPECT_EQ(cmd["workers"][0]["env"]["PRISM_GRAPH"], graph);
  const std::string payload = cmd["workers"][0]["env"]["PRISM_PAYLOAD_FILE"];
  EXPECT_NE(payload.find("/collect/payloads/rank0.bin"), std::string::npos) << payload;

  // Second run of the same job, with a virtual straggler: straight to the emulation, the what-if applied to it.
  rc = RunPrism(env, Common(out2) + "--what-if straggler=32:1.2 --ranks 0 " + Job(), &log);
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("(hit)"), std::string::npos) << log;
  EXPECT_EQ(log.find("stage 1/3 collect: ranks"), std::string::npos) << log;
  EXPECT_NE(log.find("prism: stage 1/3 collect: cached"), std::string::npos) << log;
  EXPECT_NE(log.find("prism: stage 3/3 emulate"), std::string::npos) << log;
  json rep2 = ReadJson(out2 / "report.json");
  EXPECT_EQ(rep2["graph_cache"]["hit"], true);
  EXPECT_EQ(rep2["graph"], graph);
  EXPECT_EQ(rep2["stages"][0]["cached"], true);
  EXPECT_EQ(rep2["stages"][1]["cached"], true);
  EXPECT_EQ(rep2["fill"]["rounds"], 2);
  EXPECT_EQ(ReadJson(out2 / "command.json")["workers"][0]["env"]["PRISM_WHAT_IF"], "straggler=32:1.2");
  // The dry run now says it would hit.
  EXPECT_EQ(DryRun("--ranks 0 " + Job())["graph_cache"]["hit"], true);
  EXPECT_EQ(DryRun("--refresh-graph --ranks 0 " + Job())["graph_cache"]["hit"], false);
  // --refresh-graph collects again.
  rc = RunPrism(env, Common(out2) + "--refresh-graph --ranks 0 " + Job(), &log);
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("(refresh requested)"), std::string::npos) << log;
  EXPECT_NE(log.find("prism: stage 1/3 collect: ranks"), std::string::npos) << log;
  fs::remove_all(out);
  fs::remove_all(out2);
}

TEST_F(StagesE2E, AFailedFillKeepsTheCollectAndTheNextRunResumesThere) {
  const fs::path out = FreshDir("resume");
  const std::string env = "FAKE_EVENTS_FROM=" + kRecorded;
  std::string log;
  // Every run given a graph (the fill's slices) fails: the collect is kept.
  int rc = RunPrism(env + " FAKE_FAIL_IF_GRAPH=1", Common(out) + "--ranks 0 " + Job(), &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("prism: stage 1/3 collect: done"), std::string::npos) << log;
  EXPECT_NE(log.find("the collect stays cached"), std::string::npos) << log;
  rc = RunPrism(env, Common(out) + "--ranks 0 " + Job(), &log);
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("(collect cached, fill missing)"), std::string::npos) << log;
  EXPECT_NE(log.find("prism: stage 1/3 collect: cached"), std::string::npos) << log;
  EXPECT_NE(log.find("prism: stage 2/3 fill: done"), std::string::npos) << log;
  fs::remove_all(out);
}

// A fill stopped part way (here: its third slice fails) goes on where it stopped: the next run reuses the slices
// that ended well and runs only the rest; the result is the same converged graph.
TEST_F(StagesE2E, AnInterruptedFillResumesAfterItsLastFinishedSlice) {
  const fs::path out = FreshDir("resume-mid");
  const fs::path counter = cache_.string() + "-graph-runs";
  const std::string env = "FAKE_EVENTS_FROM=" + kRecorded;
  std::string log;
  int rc = RunPrism(env + " FAKE_FAIL_IF_GRAPH=" + counter.string() + ":2", Common(out) + "--ranks 0 " + Job(), &log);
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(log.find("round 2, slice rank 0 (1 of 2"), std::string::npos) << log;
  EXPECT_NE(log.find("the collect stays cached"), std::string::npos) << log;
  rc = RunPrism(env, Common(out) + "--ranks 0 " + Job(), &log);
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("resuming: 2 slice(s) of the earlier fill reused, from round 2 slice 1"), std::string::npos) << log;
  EXPECT_EQ(log.find("round 1, slice"), std::string::npos) << log;
  EXPECT_NE(log.find("converged after 2 round(s)"), std::string::npos) << log;
  json rep = ReadJson(out / "report.json");
  EXPECT_EQ(rep["fill"]["rounds"], 2);
  EXPECT_EQ(rep["fill"]["converged"], true);
  fs::remove_all(out);
  fs::remove(counter);
}

TEST_F(StagesE2E, AFillThatKeepsMovingSaysItDidNotConverge) {
  const fs::path out = FreshDir("noconv");
  const fs::path counter = cache_.string() + "-counter";
  const std::string env = "FAKE_EVENTS_FROM=" + kRecorded + " FAKE_ALTERNATE=" + counter.string();
  std::string log;
  int rc = RunPrism(env, Common(out) + "--fill-rounds 2 --ranks 0 " + Job(), &log);
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("NOT converged: 2 round(s)"), std::string::npos) << log;
  json rep = ReadJson(out / "report.json");
  EXPECT_EQ(rep["fill"]["converged"], false);
  EXPECT_EQ(rep["fill"]["rounds"], 2);
  EXPECT_GT(rep["fill"]["last_moved_pct"].get<double>(), 0.5);
  EXPECT_NE(log.find("fill NOT converged after 2 round(s)"), std::string::npos) << log;
  // Why it did not: every other slice of a rank ran 1.3x slower, and the line says the noise is above the tolerance.
  EXPECT_NE(log.find("the slices' own compute moved by up to"), std::string::npos) << log;
  EXPECT_GT(rep["fill"]["compute_spread_pct"].get<double>(), 20.0) << rep["fill"].dump();
  fs::remove_all(out);
  for (const char* r : {".rank0", ".rank1", ".rank32", ".rank33"}) fs::remove(counter.string() + r);
}

TEST_F(StagesE2E, PolicyMirrorRunsOneEmulationAndSaysItIsNotFaithful) {
  const fs::path out = FreshDir("mirror");
  std::string log;
  int rc = RunPrism("FAKE_ITERS=3 FAKE_ITER_MS=5", Common(out) + "--policy mirror --ranks 0 " + Job(), &log);
  ASSERT_EQ(rc, 0) << log;
  EXPECT_EQ(log.find("stage 1/3"), std::string::npos) << log;
  EXPECT_NE(log.find("policy mirror (quick, not faithful"), std::string::npos) << log;
  EXPECT_NE(log.find("policy mirror: quick, NOT faithful"), std::string::npos) << log;
  json rep = ReadJson(out / "report.json");
  EXPECT_EQ(rep["policy"], "mirror");
  EXPECT_FALSE(rep.contains("graph_cache"));
  EXPECT_FALSE(fs::exists(cache_)) << "--policy mirror must not touch the graph cache";
  fs::remove_all(out);
}

}  // namespace
