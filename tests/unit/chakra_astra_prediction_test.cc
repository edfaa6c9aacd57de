// A small Chakra trace whose ASTRA-sim prediction is computed by hand from ASTRA-sim's analytical cost formulas,
// and `prism-run import-chakra` + `prism-run simulate --model alpha-beta` (the real binary) matching it within
// 0.1 %. No ASTRA-sim is needed: the formulas are those of its source (docs/chakra.md, "Agreement with
// ASTRA-sim's analytical network").
//
// ASTRA-sim set-up the prediction assumes: congestion-unaware analytical network, one Switch of 4 NPUs,
// latency 500 ns, bandwidth 50 GB/s (ASTRA-sim's GB is 2^30 bytes: bw_GBps_to_Bpns in
// astra-network-analytical common/NetworkFunction.cpp); system: Ring collectives on the one dimension,
// preferred-dataset-splits 1, endpoint-delay 0, local-reduction-delay 0 (the local-memory costs zeroed).
// Then one message of B bytes takes hops x latency + B / bandwidth (BasicTopology::compute_communication_delay,
// truncated to whole ns), with 2 hops through a switch (Switch::compute_hops_count). A ring step sends one
// message to the next rank; Ring::Ring (astra-sim Ring.cc) sets the steps and message sizes:
//   all-reduce of comm_size C: 2 (n-1) steps of C / n; all-gather of C: n-1 steps of C (C is each rank's
//   input); reduce-scatter of C: n-1 steps of C / n.
// Sends complete after their transfer whether or not the receive is posted (CommonNetworkApi); a receive
// completes when posted and the data is there.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "replay/chakra/chakra_et_io.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace prism;
namespace et = chakra::et;

constexpr int kRanks = 4;
constexpr uint64_t kMiB = 1u << 20;
constexpr double kLatencyNs = 500;  // per hop
constexpr int kHops = 2;            // through the switch
constexpr double kBandwidthGiBps = 50;

// ASTRA-sim's delay of one message, in ns (EventTime is integral: the delay is truncated).
double MessageNs(uint64_t bytes) {
  const double bytes_per_ns = kBandwidthGiBps * (1u << 30) / 1e9;
  return std::floor(kHops * kLatencyNs + static_cast<double>(bytes) / bytes_per_ns);
}

struct RankFile {
  chakra::EtFile f;
  uint64_t next = 0;
  RankFile() { f.metadata.set_version("0.0.4"); }
  // Every node depends on the one before: each rank is one chain, so ASTRA-sim's one-operation-at-a-time
  // resources and Prism's streams see the same order.
  et::Node& Add(const std::string& name, et::NodeType type) {
    et::Node& n = f.nodes.emplace_back();
    n.set_id(next);
    n.set_name(name);
    n.set_type(type);
    if (next > 0) n.add_data_deps(next - 1);
    ++next;
    return n;
  }
  void Comp(const std::string& name, uint64_t us) {
    et::Node& n = Add(name, et::COMP_NODE);
    n.set_duration_micros(us);
    *n.add_attr() = chakra::MakeBoolAttr("is_cpu_op", false);
  }
  void Coll(const std::string& name, et::CollectiveCommType type, uint64_t comm_size) {
    et::Node& n = Add(name, et::COMM_COLL_NODE);
    *n.add_attr() = chakra::MakeBoolAttr("is_cpu_op", false);
    *n.add_attr() = chakra::MakeIntAttr("comm_type", type);
    *n.add_attr() = chakra::MakeIntAttr("comm_size", static_cast<int64_t>(comm_size));
  }
  void P2p(bool send, const std::string& name, int src, int dst, int tag, uint64_t bytes) {
    et::Node& n = Add(name, send ? et::COMM_SEND_NODE : et::COMM_RECV_NODE);
    *n.add_attr() = chakra::MakeBoolAttr("is_cpu_op", false);
    *n.add_attr() = chakra::MakeInt32Attr("comm_src", src);
    *n.add_attr() = chakra::MakeInt32Attr("comm_dst", dst);
    *n.add_attr() = chakra::MakeInt32Attr("comm_tag", tag);
    *n.add_attr() = chakra::MakeIntAttr("comm_size", static_cast<int64_t>(bytes));
  }
};

// The trace: compute, a world all-reduce (16 MiB), all-gather (comm_size 4 MiB per rank), reduce-scatter
// (16 MiB); then pairs (0,1) and (2,3) exchange 8 MiB, each side sending before it receives (valid in
// ASTRA-sim, a deadlock where sends rendezvous); then the odd rank waits for 4 MiB the even rank sends after
// 200 us of compute, and computes 30 us.
void WriteTrace(const std::string& dir) {
  for (int r = 0; r < kRanks; ++r) {
    RankFile f;
    const int peer = r ^ 1;
    f.Comp("fwd", 100);
    f.Coll("grad allreduce", et::ALL_REDUCE, 16 * kMiB);
    f.Coll("param allgather", et::ALL_GATHER, 4 * kMiB);
    f.Coll("grad reducescatter", et::REDUCE_SCATTER, 16 * kMiB);
    f.P2p(true, "send act", r, peer, 7, 8 * kMiB);
    f.P2p(false, "recv act", peer, r, 7, 8 * kMiB);
    if (r % 2 == 0) {
      f.Comp("bwd", 200);
      f.P2p(true, "send grad", r, peer, 8, 4 * kMiB);
    } else {
      f.P2p(false, "recv grad", peer, r, 8, 4 * kMiB);
      f.Comp("tail", 30);
    }
    std::string err;
    ASSERT_TRUE(chakra::WriteEtFile(dir + "/astra." + std::to_string(r) + ".et", f.f, &err)) << err;
  }
}

// The prediction, step by step, in ns: the last rank to finish (an odd one).
double PredictedIterationNs(double* even_end_ns) {
  const int n = kRanks;
  double t = 100e3;                                  // fwd
  t += 2 * (n - 1) * MessageNs(16 * kMiB / n);       // all-reduce: 6 steps of 4 MiB
  t += (n - 1) * MessageNs(4 * kMiB);                // all-gather: 3 steps of comm_size = 4 MiB
  t += (n - 1) * MessageNs(16 * kMiB / n);           // reduce-scatter: 3 steps of 4 MiB
  t += MessageNs(8 * kMiB);                          // both sends complete after their transfer; the
                                                     // receives find their data then
  const double grad_sent = t + 200e3 + MessageNs(4 * kMiB);  // the even rank: bwd, then its send
  *even_end_ns = grad_sent;
  return grad_sent + 30e3;                           // the odd rank: its receive ends then, + tail
}

struct Result {
  int rc = -1;
  std::string out, err;
};

Result RunCli(const std::string& args, const std::string& err_file) {
  const char* bin = std::getenv("PRISM_RUN");
  std::string exe = bin ? bin : std::string(PRISM_BINARY_DIR) + "/bin/prism-run";
  Result r;
  FILE* f = popen((exe + " " + args + " 2>" + err_file).c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, k);
  int status = pclose(f);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  std::ifstream e(err_file);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  return r;
}

class ChakraAstraPrediction : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("prism_astra_pred_" + std::to_string(::getpid()) + "_" +
                                           testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "et");
    WriteTrace(P("et"));
    // Prism's alpha-beta model with ASTRA-sim's numbers: per step 2 hops x 500 ns, 50 x 2^30 bytes/s.
    json topo = {{"name", "astra-switch4"},
                 {"model", "alpha-beta"},
                 {"node", {{"gpus", kRanks}}},
                 {"alpha_beta",
                  {{"intra", {{"latency_us", kHops * kLatencyNs / 1e3},
                              {"bandwidth_GBps", kBandwidthGiBps * (1u << 30) / 1e9}}},
                   {"inter", {{"latency_us", 1.0}, {"bandwidth_GBps", 1.0}}}}}};
    std::ofstream(P("topo.json")) << topo.dump(1);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }

  // import-chakra (extra options), then simulate; the report, or null when a step failed (rc in *rc).
  json ImportAndSimulate(const std::string& import_opts, const std::string& sim_opts, int* rc, Result* sim_out) {
    const std::string errf = P("stderr.txt");
    Result imp = RunCli("import-chakra " + P("et") + " -o " + P("g.prism") + " --quiet " + import_opts, errf);
    EXPECT_EQ(imp.rc, 0) << imp.err;
    *sim_out = RunCli("simulate " + P("g.prism") + " --topology " + P("topo.json") + " --out " + P("sim") +
                          " --quiet " + sim_opts,
                      errf);
    *rc = sim_out->rc;
    if (!fs::exists(P("sim/report.json"))) return nullptr;
    json j = json::parse(std::ifstream(P("sim/report.json")));
    fs::remove_all(P("sim"));
    return j;
  }
  fs::path dir_;
};

TEST_F(ChakraAstraPrediction, PrismMatchesTheHandComputedAstraSimTimeWithinPointOnePercent) {
  double even_end_ns = 0;
  const double predicted_ns = PredictedIterationNs(&even_end_ns);
  // 100 + 474.75 + 237.375 + 237.375 + 157.25 + 200 + 79.125 + 30 us.
  EXPECT_DOUBLE_EQ(predicted_ns, 1515875.0);
  int rc = 0;
  Result sim;
  json report = ImportAndSimulate("", "", &rc, &sim);
  ASSERT_EQ(rc, 0) << sim.err;
  ASSERT_FALSE(report.is_null());
  EXPECT_EQ(report.at("cost_model"), "alpha-beta");
  EXPECT_EQ(report.at("send_completion"), "eager");  // import-chakra's default: ASTRA-sim's sends
  const double prism_ns = report.at("iteration_time_s").get<double>() * 1e9;
  std::printf("ASTRA-sim by hand %.3f ns, Prism %.3f ns (%+.6f %%)\n", predicted_ns, prism_ns,
              100 * (prism_ns - predicted_ns) / predicted_ns);
  EXPECT_LT(std::abs(prism_ns - predicted_ns) / predicted_ns, 1e-3)
      << "Prism " << prism_ns << " ns vs ASTRA-sim by hand " << predicted_ns << " ns";
  for (const json& r : report.at("ranks")) {
    const double end_ns = r.at("end_s").get<double>() * 1e9;
    const double want = r.at("rank").get<int>() % 2 == 0 ? even_end_ns : predicted_ns;
    EXPECT_LT(std::abs(end_ns - want) / want, 1e-3) << "rank " << r.at("rank") << ": " << end_ns << " vs " << want;
  }
}

// The same trace under the other readings is far off or cannot finish: the agreement above is no accident.
TEST_F(ChakraAstraPrediction, TheOtherConventionsDoNotMatch) {
  double even_end_ns = 0;
  const double predicted_ns = PredictedIterationNs(&even_end_ns);
  int rc = 0;
  Result sim;
  // Reading the all-gather's comm_size as the whole output: 3 steps of 1 MiB instead of 4 MiB.
  json report = ImportAndSimulate("--allgather-comm-size output", "", &rc, &sim);
  ASSERT_EQ(rc, 0) << sim.err;
  const double prism_ns = report.at("iteration_time_s").get<double>() * 1e9;
  std::printf("with --allgather-comm-size output: Prism %.3f ns vs %.3f ns\n", prism_ns, predicted_ns);
  EXPECT_GT(std::abs(prism_ns - predicted_ns) / predicted_ns, 0.1) << prism_ns;
  // Sends that wait for their receive: both stages of a pair send first, so the replay cannot finish, and
  // says who waits for whom.
  report = ImportAndSimulate("", "--send-completion rendezvous", &rc, &sim);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(sim.err.find("4 of 4 ranks are stuck"), std::string::npos) << sim.err;
  EXPECT_NE(sim.err.find("waits at send to rank 1"), std::string::npos) << sim.err;
  EXPECT_NE(sim.err.find("a cycle of"), std::string::npos) << sim.err;
  // The graph can carry that choice too (import-chakra --send-completion), with the same result.
  report = ImportAndSimulate("--send-completion rendezvous", "", &rc, &sim);
  EXPECT_EQ(rc, 1);
  // NCCL's buffer (4 MiB on one NVLink node) is smaller than the 8 MiB messages: the same deadlock.
  report = ImportAndSimulate("", "--send-completion nccl", &rc, &sim);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(sim.err.find("ranks are stuck"), std::string::npos) << sim.err;
}

}  // namespace
