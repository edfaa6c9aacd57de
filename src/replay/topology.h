// Target-cluster topology for the communication cost model: GPUs per node, intra-node links, NICs and rails,
// and which cost model to use. Topologies are JSON files (presets in examples/topologies/, compiled into the
// library so that `--topology h100-8x400g` works from any directory). docs/cost-model.md describes every key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace prism::replay {

enum class CostModelKind : uint8_t { kInvalid = 0, kNccl, kAlphaBeta };

// One link class of the alpha-beta model: time = latency + bytes / bandwidth.
struct LinkParams {
  double latency_us = 0.0;
  double bandwidth_GBps = 0.0;  // 1 GB/s = 1e9 bytes/s
};

struct Topology {
  std::string name;
  std::string description;
  CostModelKind model = CostModelKind::kNccl;

  // Hardware.
  std::string gpu;
  int compute_capability = 90;  // 90 = Hopper; selects NCCL's per-architecture tables
  int gpus_per_node = 8;
  bool intra_nvlink = true;        // false: GPUs of a node talk over PCIe
  bool nvswitch = true;            // NVLink through NVSwitch (all-to-all within the node)
  double nvlink_bw_GBps = 370.8;   // per GPU, one direction, all links (links x per-link bandwidth)
  double pci_bw_GBps = 24.0;       // GPU <-> PCIe, one direction (used when intra_nvlink is false)
  int nics_per_node = 8;
  double nic_bw_GBps = 50.0;       // per NIC, one direction (400 Gb/s = 50 GB/s)
  int rails = 8;                   // independent rail networks (GPU i of every node on rail i % rails)
  double net_latency_us = 0.0;     // extra network latency per hop (NCCL's graph->latencyInter)
  std::string cpu_vendor = "intel";  // intel | amd: picks NCCL's multi-node LL bandwidth row
  bool nvls = true;                // NVLink SHARP available (NVSwitch + fabric manager, Hopper or later)
  bool collnet = false;            // in-network reduction (SHARP) available to NCCL's CollNet
  // Added to the NCCL model's time of every collective on a one-node communicator (`prism-run calibrate` fits
  // it from measured small messages; may be negative; docs/calibrate.md). 0 in every preset.
  double nccl_intra_latency_offset_us = 0.0;

  // Send/receive (NCCL's tuner has no model for p2p; these are Prism's, see docs/cost-model.md).
  LinkParams p2p_intra{6.0, 300.0};
  LinkParams p2p_inter{12.0, 48.0};

  // Plain alpha-beta model (model "alpha-beta"): per step latency and link bandwidth.
  LinkParams ab_intra{2.0, 360.0};
  LinkParams ab_inter{5.0, 48.0};

  // Where a calibrated topology came from (`prism-run calibrate`): kept as given, never read by the model.
  nlohmann::json calibration;  // null when absent

  // Placement: node of each global rank. Empty: rank r sits on node r / gpus_per_node.
  std::vector<int32_t> rank_node;

  int NodeOf(int32_t rank) const {
    if (rank >= 0 && static_cast<size_t>(rank) < rank_node.size()) return rank_node[rank];
    return gpus_per_node > 0 ? rank / gpus_per_node : 0;
  }
  // Index of the GPU within its node (its rail when rails == gpus_per_node).
  int LocalIndexOf(int32_t rank) const { return gpus_per_node > 0 ? rank % gpus_per_node : 0; }
};

// Parses a topology from its JSON form. Unknown keys are errors (a typo must not silently fall back to a
// default). On failure returns false and sets *error naming the key.
bool TopologyFromJson(const nlohmann::json& j, Topology* out, std::string* error);
nlohmann::json TopologyToJson(const Topology& t);

// Resolves NAME|FILE|JSON text: an existing file path, inline JSON (starts with '{'), or a preset name
// (PresetNames()). `what` names the source in error messages (e.g. "--topology").
bool LoadTopology(const std::string& spec, Topology* out, std::string* error);
// The topology a graph is priced on: the option when given, else the one the graph names, else the default preset
// (what `prism-run simulate` and the coordinator's graph replay both use).
inline constexpr const char* kDefaultTopology = "h100-8x400g";
inline std::string TopologySpec(const std::string& option, const std::string& graph_topology) {
  return !option.empty() ? option : !graph_topology.empty() ? graph_topology : kDefaultTopology;
}

// Presets compiled from examples/topologies/*.json.
std::vector<std::string> PresetNames();
bool PresetJson(const std::string& name, std::string* json_text);

// Scales every inter-node bandwidth (NICs, inter-node p2p, alpha-beta inter) by `factor` (what-if bw-scale).
void ScaleNetworkBandwidth(Topology* t, double factor);

}  // namespace prism::replay
