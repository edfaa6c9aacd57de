// Topology files: presets, strict parsing with messages that name the key, NAME|FILE|JSON resolution.
#include "replay/topology.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "prism/limits.h"

namespace prism::replay {
namespace {

namespace fs = std::filesystem;

TEST(Topology, PresetsIncludeH100AndH200AndAllLoad) {
  std::vector<std::string> names = PresetNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "h100-8x400g"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "h200-8x400g"), names.end());
  for (const std::string& n : names) {
    Topology t;
    std::string err;
    EXPECT_TRUE(LoadTopology(n, &t, &err)) << n << ": " << err;
    EXPECT_EQ(t.name, n);
  }
}

TEST(Topology, H100PresetValues) {
  Topology t;
  std::string err;
  ASSERT_TRUE(LoadTopology("h100-8x400g", &t, &err)) << err;
  EXPECT_EQ(t.model, CostModelKind::kNccl);
  EXPECT_EQ(t.gpus_per_node, 8);
  EXPECT_EQ(t.compute_capability, 90);
  EXPECT_NEAR(t.nvlink_bw_GBps, 18 * 20.6, 1e-9);  // NCCL's SM90_NVLINK_BW per link
  EXPECT_DOUBLE_EQ(t.nic_bw_GBps, 50.0);           // 400 Gb/s
  EXPECT_EQ(t.nics_per_node, 8);
  EXPECT_TRUE(t.nvls);
  EXPECT_FALSE(t.collnet);
  EXPECT_EQ(t.NodeOf(17), 2);
  EXPECT_EQ(t.LocalIndexOf(17), 1);
}

TEST(Topology, InlineJsonAndDefaults) {
  Topology t;
  std::string err;
  ASSERT_TRUE(LoadTopology(R"({"name": "tiny", "model": "alpha-beta", "node": {"gpus": 4}})", &t, &err)) << err;
  EXPECT_EQ(t.name, "tiny");
  EXPECT_EQ(t.model, CostModelKind::kAlphaBeta);
  EXPECT_EQ(t.gpus_per_node, 4);
  EXPECT_EQ(t.NodeOf(5), 1);
}

TEST(Topology, FileAndPlacement) {
  std::string path = testing::TempDir() + "/topo_test_placement.json";
  {
    std::ofstream f(path);
    f << R"({"name": "placed", "node": {"gpus": 2}, "placement": [1, 1, 0, 0]})";
  }
  Topology t;
  std::string err;
  ASSERT_TRUE(LoadTopology(path, &t, &err)) << err;
  EXPECT_EQ(t.NodeOf(0), 1);
  EXPECT_EQ(t.NodeOf(3), 0);
  EXPECT_EQ(t.NodeOf(4), 2);  // beyond the list: r / gpus_per_node
  std::remove(path.c_str());
}

TEST(Topology, RoundTripsThroughJson) {
  Topology a;
  std::string err;
  ASSERT_TRUE(LoadTopology("h200-8x400g", &a, &err));
  Topology b;
  ASSERT_TRUE(TopologyFromJson(TopologyToJson(a), &b, &err)) << err;
  EXPECT_EQ(b.name, a.name);
  EXPECT_DOUBLE_EQ(b.nvlink_bw_GBps, a.nvlink_bw_GBps);
  EXPECT_DOUBLE_EQ(b.nic_bw_GBps, a.nic_bw_GBps);
  EXPECT_DOUBLE_EQ(b.p2p_inter.bandwidth_GBps, a.p2p_inter.bandwidth_GBps);
  EXPECT_DOUBLE_EQ(b.ab_intra.latency_us, a.ab_intra.latency_us);
  EXPECT_EQ(b.nvls, a.nvls);
}

struct BadCase {
  const char* json;
  const char* expect;  // must appear in the message
};

TEST(Topology, BadInputIsAnErrorNamingThePlace) {
  const BadCase cases[] = {
      {R"({"name": "x", "gpus_per_node": 8})", "gpus_per_node"},                 // unknown top-level key
      {R"({"model": "nccl2"})", "model"},                                        // bad enum
      {R"({"node": {"gpus": 0}})", "node.gpus"},                                 // out of range
      {R"({"node": {"gpus": "eight"}})", "node.gpus"},                           // wrong type
      {R"({"network": {"nic_Gbps": -400}})", "network.nic_Gbps"},               // negative
      {R"({"p2p": {"intra": {"bandwidth_GBps": 0}}})", "p2p.intra.bandwidth_GBps"},  // zero bandwidth
      {R"({"alpha_beta": {"inter": {"latency": 1}}})", "latency"},              // misspelt key
      {R"({"node": {"cpu_vendor": "arm"}})", "cpu_vendor"},
      {R"({"placement": [0, -1]})", "placement[1]"},
      {R"([1, 2])", "must be an object"},
  };
  for (const BadCase& c : cases) {
    Topology t;
    std::string err;
    EXPECT_FALSE(LoadTopology(c.json, &t, &err)) << c.json;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.json << " -> " << err;
  }
  Topology t;
  std::string err;
  EXPECT_FALSE(LoadTopology("{not json", &t, &err));
  EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
  EXPECT_FALSE(LoadTopology("no-such-preset", &t, &err));
  EXPECT_NE(err.find("h100-8x400g"), std::string::npos) << "should list the presets: " << err;
}

// A --topology file is refused above its cap (limits::kMaxTopologyFileBytes) before it is read, and when nested
// deeper than the readers' bound; a directory is not taken for a file; each error names the path.
TEST(Topology, FilesAreBoundedAndNamed) {
  const fs::path dir = fs::temp_directory_path() / ("prism_topology_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Topology t;
  std::string err;
  const std::string big = (dir / "big.json").string();
  std::ofstream(big).close();
  fs::resize_file(big, prism::limits::kMaxTopologyFileBytes + 1);  // sparse
  EXPECT_FALSE(LoadTopology(big, &t, &err));
  EXPECT_NE(err.find(big + ": 16777217 bytes is larger than the 16777216-byte (16 MiB) cap on topology files"),
            std::string::npos) << err;
  const std::string deep = (dir / "deep.json").string();
  std::ofstream(deep) << std::string(100000, '[') << std::string(100000, ']');
  EXPECT_FALSE(LoadTopology(deep, &t, &err));
  EXPECT_NE(err.find(deep + ": JSON nested deeper than 64 levels"), std::string::npos) << err;
  EXPECT_FALSE(LoadTopology(dir.string(), &t, &err));
  EXPECT_NE(err.find(dir.string() + "\": not a regular file"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(Topology, ScaleNetworkBandwidthTouchesOnlyTheNetwork) {
  Topology t;
  std::string err;
  ASSERT_TRUE(LoadTopology("h100-8x400g", &t, &err));
  Topology s = t;
  ScaleNetworkBandwidth(&s, 0.25);
  EXPECT_DOUBLE_EQ(s.nic_bw_GBps, t.nic_bw_GBps * 0.25);
  EXPECT_DOUBLE_EQ(s.p2p_inter.bandwidth_GBps, t.p2p_inter.bandwidth_GBps * 0.25);
  EXPECT_DOUBLE_EQ(s.ab_inter.bandwidth_GBps, t.ab_inter.bandwidth_GBps * 0.25);
  EXPECT_DOUBLE_EQ(s.nvlink_bw_GBps, t.nvlink_bw_GBps);
  EXPECT_DOUBLE_EQ(s.p2p_intra.bandwidth_GBps, t.p2p_intra.bandwidth_GBps);
}

}  // namespace
}  // namespace prism::replay
