// The one place the launcher starts and stops the coordinator of an emulation.
//
// LocalCoordinator runs prism::coord::Coordinator (src/coordinator/coordinator.h: the rendezvous store with virtual
// ranks standing in, and libprism's event bus) in background threads of prism-run, with the job's Megatron groups
// (model/megatron_membership.h) as the fallback membership. Its files (coordinator.json, status.json, coord.sock)
// go to the run's output directory, so `prism-run status DIR` works on a running emulation.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "launcher/plan.h"

namespace prism::launcher {

class CoordinatorLink {
 public:
  virtual ~CoordinatorLink() = default;
  // Starts the coordinator for `plan`: its store listens on plan->store_addr:plan->store_port when that port is
  // free, else on a free port, and plan->store_port (and MASTER_PORT) is updated. False with *error.
  virtual bool Start(Plan* plan, std::string* error) = 0;
  // Stops it (idempotent). Called after the workers are gone.
  virtual void Stop() = 0;
  // One line for people: where it listens, what it answered so far.
  virtual std::string Describe() const = 0;
  // The path of hang.json once the coordinator diagnosed a hang (plan.hang_timeout_s), once per diagnosis;
  // nullopt otherwise. Polled by the launcher, which stops the job under --on-hang stop.
  virtual std::optional<std::string> TakeHang() { return std::nullopt; }
  // Context switching (collect --swap): may the launcher start this rank's worker now (its GPU has room); the
  // worker of this rank ended (the scheduler forgets it). Without --swap every rank may start at once.
  virtual bool Admitted(int rank) { return true; }
  virtual void RankExited(int rank) {}
};

// The in-process coordinator.
std::unique_ptr<CoordinatorLink> MakeLocalCoordinator();
// A coordinator another host runs (plan.start_coordinator false, joined by HOST:PORT): reports its hang diagnosis
// (copied into this run's hang.json, with this host's ranks' Flight Recorder dumps).
std::unique_ptr<CoordinatorLink> MakeRemoteCoordinator(const Plan& plan);

}  // namespace prism::launcher
