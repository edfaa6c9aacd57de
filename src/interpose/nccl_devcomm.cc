// The host side of NCCL's device API (nccl_device/core.h) that takes a communicator: libtorch_cuda imports
// ncclDevCommCreate/Destroy (symmetric memory kernels). Device communicators run NCCL's own kernels over real
// peers, which do not exist here: creation fails with ncclInvalidUsage (logged) instead of handing a
// libprism communicator to the real library. Teams are answered from the communicator.
#include <nccl.h>

#include "common/log.h"
#include "interpose/api.h"
#include "interpose/core/comm.h"

using namespace prism::interpose;

namespace {
// Same layout as nccl_device/core.h's struct ncclTeam (that header needs the CUDA device compiler).
struct Team {
  int nRanks, rank, stride;
};
}  // namespace

PRISM_API ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm) {
  (void)reqs;
  (void)outDevComm;
  if (ToComm(comm) == nullptr) return ncclInvalidArgument;
  SetLastError("NCCL device communicators (symmetric kernels) are not emulated by Prism");
  prism::Log("nccl")->warn("{}", LastError());
  return ncclInvalidUsage;
}

PRISM_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm) {
  (void)devComm;
  return ToComm(comm) == nullptr ? ncclInvalidArgument : ncclInvalidUsage;
}

PRISM_API ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, Team team, int nBarriers, void* outHandle,
                                                       void* outReq) {
  (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
  return ToComm(comm) == nullptr ? ncclInvalidArgument : ncclInvalidUsage;
}

PRISM_API Team ncclTeamWorld(ncclComm_t comm) {
  Comm* c = ToComm(comm);
  return c != nullptr ? Team{c->nranks, c->rank, 1} : Team{0, 0, 1};
}

// Load-store accessible peers: none but this rank (virtual peers have no memory to map).
PRISM_API Team ncclTeamLsa(ncclComm_t comm) { return ToComm(comm) != nullptr ? Team{1, 0, 1} : Team{0, 0, 1}; }

PRISM_API Team ncclTeamRail(ncclComm_t comm) {
  Comm* c = ToComm(comm);
  return c != nullptr ? Team{c->nranks, c->rank, 1} : Team{0, 0, 1};
}

PRISM_API int ncclTeamRankToWorld(ncclComm_t comm, Team team, int rank) {
  Comm* c = ToComm(comm);
  return c != nullptr ? c->rank + (rank - team.rank) * team.stride : -1;
}

PRISM_API int ncclTeamRankToLsa(ncclComm_t comm, Team team, int rank) {
  (void)comm, (void)team, (void)rank;
  return 0;
}
