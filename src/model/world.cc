#include "model/world.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <numeric>
#include <set>

namespace prism::world {
namespace {

std::vector<std::string> Split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.emplace_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

bool ParseInt(std::string_view s, int* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

const std::set<std::string>& OrderTokens() {
  static const std::set<std::string> kTokens = {"tp", "cp", "ep", "dp", "pp"};
  return kTokens;
}

// Checks an order string from a user: known tokens, no duplicates, tp/dp/pp present.
bool ValidateOrder(std::string_view order, std::string* error) {
  std::set<std::string> seen;
  for (const std::string& tok : Split(order, '-')) {
    if (!OrderTokens().count(tok)) {
      *error = "layout order \"" + std::string(order) + "\": unknown dimension \"" + tok +
               "\" (known: tp, cp, ep, dp, pp)";
      return false;
    }
    if (!seen.insert(tok).second) {
      *error = "layout order \"" + std::string(order) + "\": \"" + tok + "\" appears twice";
      return false;
    }
  }
  return true;
}

}  // namespace

std::string Layout::ToSpec() const {
  std::string s = "tp=" + std::to_string(tp) + ",pp=" + std::to_string(pp) + ",dp=" + std::to_string(dp) +
                  ",cp=" + std::to_string(cp) + ",ep=" + std::to_string(ep) + ",etp=" + std::to_string(ExpertTp());
  if (vpp > 0) s += ",vpp=" + std::to_string(vpp);
  if (gtp != 1) s += ",gtp=" + std::to_string(gtp);
  if (egtp != 1) s += ",egtp=" + std::to_string(egtp);
  if (dist_opt_instances != 1) s += ",dist_opt=" + std::to_string(dist_opt_instances);
  if (!gloo) s += ",gloo=0";
  s += ",order=" + order;
  return s;
}

std::optional<Layout> ParseLayout(std::string_view spec, std::string* error) {
  Layout l;
  std::string trimmed = Trim(spec);
  if (trimmed.empty()) {
    *error = "empty --layout (expected e.g. \"tp=8,pp=4,dp=32\")";
    return std::nullopt;
  }
  std::set<std::string> seen;
  for (const std::string& raw : Split(trimmed, ',')) {
    std::string item = Trim(raw);
    size_t eq = item.find('=');
    if (eq == std::string::npos) {
      *error = "--layout \"" + trimmed + "\": \"" + item + "\" is not key=value";
      return std::nullopt;
    }
    std::string key = Trim(item.substr(0, eq));
    std::string value = Trim(item.substr(eq + 1));
    std::replace(key.begin(), key.end(), '-', '_');
    if (!seen.insert(key).second) {
      *error = "--layout \"" + trimmed + "\": \"" + key + "\" is given twice";
      return std::nullopt;
    }
    if (key == "order") {
      if (!ValidateOrder(value, error)) return std::nullopt;
      l.order = value;
      continue;
    }
    static const std::map<std::string, int Layout::*> kInts = {
        {"tp", &Layout::tp},   {"pp", &Layout::pp},     {"dp", &Layout::dp},
        {"cp", &Layout::cp},   {"ep", &Layout::ep},     {"etp", &Layout::etp},
        {"vpp", &Layout::vpp}, {"gtp", &Layout::gtp},   {"egtp", &Layout::egtp},
        {"dist_opt", &Layout::dist_opt_instances},
    };
    int v = 0;
    if (key == "gloo") {
      if (value != "0" && value != "1") {
        *error = "--layout: gloo must be 0 or 1, got \"" + value + "\"";
        return std::nullopt;
      }
      l.gloo = value == "1";
      continue;
    }
    auto it = kInts.find(key);
    if (it == kInts.end()) {
      *error = "--layout \"" + trimmed + "\": unknown key \"" + key +
               "\" (known: tp, pp, dp, cp, ep, etp, vpp, gtp, egtp, dist_opt, gloo, order)";
      return std::nullopt;
    }
    bool zero_ok = key == "vpp";
    if (!ParseInt(value, &v) || v < 0 || (v == 0 && !zero_ok)) {
      *error = "--layout: " + key + " must be a positive integer, got \"" + value + "\"";
      return std::nullopt;
    }
    l.*(it->second) = v;
  }
  return l;
}

std::optional<Layout> LayoutFromMegatronArgs(const std::vector<std::string>& args, std::string* error,
                                             bool* found) {
  // Why exact names only: Megatron's parser is built with allow_abbrev=False.
  static const std::set<std::string> kValued = {
      "--tensor-model-parallel-size",        "--pipeline-model-parallel-size",
      "--context-parallel-size",             "--expert-model-parallel-size",
      "--expert-tensor-parallel-size",       "--num-layers-per-virtual-pipeline-stage",
      "--num-virtual-stages-per-pipeline-rank", "--virtual-pipeline-model-parallel-size",
      "--num-distributed-optimizer-instances", "--tensor-parallel-num-weight-shards",
      "--expert-tensor-parallel-num-weight-shards", "--num-layers",
      "--model-parallel-size",
  };
  static const std::set<std::string> kFlags = {
      "--use-tp-pp-dp-mapping", "--disable-gloo-process-groups", "--account-for-embedding-in-pipeline-split",
      "--account-for-loss-in-pipeline-split"};
  std::map<std::string, int> values;
  std::set<std::string> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) continue;
    std::string name = a;
    std::optional<std::string> value;
    size_t eq = a.find('=');
    if (eq != std::string::npos) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
    }
    if (kFlags.count(name) && !value) {
      flags.insert(name);
      continue;
    }
    if (!kValued.count(name)) continue;
    if (!value) {
      if (i + 1 >= args.size()) {
        *error = "Megatron argument " + name + " has no value";
        return std::nullopt;
      }
      value = args[++i];
    }
    int v = 0;
    if (!ParseInt(*value, &v) || v <= 0) {
      *error = "Megatron argument " + name + " expects a positive integer, got \"" + *value + "\"";
      return std::nullopt;
    }
    values[name] = v;  // last one wins, as argparse
  }
  bool any = false;
  auto get = [&](const std::string& name, int dflt) {
    auto it = values.find(name);
    if (it == values.end()) return dflt;
    if (name != "--num-layers") any = true;
    return it->second;
  };
  if (values.count("--model-parallel-size")) {
    *error = "Megatron rejects --model-parallel-size (use --tensor-model-parallel-size)";
    return std::nullopt;
  }
  Layout l;
  l.tp = get("--tensor-model-parallel-size", 1);
  l.pp = get("--pipeline-model-parallel-size", 1);
  l.cp = get("--context-parallel-size", 1);
  l.ep = get("--expert-model-parallel-size", 1);
  l.etp = get("--expert-tensor-parallel-size", 0);
  l.dist_opt_instances = get("--num-distributed-optimizer-instances", 1);
  int shards = get("--tensor-parallel-num-weight-shards", 0);
  if (shards > 0) {
    if (shards % l.tp != 0) {
      *error = "--tensor-parallel-num-weight-shards (" + std::to_string(shards) +
               ") is not a multiple of --tensor-model-parallel-size (" + std::to_string(l.tp) + ")";
      return std::nullopt;
    }
    l.gtp = shards / l.tp;
  }
  int eshards = get("--expert-tensor-parallel-num-weight-shards", 0);
  if (eshards > 0) {
    if (eshards % l.ExpertTp() != 0) {
      *error = "--expert-tensor-parallel-num-weight-shards (" + std::to_string(eshards) +
               ") is not a multiple of the expert tensor-parallel size (" + std::to_string(l.ExpertTp()) + ")";
      return std::nullopt;
    }
    l.egtp = eshards / l.ExpertTp();
  }
  int vstages = get("--num-virtual-stages-per-pipeline-rank", 0);
  int vpp_old = get("--virtual-pipeline-model-parallel-size", 0);
  int layers_per_vstage = get("--num-layers-per-virtual-pipeline-stage", 0);
  if ((vstages > 0) + (vpp_old > 0) + (layers_per_vstage > 0) > 1) {
    *error = "give only one of --num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank, "
             "--virtual-pipeline-model-parallel-size";
    return std::nullopt;
  }
  if (vstages > 0) l.vpp = vstages;
  if (vpp_old > 0) l.vpp = vpp_old;
  if (layers_per_vstage > 0) {
    int layers = get("--num-layers", 0);
    if (layers == 0) {
      *error = "--num-layers-per-virtual-pipeline-stage needs --num-layers to derive the virtual pipeline size";
      return std::nullopt;
    }
    // Why the +1s: Megatron counts the embedding / loss as a layer in the split when asked to (arguments.py).
    if (flags.count("--account-for-embedding-in-pipeline-split")) ++layers;
    if (flags.count("--account-for-loss-in-pipeline-split")) ++layers;
    if (layers % l.pp != 0) {
      *error = "--num-layers (" + std::to_string(layers) + ") is not divisible by --pipeline-model-parallel-size (" +
               std::to_string(l.pp) + ")";
      return std::nullopt;
    }
    int per_stage = layers / l.pp;
    if (per_stage % layers_per_vstage != 0) {
      *error = "layers per pipeline stage (" + std::to_string(per_stage) +
               ") is not divisible by --num-layers-per-virtual-pipeline-stage (" +
               std::to_string(layers_per_vstage) + ")";
      return std::nullopt;
    }
    l.vpp = per_stage / layers_per_vstage;
  }
  if (flags.count("--use-tp-pp-dp-mapping")) {
    l.order = std::string(kTpPpDpOrder);
    any = true;
  }
  if (flags.count("--disable-gloo-process-groups")) l.gloo = false;
  if (found) *found = any;
  return l;
}

bool ResolveLayout(Layout* l, int world_size, std::string_view world_origin, std::string* error) {
  auto n = [](int v) { return std::to_string(v); };
  std::string where = world_origin.empty() ? std::string() : " (" + std::string(world_origin) + ")";
  if (!ValidateOrder(l->order, error)) return false;
  for (auto [name, v] : {std::pair{"tp", l->tp}, {"pp", l->pp}, {"cp", l->cp}, {"ep", l->ep}, {"gtp", l->gtp},
                         {"egtp", l->egtp}, {"dist_opt", l->dist_opt_instances}}) {
    if (v < 1) {
      *error = std::string("layout: ") + name + " must be >= 1, got " + n(v);
      return false;
    }
  }
  if (world_size < 1) {
    *error = "world size must be >= 1, got " + n(world_size) + where;
    return false;
  }
  int model = l->ModelSize();
  std::string model_desc = "tp(" + n(l->tp) + ") x pp(" + n(l->pp) + ") x cp(" + n(l->cp) + ")" +
                           (l->gtp != 1 ? " x gtp(" + n(l->gtp) + ")" : "") + " = " + n(model);
  if (l->dp == 0) {
    if (world_size % model != 0) {
      *error = "world size " + n(world_size) + where + " is not divisible by " + model_desc;
      return false;
    }
    l->dp = world_size / model;
  } else if (l->WorldSize() != world_size) {
    *error = model_desc + " x dp(" + n(l->dp) + ") = " + n(l->WorldSize()) + " ranks, but the world is " +
             n(world_size) + where;
    return false;
  }
  // Megatron's own checks (parallel_state.initialize_model_parallel, arguments.py), same order.
  if (l->vpp > 0 && l->pp <= 1) {
    *error = "a virtual pipeline size (" + n(l->vpp) + ") needs pp > 1, got pp(" + n(l->pp) + ")";
    return false;
  }
  int expert_model = l->ExpertTp() * l->ep * l->pp * l->egtp;
  if (world_size % expert_model != 0) {
    *error = "world size " + n(world_size) + where + " is not divisible by etp(" + n(l->ExpertTp()) + ") x ep(" +
             n(l->ep) + ") x pp(" + n(l->pp) + ")" + (l->egtp != 1 ? " x egtp(" + n(l->egtp) + ")" : "") + " = " +
             n(expert_model);
    return false;
  }
  if ((l->gtp > 1 || l->egtp > 1) && l->dist_opt_instances > 1) {
    *error = "Megatron does not support gtp/egtp > 1 with dist_opt instances (" + n(l->dist_opt_instances) + ") > 1";
    return false;
  }
  bool pp_last = l->order.size() >= 2 && l->order.compare(l->order.size() - 2, 2, "pp") == 0;
  if (!pp_last && l->pp > 1 && l->ExpertDp() != l->dp) {
    *error = "order " + l->order + " does not end with pp, so Megatron needs the expert data-parallel size (" +
             n(l->ExpertDp()) + " = world / (etp x ep x pp)) to equal dp (" + n(l->dp) + ")";
    return false;
  }
  if ((l->dp * l->cp) % l->dist_opt_instances != 0) {
    *error = "dp(" + n(l->dp) + ") x cp(" + n(l->cp) + ") is not divisible by dist_opt instances (" +
             n(l->dist_opt_instances) + ")";
    return false;
  }
  if (l->ExpertDp() % l->dist_opt_instances != 0) {
    *error = "expert dp (" + n(l->ExpertDp()) + ") is not divisible by dist_opt instances (" +
             n(l->dist_opt_instances) + ")";
    return false;
  }
  return true;
}

std::string InjectGtpRemat(std::string_view order, std::string_view after) {
  std::vector<std::string> toks = Split(order, '-');
  if (std::find(toks.begin(), toks.end(), "gtp_remat") != toks.end()) return std::string(order);
  auto has = [&](std::string_view t) { return std::find(toks.begin(), toks.end(), t) != toks.end(); };
  std::string anchor = has(after) ? std::string(after) : "tp";
  size_t pos = 0;
  if (has(anchor)) pos = std::find(toks.begin(), toks.end(), anchor) - toks.begin() + 1;
  toks.insert(toks.begin() + pos, "gtp_remat");
  std::string out;
  for (size_t i = 0; i < toks.size(); ++i) out += (i ? "-" : "") + toks[i];
  return out;
}

std::optional<RankGrid> RankGrid::Make(const std::vector<std::pair<std::string, int>>& dims,
                                       std::string_view order, std::string* error) {
  RankGrid g;
  std::vector<std::string> toks = Split(order, '-');
  std::map<std::string, int> size_of(dims.begin(), dims.end());
  std::set<std::string> used;
  for (const std::string& t : toks) {
    auto it = size_of.find(t);
    if (it == size_of.end()) {
      *error = "order \"" + std::string(order) + "\" names unknown dimension \"" + t + "\"";
      return std::nullopt;
    }
    if (!used.insert(t).second) {
      *error = "order \"" + std::string(order) + "\" names \"" + t + "\" twice";
      return std::nullopt;
    }
    g.names_.push_back(t);
    g.sizes_.push_back(it->second);
  }
  for (const auto& [name, size] : dims) {
    if (used.count(name)) continue;
    if (size != 1) {
      *error = "the size of " + name + " is " + std::to_string(size) + " but the order \"" + std::string(order) +
               "\" does not name it";
      return std::nullopt;
    }
    g.names_.push_back(name);
    g.sizes_.push_back(1);
  }
  g.size_ = 1;
  for (int s : g.sizes_) {
    if (s < 1) {
      *error = "dimension sizes must be >= 1";
      return std::nullopt;
    }
    g.strides_.push_back(g.size_);
    g.size_ *= s;
  }
  return g;
}

std::vector<std::vector<int>> RankGrid::Groups(std::string_view token) const {
  std::vector<bool> mask(names_.size(), false);
  for (const std::string& t : Split(token, '-')) {
    auto it = std::find(names_.begin(), names_.end(), t);
    if (it == names_.end()) return {};
    mask[it - names_.begin()] = true;
  }
  std::vector<int> in_sizes, in_strides, out_sizes, out_strides;
  for (size_t i = 0; i < names_.size(); ++i) {
    (mask[i] ? in_sizes : out_sizes).push_back(sizes_[i]);
    (mask[i] ? in_strides : out_strides).push_back(strides_[i]);
  }
  int group_size = std::accumulate(in_sizes.begin(), in_sizes.end(), 1, std::multiplies<int>());
  int groups = size_ / group_size;
  // Base rank of a group (unmasked dims) plus offset of a member (masked dims), both decomposed
  // leftmost-fastest: the same arithmetic as generate_masked_orthogonal_rank_groups.
  auto compose = [](int index, const std::vector<int>& sizes, const std::vector<int>& strides) {
    int r = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      r += (index % sizes[i]) * strides[i];
      index /= sizes[i];
    }
    return r;
  };
  std::vector<std::vector<int>> out(groups);
  for (int gi = 0; gi < groups; ++gi) {
    int base = compose(gi, out_sizes, out_strides);
    out[gi].reserve(group_size);
    for (int m = 0; m < group_size; ++m) out[gi].push_back(base + compose(m, in_sizes, in_strides));
  }
  return out;
}

int RankGrid::Coord(int rank, std::string_view name) const {
  auto it = std::find(names_.begin(), names_.end(), name);
  if (it == names_.end()) return -1;
  size_t i = it - names_.begin();
  return (rank / strides_[i]) % sizes_[i];
}

int RankGrid::RankOf(const std::vector<int>& idx) const {
  int r = 0;
  for (size_t i = 0; i < idx.size() && i < sizes_.size(); ++i) r += idx[i] * strides_[i];
  return r;
}

std::optional<World> World::Make(const Layout& layout, int gpus_per_node, std::string* error) {
  if (layout.dp < 1) {
    *error = "layout is not resolved (dp unknown)";
    return std::nullopt;
  }
  if (gpus_per_node < 1) {
    *error = "gpus per node must be >= 1, got " + std::to_string(gpus_per_node);
    return std::nullopt;
  }
  World w;
  w.layout_ = layout;
  w.size_ = layout.WorldSize();
  w.gpus_per_node_ = gpus_per_node;
  auto dense = RankGrid::Make({{"tp", layout.tp}, {"pp", layout.pp}, {"dp", layout.dp}, {"ep", 1},
                               {"cp", layout.cp}, {"gtp_remat", layout.gtp}},
                              InjectGtpRemat(layout.order, "tp"), error);
  if (!dense) return std::nullopt;
  int etp = layout.ExpertTp();
  int expert_model = etp * layout.ep * layout.pp * layout.egtp;
  if (w.size_ % expert_model != 0) {
    *error = "world size " + std::to_string(w.size_) + " is not divisible by etp x ep x pp x egtp = " +
             std::to_string(expert_model);
    return std::nullopt;
  }
  auto expert = RankGrid::Make({{"tp", etp}, {"pp", layout.pp}, {"dp", w.size_ / expert_model},
                                {"ep", layout.ep}, {"cp", 1}, {"gtp_remat", layout.egtp}},
                               InjectGtpRemat(layout.order, "ep"), error);
  if (!expert) return std::nullopt;
  if (dense->Groups("pp") != expert->Groups("pp")) {
    // Megatron asserts the same: the pipeline groups must agree between dense and expert layers.
    *error = "pipeline groups differ between the dense grid and the expert grid for layout " + layout.ToSpec();
    return std::nullopt;
  }
  w.dense_ = std::move(*dense);
  w.expert_ = std::move(*expert);
  w.BuildGroups();
  return w;
}

Coords World::CoordsOf(int rank) const {
  Coords c;
  c.tp = dense_.Coord(rank, "tp");
  c.cp = dense_.Coord(rank, "cp");
  c.dp = dense_.Coord(rank, "dp");
  c.pp = dense_.Coord(rank, "pp");
  c.gtp = dense_.Coord(rank, "gtp_remat");
  c.etp = expert_.Coord(rank, "tp");
  c.ep = expert_.Coord(rank, "ep");
  c.edp = expert_.Coord(rank, "dp");
  c.egtp = expert_.Coord(rank, "gtp_remat");
  return c;
}

int World::RankOf(int tp, int cp, int dp, int pp, int gtp) const {
  const Layout& l = layout_;
  if (tp < 0 || tp >= l.tp || cp < 0 || cp >= l.cp || dp < 0 || dp >= l.dp || pp < 0 || pp >= l.pp || gtp < 0 ||
      gtp >= l.gtp)
    return -1;
  std::vector<int> idx;
  for (const std::string& n : dense_.names()) {
    if (n == "tp") idx.push_back(tp);
    else if (n == "cp") idx.push_back(cp);
    else if (n == "dp") idx.push_back(dp);
    else if (n == "pp") idx.push_back(pp);
    else if (n == "gtp_remat") idx.push_back(gtp);
    else idx.push_back(0);
  }
  return dense_.RankOf(idx);
}

void World::Add(std::string desc, std::string kind, std::string backend, std::vector<int> members) {
  groups_.push_back(Group{std::move(desc), std::move(kind), std::move(backend), std::move(members)});
}

// The order of new_group calls in Megatron's initialize_model_parallel (megatron/core/parallel_state.py at
// d98e8a64). Not modelled: hierarchical context parallel, hybrid context parallel, SHARP (none changes the
// default path's groups).
void World::BuildGroups() {
  const Layout& l = layout_;
  bool gloo = l.gloo;
  for (auto& g : dense_.Groups("gtp_remat")) Add("GTP_WEIGHT_REMAT_GROUP", "gtp", "nccl", g);
  if (l.gtp > 1) gloo = false;  // Megatron: no Gloo under GTP_remat

  int intra_dp_cp = l.dp * l.cp / l.dist_opt_instances;
  for (auto& g : dense_.Groups("dp-cp")) {
    Add("DATA_PARALLEL_GROUP_WITH_CP", "dp-cp", "nccl", g);
    if (gloo) Add("DATA_PARALLEL_GROUP_WITH_CP_GLOO", "dp-cp", "gloo", g);
    if (l.dist_opt_instances > 1) {
      for (int i = 0; i < l.dist_opt_instances; ++i) {
        std::vector<int> part(g.begin() + i * intra_dp_cp, g.begin() + (i + 1) * intra_dp_cp);
        Add("INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP", "intra-dp-cp", "nccl", part);
        if (gloo) Add("INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO", "intra-dp-cp", "gloo", part);
      }
    }
  }
  for (auto& g : dense_.Groups("dp")) {
    Add("DATA_PARALLEL_GROUP", "dp", "nccl", g);
    if (gloo) Add("DATA_PARALLEL_GROUP_GLOO", "dp", "gloo", g);
  }
  if (l.gtp > 1) {
    for (auto& g : dense_.Groups("gtp_remat-dp")) Add("DATA_PARALLEL_GROUP_WITH_GTP_REMAT", "gtp-dp", "nccl", g);
    for (auto& g : dense_.Groups("gtp_remat-dp-cp"))
      Add("DATA_PARALLEL_GROUP_WITH_CP_WITH_GTP_REMAT", "gtp-dp-cp", "nccl", g);
  }
  for (auto& g : dense_.Groups("cp")) Add("CONTEXT_PARALLEL_GROUP", "cp", "nccl", g);
  for (auto& g : dense_.Groups("tp-gtp_remat-pp")) Add("MODEL_PARALLEL_GROUP", "mp", "nccl", g);
  for (auto& g : dense_.Groups("tp")) Add("TENSOR_MODEL_PARALLEL_GROUP", "tp", "nccl", g);
  for (auto& g : dense_.Groups("pp")) {
    // Megatron's default_embedding_ranks / default_position_embedding_ranks.
    std::vector<int> embd = g.size() == 1 ? std::vector<int>{g.front()} : std::vector<int>{g.front(), g.back()};
    std::vector<int> pos_embd = {g.front()};
    Add("PIPELINE_MODEL_PARALLEL_GROUP", "pp", "nccl", g);
    Add("EMBEDDING_GROUP", "embd", "nccl", embd);
    Add("POSITION_EMBEDDING_GROUP", "pos-embd", "nccl", pos_embd);
  }
  for (auto& g : dense_.Groups("tp-gtp_remat-dp-cp"))
    Add("TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP", "tp-dp-cp", "nccl", g);
  for (auto& g : dense_.Groups("tp-gtp_remat-dp")) Add("TENSOR_AND_DATA_PARALLEL_GROUP", "tp-dp", "nccl", g);
  for (auto& g : dense_.Groups("tp-cp")) Add("TENSOR_AND_CONTEXT_PARALLEL_GROUP", "tp-cp", "nccl", g);

  // Expert groups.
  for (auto& g : expert_.Groups("gtp_remat")) Add("EXPERT_GTP_WEIGHT_REMAT_GROUP", "egtp", "nccl", g);
  for (auto& g : expert_.Groups("ep")) Add("EXPERT_MODEL_PARALLEL_GROUP", "ep", "nccl", g);
  for (auto& g : expert_.Groups("tp")) Add("EXPERT_TENSOR_PARALLEL_GROUP", "etp", "nccl", g);
  for (auto& g : expert_.Groups("tp-ep")) Add("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", "tp-ep", "nccl", g);
  for (auto& g : expert_.Groups("tp-ep-pp"))
    Add("EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", "tp-ep-pp", "nccl", g);
  for (auto& g : expert_.Groups("tp-ep-gtp_remat-pp"))
    Add("EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP_WITH_EGTP", "tp-ep-egtp-pp", "nccl", g);
  if (l.egtp > 1) gloo = false;  // Megatron: Gloo only on the non-EGTP path
  int edp = l.ExpertDp();
  int intra_edp = edp / l.dist_opt_instances;
  for (auto& g : expert_.Groups("dp")) {
    Add("EXPERT_DATA_PARALLEL_GROUP", "edp", "nccl", g);
    if (gloo) Add("EXPERT_DATA_PARALLEL_GROUP_GLOO", "edp", "gloo", g);
    if (l.dist_opt_instances > 1) {
      // create_hierarchical_groups(ranks, [intra, instances]): level k groups are the rearrangement
      // "(l s u) -> (l u) s" with s = sizes[k], u = prod(sizes[:k]), l = prod(sizes[k+1:]).
      std::vector<int> sizes = {intra_edp, l.dist_opt_instances};
      for (size_t level = 0; level < sizes.size(); ++level) {
        int s = sizes[level];
        int u = 1;
        for (size_t j = 0; j < level; ++j) u *= sizes[j];
        int lo = static_cast<int>(g.size()) / (s * u);
        for (int li = 0; li < lo; ++li) {
          for (int ui = 0; ui < u; ++ui) {
            std::vector<int> sub;
            for (int si = 0; si < s; ++si) sub.push_back(g[li * s * u + si * u + ui]);
            std::string lv = std::to_string(level);
            Add("HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L" + lv, level == 0 ? "intra-edp" : "inter-edp", "nccl",
                sub);
            if (gloo) Add("HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_GLOO_L" + lv, level == 0 ? "intra-edp" : "inter-edp",
                          "gloo", sub);
          }
        }
      }
    }
  }
  if (l.egtp > 1) {
    for (auto& g : expert_.Groups("gtp_remat-dp"))
      Add("EXPERT_DATA_PARALLEL_GROUP_WITH_GTP_REMAT", "egtp-edp", "nccl", g);
  }
  if (l.gtp > 1 || l.egtp > 1) {
    std::vector<int> all(size_);
    std::iota(all.begin(), all.end(), 0);
    Add("INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", "dist-opt", "nccl", all);
  } else {
    std::vector<int> acc;
    int count = 0;
    for (auto& g : expert_.Groups("tp-ep-pp")) {
      ++count;
      acc.insert(acc.end(), g.begin(), g.end());
      if (count % intra_edp == 0) {
        Add("INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", "dist-opt", "nccl", acc);
        acc.clear();
      }
    }
  }
}

std::vector<int> World::GroupOf(std::string_view kind, int rank) const {
  for (const Group& g : groups_) {
    if (g.kind != kind || g.backend != "nccl") continue;
    if (std::find(g.members.begin(), g.members.end(), rank) != g.members.end()) return g.members;
  }
  return {};
}

std::vector<std::vector<int>> World::GroupsOfKind(std::string_view kind) const {
  std::vector<std::vector<int>> out;
  for (const Group& g : groups_)
    if (g.kind == kind && g.backend == "nccl") out.push_back(g.members);
  return out;
}

}  // namespace prism::world
