#include "coordinator/status/status_view.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "coordinator/hang/hang_detector.h"
#include "model/world.h"

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

namespace {

// j[k] when it is a string, else def.
std::string Str(const json& j, const char* k, const char* def = "?") {
  return j.is_object() && j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string(def);
}

// RenderStatus's sections, in its order, each appending to the text.
class StatusRenderer {
 public:
  StatusRenderer(const StatusDocs& d, const StatusViewOptions& opts)
      : d_(d), opts_(opts), info_(d.info), st_(d.status), now_(opts.now_ns) {}

  void Coordinator();
  void StatusLine();
  void Hang();
  bool HasStatus() const { return st_.is_object(); }
  void Held();
  void Store();
  void Communicators();
  void RealRanks();
  void VirtualRanks();
  std::string Text() const { return o_.str(); }

 private:
  std::string CommName(uint32_t id) const;
  void RealRank(const json& r, const std::map<int, const json*>& positions);
  void VirtualGroup(const std::vector<uint32_t>& sig, const std::vector<int>& ranks);

  const StatusDocs& d_;
  const StatusViewOptions& opts_;
  const json& info_;
  const json& st_;
  const uint64_t now_;
  std::ostringstream o_;
  int world_size_ = 0;
  std::map<uint32_t, CommInfo> comms_;
  // Per (comm, real rank): its position, for the virtual lines below.
  std::map<uint32_t, std::map<int, json>> by_comm_;
};

void StatusRenderer::Coordinator() {
  if (info_.is_object()) {
    world_size_ = info_.value("world_size", 0);
    o_ << fmt::format("run {} in {}: coordinator pid {} on {}, {}\n", Str(info_, "run_id"), d_.where,
                      info_.value("pid", 0), Str(info_, "host"), d_.alive);
    o_ << fmt::format("world {}, real ranks {}, store {}:{}, bus {}{}\n", world_size_,
                      RankListText(info_.value("real_ranks", std::vector<int>{})), Str(info_, "store_host"),
                      info_.value("store_port", 0), Str(info_, "socket"),
                      Str(info_, "bus_tcp", "").empty() ? "" : " and " + Str(info_, "bus_tcp"));
  } else {
    o_ << fmt::format("coordinator at {}: {}\n", d_.where, d_.alive);
  }
}

void StatusRenderer::StatusLine() {
  if (!st_.is_object()) {
    o_ << "no status yet (the coordinator has not written status.json)\n";
  } else {
    if (world_size_ == 0) world_size_ = st_.value("world_size", 0);
    o_ << fmt::format("status as of {} ago; {} operations released\n", Ago(st_.value("t_ns", uint64_t{0}), now_),
                      st_.value("releases", 0));
  }
}

void StatusRenderer::Hang() {
  if (d_.hang.is_object()) {
    o_ << fmt::format("\nHANG diagnosed {} ago (hang.json):\n", Ago(d_.hang.value("t_ns", uint64_t{0}), now_));
    std::string text = Str(d_.hang, "text", "");
    if (text.empty()) text = d_.hang.dump(2) + "\n";
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) o_ << "  " << line << "\n";
  }
}

void StatusRenderer::Held() {
  for (const json& h : Arr(st_, "held")) {
    o_ << fmt::format("held: comm {} seq {}: its real members disagree ({})\n", h.value("comm", 0),
                      h.value("seq", 0), Str(h, "differs"));
  }
}

void StatusRenderer::Store() {
  if (st_.contains("store")) {
    const json& s = st_["store"];
    o_ << fmt::format("store: {} clients, {} keys, {} synthesized for virtual ranks, {} waiting, {} dropped\n",
                      s.value("clients", 0), s.value("keys", 0), s.value("synthesized", 0), s.value("waits", 0),
                      s.value("dropped", 0));
    for (const auto& k : s.value("waited_keys", json::array())) o_ << "  waited on: " << k.get<std::string>() << "\n";
    for (const auto& k : s.value("unresolved_groups", json::array())) {
      o_ << "  group members unknown for: " << k.get<std::string>() << " (register the group; docs/coordinator.md)\n";
    }
  }
}

void StatusRenderer::Communicators() {
  auto megatron = MegatronLabels(info_.is_object() ? Str(info_, "layout", "") : std::string(), world_size_);
  for (const json& c : Arr(st_, "communicators")) {
    CommInfo ci;
    ci.id = c.value("comm", 0u);
    ci.members = c.value("members", std::vector<int>{});
    ci.real = c.value("real", std::vector<int>{});
    std::string desc = Str(c, "pg_desc", "");
    std::string name = Str(c, "name", "");
    ci.label = !desc.empty() ? desc : name;
    auto m = megatron.find(ci.members);
    // Why not for the world: every Megatron group spanning all ranks matches it, which says nothing.
    if (m != megatron.end() && static_cast<int>(ci.members.size()) != world_size_ &&
        ci.label.find(m->second) == std::string::npos) {
      ci.label += (ci.label.empty() ? "" : ", ") + m->second;
    }
    if (ci.label.empty() && static_cast<int>(ci.members.size()) == world_size_) ci.label = "world";
    comms_[ci.id] = std::move(ci);
  }
  if (!comms_.empty()) {
    o_ << "\ncommunicators with real members:\n";
    for (const auto& [id, c] : comms_) {
      o_ << fmt::format("  {}: {} ranks {}, real {}\n", CommName(id), c.members.size(), RankListText(c.members),
                        RankListText(c.real));
    }
  }
}

std::string StatusRenderer::CommName(uint32_t id) const {
  auto it = comms_.find(id);
  return it == comms_.end() || it->second.label.empty() ? fmt::format("comm {}", id)
                                                        : fmt::format("comm {} ({})", id, it->second.label);
}

void StatusRenderer::RealRanks() {
  std::map<int, const json*> positions;
  for (const json& p : Arr(st_, "positions")) positions[p.value("rank", -1)] = &p;
  o_ << "\nreal ranks:\n";
  o_ << fmt::format("  {:<7} {:<14} {:<8} {:>6} {:>10} {:>11} {:>8}\n", "rank", "state", "pid", "iter", "last_it_s",
                    "peak_mem", "ops_done");
  for (const json& r : Arr(st_, "ranks")) RealRank(r, positions);
}

// One real rank's line, then where it is on each communicator (or only what it waits at, without a position).
void StatusRenderer::RealRank(const json& r, const std::map<int, const json*>& positions) {
  int rank = r.value("rank", -1);
  o_ << fmt::format("  {:<7} {:<14} {:<8} {:>6} {:>10.3f} {:>11} {:>8}\n", rank, Str(r, "state"), r.value("pid", 0),
                    r.value("iterations", 0), r.value("last_iteration_s", 0.0),
                    Mem(r.value("peak_memory_bytes", uint64_t{0})), r.value("ops_recorded", 0));
  auto p = positions.find(rank);
  if (p == positions.end()) {
    if (r.contains("waiting")) {
      const json& w = r["waiting"];
      o_ << fmt::format("      waiting at comm {} seq {} for {}\n", w.value("comm", 0), w.value("seq", 0),
                        Ago(w.value("since_ns", uint64_t{0}), now_));
    }
    return;
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
    by_comm_[id][rank] = c;
    std::string line = fmt::format("      {}: ", CommName(id));
    line += c.contains("done") ? fmt::format("done {} ({} ago)", OpText(c["done"]),
                                             Ago(c["done"].value("t_ns", uint64_t{0}), now_))
                               : std::string("nothing completed yet");
    if (c.contains("pending")) {
      line += fmt::format("; WAITING at {} for {}", OpText(c["pending"]),
                          Ago(c["pending"].value("since_ns", uint64_t{0}), now_));
      if (id == waiting_comm && !waiting_for.empty()) line += " on ranks " + RankListText(waiting_for);
    }
    o_ << line << "\n";
  }
}

// Virtual ranks, grouped by the communicators (with real members) they belong to.
void StatusRenderer::VirtualRanks() {
  int virt = st_.value("virtual_ranks", 0);
  if (virt > 0 && world_size_ > 0) {
    const std::vector<int> real_list = st_.value("real_ranks", std::vector<int>{});
    const std::set<int> real(real_list.begin(), real_list.end());
    std::vector<std::vector<uint32_t>> member_of(static_cast<size_t>(world_size_));
    for (const auto& [id, c] : comms_) {
      for (int m : c.members) {
        if (m >= 0 && m < world_size_ && !real.count(m)) member_of[static_cast<size_t>(m)].push_back(id);
      }
    }
    std::map<std::vector<uint32_t>, std::vector<int>> groups;
    for (int r = 0; r < world_size_; ++r) {
      if (!real.count(r)) groups[member_of[static_cast<size_t>(r)]].push_back(r);
    }
    std::string graph = Str(st_, "graph", "");
    o_ << fmt::format("\nvirtual ranks ({}): {}\n", virt,
                      graph.empty() ? fmt::format("payload '{}' without a graph: a virtual member of a communicator is "
                                                  "where its real members are",
                                                  Str(st_, "payload", "mirror"))
                                    : "they follow graph " + graph + " (positions below are the real members')");
    size_t shown = 0;
    for (const auto& [sig, ranks] : groups) {
      if (shown++ == opts_.max_groups) {
        o_ << fmt::format("  ... {} more groups\n", groups.size() - opts_.max_groups);
        break;
      }
      VirtualGroup(sig, ranks);
    }
  }
}

// One group of alike virtual ranks: per communicator, where its real members are.
void StatusRenderer::VirtualGroup(const std::vector<uint32_t>& sig, const std::vector<int>& ranks) {
  o_ << fmt::format("  {} ({} rank{}):", RankListText(ranks), ranks.size(), ranks.size() == 1 ? "" : "s");
  if (sig.empty()) {
    o_ << " in no communicator a real rank created; nothing to show\n";
    return;
  }
  o_ << "\n";
  for (uint32_t id : sig) {
    const auto& at = by_comm_[id];
    std::string line = fmt::format("      {}: as real rank{} {}", CommName(id),
                                   comms_[id].real.size() == 1 ? "" : "s", RankListText(comms_[id].real));
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
                          Ago(pending->value("since_ns", uint64_t{0}), now_));
    }
    o_ << line << "\n";
  }
}

}  // namespace

std::string RenderStatus(const StatusDocs& d, const StatusViewOptions& opts) {
  StatusRenderer r(d, opts);
  r.Coordinator();
  r.StatusLine();
  // The diagnosis first: it is what someone running status on a stuck job wants.
  r.Hang();
  if (!r.HasStatus()) return r.Text();
  r.Held();
  r.Store();
  r.Communicators();
  r.RealRanks();
  r.VirtualRanks();
  return r.Text();
}

}  // namespace prism::coord
