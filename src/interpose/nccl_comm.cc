// NCCL communicator API: unique ids, init (rank, config, scalable, all), split, shrink, queries, finalize,
// destroy, abort, revoke, async errors. Thin: each converts its arguments and calls one function of
// core/comm.h. pnccl* are NCCL's profiling aliases of the same functions.
#include <nccl.h>

#include "interpose/api.h"
#include "interpose/core/comm.h"

using namespace prism::interpose;

namespace {

ncclResult_t InitInto(ncclComm_t* out, const InitArgs& a) {
  if (out == nullptr) return ncclInvalidArgument;
  return Guarded(ncclInternalError, [&] {
    Comm* c = nullptr;
    ncclResult_t r = CommInit(a, &c);
    if (c != nullptr) *out = reinterpret_cast<ncclComm_t>(c);  // also for ncclInProgress (nonblocking)
    return r;
  });
}

ncclResult_t WithComm(ncclComm_t comm, ncclResult_t (*fn)(Comm*)) {
  Comm* c = ToComm(comm);
  if (c == nullptr) {
    SetLastError("invalid communicator");
    return ncclInvalidArgument;
  }
  return Guarded(ncclInternalError, [&] { return fn(c); });
}

}  // namespace

PRISM_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  // Why the caller: libnccl's ncclCommInitAll (a passthrough job's own) takes its id through the public function.
  if (CalledFromRealNccl(__builtin_return_address(0))) return ForwardForeign(RealNccl().ncclGetUniqueId, uniqueId);
  return Guarded(ncclInternalError, [&] { return GetUniqueId(uniqueId); });
}

PRISM_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                              ncclConfig_t* config) {
  InitArgs a;
  a.nranks = nranks;
  a.rank = rank;
  a.ids = &commId;
  a.config = config;
  return InitInto(comm, a);
}

PRISM_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

PRISM_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                ncclUniqueId* commIds, ncclConfig_t* config) {
  InitArgs a;
  a.nranks = nranks;
  a.rank = myrank;
  a.ids = commIds;
  a.nids = nId;
  a.config = config;
  return InitInto(newcomm, a);
}

PRISM_API ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  return Guarded(ncclInternalError, [&] { return CommInitAll(comm, ndev, devlist); });
}

PRISM_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  Comm* c = ToComm(comm);
  if (c == nullptr) return ForwardForeign(RealNccl().ncclCommSplit, comm, color, key, newcomm, config);
  return Guarded(ncclInternalError, [&] { return CommSplit(c, color, key, newcomm, config); });
}

PRISM_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                      ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  Comm* c = ToComm(comm);
  if (c == nullptr) return ncclInvalidArgument;
  return Guarded(ncclInternalError,
                 [&] { return CommShrink(c, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags); });
}

PRISM_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (IsForeign(comm)) return ForwardForeign(RealNccl().ncclCommFinalize, comm);
  return WithComm(comm, &CommFinalize);
}
PRISM_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // NCCL accepts destroying NULL
  if (ToComm(comm) == nullptr) return ForwardForeign(RealNccl().ncclCommDestroy, comm);
  return WithComm(comm, &CommDestroy);
}
PRISM_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (ToComm(comm) == nullptr) return ForwardForeign(RealNccl().ncclCommAbort, comm);
  return WithComm(comm, &CommAbort);
}

PRISM_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  Comm* c = ToComm(comm);
  if (c == nullptr) return ncclInvalidArgument;
  return Guarded(ncclInternalError, [&] { return CommRevoke(c, revokeFlags); });
}

PRISM_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  Comm* c = ToComm(comm);
  if (c == nullptr) return ForwardForeign(RealNccl().ncclCommGetAsyncError, comm, asyncError);
  return Guarded(ncclInternalError, [&] { return CommGetAsyncError(c, asyncError); });
}

PRISM_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  Comm* c = ToComm(comm);
  if (c == nullptr && comm != nullptr) return ForwardForeign(RealNccl().ncclCommCount, comm, count);
  if (c == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = c->nranks;
  return ncclSuccess;
}

PRISM_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  Comm* c = ToComm(comm);
  if (c == nullptr && comm != nullptr) return ForwardForeign(RealNccl().ncclCommCuDevice, comm, device);
  if (c == nullptr || device == nullptr) return ncclInvalidArgument;
  *device = c->device;
  return ncclSuccess;
}

PRISM_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  Comm* c = ToComm(comm);
  if (c == nullptr && comm != nullptr) return ForwardForeign(RealNccl().ncclCommUserRank, comm, rank);
  if (c == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = c->rank;
  return ncclSuccess;
}

#define PRISM_ALIAS(name) __attribute__((alias(#name), visibility("default")))
extern "C" {
ncclResult_t pncclGetUniqueId(ncclUniqueId*) PRISM_ALIAS(ncclGetUniqueId);
ncclResult_t pncclCommInitRankConfig(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*)
    PRISM_ALIAS(ncclCommInitRankConfig);
ncclResult_t pncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) PRISM_ALIAS(ncclCommInitRank);
ncclResult_t pncclCommInitRankScalable(ncclComm_t*, int, int, int, ncclUniqueId*, ncclConfig_t*)
    PRISM_ALIAS(ncclCommInitRankScalable);
ncclResult_t pncclCommInitAll(ncclComm_t*, int, const int*) PRISM_ALIAS(ncclCommInitAll);
ncclResult_t pncclCommSplit(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*) PRISM_ALIAS(ncclCommSplit);
ncclResult_t pncclCommShrink(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int) PRISM_ALIAS(ncclCommShrink);
ncclResult_t pncclCommFinalize(ncclComm_t) PRISM_ALIAS(ncclCommFinalize);
ncclResult_t pncclCommDestroy(ncclComm_t) PRISM_ALIAS(ncclCommDestroy);
ncclResult_t pncclCommAbort(ncclComm_t) PRISM_ALIAS(ncclCommAbort);
ncclResult_t pncclCommRevoke(ncclComm_t, int) PRISM_ALIAS(ncclCommRevoke);
ncclResult_t pncclCommGetAsyncError(ncclComm_t, ncclResult_t*) PRISM_ALIAS(ncclCommGetAsyncError);
ncclResult_t pncclCommCount(const ncclComm_t, int*) PRISM_ALIAS(ncclCommCount);
ncclResult_t pncclCommCuDevice(const ncclComm_t, int*) PRISM_ALIAS(ncclCommCuDevice);
ncclResult_t pncclCommUserRank(const ncclComm_t, int*) PRISM_ALIAS(ncclCommUserRank);
}
