// The one place the launcher starts and stops the coordinator of an emulation.
//
// Today it runs, inside prism-run, the coordinator's rendezvous store (coordinator/store_server.h) with the
// virtual-rank stand-ins (coordinator/virtual_ranks.h) fed with the job's Megatron groups. When the coordinator's
// Start()/Stop() API (src/coordinator/coordinator.h) lands, LocalCoordinator switches to it; nothing else in the
// launcher changes.
#pragma once

#include <memory>
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
};

// The in-process coordinator.
std::unique_ptr<CoordinatorLink> MakeLocalCoordinator();

}  // namespace prism::launcher
