// ncclSend / ncclRecv. Inside a group, a group's sends and receives act as one exchange (core/submit.h); under
// the mirror policy a receive gets this rank's own most recent send of that size (src/nccl_patch/semantics.h).
#include <nccl.h>

#include "interpose/api.h"
#include "interpose/core/submit.h"

using namespace prism::interpose;
using prism::payload::OpKind;

namespace {

ncclResult_t P2p(OpKind op, const void* send, void* recv, size_t count, ncclDataType_t dtype, int peer,
                 ncclComm_t comm, cudaStream_t stream) {
  const OpCall c{.op = op, .dtype = dtype, .count = count, .send = send, .recv = recv, .peer = peer,
                 .comm = ToComm(comm), .stream = stream};
  return Guarded(ncclInternalError, [&] { return Submit(c); });
}

}  // namespace

PRISM_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                ncclComm_t comm, cudaStream_t stream) {
  if (IsForeign(comm)) return ForwardForeign(RealNccl().ncclSend, sendbuff, count, datatype, peer, comm, stream);
  return P2p(OpKind::kSend, sendbuff, nullptr, count, datatype, peer, comm, stream);
}

PRISM_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                cudaStream_t stream) {
  if (IsForeign(comm)) return ForwardForeign(RealNccl().ncclRecv, recvbuff, count, datatype, peer, comm, stream);
  return P2p(OpKind::kRecv, nullptr, recvbuff, count, datatype, peer, comm, stream);
}

#define PRISM_ALIAS(name) __attribute__((alias(#name), visibility("default")))
extern "C" {
ncclResult_t pncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) PRISM_ALIAS(ncclSend);
ncclResult_t pncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) PRISM_ALIAS(ncclRecv);
}
