#include "coordinator/status_writer.h"

#include <unistd.h>

#include <algorithm>

#include "common/atomic_file.h"
#include "common/log.h"
#include "common/net.h"
#include "coordinator/swap_controller.h"

namespace prism::coord {
namespace {

using json = nlohmann::json;

const char* OpName(uint32_t op) {
  // prism::trace::CollOp values are the lead's; only names for status lines, numbers are printed too.
  if (op >= 100) return op == 103 ? "send" : op == 104 ? "recv" : "p2p";
  return "coll";
}

}  // namespace

void StatusWriter::WriteInfo(const char* state) {
  json j;
  j["version"] = 1;
  j["state"] = state;
  j["run_id"] = st_.opts.run_id;
  j["pid"] = ::getpid();
  j["host"] = net::HostName();
  j["store_host"] = st_.ep.store_host;
  j["store_bind"] = st_.opts.store_host;
  j["store_port"] = st_.ep.store_port;
  j["socket"] = st_.ep.socket_path;
  j["bus_tcp"] = st_.ep.bus_tcp;
  j["world_size"] = st_.opts.world_size;
  j["real_ranks"] = st_.opts.real_ranks;
  j["out_dir"] = st_.opts.out_dir;
  j["layout"] = st_.opts.layout;
  j["graph"] = st_.opts.graph;
  j["payload"] = st_.opts.payload;
  j["started_ns"] = started_ns_;
  j["status"] = "status.json";
  if (std::string(state) != "running") j["stopped_ns"] = NowNs();
  info_written_ = true;
  std::string text = j.dump(2) + "\n";
  if (std::string error; !WriteFileAtomic(st_.ep.info_path, text, &error)) Log("coord")->error("{}", error);
  // Why in the store too: a prism-run joining from another host learns the event bus port and the real ranks there.
  store_.Call([&](store::StoreState& st) { st.Set(kInfoKey, text); });
}

json StatusWriter::StatusLocked() {
  json j;
  j["version"] = 1;
  j["t_ns"] = NowNs();
  j["run_id"] = st_.opts.run_id;
  j["world_size"] = st_.opts.world_size;
  j["real_ranks"] = st_.opts.real_ranks;
  j["virtual_ranks"] = st_.opts.world_size - static_cast<int>(st_.opts.real_ranks.size());
  j["payload"] = st_.opts.payload;
  j["graph"] = st_.opts.graph;
  j["comms"] = comms_.size();
  j["releases"] = release_.releases();
  j["prereleases"] = {{"sent", release_.prereleases_sent()},
                      {"used", release_.prereleases_used()},
                      {"disagreed", release_.prerelease_mismatches()}};
  const auto& pending = release_.pending();
  json ranks = json::array();
  for (const auto& [r, s] : st_.ranks) {
    json x = {{"rank", r},
              {"state", s.state},
              {"pid", s.pid},
              {"host", s.host},
              {"gpu", s.gpu},
              {"iterations", s.iterations},
              {"last_iteration_s", static_cast<double>(s.last_iter_dur_ns) * 1e-9},
              {"peak_memory_bytes", s.peak_bytes},
              {"current_memory_bytes", s.current_bytes},
              {"torch_max_allocated", s.torch_max_allocated},
              {"ops_arrived", s.ops_arrived},
              {"ops_recorded", s.ops_recorded},
              {"last_seen_ns", s.last_seen_ns}};
    if (!s.bye_reason.empty()) x["bye_reason"] = s.bye_reason;
    if (swap_) x["swap"] = SwapPhaseName(swap_->scheduler().phase(r));
    if (s.has_record) {
      uint32_t comm = s.last_record.comm_id, op = s.last_record.op;
      uint64_t seq = s.last_record.seq, bytes = s.last_record.bytes;
      x["last_op"] = {{"comm", comm}, {"seq", seq}, {"op", op}, {"bytes", bytes}};
    }
    if (s.waiting) {
      json w = {{"comm", s.waiting_comm}, {"seq", s.waiting_seq}, {"op", s.waiting_op},
                {"kind", OpName(s.waiting_op)}, {"since_ns", s.waiting_since_ns}};
      auto p = pending.find({s.waiting_comm, s.waiting_seq});
      if (p != pending.end() && s.waiting_comm >= 1 && s.waiting_comm <= comms_.size()) {
        std::vector<int> missing;
        for (int m : comms_[s.waiting_comm - 1].real_members) {
          bool in = std::any_of(p->second.begin(), p->second.end(), [&](const Arrival& a) { return a.rank == m; });
          if (!in) missing.push_back(m);
        }
        w["waiting_for"] = missing;
      }
      x["waiting"] = w;
    }
    ranks.push_back(std::move(x));
  }
  j["ranks"] = std::move(ranks);
  json held = json::array();
  for (const auto& [key, what] : release_.held()) {
    held.push_back({{"comm", key.first}, {"seq", key.second}, {"differs", what}});
  }
  j["held"] = std::move(held);
  if (swap_) j["swap"] = swap_->Json();
  AddPositions(st_.hang, &j);
  return j;
}

std::string StatusWriter::StatusJson() {
  json j;
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    j = StatusLocked();
  }
  store::ServerStats st = store_.Stats();
  j["store"] = {{"host", st_.ep.store_host},
                {"port", st_.ep.store_port},
                {"clients", st.clients},
                {"accepted", st.accepted},
                {"dropped", st.dropped},
                {"keys", st.store.keys},
                {"bytes", st.store.bytes},
                {"waits", st.store.waits},
                {"requests", st.store.requests},
                {"synthesized", st.store.materialized},
                {"waited_keys", store_.WaitedKeys(20)},
                {"unresolved_groups", st_.vr->Unresolved()}};
  return j.dump(2) + "\n";
}

void StatusWriter::MaybeWriteStatus(bool force) {
  {
    std::lock_guard<std::mutex> lock(st_.mu);
    // Store activity changes status too (clients, waits): refresh at least every 10 intervals.
    if (!force && !st_.status_dirty && ++idle_ticks_ < 10) return;
    idle_ticks_ = 0;
    st_.status_dirty = false;
  }
  std::string text = StatusJson();
  if (std::string error; !WriteFileAtomic(st_.ep.status_path, text, &error)) Log("coord")->warn("{}", error);
  // Why also in the store: `prism-run status HOST:PORT` and prism-runs joining from other hosts read it there.
  store_.Call([&](store::StoreState& st) { st.Set(kStatusKey, text); });
}

}  // namespace prism::coord
