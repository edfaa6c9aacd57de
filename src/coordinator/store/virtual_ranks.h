// Virtual ranks in the rendezvous store: the store answers for every rank that no process runs, so a real rank
// never waits on a key only a virtual rank would write. The rules (docs/coordinator.md, "Stand-in rules"):
//
//   init/                                  ADD by a worker: the count starts at (world size - real ranks), so it
//                                          reaches the world size when the last real rank arrives.
//   <P>store_based_barrier_key:<G>         first ADD: the count starts at the number of virtual participants, so the
//                                          last real participant sees the full count and sets ":last_worker" itself.
//                                          P = "/default_pg/" or the default group's prefix: the whole world takes
//                                          part; P = a registered group's prefix (use_local_synchronization): its members.
//   <group prefix><dev>//<n>               NCCL unique id of the group's n-th communicator; writer: group rank 0.
//   <group prefix><dev>//<a>:<b>           unique id of the 2-rank p2p communicator; writer: group rank min(a,b).
//   <group prefix><dev>//UniqueNCCLID:<r>  scalable init: root r's id; writer: the first group rank of root r's block
//                                          (ProcessGroupNCCL's getRootIndex split).
// A read (WAIT/GET/CHECK/MULTI_GET) of a missing unique-id key whose writer is virtual gets a synthesized id
// (prism::ipc::MakeVirtualNcclId: deterministic, derived from the key, marked so libprism can tell). When the
// writer is real, the store waits for it as torch's would.
//
// Group membership. The wire prefix of group G is "/default_pg/<default name>//" for the default group and
// "/default_pg/<default name>//<G>//" for new_group G (PrefixStore nesting, torch 2.x). Members come from, in
// order: (1) a registration SET of "<prefix>__prism_group__" with JSON {"name","ranks","size","desc"} that the
// Python hook sends through the group's own store just before torch creates the group (same connection as the
// later reads, so it always arrives first); (2) RegisterGroup() calls (the launcher's layout, by name);
// (3) the GroupMembership given in the options (by name). The default group is always known (every rank).
// When the members of a group are unknown, a read of its id key waits (as torch would) and is listed as
// unresolved with a warning; a later registration answers it at once (StoreState::RetryWaits).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "coordinator/store/store_state.h"
#include "model/group_membership.h"

namespace prism::coord {

inline constexpr std::string_view kGroupRegistrationKey = "__prism_group__";
inline constexpr std::string_view kInitKey = "init/";
inline constexpr std::string_view kBarrierKeyMarker = "store_based_barrier_key:";

// A parsed NCCL unique-id key.
struct IdKey {
  enum class Kind { kCollective, kP2P, kScalable };
  Kind kind = Kind::kCollective;
  std::string group_prefix;  // wire prefix of the group ("/default_pg/0//1//"), ends with "//"
  std::string group_name;    // torch group name where the prefix follows the standard nesting, else ""
  std::string device;        // "cuda", "cpu", ...
  int index = 0;             // collective: n-th communicator of the group
  int low = 0, high = 0;     // p2p: group ranks
  int root = 0;              // scalable: root index
  std::string stem;          // scalable: the key without the root index (all roots' keys share it)
};

// Parses `key` as a unique-id key under `group_prefix` (which must be a prefix of key). nullopt: not an id key.
std::optional<IdKey> ParseIdKeyUnder(std::string_view key, std::string_view group_prefix);

// Splits the standard nesting "/default_pg/<D>//[<G>//]<dev>//<suffix>": the group's wire prefix and name.
// The default group (no <G>) is named <D>. nullopt when the key does not have this shape.
struct StandardPrefix {
  std::string prefix;
  std::string name;
  bool is_default = false;
};
std::optional<StandardPrefix> SplitStandardIdKey(std::string_view key);

// First group rank of scalable-init root `root` when `nranks` ranks are split among `nroots` roots (the inverse of
// ProcessGroupNCCL's getRootIndex: the first nranks % nroots roots get one rank more).
int ScalableRootGroupRank(int root, int nranks, int nroots);

// What the coordinator knows about a communicator whose unique id went through the store.
struct CommIdentity {
  std::string comm_key;      // stable name: the id key (for scalable init: its stem)
  std::string group_name;
  std::string group_desc;
  std::vector<int> members;  // global ranks in communicator-rank order; empty when the group is unknown
  bool virtual_leader = false;
};

struct GroupInfo {
  std::string name;
  std::string desc;
  std::string prefix;
  std::vector<int> members;
};

struct VirtualRanksOptions {
  int world_size = 0;
  std::vector<int> real_ranks;
  // Why: a single GET of one scalable key (no batch) needs the root count; torch's default TORCH_NCCL_RANKS_PER_ROOT.
  int ranks_per_root = 128;
  std::string default_group_name = "0";
  const world::GroupMembership* membership = nullptr;  // model/group_membership.h
};

class VirtualRanks : public store::StandIn {
 public:
  explicit VirtualRanks(VirtualRanksOptions opts);

  // store::StandIn (store thread).
  std::optional<std::string> Materialize(std::string_view key, Access access,
                                         std::span<const std::string_view> batch) override;
  bool OnSet(std::string_view key, std::string_view value) override;

  // Registers a group's members (thread-safe). `prefix` "" derives it from the name the standard way. After a call
  // from outside the store thread, have the store retry its waits (StoreServer::RetryWaits).
  void RegisterGroup(std::string_view name, std::vector<int> members, std::string_view desc = {},
                     std::string_view prefix = {});

  // Called (from the store thread, under a lock: keep it short, e.g. write an eventfd) whenever a new unique id is
  // recorded, so a LookupId that failed because the id's SET was not read yet can be retried.
  void SetIdListener(std::function<void()> fn);

  // Thread-safe lookups for the event bus.
  std::optional<CommIdentity> LookupId(std::string_view id_bytes) const;
  std::optional<GroupInfo> LookupGroupByName(std::string_view name) const;
  // Torch passes "<group_desc>:<group_name>"-like descriptions to NCCL (commDesc); matches a registered group
  // whose name or desc ends the string.
  std::optional<GroupInfo> LookupGroupByCommDesc(std::string_view comm_desc) const;

  bool IsReal(int rank) const { return rank >= 0 && rank < opts_.world_size && real_[rank]; }
  int world_size() const { return opts_.world_size; }
  int num_real() const { return num_real_; }
  // Keys some real rank read whose group members were unknown (for status and hang diagnosis).
  std::vector<std::string> Unresolved() const;
  uint64_t synthesized() const;

 private:
  struct Resolved {
    IdKey id;
    std::vector<int> group_members;
    GroupInfo group;
  };
  // Finds the group a key lives under (registered prefix first, then the standard nesting). Caller holds mu_.
  std::optional<Resolved> ResolveIdKeyLocked(std::string_view key) const;
  std::optional<std::vector<int>> MembersByNameLocked(std::string_view name, bool is_default) const;
  std::optional<int> BarrierParticipantsLocked(std::string_view prefix) const;
  CommIdentity IdentityLocked(const Resolved& r) const;
  void RegisterLocked(GroupInfo g);

  VirtualRanksOptions opts_;
  std::vector<bool> real_;
  int num_real_ = 0;
  mutable std::mutex mu_;
  std::unordered_map<std::string, GroupInfo> by_prefix_;
  std::unordered_map<std::string, GroupInfo> by_name_;
  std::unordered_map<std::string, std::string> ids_;  // 128-byte id -> the key it was exchanged under
  std::set<std::string> unresolved_;
  uint64_t synthesized_ = 0;
  std::function<void()> id_listener_;
};

}  // namespace prism::coord
