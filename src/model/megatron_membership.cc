#include "model/megatron_membership.h"

#include <charconv>

namespace prism::world {

MegatronMembership::MegatronMembership(const World& world, int first_name)
    : groups_(world.MegatronGroups()), first_name_(first_name) {}

const Group* MegatronMembership::Find(std::string_view name) const {
  int k = 0;
  auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), k);
  if (ec != std::errc() || p != name.data() + name.size()) return nullptr;
  long idx = static_cast<long>(k) - first_name_;
  if (idx < 0 || idx >= static_cast<long>(groups_.size())) return nullptr;
  return &groups_[static_cast<size_t>(idx)];
}

std::optional<std::vector<int>> MegatronMembership::Members(std::string_view name) const {
  const Group* g = Find(name);
  if (!g) return std::nullopt;
  return g->members;
}

std::string_view MegatronMembership::Desc(std::string_view name) const {
  const Group* g = Find(name);
  return g ? std::string_view(g->desc) : std::string_view();
}

}  // namespace prism::world
