// Members of the torch process groups a Megatron job creates, by torch group name: the coordinator's fallback
// when the Python hook did not register a group itself (coordinator/store/virtual_ranks.h; group_membership.h).
//
// torch names groups "1", "2", ... in new_group call order on every rank ("0" is the default group), and
// Megatron's initialize_model_parallel makes its calls in the order of world::World::MegatronGroups(), so group
// "k" is the (k - first_name)-th entry. `first_name` is 1 when nothing called new_group before
// initialize_model_parallel (Megatron's pretrain path).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "model/group_membership.h"
#include "model/world.h"

namespace prism::world {

class MegatronMembership : public GroupMembership {
 public:
  explicit MegatronMembership(const World& world, int first_name = 1);
  std::optional<std::vector<int>> Members(std::string_view group_name) const override;
  // Description of group `group_name` ("TENSOR_MODEL_PARALLEL_GROUP"), or "" when unknown.
  std::string_view Desc(std::string_view group_name) const;

 private:
  const Group* Find(std::string_view group_name) const;
  std::vector<Group> groups_;
  int first_name_;
};

}  // namespace prism::world
