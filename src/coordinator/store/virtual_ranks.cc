#include "coordinator/store/virtual_ranks.h"

#include <algorithm>
#include <charconv>

#include <nlohmann/json.hpp>

#include "common/ipc_io.h"
#include "common/log.h"

namespace prism::coord {
namespace {

constexpr std::string_view kDefaultPg = "/default_pg/";
constexpr std::string_view kLastWorker = ":last_worker";

bool AllDigits(std::string_view s) {
  if (s.empty() || s.size() > 9) return false;  // Why 9: fits an int; torch's counters never get there
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

int ToInt(std::string_view s) {
  int v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v);
  return v;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::vector<int> Iota(int n) {
  std::vector<int> v(static_cast<size_t>(std::max(n, 0)));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

}  // namespace

std::optional<IdKey> ParseIdKeyUnder(std::string_view key, std::string_view group_prefix) {
  if (key.size() <= group_prefix.size() || key.substr(0, group_prefix.size()) != group_prefix) return std::nullopt;
  std::string_view rest = key.substr(group_prefix.size());
  size_t sep = rest.find("//");
  if (sep == std::string_view::npos || sep == 0) return std::nullopt;
  std::string_view dev = rest.substr(0, sep);
  std::string_view suffix = rest.substr(sep + 2);
  if (dev.find('/') != std::string_view::npos || suffix.empty() || suffix.find('/') != std::string_view::npos) {
    return std::nullopt;
  }
  IdKey id;
  id.group_prefix = std::string(group_prefix);
  id.device = std::string(dev);
  if (AllDigits(suffix)) {
    id.kind = IdKey::Kind::kCollective;
    id.index = ToInt(suffix);
    return id;
  }
  size_t colon = suffix.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::string_view head = suffix.substr(0, colon), tail = suffix.substr(colon + 1);
  if (!AllDigits(tail)) return std::nullopt;
  if (AllDigits(head)) {
    id.kind = IdKey::Kind::kP2P;
    id.low = std::min(ToInt(head), ToInt(tail));
    id.high = std::max(ToInt(head), ToInt(tail));
    return id;
  }
  // Why "contains": a later torch namespaces these keys (pytorch#178493); the root index stays the last field.
  if (head.find("UniqueNCCLID") != std::string_view::npos) {
    id.kind = IdKey::Kind::kScalable;
    id.root = ToInt(tail);
    id.stem = std::string(key.substr(0, key.size() - tail.size()));
    return id;
  }
  return std::nullopt;
}

std::optional<StandardPrefix> SplitStandardIdKey(std::string_view key) {
  if (key.substr(0, kDefaultPg.size()) != kDefaultPg) return std::nullopt;
  std::string_view rest = key.substr(kDefaultPg.size());
  std::vector<std::string_view> tok;
  for (size_t start = 0;;) {
    size_t p = rest.find("//", start);
    if (p == std::string_view::npos) {
      tok.push_back(rest.substr(start));
      break;
    }
    tok.push_back(rest.substr(start, p - start));
    start = p + 2;
  }
  if (tok.size() < 3 || tok[0].empty()) return std::nullopt;
  StandardPrefix sp;
  sp.prefix = std::string(kDefaultPg) + std::string(tok[0]) + "//";
  if (tok.size() == 3) {
    sp.name = std::string(tok[0]);
    sp.is_default = true;
    return sp;
  }
  std::string g;
  for (size_t i = 1; i + 2 < tok.size(); ++i) {
    if (i > 1) g += "//";
    g += tok[i];
  }
  if (g.empty()) return std::nullopt;
  sp.prefix += g + "//";
  sp.name = g;
  return sp;
}

int ScalableRootGroupRank(int root, int nranks, int nroots) {
  if (nroots <= 0) return 0;
  int rpr = nranks / nroots, rmr = nranks % nroots;
  if (root < rmr) return root * (rpr + 1);
  return rmr * (rpr + 1) + (root - rmr) * rpr;
}

VirtualRanks::VirtualRanks(VirtualRanksOptions opts) : opts_(std::move(opts)) {
  real_.assign(static_cast<size_t>(std::max(opts_.world_size, 0)), false);
  for (int r : opts_.real_ranks) {
    if (r >= 0 && r < opts_.world_size && !real_[static_cast<size_t>(r)]) {
      real_[static_cast<size_t>(r)] = true;
      ++num_real_;
    }
  }
  GroupInfo world;
  world.name = opts_.default_group_name;
  world.desc = "default_pg";
  world.prefix = std::string(kDefaultPg) + opts_.default_group_name + "//";
  world.members = Iota(opts_.world_size);
  RegisterLocked(std::move(world));
}

void VirtualRanks::RegisterLocked(GroupInfo g) {
  if (g.prefix.empty()) {
    g.prefix = std::string(kDefaultPg) + opts_.default_group_name + "//";
    if (g.name != opts_.default_group_name) g.prefix += g.name + "//";
  }
  auto it = by_prefix_.find(g.prefix);
  if (it != by_prefix_.end() && it->second.members != g.members) {
    Log("store")->warn("group '{}' (prefix '{}') registered again with other members ({} before, {} now); keeping "
                       "the new list",
                       g.name, store::PrintableKey(g.prefix), it->second.members.size(), g.members.size());
  }
  by_prefix_[g.prefix] = g;
  if (!g.name.empty()) by_name_[g.name] = g;
}

void VirtualRanks::RegisterGroup(std::string_view name, std::vector<int> members, std::string_view desc,
                                 std::string_view prefix) {
  GroupInfo g;
  g.name = std::string(name);
  g.desc = std::string(desc);
  g.prefix = std::string(prefix);
  g.members = std::move(members);
  std::lock_guard<std::mutex> lock(mu_);
  RegisterLocked(std::move(g));
}

std::optional<std::vector<int>> VirtualRanks::MembersByNameLocked(std::string_view name, bool is_default) const {
  if (is_default) return Iota(opts_.world_size);
  auto it = by_name_.find(std::string(name));
  if (it != by_name_.end()) return it->second.members;
  if (opts_.membership) return opts_.membership->Members(name);
  return std::nullopt;
}

std::optional<VirtualRanks::Resolved> VirtualRanks::ResolveIdKeyLocked(std::string_view key) const {
  // Longest registered prefix first: a key's prefix ends at one of its "//".
  for (size_t end = key.size(); end > 0;) {
    size_t p = key.rfind("//", end - 1);
    if (p == std::string_view::npos) break;
    auto it = by_prefix_.find(std::string(key.substr(0, p + 2)));
    if (it != by_prefix_.end()) {
      if (auto id = ParseIdKeyUnder(key, it->first)) {
        Resolved r{*id, it->second.members, it->second};
        r.id.group_name = it->second.name;
        return r;
      }
    }
    if (p == 0) break;
    end = p;
  }
  auto sp = SplitStandardIdKey(key);
  if (!sp) return std::nullopt;
  auto id = ParseIdKeyUnder(key, sp->prefix);
  if (!id) return std::nullopt;
  id->group_name = sp->name;
  Resolved r{*id, {}, {}};
  r.group.name = sp->name;
  r.group.prefix = sp->prefix;
  if (auto m = MembersByNameLocked(sp->name, sp->is_default && sp->name == opts_.default_group_name)) {
    r.group_members = *m;
    r.group.members = *m;
  } else if (sp->is_default) {
    r.group_members = Iota(opts_.world_size);  // the default group is the world whatever its name
    r.group.members = r.group_members;
  }
  return r;
}

std::optional<int> VirtualRanks::BarrierParticipantsLocked(std::string_view prefix) const {
  auto count_virtual = [this](const std::vector<int>& members) {
    int n = 0;
    for (int m : members) n += IsReal(m) ? 0 : 1;
    return n;
  };
  const int world_virtual = opts_.world_size - num_real_;
  if (prefix == kDefaultPg) return world_virtual;  // init_process_group's barrier: PrefixStore("default_pg")
  auto it = by_prefix_.find(std::string(prefix));
  if (it != by_prefix_.end()) {
    if (it->second.name == opts_.default_group_name) return world_virtual;  // new_group's barrier, default store
    return count_virtual(it->second.members);  // use_local_synchronization: the group's own store
  }
  // Unregistered: the standard nesting "/default_pg/<D>//" or "/default_pg/<D>//<G>//".
  std::string probe = std::string(prefix) + "x//0";
  if (auto sp = SplitStandardIdKey(probe); sp && sp->prefix == prefix) {
    if (sp->is_default) return world_virtual;
    if (auto m = MembersByNameLocked(sp->name, false)) return count_virtual(*m);
  }
  return std::nullopt;
}

std::optional<std::string> VirtualRanks::Materialize(std::string_view key, Access access,
                                                     std::span<const std::string_view> batch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (key == kInitKey) {
    int v = opts_.world_size - num_real_;
    if (v <= 0) return std::nullopt;
    Log("store")->debug("init/: counting {} virtual workers", v);
    return std::to_string(v);
  }
  if (size_t pos = key.find(kBarrierKeyMarker); pos != std::string_view::npos) {
    if (access != Access::kAdd || EndsWith(key, kLastWorker)) return std::nullopt;
    std::optional<int> v = BarrierParticipantsLocked(key.substr(0, pos));
    if (!v) {
      Log("store")->warn("store barrier '{}': participants unknown (group not registered); counting real ranks only",
                         store::PrintableKey(key));
      return std::nullopt;
    }
    if (*v <= 0) return std::nullopt;
    Log("store")->debug("store barrier '{}': counting {} virtual participants", store::PrintableKey(key), *v);
    return std::to_string(*v);
  }
  if (access != Access::kRead) return std::nullopt;
  std::optional<Resolved> r = ResolveIdKeyLocked(key);
  if (!r) return std::nullopt;
  const std::vector<int>& m = r->group_members;
  if (m.empty()) {
    if (unresolved_.insert(std::string(key)).second) {
      Log("store")->warn("a rank waits on NCCL id key '{}' of group '{}' whose members are unknown: it is answered "
                         "when a real leader sets it or the group is registered (docs/coordinator.md)",
                         store::PrintableKey(key), r->id.group_name);
    }
    return std::nullopt;
  }
  int writer_group_rank = 0;
  switch (r->id.kind) {
    case IdKey::Kind::kCollective:
      writer_group_rank = 0;
      break;
    case IdKey::Kind::kP2P:
      writer_group_rank = r->id.low;
      break;
    case IdKey::Kind::kScalable: {
      int nroots = 0;
      for (std::string_view b : batch) {
        auto other = ParseIdKeyUnder(b, r->id.group_prefix);
        if (other && other->kind == IdKey::Kind::kScalable && other->stem == r->id.stem) ++nroots;
      }
      if (nroots <= 1) {
        int per = std::max(opts_.ranks_per_root, 1);
        nroots = std::max(1, (static_cast<int>(m.size()) + per - 1) / per);
      }
      writer_group_rank = ScalableRootGroupRank(r->id.root, static_cast<int>(m.size()), nroots);
      break;
    }
  }
  if (writer_group_rank < 0 || writer_group_rank >= static_cast<int>(m.size())) {
    Log("store")->warn("NCCL id key '{}': writer group rank {} outside group '{}' of {} ranks",
                       store::PrintableKey(key), writer_group_rank, r->id.group_name, m.size());
    return std::nullopt;
  }
  unresolved_.erase(std::string(key));
  int writer = m[static_cast<size_t>(writer_group_rank)];
  if (IsReal(writer)) return std::nullopt;  // a real leader will set it
  std::string id = ipc::MakeVirtualNcclId(key, writer);
  ids_[id] = std::string(key);
  ++synthesized_;
  if (id_listener_) id_listener_();
  Log("store")->debug("NCCL id '{}' synthesized for virtual leader {}", store::PrintableKey(key), writer);
  return id;
}

bool VirtualRanks::OnSet(std::string_view key, std::string_view value) {
  if (EndsWith(key, kGroupRegistrationKey)) {
    std::string prefix(key.substr(0, key.size() - kGroupRegistrationKey.size()));
    GroupInfo g;
    g.prefix = prefix;
    try {
      nlohmann::json j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) throw std::runtime_error("not a JSON object");
      g.name = j.value("name", std::string());
      g.desc = j.value("desc", std::string());
      if (j.contains("ranks")) g.members = j.at("ranks").get<std::vector<int>>();
      // torch passes no ranks for the default group: "ranks": [] means the whole world (or "size" ranks).
      if (g.members.empty()) g.members = Iota(j.value("size", opts_.world_size));
      for (int m : g.members) {
        if (m < 0 || m >= opts_.world_size) throw std::runtime_error("rank " + std::to_string(m) + " outside world");
      }
    } catch (const std::exception& e) {
      Log("store")->warn("ignoring group registration '{}': {} (value '{}')", store::PrintableKey(key), e.what(),
                         store::PrintableKey(value, 200));
      return true;
    }
    Log("store")->debug("group '{}' registered: {} members, prefix '{}'", g.name, g.members.size(),
                        store::PrintableKey(prefix));
    std::lock_guard<std::mutex> lock(mu_);
    RegisterLocked(std::move(g));
    return true;
  }
  if (value.size() == ipc::kNcclIdBytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ResolveIdKeyLocked(key)) {
      ids_[std::string(value)] = std::string(key);
      unresolved_.erase(std::string(key));
      if (id_listener_) id_listener_();
    }
  }
  return false;
}

CommIdentity VirtualRanks::IdentityLocked(const Resolved& r) const {
  CommIdentity c;
  c.group_name = r.group.name;
  c.group_desc = r.group.desc;
  c.comm_key = r.id.kind == IdKey::Kind::kScalable ? r.id.stem : r.id.group_prefix + r.id.device + "//" +
                   (r.id.kind == IdKey::Kind::kP2P ? std::to_string(r.id.low) + ":" + std::to_string(r.id.high)
                                                   : std::to_string(r.id.index));
  const auto& m = r.group_members;
  if (r.id.kind == IdKey::Kind::kP2P) {
    if (r.id.high < static_cast<int>(m.size())) {
      c.members = {m[static_cast<size_t>(r.id.low)], m[static_cast<size_t>(r.id.high)]};
    }
  } else {
    c.members = m;
  }
  return c;
}

void VirtualRanks::SetIdListener(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  id_listener_ = std::move(fn);
}

std::optional<CommIdentity> VirtualRanks::LookupId(std::string_view id_bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ids_.find(std::string(id_bytes));
  if (it == ids_.end()) return std::nullopt;
  auto r = ResolveIdKeyLocked(it->second);
  if (!r) return std::nullopt;
  CommIdentity c = IdentityLocked(*r);
  c.virtual_leader = ipc::IsVirtualNcclId(id_bytes.data(), id_bytes.size());
  return c;
}

std::optional<GroupInfo> VirtualRanks::LookupGroupByName(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(std::string(name));
  if (it != by_name_.end()) return it->second;
  if (opts_.membership) {
    if (auto m = opts_.membership->Members(name)) return GroupInfo{std::string(name), {}, {}, *m};
  }
  return std::nullopt;
}

std::optional<GroupInfo> VirtualRanks::LookupGroupByCommDesc(std::string_view comm_desc) const {
  std::lock_guard<std::mutex> lock(mu_);
  const GroupInfo* best = nullptr;
  for (const auto& [name, g] : by_name_) {
    bool match = (!g.desc.empty() && comm_desc.substr(0, g.desc.size() + 1) == g.desc + ":" &&
                  EndsWith(comm_desc, ":" + g.name)) ||
                 comm_desc == g.name || (!g.desc.empty() && comm_desc == g.desc);
    if (match && (!best || g.name.size() > best->name.size())) best = &g;
  }
  if (best) return *best;
  return std::nullopt;
}

std::vector<std::string> VirtualRanks::Unresolved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {unresolved_.begin(), unresolved_.end()};
}

uint64_t VirtualRanks::synthesized() const {
  std::lock_guard<std::mutex> lock(mu_);
  return synthesized_;
}

}  // namespace prism::coord
