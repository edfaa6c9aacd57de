#include "coordinator/status_view.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "coordinator/hang_detector.h"
#include "coordinator/world.h"

namespace prism::coord {
namespace {

using json = nlohmann::json;

std::string Bytes(uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

std::string Mem(uint64_t b) {
  if (b == 0) return "-";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string Ago(uint64_t t_ns, uint64_t now_ns) {
  if (t_ns == 0 || t_ns > now_ns) return "now";
  double s = static_cast<double>(now_ns - t_ns) * 1e-9;
  if (s < 120) return fmt::format("{:.1f} s", s);
  if (s < 7200) return fmt::format("{:.0f} min", s / 60);
  return fmt::format("{:.1f} h", s / 3600);
}

// "seq 12 all_reduce 1 MiB bf16"
std::string OpText(const json& o) {
  std::string s = fmt::format("seq {} {} {}", o.value("seq", uint64_t{0}), o.value("op", std::string("?")),
                              Bytes(o.value("bytes", uint64_t{0})));
  if (o.contains("dtype") && o["dtype"].is_string()) s += " " + o["dtype"].get<std::string>();
  if (o.contains("peer")) {
    s += fmt::format(" {} rank {}", o.value("op", std::string()) == "recv" ? "from" : "to", o["peer"].get<int>());
  }
  return s;
}

// j[k] when it is an array, else an empty array; a reference, so pointers into it stay valid.
const json& Arr(const json& j, const char* k) {
  static const json kEmpty = json::array();
  return j.is_object() && j.contains(k) && j[k].is_array() ? j[k] : kEmpty;
}

struct CommInfo {
  uint32_t id = 0;
  std::string label;
  std::vector<int> members;
  std::vector<int> real;
};

}  // namespace

std::map<std::vector<int>, std::string> MegatronLabels(const std::string& layout, int world_size) {
  std::map<std::vector<int>, std::string> out;
  if (layout.empty() || world_size <= 0) return out;
  std::string error;
  auto l = world::ParseLayout(layout, &error);
  if (!l || !world::ResolveLayout(&*l, world_size, "world size", &error)) return out;
  // Why any gpus_per_node: the groups' members do not depend on placement.
  auto w = world::World::Make(*l, 1, &error);
  if (!w) return out;
  for (const world::Group& g : w->MegatronGroups()) {
    if (g.backend != "nccl") continue;
    std::string& label = out[g.members];
    std::string name = g.desc.empty() ? g.kind : g.desc;
    // Why whole names: DATA_PARALLEL_GROUP is a prefix of DATA_PARALLEL_GROUP_WITH_CP.
    if (("|" + label + "|").find("|" + name + "|") == std::string::npos) label += (label.empty() ? "" : "|") + name;
  }
  return out;
}

std::string RenderStatus(const StatusDocs& d, const StatusViewOptions& opts) {
  std::ostringstream o;
  const json& info = d.info;
  const json& st = d.status;
  const uint64_t now = opts.now_ns;
  auto str = [](const json& j, const char* k, const char* def = "?") {
    return j.is_object() && j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string(def);
  };
  int world_size = 0;
  if (info.is_object()) {
    world_size = info.value("world_size", 0);
    o << fmt::format("run {} in {}: coordinator pid {} on {}, {}\n", str(info, "run_id"), d.where,
                     info.value("pid", 0), str(info, "host"), d.alive);
    o << fmt::format("world {}, real ranks {}, store {}:{}, bus {}{}\n", world_size,
                     RankListText(info.value("real_ranks", std::vector<int>{})), str(info, "store_host"),
                     info.value("store_port", 0), str(info, "socket"),
                     str(info, "bus_tcp", "").empty() ? "" : " and " + str(info, "bus_tcp"));
  } else {
    o << fmt::format("coordinator at {}: {}\n", d.where, d.alive);
  }
  if (!st.is_object()) {
    o << "no status yet (the coordinator has not written status.json)\n";
  } else {
    if (world_size == 0) world_size = st.value("world_size", 0);
    o << fmt::format("status as of {} ago; {} operations released\n", Ago(st.value("t_ns", uint64_t{0}), now),
                     st.value("releases", 0));
  }

  // The diagnosis first: it is what someone running status on a stuck job wants.
  if (d.hang.is_object()) {
    o << fmt::format("\nHANG diagnosed {} ago (hang.json):\n", Ago(d.hang.value("t_ns", uint64_t{0}), now));
    std::string text = str(d.hang, "text", "");
    if (text.empty()) text = d.hang.dump(2) + "\n";
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) o << "  " << line << "\n";
  }
  if (!st.is_object()) return o.str();
  for (const json& h : Arr(st, "held")) {
    o << fmt::format("held: comm {} seq {}: its real members disagree ({})\n", h.value("comm", 0),
                     h.value("seq", 0), str(h, "differs"));
  }
  if (st.contains("store")) {
    const json& s = st["store"];
    o << fmt::format("store: {} clients, {} keys, {} synthesized for virtual ranks, {} waiting, {} dropped\n",
                     s.value("clients", 0), s.value("keys", 0), s.value("synthesized", 0), s.value("waits", 0),
                     s.value("dropped", 0));
    for (const auto& k : s.value("waited_keys", json::array())) o << "  waited on: " << k.get<std::string>() << "\n";
    for (const auto& k : s.value("unresolved_groups", json::array())) {
      o << "  group members unknown for: " << k.get<std::string>() << " (register the group; docs/coordinator.md)\n";
    }
  }

  // Communicators.
  auto megatron = MegatronLabels(info.is_object() ? str(info, "layout", "") : std::string(), world_size);
  std::map<uint32_t, CommInfo> comms;
  for (const json& c : Arr(st, "communicators")) {
    CommInfo ci;
    ci.id = c.value("comm", 0u);
    ci.members = c.value("members", std::vector<int>{});
    ci.real = c.value("real", std::vector<int>{});
    std::string desc = str(c, "pg_desc", "");
    std::string name = str(c, "name", "");
    ci.label = !desc.empty() ? desc : name;
    auto m = megatron.find(ci.members);
    // Why not for the world: every Megatron group spanning all ranks matches it, which says nothing.
    if (m != megatron.end() && static_cast<int>(ci.members.size()) != world_size &&
        ci.label.find(m->second) == std::string::npos) {
      ci.label += (ci.label.empty() ? "" : ", ") + m->second;
    }
    if (ci.label.empty() && static_cast<int>(ci.members.size()) == world_size) ci.label = "world";
    comms[ci.id] = std::move(ci);
  }
  auto comm_name = [&](uint32_t id) {
    auto it = comms.find(id);
    return it == comms.end() || it->second.label.empty() ? fmt::format("comm {}", id)
                                                         : fmt::format("comm {} ({})", id, it->second.label);
  };
  if (!comms.empty()) {
    o << "\ncommunicators with real members:\n";
    for (const auto& [id, c] : comms) {
      o << fmt::format("  {}: {} ranks {}, real {}\n", comm_name(id), c.members.size(), RankListText(c.members),
                       RankListText(c.real));
    }
  }

  // Real ranks.
  std::map<int, const json*> positions;
  for (const json& p : Arr(st, "positions")) positions[p.value("rank", -1)] = &p;
  o << "\nreal ranks:\n";
  o << fmt::format("  {:<7} {:<14} {:<8} {:>6} {:>10} {:>11} {:>8}\n", "rank", "state", "pid", "iter", "last_it_s",
                   "peak_mem", "ops_done");
  // Per (comm, real rank): its position, for the virtual lines below.
  std::map<uint32_t, std::map<int, json>> by_comm;
  for (const json& r : Arr(st, "ranks")) {
    int rank = r.value("rank", -1);
    o << fmt::format("  {:<7} {:<14} {:<8} {:>6} {:>10.3f} {:>11} {:>8}\n", rank, str(r, "state"), r.value("pid", 0),
                     r.value("iterations", 0), r.value("last_iteration_s", 0.0),
                     Mem(r.value("peak_memory_bytes", uint64_t{0})), r.value("ops_recorded", 0));
    auto p = positions.find(rank);
    if (p == positions.end()) {
      if (r.contains("waiting")) {
        const json& w = r["waiting"];
        o << fmt::format("      waiting at comm {} seq {} for {}\n", w.value("comm", 0), w.value("seq", 0),
                         Ago(w.value("since_ns", uint64_t{0}), now));
      }
      continue;
    }
    // Which real ranks each waiting op waits for (the coordinator's view).
    std::vector<int> waiting_for;
    uint32_t waiting_comm = 0;
    if (r.contains("waiting")) {
      waiting_comm = r["waiting"].value("comm", 0u);
      waiting_for = r["waiting"].value("waiting_for", std::vector<int>{});
    }
    for (const json& c : Arr(*p->second, "comms")) {
      uint32_t id = c.value("comm", 0u);
      by_comm[id][rank] = c;
      std::string line = fmt::format("      {}: ", comm_name(id));
      line += c.contains("done") ? fmt::format("done {} ({} ago)", OpText(c["done"]),
                                               Ago(c["done"].value("t_ns", uint64_t{0}), now))
                                 : std::string("nothing completed yet");
      if (c.contains("pending")) {
        line += fmt::format("; WAITING at {} for {}", OpText(c["pending"]),
                            Ago(c["pending"].value("since_ns", uint64_t{0}), now));
        if (id == waiting_comm && !waiting_for.empty()) line += " on ranks " + RankListText(waiting_for);
      }
      o << line << "\n";
    }
  }

  // Virtual ranks, grouped by the communicators (with real members) they belong to.
  int virt = st.value("virtual_ranks", 0);
  if (virt > 0 && world_size > 0) {
    const std::vector<int> real_list = st.value("real_ranks", std::vector<int>{});
    const std::set<int> real(real_list.begin(), real_list.end());
    std::vector<std::vector<uint32_t>> member_of(static_cast<size_t>(world_size));
    for (const auto& [id, c] : comms) {
      for (int m : c.members) {
        if (m >= 0 && m < world_size && !real.count(m)) member_of[static_cast<size_t>(m)].push_back(id);
      }
    }
    std::map<std::vector<uint32_t>, std::vector<int>> groups;
    for (int r = 0; r < world_size; ++r) {
      if (!real.count(r)) groups[member_of[static_cast<size_t>(r)]].push_back(r);
    }
    std::string graph = str(st, "graph", "");
    o << fmt::format("\nvirtual ranks ({}): {}\n", virt,
                     graph.empty() ? fmt::format("payload '{}' without a graph: a virtual member of a communicator is "
                                                 "where its real members are",
                                                 str(st, "payload", "mirror"))
                                   : "they follow graph " + graph + " (positions below are the real members')");
    size_t shown = 0;
    for (const auto& [sig, ranks] : groups) {
      if (shown++ == opts.max_groups) {
        o << fmt::format("  ... {} more groups\n", groups.size() - opts.max_groups);
        break;
      }
      o << fmt::format("  {} ({} rank{}):", RankListText(ranks), ranks.size(), ranks.size() == 1 ? "" : "s");
      if (sig.empty()) {
        o << " in no communicator a real rank created; nothing to show\n";
        continue;
      }
      o << "\n";
      for (uint32_t id : sig) {
        const auto& at = by_comm[id];
        std::string line = fmt::format("      {}: as real rank{} {}", comm_name(id),
                                       comms[id].real.size() == 1 ? "" : "s", RankListText(comms[id].real));
        // The furthest completed and any wait among the real members.
        const json* done = nullptr;
        const json* pending = nullptr;
        for (const auto& [rank, c] : at) {
          if (c.contains("done") && (!done || c["done"].value("seq", 0) > done->value("seq", 0))) done = &c["done"];
          if (c.contains("pending") && !pending) pending = &c["pending"];
        }
        if (done) line += ", done " + OpText(*done);
        if (pending) {
          line += fmt::format(", waiting at {} for {}", OpText(*pending),
                              Ago(pending->value("since_ns", uint64_t{0}), now));
        }
        o << line << "\n";
      }
    }
  }
  return o.str();
}

}  // namespace prism::coord
