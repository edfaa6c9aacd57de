#include "replay/topology.h"

#include <cmath>
#include <sys/stat.h>

#include "common/bounded_read.h"
#include "common/document_shape.h"
#include "prism/limits.h"
#include "replay/topology_presets.h"

namespace prism::replay {
namespace {

using nlohmann::json;

struct TopoError {
  std::string what;
};

[[noreturn]] void Fail(const std::string& where, const std::string& what) { throw TopoError{where + ": " + what}; }

// Rejects keys not in `known`: a misspelt key must not silently leave a default in place.
void CheckKeys(const json& obj, const std::string& where, std::initializer_list<const char*> known) {
  if (!obj.is_object()) Fail(where, "must be an object");
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) {
      std::string list;
      for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
      Fail(where, "unknown key \"" + it.key() + "\" (known: " + list + ")");
    }
  }
}

double Num(const json& obj, const char* key, double dflt, const std::string& where, bool positive = false) {
  auto it = obj.find(key);
  if (it == obj.end()) return dflt;
  if (!it->is_number()) Fail(where + "." + key, std::string("must be a number, not ") + it->type_name());
  double v = it->get<double>();
  if (!std::isfinite(v) || v < 0 || (positive && v == 0)) {
    Fail(where + "." + key, "must be " + std::string(positive ? "positive" : "non-negative") + " (got " +
                                it->dump() + ")");
  }
  return v;
}

int Int(const json& obj, const char* key, int dflt, const std::string& where, int min_value) {
  auto it = obj.find(key);
  if (it == obj.end()) return dflt;
  if (!it->is_number_integer()) Fail(where + "." + key, std::string("must be an integer, not ") + it->type_name());
  int64_t v = it->get<int64_t>();
  if (v < min_value || v > (1 << 24)) Fail(where + "." + key, "out of range (got " + it->dump() + ")");
  return static_cast<int>(v);
}

bool Bool(const json& obj, const char* key, bool dflt, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return dflt;
  if (!it->is_boolean()) Fail(where + "." + key, "must be true or false");
  return it->get<bool>();
}

std::string Str(const json& obj, const char* key, const std::string& dflt, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return dflt;
  if (!it->is_string()) Fail(where + "." + key, "must be a string");
  return it->get<std::string>();
}

LinkParams Link(const json& obj, const char* key, LinkParams dflt, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return dflt;
  std::string w = where + "." + key;
  CheckKeys(*it, w, {"latency_us", "bandwidth_GBps"});
  LinkParams p;
  p.latency_us = Num(*it, "latency_us", dflt.latency_us, w);
  p.bandwidth_GBps = Num(*it, "bandwidth_GBps", dflt.bandwidth_GBps, w, true);
  return p;
}

void Parse(const json& j, Topology* t) {
  const std::string w = "topology";
  CheckKeys(j, w, {"name", "description", "model", "gpu", "node", "network", "nccl", "p2p", "alpha_beta",
                   "placement", "calibration"});
  t->name = Str(j, "name", "custom", w);
  t->description = Str(j, "description", "", w);
  std::string model = Str(j, "model", "nccl", w);
  if (model == "nccl") {
    t->model = CostModelKind::kNccl;
  } else if (model == "alpha-beta") {
    t->model = CostModelKind::kAlphaBeta;
  } else {
    Fail(w + ".model", "must be \"nccl\" or \"alpha-beta\" (got \"" + model + "\")");
  }
  if (auto it = j.find("gpu"); it != j.end()) {
    CheckKeys(*it, w + ".gpu", {"name", "compute_capability"});
    t->gpu = Str(*it, "name", t->gpu, w + ".gpu");
    t->compute_capability = Int(*it, "compute_capability", t->compute_capability, w + ".gpu", 60);
  }
  if (auto it = j.find("node"); it != j.end()) {
    std::string wn = w + ".node";
    CheckKeys(*it, wn, {"gpus", "link", "nvswitch", "nvlink_links", "nvlink_link_GBps", "pci_GBps", "cpu_vendor"});
    t->gpus_per_node = Int(*it, "gpus", t->gpus_per_node, wn, 1);
    std::string link = Str(*it, "link", "nvlink", wn);
    if (link != "nvlink" && link != "pci") Fail(wn + ".link", "must be \"nvlink\" or \"pci\" (got \"" + link + "\")");
    t->intra_nvlink = link == "nvlink";
    t->nvswitch = Bool(*it, "nvswitch", t->intra_nvlink, wn);
    int links = Int(*it, "nvlink_links", 18, wn, 0);
    double per_link = Num(*it, "nvlink_link_GBps", 20.6, wn);
    t->nvlink_bw_GBps = t->intra_nvlink ? links * per_link : 0.0;
    if (t->intra_nvlink && t->nvlink_bw_GBps <= 0) Fail(wn, "link \"nvlink\" needs nvlink_links > 0 and nvlink_link_GBps > 0");
    t->pci_bw_GBps = Num(*it, "pci_GBps", t->pci_bw_GBps, wn, true);
    t->cpu_vendor = Str(*it, "cpu_vendor", t->cpu_vendor, wn);
    if (t->cpu_vendor != "intel" && t->cpu_vendor != "amd") {
      Fail(wn + ".cpu_vendor", "must be \"intel\" or \"amd\" (got \"" + t->cpu_vendor + "\")");
    }
  }
  if (auto it = j.find("network"); it != j.end()) {
    std::string wn = w + ".network";
    CheckKeys(*it, wn, {"nics_per_node", "nic_Gbps", "rails", "latency_us"});
    t->nics_per_node = Int(*it, "nics_per_node", t->nics_per_node, wn, 1);
    t->nic_bw_GBps = Num(*it, "nic_Gbps", t->nic_bw_GBps * 8.0, wn, true) / 8.0;
    t->rails = Int(*it, "rails", t->nics_per_node, wn, 1);
    t->net_latency_us = Num(*it, "latency_us", t->net_latency_us, wn);
  }
  if (auto it = j.find("nccl"); it != j.end()) {
    CheckKeys(*it, w + ".nccl", {"nvls", "collnet", "intra_latency_offset_us"});
    t->nvls = Bool(*it, "nvls", t->nvls, w + ".nccl");
    t->collnet = Bool(*it, "collnet", t->collnet, w + ".nccl");
    if (auto o = it->find("intra_latency_offset_us"); o != it->end()) {
      // Why signed: a calibration may find NCCL faster than its own latency tables say.
      std::string wo = w + ".nccl.intra_latency_offset_us";
      if (!o->is_number()) Fail(wo, std::string("must be a number, not ") + o->type_name());
      double v = o->get<double>();
      if (!std::isfinite(v) || v < -1000.0 || v > 1e6) Fail(wo, "out of range (got " + o->dump() + ")");
      t->nccl_intra_latency_offset_us = v;
    }
  }
  if (!t->nvswitch || t->compute_capability < 90) t->nvls = false;  // NVLS needs NVSwitch and Hopper+
  if (auto it = j.find("p2p"); it != j.end()) {
    CheckKeys(*it, w + ".p2p", {"intra", "inter"});
    t->p2p_intra = Link(*it, "intra", t->p2p_intra, w + ".p2p");
    t->p2p_inter = Link(*it, "inter", t->p2p_inter, w + ".p2p");
  }
  if (auto it = j.find("alpha_beta"); it != j.end()) {
    CheckKeys(*it, w + ".alpha_beta", {"intra", "inter"});
    t->ab_intra = Link(*it, "intra", t->ab_intra, w + ".alpha_beta");
    t->ab_inter = Link(*it, "inter", t->ab_inter, w + ".alpha_beta");
  }
  if (auto it = j.find("calibration"); it != j.end()) {
    if (!it->is_object()) Fail(w + ".calibration", "must be an object (written by prism-run calibrate)");
    t->calibration = *it;
  }
  if (auto it = j.find("placement"); it != j.end()) {
    if (!it->is_array()) Fail(w + ".placement", "must be an array: the node of each global rank");
    t->rank_node.clear();
    for (size_t i = 0; i < it->size(); ++i) {
      const json& v = (*it)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 24)) {
        Fail(w + ".placement[" + std::to_string(i) + "]", "must be a non-negative node index");
      }
      t->rank_node.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
  }
}

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

bool TopologyFromJson(const json& j, Topology* out, std::string* error) {
  Topology t;
  try {
    Parse(j, &t);
  } catch (const TopoError& e) {
    if (error) *error = e.what;
    return false;
  } catch (const std::exception& e) {
    if (error) *error = std::string("topology: ") + e.what();
    return false;
  }
  *out = std::move(t);
  return true;
}

json TopologyToJson(const Topology& t) {
  json j;
  j["name"] = t.name;
  if (!t.description.empty()) j["description"] = t.description;
  j["model"] = t.model == CostModelKind::kAlphaBeta ? "alpha-beta" : "nccl";
  j["gpu"] = {{"name", t.gpu}, {"compute_capability", t.compute_capability}};
  // Why links = 1: the in-memory form keeps only the per-GPU total, which round-trips exactly this way.
  j["node"] = {{"gpus", t.gpus_per_node},
               {"link", t.intra_nvlink ? "nvlink" : "pci"},
               {"nvswitch", t.nvswitch},
               {"nvlink_links", t.intra_nvlink ? 1 : 0},
               {"nvlink_link_GBps", t.nvlink_bw_GBps},
               {"pci_GBps", t.pci_bw_GBps},
               {"cpu_vendor", t.cpu_vendor}};
  j["network"] = {{"nics_per_node", t.nics_per_node},
                  {"nic_Gbps", t.nic_bw_GBps * 8.0},
                  {"rails", t.rails},
                  {"latency_us", t.net_latency_us}};
  j["nccl"] = {{"nvls", t.nvls}, {"collnet", t.collnet}};
  if (t.nccl_intra_latency_offset_us != 0.0) j["nccl"]["intra_latency_offset_us"] = t.nccl_intra_latency_offset_us;
  auto link = [](const LinkParams& p) { return json{{"latency_us", p.latency_us}, {"bandwidth_GBps", p.bandwidth_GBps}}; };
  j["p2p"] = {{"intra", link(t.p2p_intra)}, {"inter", link(t.p2p_inter)}};
  j["alpha_beta"] = {{"intra", link(t.ab_intra)}, {"inter", link(t.ab_inter)}};
  if (!t.rank_node.empty()) j["placement"] = t.rank_node;
  if (t.calibration.is_object()) j["calibration"] = t.calibration;
  return j;
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const TopologyPreset& p : TopologyPresets()) names.emplace_back(p.name);
  return names;
}

bool PresetJson(const std::string& name, std::string* json_text) {
  for (const TopologyPreset& p : TopologyPresets()) {
    if (p.name == name) {
      *json_text = std::string(p.json);
      return true;
    }
  }
  return false;
}

bool LoadTopology(const std::string& spec, Topology* out, std::string* error) {
  std::string text;
  std::string source;
  size_t first = spec.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (spec[first] == '{' || spec[first] == '[')) {
    text = spec;
    source = "inline topology";
  } else if (IsFile(spec)) {
    std::string why;
    if (!ReadFileBounded(spec, limits::kMaxTopologyFileBytes, "topology files", &text, &why)) {
      if (error) *error = why;
      return false;
    }
    source = spec;
  } else if (PresetJson(spec, &text)) {
    source = "preset " + spec;
  } else if (struct stat st; ::stat(spec.c_str(), &st) == 0) {
    if (error) *error = "topology \"" + spec + "\": not a regular file (a directory or a device) and not a preset";
    return false;
  } else {
    std::string names;
    for (const std::string& n : PresetNames()) names += (names.empty() ? "" : ", ") + n;
    if (error) *error = "topology \"" + spec + "\": no such file and not a preset (presets: " + names + ")";
    return false;
  }
  if (std::string why; !CheckJsonShape(text, DocumentBounds{}, &why)) {
    if (error) *error = source + ": JSON " + why;
    return false;
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    if (error) *error = source + ": not valid JSON";
    return false;
  }
  std::string err;
  if (!TopologyFromJson(j, out, &err)) {
    if (error) *error = source + ": " + err;
    return false;
  }
  return true;
}

void ScaleNetworkBandwidth(Topology* t, double factor) {
  t->nic_bw_GBps *= factor;
  t->p2p_inter.bandwidth_GBps *= factor;
  t->ab_inter.bandwidth_GBps *= factor;
}

}  // namespace prism::replay
