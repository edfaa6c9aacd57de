#include "launcher/coordinator_link.h"

#include <algorithm>
#include <optional>

#include "coordinator/store_server.h"
#include "coordinator/virtual_ranks.h"
#include "launcher/megatron_membership.h"

namespace prism::launcher {
namespace {

class LocalCoordinator : public CoordinatorLink {
 public:
  ~LocalCoordinator() override { Stop(); }

  bool Start(Plan* plan, std::string* error) override {
    auto world = world::World::Make(plan->layout, plan->nproc_per_node, error);
    if (!world) return false;
    membership_ = std::make_unique<MegatronMembership>(*world);
    coord::VirtualRanksOptions vo;
    vo.world_size = plan->world_size;
    for (const RealRank& r : plan->real) vo.real_ranks.push_back(r.rank);
    // Why: the plan sets TORCH_NCCL_RANKS_PER_ROOT to this value, so both sides split scalable-init roots alike.
    vo.ranks_per_root = std::max(plan->world_size, 128);
    vo.membership = membership_.get();
    stand_in_ = std::make_unique<coord::VirtualRanks>(vo);

    store::StoreServerOptions so;
    so.host = plan->store_addr == "127.0.0.1" || plan->store_addr == "localhost" ? "127.0.0.1" : "0.0.0.0";
    so.port = static_cast<uint16_t>(plan->store_port);
    so.stand_in = stand_in_.get();
    server_ = std::make_unique<store::StoreServer>();
    std::string first_error;
    if (!server_->Start(so, &first_error)) {
      // Why: the job's --master-port (default 29500) may be taken by another run; any free port will do because
      // the workers are told the port through MASTER_PORT.
      so.port = 0;
      server_ = std::make_unique<store::StoreServer>();
      if (!server_->Start(so, error)) {
        *error = "coordinator store: " + *error + " (after " + first_error + ")";
        return false;
      }
    }
    SetStorePort(plan, server_->port());
    addr_ = so.host + ":" + std::to_string(server_->port());
    return true;
  }

  void Stop() override {
    if (server_) server_->Stop();
  }

  std::string Describe() const override {
    if (!server_) return "coordinator not started";
    std::string s = "coordinator store on " + addr_;
    if (stand_in_ && stand_in_->synthesized() > 0)
      s += ", " + std::to_string(stand_in_->synthesized()) + " NCCL ids stood in for virtual ranks";
    if (stand_in_) {
      auto unresolved = stand_in_->Unresolved();
      if (!unresolved.empty())
        s += ", " + std::to_string(unresolved.size()) + " keys of groups with unknown members (first: " +
             unresolved.front() + ")";
    }
    return s;
  }

 private:
  std::unique_ptr<MegatronMembership> membership_;
  std::unique_ptr<coord::VirtualRanks> stand_in_;
  std::unique_ptr<store::StoreServer> server_;
  std::string addr_;
};

}  // namespace

std::unique_ptr<CoordinatorLink> MakeLocalCoordinator() { return std::make_unique<LocalCoordinator>(); }

}  // namespace prism::launcher
