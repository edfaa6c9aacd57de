// report.json: aggregation of rank event files (what the launcher writes), show, and diff (the CI gate), on
// hand-written reports in tests/data/launcher/reports/, and through prism-run itself.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "analysis/report_compare.h"
#include "analysis/run_report.h"

namespace prism::analysis {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string Data(const std::string& rel) { return std::string(PRISM_SOURCE_DIR) + "/tests/data/launcher/" + rel; }

json Load(const std::string& rel) {
  std::string err;
  auto j = LoadReport(Data(rel), &err);
  EXPECT_TRUE(j) << err;
  return j ? *j : json();
}

TEST(ReportDiff, IterationTimeRegression) {
  std::string err;
  auto d = DiffReports(Load("reports/base"), Load("reports/slower"), 5, &err);
  ASSERT_TRUE(d) << err;
  EXPECT_TRUE(d->regression);
  EXPECT_NE(d->text.find("+12.5%"), std::string::npos) << d->text;
  EXPECT_NE(d->text.find("REGRESSION"), std::string::npos) << d->text;
  d = DiffReports(Load("reports/base"), Load("reports/slower"), 15, &err);
  EXPECT_FALSE(d->regression) << d->text;
  d = DiffReports(Load("reports/base"), Load("reports/better"), 0, &err);
  EXPECT_FALSE(d->regression) << d->text;
  d = DiffReports(Load("reports/base"), Load("reports/base"), 0, &err);
  EXPECT_FALSE(d->regression) << d->text;
}

TEST(ReportDiff, PeakMemoryRegressionPerRank) {
  std::string err;
  auto d = DiffReports(Load("reports/base"), Load("reports/fatter"), 5, &err);
  ASSERT_TRUE(d) << err;
  EXPECT_TRUE(d->regression);
  EXPECT_NE(d->text.find("rank 63 peak_memory_bytes"), std::string::npos) << d->text;
  EXPECT_NE(d->text.find("+10.0%"), std::string::npos) << d->text;
  d = DiffReports(Load("reports/base"), Load("reports/fatter"), 10, &err);
  EXPECT_FALSE(d->regression) << d->text;  // exactly 10% is not more than 10%
}

TEST(ReportDiff, SimulateReports) {
  std::string err;
  auto d = DiffReports(Load("reports/simulate"), Load("reports/simulate_slower"), 5, &err);
  ASSERT_TRUE(d) << err;
  EXPECT_TRUE(d->regression);
  EXPECT_NE(d->text.find("not in both"), std::string::npos) << d->text;
  d = DiffReports(Load("reports/simulate"), Load("reports/simulate"), 5, &err);
  EXPECT_FALSE(d->regression);
}

TEST(ReportDiff, NothingToCompare) {
  std::string err;
  EXPECT_FALSE(DiffReports(Load("reports/base"), Load("reports/norun"), 5, &err));
  EXPECT_NE(err.find("B has no iteration_time_s"), std::string::npos) << err;
}

TEST(ReportLoad, BadInputsAreNamed) {
  std::string err;
  EXPECT_FALSE(LoadReport(Data("reports_bad/notjson"), &err));
  EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
  EXPECT_NE(err.find("notjson/report.json"), std::string::npos) << err;
  EXPECT_FALSE(LoadReport(Data("reports_bad/noranks"), &err));
  EXPECT_NE(err.find("\"ranks\""), std::string::npos) << err;
  EXPECT_FALSE(LoadReport(Data("reports_bad/missing"), &err));
  EXPECT_NE(err.find("missing: cannot open"), std::string::npos) << err;
  EXPECT_TRUE(LoadReport(Data("reports/base/report.json"), &err)) << err;  // the file itself works too
}

TEST(ReportShow, Table) {
  std::string t = ShowReport(Load("reports/base"));
  EXPECT_NE(t.find("mode emulate, world 64"), std::string::npos) << t;
  EXPECT_NE(t.find("40.00 ms"), std::string::npos) << t;
  EXPECT_NE(t.find("1.00 GB"), std::string::npos) << t;
  EXPECT_NE(t.find("TENSOR_MODEL_PARALLEL_GROUP"), std::string::npos) << t;
  t = ShowReport(Load("reports/simulate"), 4);
  EXPECT_NE(t.find("... 4 more ranks"), std::string::npos) << t;
}

// Event lines for the wait-per-iteration tests: mark `it` at t_ms (iteration 0 has no duration), and an operation on
// comm 2 arriving at at_ms, held held_ms of which 1 ms is modelled.
std::string IterMark(int it, int64_t t_ms) {
  return json({{"type", "iter"}, {"iteration", it}, {"t_ns", t_ms * 1000000}, {"dur_ns", it ? 100000000 : 0}}).dump();
}
std::string HeldOp(int64_t at_ms, int64_t held_ms) {
  return json({{"type", "op"}, {"comm_id", 2}, {"seq", 0}, {"op", "recv"}, {"arrival_ns", at_ms * 1000000},
               {"release_ns", (at_ms + held_ms) * 1000000}, {"model_dur_ns", 1000000}, {"wait_on_rank", 32}})
      .dump();
}

// Waits per iteration: each operation's wait counts in the iteration whose marks bracket its arrival; the median
// over measured iterations (the first mark's iteration is left out, as for iteration_time_s).
TEST(RunReport, WaitPerIterationIsTheMedianOverMeasuredIterations) {
  RunReport r("/nonexistent", 64, {0});
  r.Feed(0, R"({"type":"comm","comm_id":2,"desc":"PIPELINE_MODEL_PARALLEL_GROUP","nranks":2,"rank":0})");
  // Marks at 0, 100, 200, 300, 400 ms: iterations 1-4; iteration 1 follows the first mark and is measured.
  for (int i = 0; i <= 4; ++i) r.Feed(0, IterMark(i, 100 * i));
  r.Feed(0, HeldOp(-50, 500));  // before the first mark: in no iteration (the total keeps it)
  r.Feed(0, HeldOp(10, 31));    // iteration 1: 30 ms waited
  r.Feed(0, HeldOp(150, 11));   // iteration 2: 10 ms
  r.Feed(0, HeldOp(160, 21));   // iteration 2: +20 ms -> 30 ms
  r.Feed(0, HeldOp(350, 41));   // iteration 4: 40 ms; iteration 3 waited 0
  json rep = r.Build(1.0, {}, json::object());
  const json& r0 = rep["ranks"][0];
  EXPECT_NEAR(r0["wait_s"]["PIPELINE_MODEL_PARALLEL_GROUP"].get<double>(), 0.499 + 0.030 + 0.010 + 0.020 + 0.040,
              1e-9);
  // Per iteration 30, 30, 0, 40 ms: median 30 ms.
  EXPECT_NEAR(r0["wait_per_iteration_s"]["PIPELINE_MODEL_PARALLEL_GROUP"].get<double>(), 0.030, 1e-9);
}

// The lines of operations that arrived after a mark can come before the mark's own line (libprism writes a mark
// once its GPU stamp is read): they wait for it and land in the right iteration.
TEST(RunReport, WaitPerIterationWithMarksReadLate) {
  RunReport r("/nonexistent", 64, {0});
  r.Feed(0, R"({"type":"comm","comm_id":2,"desc":"PP","nranks":2,"rank":0})");
  r.Feed(0, HeldOp(-5, 6));     // before mark 0, read before it: mark 0's iteration (not measured)
  r.Feed(0, IterMark(0, 0));
  r.Feed(0, HeldOp(50, 11));    // iteration 1, read before mark 1
  r.Feed(0, HeldOp(150, 21));   // iteration 2, read before mark 1
  r.Feed(0, IterMark(1, 100));
  r.Feed(0, HeldOp(120, 11));   // iteration 2 (mark 1 known)
  r.Feed(0, IterMark(2, 200));
  r.Feed(0, HeldOp(250, 31));   // iteration 3
  r.Feed(0, IterMark(3, 300));
  r.Feed(0, HeldOp(350, 91));   // after the last mark: an unfinished iteration, not measured
  json rep = r.Build(1.0, {}, json::object());
  // Iterations 1, 2, 3 waited 10, 30, 30 ms: median 30 ms.
  EXPECT_NEAR(rep["ranks"][0]["wait_per_iteration_s"]["PP"].get<double>(), 0.030, 1e-9);
  EXPECT_NEAR(rep["ranks"][0]["wait_s"]["PP"].get<double>(), 0.005 + 0.010 + 0.020 + 0.010 + 0.030 + 0.090, 1e-9);
}

// Gates that opened after their decided release (op lines' opened_ns; the coordinator's decision latency under
// --graph): counted per iteration as the waits are, reported only when the op lines carry the field.
TEST(RunReport, CoordinatorLatencyFromOpenedStamps) {
  auto opened = [](int64_t at_ms, int64_t held_ms, double late_ms) {
    json j = json::parse(HeldOp(at_ms, held_ms));
    j["opened_ns"] = (at_ms + held_ms) * 1000000 + static_cast<int64_t>(late_ms * 1e6);
    return j.dump();
  };
  RunReport r("/nonexistent", 64, {0, 1});
  r.Feed(0, R"({"type":"comm","comm_id":2,"desc":"PP","nranks":2,"rank":0})");
  for (int i = 0; i <= 3; ++i) r.Feed(0, IterMark(i, 100 * i));
  r.Feed(0, opened(10, 2, 5));     // iteration 1: 5 ms late
  r.Feed(0, opened(20, 2, 0));     // on time
  r.Feed(0, opened(150, 2, 1));    // iteration 2: 1 ms
  r.Feed(0, opened(160, 2, 2));    // iteration 2: +2 ms -> 3 ms
  r.Feed(0, opened(250, 2, -0.5)); // opened before its release (clock jitter): 0; iteration 3 waited 0
  // Rank 1: files without the field.
  r.Feed(1, R"({"type":"comm","comm_id":2,"desc":"PP","nranks":2,"rank":1})");
  for (int i = 0; i <= 3; ++i) r.Feed(1, IterMark(i, 100 * i));
  r.Feed(1, HeldOp(10, 2));
  json rep = r.Build(1.0, {}, json::object());
  const json& r0 = rep["ranks"][0];
  ASSERT_TRUE(r0.contains("coordinator_latency_s")) << r0.dump();
  EXPECT_NEAR(r0["coordinator_latency_s"].get<double>(), 0.008, 1e-9);
  // Per iteration 5, 3, 0 ms: median 3 ms.
  EXPECT_NEAR(r0["coordinator_latency_per_iteration_s"].get<double>(), 0.003, 1e-9);
  EXPECT_NEAR(r0["wait_s"]["PP"].get<double>(), 5 * 0.001, 1e-9) << "wait_s unchanged: release - arrival - model";
  const json& r1 = rep["ranks"][1];
  EXPECT_FALSE(r1.contains("coordinator_latency_s")) << r1.dump();
  EXPECT_FALSE(r1.contains("coordinator_latency_per_iteration_s")) << r1.dump();
}

// The launcher's aggregation of event lines.
TEST(RunReport, AggregatesEvents) {
  RunReport r("/nonexistent", 64, {0, 63});
  auto iter = [](int it, double ms, int64_t peak, int64_t torch) {
    return json({{"type", "iter"}, {"iteration", it}, {"t_ns", 1000000000LL + it}, {"dur_ns", int64_t(ms * 1e6)},
                 {"peak_bytes", peak}, {"torch_max_allocated", torch}}).dump();
  };
  r.Feed(0, R"({"type":"hello","v":1,"rank":0,"pid":42,"host":"h","gpu":0,"t_ns":1})");
  r.Feed(0, R"({"type":"comm","comm_id":3,"desc":"DATA_PARALLEL_GROUP","nranks":16,"rank":0})");
  r.Feed(0, iter(0, 500, 10, 9));  // warm-up, excluded
  r.Feed(0, iter(1, 30, 20, 19));
  r.Feed(0, iter(2, 50, 30, 29));
  r.Feed(0, iter(3, 40, 25, 24));
  r.Feed(63, iter(0, 400, 5, -1));
  r.Feed(63, iter(1, 35, 6, -1));
  r.Feed(63, iter(2, 20, 7, -1));
  r.Feed(63, iter(3, 60, 8, -1));
  // Held 3 ms, 1 ms modelled -> 2 ms waiting, on rank 17.
  r.Feed(0, R"({"type":"op","comm_id":3,"seq":0,"op":"all_reduce","arrival_ns":1000000,"release_ns":4000000,"model_dur_ns":1000000,"wait_on_rank":17})");
  r.Feed(0, R"({"type":"op","comm_id":9,"seq":0,"op":"send","arrival_ns":1000000,"release_ns":1500000,"model_dur_ns":2000000,"wait_on_rank":-1})");
  r.Feed(0, R"({"type":"bye","t_ns":5,"peak_bytes":99})");
  r.Feed(63, "this is not json");
  r.Feed(63, R"({"type":"error","what":"lost the coordinator"})");
  r.Feed(63, R"({"type":"from_the_future","x":1})");

  json rep = r.Build(12.5, {"a plan warning"}, json{{"status", "finished"}});
  EXPECT_EQ(rep["world_size"], 64);
  EXPECT_EQ(rep["mode"], "emulate");
  EXPECT_EQ(rep["iterations"], 4);
  EXPECT_EQ(rep["measured_iterations"], 3);
  // Per iteration slowest: 1 -> 35, 2 -> 50, 3 -> 60; median 50 ms.
  EXPECT_NEAR(rep["iteration_time_s"].get<double>(), 0.050, 1e-9);
  EXPECT_EQ(rep["wall_s"], 12.5);
  EXPECT_EQ(rep["status"], "finished");
  const json& r0 = rep["ranks"][0];
  EXPECT_EQ(r0["rank"], 0);
  EXPECT_NEAR(r0["iteration_time_s"].get<double>(), 0.040, 1e-9);  // median of 30, 50, 40
  EXPECT_EQ(r0["peak_memory_bytes"], 99);
  EXPECT_EQ(r0["torch_max_allocated_bytes"], 29);
  EXPECT_NEAR(r0["wait_s"]["DATA_PARALLEL_GROUP"].get<double>(), 0.002, 1e-12);
  EXPECT_NEAR(r0["comm_s"]["DATA_PARALLEL_GROUP"].get<double>(), 0.003, 1e-12);
  EXPECT_NEAR(r0["wait_s"]["comm9"].get<double>(), 0.0, 1e-12);  // faster than modelled: no wait
  EXPECT_NEAR(r0["wait_on_ranks"]["17"].get<double>(), 0.002, 1e-12);
  const json& r63 = rep["ranks"][1];
  EXPECT_NEAR(r63["iteration_time_s"].get<double>(), 0.035, 1e-9);
  EXPECT_TRUE(r63["torch_max_allocated_bytes"].is_null());
  std::string warnings = rep["warnings"].dump();
  EXPECT_NE(warnings.find("a plan warning"), std::string::npos);
  EXPECT_NE(warnings.find("not a JSON object"), std::string::npos);
  EXPECT_NE(warnings.find("lost the coordinator"), std::string::npos);

  // Progress lines: in order, once each.
  auto none_done = [](int) { return false; };
  EXPECT_EQ(r.NewCompleteIterations(none_done), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_TRUE(r.NewCompleteIterations(none_done).empty());
  std::string line = r.ProgressLine(2);
  EXPECT_NE(line.find("iter 2 | rank 0: 50.0 ms, peak 30 B | rank 63: 20.0 ms"), std::string::npos) << line;

  json trace = r.BuildTrace();
  EXPECT_GT(trace["traceEvents"].size(), 8u);
}

// libprism's first iteration mark ends the first training step and has nothing to measure from: dur_ns 0.
TEST(RunReport, FirstMarkWithoutDuration) {
  RunReport r("/nonexistent", 8, {3});
  r.Feed(3, R"({"type":"iter","iteration":0,"t_ns":100,"dur_ns":0,"peak_bytes":5,"torch_max_allocated":4,"clock":"gpu"})");
  r.Feed(3, R"({"type":"iter","iteration":1,"t_ns":200,"dur_ns":30000000,"peak_bytes":5,"torch_max_allocated":4})");
  r.Feed(3, R"({"type":"iter","iteration":2,"t_ns":300,"dur_ns":50000000,"peak_bytes":5,"torch_max_allocated":4})");
  r.Feed(3, R"({"type":"iter","iteration":3,"t_ns":400,"dur_ns":40000000,"peak_bytes":5,"torch_max_allocated":4})");
  json rep = r.Build(1, {}, json::object());
  EXPECT_EQ(rep["iterations"], 4);
  EXPECT_EQ(rep["measured_iterations"], 3);
  EXPECT_NEAR(rep["iteration_time_s"].get<double>(), 0.040, 1e-12);
  EXPECT_NEAR(rep["ranks"][0]["iteration_time_s"].get<double>(), 0.040, 1e-12);
  EXPECT_TRUE(rep["ranks"][0]["iteration_times_s"][0].is_null());
  EXPECT_NE(r.ProgressLine(0).find("first mark"), std::string::npos) << r.ProgressLine(0);

  RunReport only("/nonexistent", 8, {3});
  only.Feed(3, R"({"type":"iter","iteration":0,"t_ns":100,"dur_ns":0,"peak_bytes":7,"torch_max_allocated":0})");
  rep = only.Build(1, {}, json::object());
  EXPECT_TRUE(rep["iteration_time_s"].is_null());
  EXPECT_TRUE(rep["ranks"][0]["torch_max_allocated_bytes"].is_null());  // 0: the hook reported nothing
  EXPECT_EQ(rep["ranks"][0]["peak_memory_bytes"], 7);
  EXPECT_EQ(rep["iterations"], 1);
}

TEST(RunReport, ProgressWaitsForEveryLiveRank) {
  RunReport r("/nonexistent", 8, {0, 5});
  r.Feed(0, R"({"type":"iter","iteration":0,"dur_ns":1000000})");
  r.Feed(0, R"({"type":"iter","iteration":1,"dur_ns":1000000})");
  bool five_done = false;
  auto done = [&](int rank) { return rank == 5 && five_done; };
  EXPECT_TRUE(r.NewCompleteIterations(done).empty());  // rank 5 has not reported iteration 0
  r.Feed(5, R"({"type":"iter","iteration":0,"dur_ns":2000000})");
  EXPECT_EQ(r.NewCompleteIterations(done), (std::vector<int64_t>{0}));
  five_done = true;  // rank 5 died: its missing iterations no longer hold the lines back
  EXPECT_EQ(r.NewCompleteIterations(done), (std::vector<int64_t>{1}));
  json rep = r.Build(1, {}, json::object());
  // One iteration only for rank 5: reported as is, and the run has a warm-up-excluded median for the job.
  EXPECT_NEAR(rep["ranks"][1]["iteration_time_s"].get<double>(), 0.002, 1e-12);
}

TEST(RunReport, ReadsFilesIncrementallyAndAtomicWrite) {
  fs::path dir = fs::temp_directory_path() / ("prism-runreport-" + std::to_string(getpid()));
  fs::create_directories(dir);
  RunReport r(dir.string(), 2, {1});
  EXPECT_FALSE(r.Poll());  // no file yet
  std::ofstream f(dir / "rank1.events.jsonl");
  f << R"({"type":"iter","iteration":0,"dur_ns":5000000})" << "\n" << R"({"type":"iter","iter)";
  f.flush();
  EXPECT_TRUE(r.Poll());
  EXPECT_EQ(r.rank(1).iterations.size(), 1u);
  f << R"(ation":1,"dur_ns":7000000})" << "\n";  // the rest of a half-written line
  f.flush();
  EXPECT_TRUE(r.Poll());
  EXPECT_EQ(r.rank(1).iterations.size(), 2u);
  EXPECT_EQ(r.rank(1).malformed, 0);
  std::string err;
  ASSERT_TRUE(WriteJsonAtomic((dir / "report.json").string(), r.Build(1, {}, json::object()), &err)) << err;
  EXPECT_FALSE(fs::exists(dir / "report.json.tmp"));
  EXPECT_TRUE(LoadReport(dir.string(), &err)) << err;
  fs::remove_all(dir);
}

int RunPrism(const std::string& args, std::string* out) {
  const char* bin = std::getenv("PRISM_RUN");
  if (!bin) return -1;
  FILE* f = popen((std::string(bin) + " " + args + " 2>&1").c_str(), "r");
  char buf[4096];
  out->clear();
  while (size_t n = fread(buf, 1, sizeof buf, f)) out->append(buf, n);
  return WEXITSTATUS(pclose(f));
}

TEST(ReportCli, ShowAndDiffExitCodes) {
  ASSERT_NE(std::getenv("PRISM_RUN"), nullptr);
  std::string out;
  EXPECT_EQ(RunPrism("report show " + Data("reports/base"), &out), 0) << out;
  EXPECT_NE(out.find("rank"), std::string::npos) << out;
  EXPECT_EQ(RunPrism("report diff " + Data("reports/base") + " " + Data("reports/better"), &out), 0) << out;
  EXPECT_EQ(RunPrism("report diff " + Data("reports/base") + " " + Data("reports/slower"), &out), 1) << out;
  EXPECT_EQ(RunPrism("report diff " + Data("reports/base") + " " + Data("reports/slower") + " --max-regression 20", &out),
            0)
      << out;
  EXPECT_EQ(RunPrism("report diff --max-regression 5 " + Data("reports/base") + " " + Data("reports/fatter"), &out), 1)
      << out;
  EXPECT_EQ(RunPrism("report diff " + Data("reports/simulate") + " " + Data("reports/simulate_slower"), &out), 1) << out;
  EXPECT_EQ(RunPrism("report diff " + Data("reports/base") + " " + Data("reports_bad/notjson"), &out), 2) << out;
  EXPECT_NE(out.find("notjson"), std::string::npos) << out;
  EXPECT_EQ(RunPrism("report diff " + Data("reports/base") + " " + Data("reports/norun"), &out), 2) << out;
  EXPECT_EQ(RunPrism("report show " + Data("reports_bad/missing"), &out), 2) << out;
  EXPECT_EQ(RunPrism("report diff " + Data("reports/base"), &out), 2) << out;  // B missing: usage error
}

}  // namespace
}  // namespace prism::analysis
