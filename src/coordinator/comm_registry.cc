#include "coordinator/comm_registry.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "common/log.h"

namespace prism::coord {

using json = nlohmann::json;

void CommRegistry::OnCommInit(BusId id, BusClient& c, json j, size_t text_bytes) {
  // Replies keep the order of requests: behind a parked request of this client, park too.
  bool behind = std::any_of(parked_.begin(), parked_.end(), [&](const Parked& p) { return p.id == id; });
  if (!behind && HandleCommInit(id, c, j, false)) return;
  const uint64_t cap = st_.bus.limits().max_parked_bytes;
  if (c.parked_bytes + text_bytes > cap) {
    c.drop_reason = fmt::format("has {} bytes of kCommInit requests waiting for their ids, and {} more would pass the "
                                "{}-byte cap", c.parked_bytes, text_bytes, cap);
    return;
  }
  c.parked_bytes += text_bytes;
  parked_.push_back(Parked{id, std::move(j), text_bytes,
                           std::chrono::steady_clock::now() + std::chrono::milliseconds(st_.opts.comm_wait_ms)});
}

void CommRegistry::RetryParked(bool timer) {
  if (parked_.empty()) return;
  auto now = std::chrono::steady_clock::now();
  std::vector<Parked> keep;
  std::vector<BusId> blocked;  // clients with a request still parked: their later ones wait behind it
  for (Parked& p : parked_) {
    BusClient* c = st_.bus.Find(p.id);
    if (!c) continue;
    bool final = timer && now >= p.deadline;
    bool behind = std::find(blocked.begin(), blocked.end(), p.id) != blocked.end();
    if (behind || !HandleCommInit(p.id, *c, p.request, final)) {
      blocked.push_back(p.id);
      keep.push_back(std::move(p));
    } else {
      c->parked_bytes -= std::min(c->parked_bytes, p.bytes);
    }
  }
  parked_ = std::move(keep);
}

// A kCommInit's fields, and the members found for it: how (`how`), under which key (`comm_key`), from which group.
struct CommRegistry::CommInitRequest {
  std::string key, desc, name;
  int nranks = 0;
  int comm_rank = -1;
  std::vector<int> members;
  std::string comm_key, group, group_desc, how;
  bool virtual_leader = false;
  std::string id_bytes;  // the unique id `key` decodes to
};

bool CommRegistry::HandleCommInit(BusId id, BusClient& c, const json& j, bool final) {
  CommInitRequest q;
  q.key = j.value("key", std::string());
  q.desc = j.value("desc", std::string());
  q.nranks = j.value("nranks", 0);
  q.comm_rank = j.value("rank", -1);
  FindMembers(j, &q);
  // Park (the leader's SET of the id may still be on its way) when nothing matched, or when only a name, a
  // description or the world size matched with the wrong size (a p2p communicator named after its parent group).
  const bool wrong_size = q.how != "unique id" && q.nranks != 0 && static_cast<int>(q.members.size()) != q.nranks;
  if ((q.members.empty() || wrong_size) && !final && q.id_bytes.size() == ipc::kNcclIdBytes) return false;
  if (std::string problem = Problem(c, q); !problem.empty()) {
    Refuse(id, c, q, problem);
    return true;
  }
  std::optional<uint32_t> comm_id = FindOrAddComm(q, final);
  if (!comm_id) return false;  // park: a real member's GPU is not known yet
  SendCommInfo(id, q, *comm_id);
  return true;
}

// The members, by the unique id the store saw, a registered group's name or description, the member's own list,
// or the world size, in that order.
void CommRegistry::FindMembers(const json& j, CommInitRequest* q) {
  const std::string& key = q->key;
  if (!key.empty() && ipc::HexDecode(key, &q->id_bytes)) {
    if (auto ident = st_.vr->LookupId(q->id_bytes); ident && !ident->members.empty()) {
      q->members = ident->members;
      q->comm_key = ident->comm_key;
      q->group = ident->group_name;
      q->group_desc = ident->group_desc;
      q->virtual_leader = ident->virtual_leader;
      q->how = "unique id";
    }
  }
  // A registered group found by name or description: its members, under a key of that group.
  auto adopt = [&](const auto& g, const std::string& comm_key, const char* how) {
    q->members = g.members;
    q->group = g.name;
    q->group_desc = g.desc;
    q->comm_key = comm_key;
    q->how = how;
  };
  q->name = j.value("name", std::string());
  if (q->members.empty() && !q->name.empty()) {
    if (auto g = st_.vr->LookupGroupByName(q->name)) adopt(*g, "group:" + q->name + ":" + key, "group name");
  }
  if (q->members.empty() && !q->desc.empty()) {
    if (auto g = st_.vr->LookupGroupByCommDesc(q->desc)) adopt(*g, "desc:" + q->desc + ":" + key, "description");
  }
  if (q->members.empty() && j.contains("members") && j["members"].is_array()) {
    // A split or shrink: the member named them (from the hook's scope or the parent); every member of the same
    // child sends the same key (its stable id), so the first one's list names the communicator.
    for (const json& m : j["members"]) {
      if (m.is_number_integer() && m.get<int>() >= 0 && m.get<int>() < st_.opts.world_size) {
        q->members.push_back(m.get<int>());
      }
    }
    q->comm_key = key;
    q->how = "the member's list";
  }
  if (q->members.empty() && q->nranks == st_.opts.world_size) {
    q->members.resize(static_cast<size_t>(q->nranks));
    for (int i = 0; i < q->nranks; ++i) q->members[static_cast<size_t>(i)] = i;
    q->comm_key = "world:" + key;
    q->how = "world size";
  }
}

// Why the members found cannot answer the request; "" when they can.
std::string CommRegistry::Problem(const BusClient& c, const CommInitRequest& q) const {
  const std::vector<int>& members = q.members;
  if (members.empty()) {
    return "members unknown: the unique id did not go through the store and no registered group matches";
  } else if (q.nranks != 0 && static_cast<int>(members.size()) != q.nranks) {
    return fmt::format("found {} members by {}, the communicator has {}", members.size(), q.how, q.nranks);
  } else if (q.comm_rank >= 0 && (q.comm_rank >= static_cast<int>(members.size()) ||
                                  members[static_cast<size_t>(q.comm_rank)] != c.rank)) {
    return fmt::format("rank {} is not communicator rank {} of the members found by {}", c.rank, q.comm_rank, q.how);
  }
  return std::string();
}

void CommRegistry::Refuse(BusId id, const BusClient& c, const CommInitRequest& q, const std::string& problem) {
  Log("coord")->warn("comm init from rank {} (key {}..., desc '{}'): {}", c.rank, q.key.substr(0, 16), q.desc,
                     problem);
  json reply = {{"key", q.key}};
  reply["comm_id"] = 0;
  reply["members"] = json::array();
  reply["real"] = json::array();
  reply["error"] = problem;
  st_.bus.SendJson(id, ipc::MsgType::kCommInfo, reply);
}

// The communicator's id, a new one when neither its key nor its unique id is known; nullopt (park) while a new
// communicator's passthrough cannot be decided yet.
std::optional<uint32_t> CommRegistry::FindOrAddComm(const CommInitRequest& q, bool final) {
  const std::string& key = q.key;
  auto it = comm_by_key_.find(q.comm_key);
  auto by_id0 = key.empty() ? comm_by_id_.end() : comm_by_id_.find(key);
  std::optional<bool> passthrough = false;
  if (it == comm_by_key_.end() && by_id0 == comm_by_id_.end()) {
    passthrough = DecidePassthrough(q.members, final);
    if (!passthrough) return std::nullopt;
  }
  // Why also by the unique id: a leader's kCommInit can beat its own SET of the id to the store and resolve by group
  // name, while its peers resolve by the id; both must land on one communicator (seen as two comm ids in a test).
  auto by_id = key.empty() ? comm_by_id_.end() : comm_by_id_.find(key);
  if (it == comm_by_key_.end() && by_id != comm_by_id_.end()) it = comm_by_key_.find(comms_[by_id->second - 1].key);
  const uint32_t comm_id = it != comm_by_key_.end() ? it->second : AddComm(q, *passthrough);
  if (!key.empty()) comm_by_id_.emplace(key, comm_id);
  return comm_id;
}

// A new communicator: its view, its exchange and its hang detector entry.
uint32_t CommRegistry::AddComm(const CommInitRequest& q, bool passthrough) {
  const std::vector<int>& members = q.members;
  CommView v;
  v.comm_id = static_cast<uint32_t>(comms_.size() + 1);
  v.key = q.comm_key;
  v.members = members;
  for (int m : members) {
    if (st_.vr->IsReal(m)) v.real_members.push_back(m);
  }
  v.passthrough = passthrough;
  {
    std::vector<int> sorted = members;
    std::sort(sorted.begin(), sorted.end());
    for (const CommView& o : comms_) {
      std::vector<int> os = o.members;
      std::sort(os.begin(), os.end());
      if (os == sorted) ++v.member_twin;
      if (os == sorted && o.desc == q.group_desc) ++v.desc_twin;
    }
  }
  v.desc = q.group_desc;
  if (v.passthrough) {
    Log("coord")->info("comm {} ({} members, '{}'): passthrough (real NCCL among its members)", v.comm_id,
                       members.size(), !q.group_desc.empty() ? q.group_desc : q.group);
  }
  comms_.push_back(std::move(v));
  const uint32_t comm_id = comms_.back().comm_id;
  comm_by_key_[q.comm_key] = comm_id;
  std::vector<bool> is_real;
  for (int m : members) is_real.push_back(st_.vr->IsReal(m));
  st_.xhub.AddComm(comm_id, members, is_real);
  AddHangComm(comm_id, q, std::move(is_real));
  return comm_id;
}

void CommRegistry::AddHangComm(uint32_t comm_id, const CommInitRequest& q, std::vector<bool> is_real) {
  const std::vector<int>& members = q.members;
  HangComm hc;
  hc.name = !q.group_desc.empty() ? q.group_desc : !q.group.empty() ? "group " + q.group : std::string();
  // torch's lazy 2-rank p2p communicator (its unique id under a "<low>:<high>" key of its process group) carries
  // that group's name; say which pair it is (as flight_recorder.cc names p2p communicators read from dumps), so
  // "comm 1 (default_pg)" is not taken for the whole default group.
  const size_t last = q.comm_key.rfind("//");
  const std::string tail = last == std::string::npos ? std::string() : q.comm_key.substr(last + 2);
  const size_t colon = tail.find(':');
  auto digits = [](const std::string& s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  };
  if (q.how == "unique id" && members.size() == 2 && colon != std::string::npos && digits(tail.substr(0, colon)) &&
      digits(tail.substr(colon + 1))) {
    hc.name = fmt::format("{}{}p2p {}:{}", hc.name, hc.name.empty() ? "" : " ", members[0], members[1]);
  }
  hc.members = members;
  hc.real = std::move(is_real);
  hc.pg_name = q.group;
  hc.pg_desc = q.group_desc;
  if (!q.group.empty()) {
    if (auto g = st_.vr->LookupGroupByName(q.group)) hc.pg_members = g->members;
  }
  st_.hang.AddComm(comm_id, std::move(hc));
}

void CommRegistry::SendCommInfo(BusId id, const CommInitRequest& q, uint32_t comm_id) {
  std::vector<bool> real;
  for (int m : q.members) real.push_back(st_.vr->IsReal(m));
  json reply = {{"key", q.key}};
  reply["comm_id"] = comm_id;
  reply["members"] = q.members;
  reply["real"] = real;
  reply["group"] = q.group;
  reply["desc"] = q.group_desc;
  reply["virtual_leader"] = q.virtual_leader;
  reply["passthrough"] = comms_[comm_id - 1].passthrough;
  st_.bus.SendJson(id, ipc::MsgType::kCommInfo, reply);
}

std::optional<bool> CommRegistry::DecidePassthrough(const std::vector<int>& members, bool final) {
  if (!st_.opts.passthrough || static_cast<int>(members.size()) < std::max(st_.opts.passthrough_min_members, 1)) {
    return false;
  }
  std::set<std::string> gpus;
  for (int m : members) {
    if (!st_.vr->IsReal(m)) return false;
    auto it = st_.ranks.find(m);
    if (it == st_.ranks.end() || it->second.conn == 0) {
      if (final) return false;
      return std::nullopt;
    }
    const RankState& s = it->second;
    if (!s.can_passthrough || s.gpu_id.empty() || !gpus.insert(s.gpu_id).second) return false;
  }
  return true;
}

void CommRegistry::OnRealNcclId(BusId id, BusClient& c, const json& j) {
  const uint32_t comm_id = j.value("comm_id", 0u);
  if (comm_id == 0 || comm_id > comms_.size() || !comms_[comm_id - 1].passthrough) {
    st_.bus.SendJson(
        id, ipc::MsgType::kRealNcclIdInfo,
        {{"comm_id", comm_id}, {"error", fmt::format("comm {} is not a passthrough communicator", comm_id)}});
    return;
  }
  CommView& v = comms_[comm_id - 1];
  if (j.contains("id")) {
    std::string hex = j.value("id", std::string());
    std::string bytes;
    if (!ipc::HexDecode(hex, &bytes) || bytes.size() != ipc::kNcclIdBytes) {
      st_.bus.SendJson(id, ipc::MsgType::kRealNcclIdInfo, {{"comm_id", comm_id}, {"error", "malformed unique id"}});
      return;
    }
    if (!v.real_nccl_id.empty() && v.real_nccl_id != hex) {
      Log("coord")->warn("comm {}: rank {} posted a second real NCCL unique id; the first stays", comm_id, c.rank);
    } else {
      v.real_nccl_id = hex;
    }
  }
  if (v.real_nccl_id.empty()) {
    real_id_waiters_[comm_id].push_back(id);
    return;
  }
  json reply = {{"comm_id", comm_id}, {"id", v.real_nccl_id}};
  st_.bus.SendJson(id, ipc::MsgType::kRealNcclIdInfo, reply);
  auto w = real_id_waiters_.find(comm_id);
  if (w != real_id_waiters_.end()) {
    for (BusId waiter : w->second) {
      if (st_.bus.Find(waiter)) st_.bus.SendJson(waiter, ipc::MsgType::kRealNcclIdInfo, reply);
    }
    real_id_waiters_.erase(w);
  }
}

}  // namespace prism::coord
