// PreMulSum reduction operators (ncclRedOpCreatePreMulSum / ncclRedOpDestroy): kept per communicator (comm.h
// PreMulSumOp) and applied by the payload steps; a passthrough communicator's go to the real NCCL.
#pragma once

#include <nccl.h>

#include "interpose/core/comm.h"

namespace prism::interpose {

ncclResult_t RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t dtype,
                                  ncclScalarResidence_t residence, Comm* comm);
ncclResult_t RedOpDestroy(ncclRedOp_t op, Comm* comm);

}  // namespace prism::interpose
