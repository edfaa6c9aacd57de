#include "launcher/coordinator_link.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "coordinator/coordinator.h"
#include "coordinator/hang/flight_recorder.h"
#include "coordinator/release/graph_release.h"
#include "replay/simulate.h"
#include "coordinator/store/store_client.h"
#include "model/megatron_membership.h"

namespace prism::launcher {
namespace {

constexpr int kRemoteLingerMs = 2000;

std::string EnvOf(const Plan& p, const std::string& k) {
  for (const auto& [name, v] : p.env)
    if (name == k) return v;
  return "";
}

class LocalCoordinator : public CoordinatorLink {
 public:
  ~LocalCoordinator() override { Stop(); }

  bool Start(Plan* plan, std::string* error) override {
    auto world = world::World::Make(plan->layout, plan->nproc_per_node, error);
    if (!world) return false;
    membership_ = std::make_unique<world::MegatronMembership>(*world);
    coord::CoordinatorOptions o;
    o.world_size = plan->world_size;
    o.real_ranks.clear();
    for (const RealRank& r : plan->real) o.real_ranks.push_back(r.rank);
    o.real_ranks.insert(o.real_ranks.end(), plan->remote_ranks.begin(), plan->remote_ranks.end());
    std::sort(o.real_ranks.begin(), o.real_ranks.end());
    remote_ = !plan->remote_ranks.empty();
    o.store_host = plan->listen.empty() ? plan->store_addr : plan->listen;
    // Other hosts' shims reach the event bus over TCP; its port is published in the store (coord::kInfoKey).
    if (!plan->listen.empty()) o.bus_tcp = plan->listen + ":0";
    o.store_port = static_cast<uint16_t>(plan->store_port);
    o.out_dir = plan->out_dir;
    o.layout = plan->layout.ToSpec();
    o.graph = EnvOf(*plan, "PRISM_GRAPH");
    o.topology = EnvOf(*plan, "PRISM_TOPOLOGY");
    o.payload = EnvOf(*plan, "PRISM_PAYLOAD");
    o.run_id = EnvOf(*plan, "TORCHELASTIC_RUN_ID");
    // Why: the plan sets TORCH_NCCL_RANKS_PER_ROOT to this value, so both sides split scalable-init roots alike.
    o.ranks_per_root = std::max(plan->world_size, 128);
    o.membership = membership_.get();
    o.hang_timeout_s = plan->hang_timeout_s;
    o.passthrough = plan->passthrough;
    o.passthrough_min_members = plan->passthrough_min_members;
    if (const char* v = std::getenv("PRISM_PASSTHROUGH_MIN_MEMBERS"); v != nullptr && *v != '\0') {
      o.passthrough_min_members = std::max(1, std::atoi(v));
    }
    // Why always a callback: the launcher decides (--on-hang) and records the hang in the report either way.
    o.on_hang = [this](const std::string& path) {
      std::lock_guard<std::mutex> lock(hang_mu_);
      hang_.push_back(path);
    };
    o.swap = plan->swap;
    if (o.swap.enabled) {
      // Why host/device: the key libprism's hello sends as gpu_id (the CUDA_VISIBLE_DEVICES entry it got).
      char host[256] = {0};
      ::gethostname(host, sizeof(host) - 1);
      for (const RealRank& r : plan->real) o.swap.rank_gpu[r.rank] = std::string(host) + "/" + r.device;
    }
    if (!o.graph.empty()) {
      graph_release_ = coord::GraphRelease::Load(o.graph, o.world_size, o.real_ranks, error);
      if (!graph_release_ || !graph_release_->UseTopology(o.topology, error)) return false;
      if (std::string w = EnvOf(*plan, "PRISM_WHAT_IF"); !w.empty()) {
        replay::WhatIf wi;
        if (!replay::ParseWhatIf(w, &wi, error) || !graph_release_->SetStragglers(wi.stragglers, error)) {
          *error = "--what-if " + w + ": " + *error;
          return false;
        }
      }
      if (std::string l = EnvOf(*plan, "PRISM_LOCKSTEP_SLOTS"); !l.empty()) {
        std::vector<std::string> slots;
        std::stringstream ss(l);
        for (std::string s; std::getline(ss, s, ',');)
          if (!s.empty()) slots.push_back(s);
        graph_release_->SetLockstepSlots(slots);
      }
      o.release_policy = graph_release_.get();
    }
    std::string first_error;
    coord_ = coord::Coordinator::Start(o, &first_error);
    if (!coord_) {
      // Why: the job's --master-port (default 29500) may be taken by another run; any free port will do because
      // the workers are told the port through MASTER_PORT.
      o.store_port = 0;
      coord_ = coord::Coordinator::Start(o, error);
      if (!coord_) {
        *error += " (first try: " + first_error + ")";
        return false;
      }
    }
    const coord::CoordinatorEndpoints& ep = coord_->endpoints();
    SetStorePort(plan, ep.store_port, ep.socket_path);
    addr_ = ep.store_host + ":" + std::to_string(ep.store_port) + ", event bus " + ep.socket_path;
    return true;
  }

  void Stop() override {
    if (!coord_) return;
    bool hang;
    {
      std::lock_guard<std::mutex> lock(hang_mu_);
      hang = had_hang_;
    }
    if (hang && remote_ && !stopped_) {
      // Why linger: prism-runs on other hosts poll the store (every 0.5 s) for the diagnosis and their dumps.
      std::this_thread::sleep_for(std::chrono::milliseconds(kRemoteLingerMs));
    }
    stopped_ = true;
    coord_->Stop();
    if (graph_release_ && !replay_said_) {
      replay_said_ = true;  // Why: Stop runs again at the launcher's exit
      // Why said: how the virtual ranks answered (a run with many blocked or unmatched decisions did not follow the
      // graph), and in fill slices how many collectives the lockstep slots released (fill --lockstep).
      const coord::GraphRelease::Stats st = graph_release_->stats();
      std::fprintf(stderr,
                   "prism: graph replay: %llu decisions from the graph (%llu on the real rank's own arrival, lockstep), "
                   "%llu blocked, %llu unmatched; %llu prereleases predicted; %llu priced by the cost model\n",
                   static_cast<unsigned long long>(st.decided), static_cast<unsigned long long>(st.lockstep),
                   static_cast<unsigned long long>(st.blocked), static_cast<unsigned long long>(st.unmatched),
                   static_cast<unsigned long long>(st.predicted), static_cast<unsigned long long>(st.modelled));
    }
  }

  std::optional<std::string> TakeHang() override {
    std::lock_guard<std::mutex> lock(hang_mu_);
    if (hang_.empty()) return std::nullopt;
    std::string p = hang_.front();
    hang_.erase(hang_.begin());
    had_hang_ = true;
    return p;
  }

  bool Admitted(int rank) override { return !coord_ || coord_->SwapAdmitted(rank); }
  void RankExited(int rank) override {
    if (coord_) coord_->SwapRankExited(rank);
  }

  std::string Describe() const override {
    if (!coord_) return "coordinator not started";
    std::string s = "coordinator: store " + addr_;
    uint64_t ids = coord_->virtual_ranks().synthesized();
    if (ids > 0) s += "; " + std::to_string(ids) + " NCCL ids stood in for virtual ranks";
    auto unresolved = coord_->virtual_ranks().Unresolved();
    if (!unresolved.empty())
      s += "; " + std::to_string(unresolved.size()) + " keys of groups with unknown members (first: " +
           unresolved.front() + ")";
    return s;
  }

 private:
  std::unique_ptr<world::MegatronMembership> membership_;
  std::unique_ptr<coord::GraphRelease> graph_release_;  // before coord_: outlives it
  std::unique_ptr<coord::Coordinator> coord_;
  std::string addr_;
  std::mutex hang_mu_;
  std::vector<std::string> hang_;  // hang.json paths not yet taken
  bool had_hang_ = false;
  bool remote_ = false;   // other hosts run real ranks against this coordinator
  bool stopped_ = false;
  bool replay_said_ = false;  // the graph replay line printed (Stop)
};

// A coordinator on another host, joined with --coordinator HOST:PORT: the hang diagnosis and the Flight Recorder
// dumps of this host's ranks come from its store (coord::kHangKey, kFrKeyPrefix), polled every half second.
class RemoteCoordinator : public CoordinatorLink {
 public:
  explicit RemoteCoordinator(const Plan& plan) : plan_(plan) {}
  bool Start(Plan*, std::string*) override { return true; }
  void Stop() override {}
  std::string Describe() const override {
    return "joined the coordinator at " + plan_.store_addr + ":" + std::to_string(plan_.store_port);
  }

  std::optional<std::string> TakeHang() override {
    auto now = std::chrono::steady_clock::now();
    if (now < next_poll_) return std::nullopt;
    next_poll_ = now + std::chrono::milliseconds(500);
    if (!client_ || !client_->error().empty()) {
      client_ = std::make_unique<store::StoreClient>();
      if (!client_->Connect(plan_.store_addr, static_cast<uint16_t>(plan_.store_port), 2000)) return std::nullopt;
    }
    std::string text;
    if (!client_->Get(coord::kHangKey, &text) || text.empty() || text == last_) return std::nullopt;
    last_ = text;
    namespace fs = std::filesystem;
    std::string path = (fs::path(plan_.out_dir) / "hang.json").string();
    std::string tmp = path + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f << text;
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    // This host's ranks' Flight Recorder dumps, as the coordinator wrote them at the diagnosis.
    fs::path fr = fs::path(plan_.out_dir) / coord::kFrDirName;
    fs::create_directories(fr, ec);
    for (const RealRank& r : plan_.real) {
      std::string name = std::string(coord::kFrPrefix) + std::to_string(r.rank), dump;
      if (client_->Get(std::string(coord::kFrKeyPrefix) + name, &dump) && !dump.empty()) {
        std::ofstream(fr / name, std::ios::binary | std::ios::trunc) << dump;
      }
    }
    return path;
  }

 private:
  Plan plan_;
  std::unique_ptr<store::StoreClient> client_;
  std::string last_;
  std::chrono::steady_clock::time_point next_poll_{};
};

}  // namespace

std::unique_ptr<CoordinatorLink> MakeLocalCoordinator() { return std::make_unique<LocalCoordinator>(); }

std::unique_ptr<CoordinatorLink> MakeRemoteCoordinator(const Plan& plan) {
  return std::make_unique<RemoteCoordinator>(plan);
}

}  // namespace prism::launcher
