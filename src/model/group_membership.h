// Who is in a torch process group, by its torch group name: what the coordinator's store asks when the Python hook
// did not register a group itself (coordinator/store/virtual_ranks.h, "Group membership"). The logical world answers
// it for Megatron's groups (megatron_membership.h); the launcher passes one to the coordinator
// (CoordinatorOptions::membership).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace prism::world {

// Members (global ranks, in group-rank order) of a torch process group, looked up by its torch group name.
// nullopt means "not known here".
class GroupMembership {
 public:
  virtual ~GroupMembership() = default;
  virtual std::optional<std::vector<int>> Members(std::string_view group_name) const = 0;
};

}  // namespace prism::world
