// The logical world of a Megatron-style job: its parallel layout, rank <-> coordinates, the members of every
// process group Megatron's initialize_model_parallel creates (in the order it creates them), and placement of
// ranks on nodes. Pure arithmetic: no I/O, no CUDA, usable by the launcher, the coordinator and the replay.
//
// Conventions follow Megatron-LM (megatron/core/parallel_state.py, RankGenerator):
//  - an order string such as "tp-cp-ep-dp-pp" lists the dimensions, leftmost with stride 1:
//      global_rank = sum_i idx_i * prod_{j<i} size_j
//  - the dense ("decoder") grid has dims tp, gtp_remat (injected right after tp), cp, dp, pp (ep = 1);
//  - the expert grid has dims etp (named tp), ep, gtp_remat (injected right after ep), edp (named dp), pp
//    (cp = 1), with edp = world / (etp * ep * pp * egtp).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace prism::world {

inline constexpr std::string_view kDefaultOrder = "tp-cp-ep-dp-pp";
inline constexpr std::string_view kTpPpDpOrder = "tp-cp-ep-pp-dp";  // Megatron's --use-tp-pp-dp-mapping

// Sizes of every parallel dimension. dp == 0 means "derive from the world size" (see ResolveLayout).
struct Layout {
  int tp = 1;
  int pp = 1;
  int dp = 0;
  int cp = 1;
  int ep = 1;
  int etp = 0;   // expert tensor parallel size; 0: same as tp (Megatron's default)
  int vpp = 0;   // virtual pipeline stages per pipeline rank; 0: not interleaved. Changes no group.
  int gtp = 1;   // Megatron's gtp_weight_remat_size (--tensor-parallel-num-weight-shards / tp)
  int egtp = 1;  // expert_gtp_weight_remat_size
  int dist_opt_instances = 1;  // --num-distributed-optimizer-instances
  bool gloo = true;            // Megatron creates Gloo twins of the DP groups unless --disable-gloo-process-groups
  std::string order = std::string(kDefaultOrder);

  int ExpertTp() const { return etp > 0 ? etp : tp; }
  int ModelSize() const { return tp * pp * cp * gtp; }  // ranks of one data-parallel replica
  int WorldSize() const { return ModelSize() * dp; }    // valid once dp is resolved
  int ExpertDp() const { return WorldSize() / (ExpertTp() * ep * pp * egtp); }
  // "tp=2,pp=2,dp=16,cp=1,ep=1,etp=2,order=tp-cp-ep-dp-pp" (+ vpp, gtp, egtp, ... when not default).
  // ParseLayout(ToSpec()) gives the same layout back.
  std::string ToSpec() const;
};

// Parses a --layout spec: comma-separated key=value with keys tp, pp, dp, cp, ep, etp, vpp, gtp, egtp,
// dist_opt (or dist-opt), gloo (0/1) and order. Unset sizes are 1; unset dp is 0 (derived later).
std::optional<Layout> ParseLayout(std::string_view spec, std::string* error);

// Reads the layout from a Megatron training script's own arguments (--tensor-model-parallel-size,
// --pipeline-model-parallel-size, --context-parallel-size, --expert-model-parallel-size,
// --expert-tensor-parallel-size, --num-layers-per-virtual-pipeline-stage (with --num-layers),
// --num-virtual-stages-per-pipeline-rank, --virtual-pipeline-model-parallel-size, --use-tp-pp-dp-mapping,
// --disable-gloo-process-groups, --num-distributed-optimizer-instances, --tensor-parallel-num-weight-shards,
// --expert-tensor-parallel-num-weight-shards). Both "--flag value" and "--flag=value"; the last one wins (as
// argparse). *found tells whether any of these flags was present. dp is left 0.
std::optional<Layout> LayoutFromMegatronArgs(const std::vector<std::string>& args, std::string* error,
                                             bool* found = nullptr);

// Derives dp from world_size when it is 0 and checks every size the way Megatron does; an error names the
// sizes that disagree. `world_origin` (e.g. "8 nodes x 8 processes") is quoted in errors.
bool ResolveLayout(Layout* layout, int world_size, std::string_view world_origin, std::string* error);

// A grid of named dimensions, leftmost stride 1: Megatron's RankGenerator without the process groups.
class RankGrid {
 public:
  // dims: name -> size; order: dims joined by '-'. Dims of size 1 missing from the order are appended (as
  // Megatron does); a dim of size > 1 missing from the order is an error, and so is an unknown name in it.
  static std::optional<RankGrid> Make(const std::vector<std::pair<std::string, int>>& dims,
                                      std::string_view order, std::string* error);

  int size() const { return size_; }
  const std::vector<std::string>& names() const { return names_; }
  // Members of every group spanning the dims in `token` ("tp", "dp-cp", "tp-gtp_remat-pp"): groups are
  // enumerated with the other dims leftmost-fastest, members with the token's dims leftmost-fastest in grid
  // order (not token order). Exactly Megatron's RankGenerator.get_ranks. Unknown dim: empty result.
  std::vector<std::vector<int>> Groups(std::string_view token) const;
  // Index of `rank` along dim `name` (-1 for an unknown name).
  int Coord(int rank, std::string_view name) const;
  // Rank from per-dim indices (in names() order).
  int RankOf(const std::vector<int>& idx) const;

 private:
  std::vector<std::string> names_;
  std::vector<int> sizes_;
  std::vector<int> strides_;
  int size_ = 1;
};

// Where a rank sits in both grids.
struct Coords {
  int tp = 0, cp = 0, dp = 0, pp = 0, gtp = 0;  // dense grid
  int etp = 0, ep = 0, edp = 0, egtp = 0;       // expert grid (pp is the same in both)
};

// One torch.distributed.new_group call made by initialize_model_parallel.
struct Group {
  std::string desc;     // Megatron's group_desc, e.g. "TENSOR_MODEL_PARALLEL_GROUP"
  std::string kind;     // short name: tp pp dp dp-cp cp mp embd pos-embd tp-dp tp-dp-cp tp-cp ep etp tp-ep ...
  std::string backend;  // "nccl" or "gloo"
  std::vector<int> members;  // global ranks, in group-rank order
};

class World {
 public:
  // `layout` must be resolved (dp > 0, consistent). gpus_per_node >= 1 (torchrun's --nproc-per-node).
  static std::optional<World> Make(const Layout& layout, int gpus_per_node, std::string* error);

  int size() const { return size_; }
  const Layout& layout() const { return layout_; }
  int gpus_per_node() const { return gpus_per_node_; }
  int nodes() const { return (size_ + gpus_per_node_ - 1) / gpus_per_node_; }
  int NodeOf(int rank) const { return rank / gpus_per_node_; }
  int LocalRankOf(int rank) const { return rank % gpus_per_node_; }

  Coords CoordsOf(int rank) const;
  // Dense-grid rank of (tp, cp, dp, pp, gtp) coordinates; -1 when out of range.
  int RankOf(int tp, int cp, int dp, int pp, int gtp = 0) const;

  // Every group initialize_model_parallel creates, in creation order. With no new_group before it, torch names
  // the i-th entry (0-based) str(i + 1) ("0" is the default group), on every rank, member or not.
  const std::vector<Group>& MegatronGroups() const { return groups_; }
  // The members of the group of `kind` (e.g. "tp", "dp-cp", "ep", "embd") containing `rank`, from the NCCL
  // groups; empty when there is none (e.g. "embd" for a middle pipeline stage).
  std::vector<int> GroupOf(std::string_view kind, int rank) const;
  // All NCCL groups of one kind, in creation order.
  std::vector<std::vector<int>> GroupsOfKind(std::string_view kind) const;

  const RankGrid& dense() const { return dense_; }
  const RankGrid& expert() const { return expert_; }

 private:
  void BuildGroups();
  void Add(std::string desc, std::string kind, std::string backend, std::vector<int> members);

  Layout layout_;
  int size_ = 0;
  int gpus_per_node_ = 1;
  RankGrid dense_;
  RankGrid expert_;
  std::vector<Group> groups_;
};

// Megatron's _inject_gtp_remat_axis: "gtp_remat" right after `after` (or after tp, or first).
std::string InjectGtpRemat(std::string_view order, std::string_view after);

}  // namespace prism::world
