// NCCL collectives: each packs its arguments into one OpCall and hands it to Submit (core/submit.h), which
// writes the payload-policy output and gates the stream until the collective completes at the target scale.
#include <nccl.h>

#include "interpose/api.h"
#include "interpose/core/submit.h"

using namespace prism::interpose;
using prism::payload::OpKind;

namespace {

ncclResult_t Coll(OpKind op, const void* send, void* recv, size_t count, ncclDataType_t dtype, ncclRedOp_t redop,
                  int root, ncclComm_t comm, cudaStream_t stream) {
  const OpCall c{.op = op, .dtype = dtype, .redop = redop, .count = count, .send = send, .recv = recv, .root = root,
                 .comm = ToComm(comm), .stream = stream};
  return Guarded(ncclInternalError, [&] { return Submit(c); });
}

}  // namespace

PRISM_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                     ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (IsForeign(comm)) {
    return ForwardForeign(RealNccl().ncclAllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
  }
  return Coll(OpKind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

PRISM_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                     int root, ncclComm_t comm, cudaStream_t stream) {
  if (IsForeign(comm)) {
    return ForwardForeign(RealNccl().ncclBroadcast, sendbuff, recvbuff, count, datatype, root, comm, stream);
  }
  return Coll(OpKind::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

PRISM_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream) {
  if (IsForeign(comm)) return ForwardForeign(RealNccl().ncclBcast, buff, count, datatype, root, comm, stream);
  return Coll(OpKind::kBroadcast, buff, buff, count, datatype, ncclSum, root, comm, stream);
}

PRISM_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  if (IsForeign(comm)) {
    return ForwardForeign(RealNccl().ncclReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
  }
  return Coll(OpKind::kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

PRISM_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                     ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  if (IsForeign(comm)) {
    return ForwardForeign(RealNccl().ncclAllGather, sendbuff, recvbuff, sendcount, datatype, comm, stream);
  }
  return Coll(OpKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

PRISM_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
  if (IsForeign(comm)) {
    return ForwardForeign(RealNccl().ncclReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  }
  return Coll(OpKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

PRISM_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                    ncclComm_t comm, cudaStream_t stream) {
  if (IsForeign(comm)) {
    return ForwardForeign(RealNccl().ncclAlltoAll, sendbuff, recvbuff, count, datatype, comm, stream);
  }
  return Coll(OpKind::kAllToAll, sendbuff, recvbuff, count, datatype, ncclSum, 0, comm, stream);
}

PRISM_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                  int root, ncclComm_t comm, cudaStream_t stream) {
  if (IsForeign(comm)) {
    return ForwardForeign(RealNccl().ncclGather, sendbuff, recvbuff, count, datatype, root, comm, stream);
  }
  return Coll(OpKind::kGather, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

PRISM_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                   int root, ncclComm_t comm, cudaStream_t stream) {
  if (IsForeign(comm)) {
    return ForwardForeign(RealNccl().ncclScatter, sendbuff, recvbuff, count, datatype, root, comm, stream);
  }
  return Coll(OpKind::kScatter, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

#define PRISM_ALIAS(name) __attribute__((alias(#name), visibility("default")))
extern "C" {
ncclResult_t pncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)
    PRISM_ALIAS(ncclAllReduce);
ncclResult_t pncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    PRISM_ALIAS(ncclBroadcast);
ncclResult_t pncclBcast(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) PRISM_ALIAS(ncclBcast);
ncclResult_t pncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t)
    PRISM_ALIAS(ncclReduce);
ncclResult_t pncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)
    PRISM_ALIAS(ncclAllGather);
ncclResult_t pncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)
    PRISM_ALIAS(ncclReduceScatter);
ncclResult_t pncclAlltoAll(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t)
    PRISM_ALIAS(ncclAlltoAll);
ncclResult_t pncclGather(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    PRISM_ALIAS(ncclGather);
ncclResult_t pncclScatter(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    PRISM_ALIAS(ncclScatter);
}
