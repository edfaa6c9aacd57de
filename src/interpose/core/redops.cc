#include "interpose/core/redops.h"

#include <cstring>
#include <mutex>

#include "interpose/core/real_symbols.h"

namespace prism::interpose {

ncclResult_t RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t dtype,
                                  ncclScalarResidence_t residence, Comm* comm) {
  // Why the real operator as is: it is only ever used with this communicator, whose operations go to the real NCCL.
  if (comm->real != nullptr) return RealNccl().ncclRedOpCreatePreMulSum(op, scalar, dtype, residence, comm->real);
  if (op == nullptr || scalar == nullptr || dtype < 0 || dtype >= ncclNumTypes) return ncclInvalidArgument;
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate) return ncclInvalidArgument;
  PreMulSumOp p;
  p.used = true;
  p.dtype = static_cast<payload::DataType>(dtype);
  if (residence == ncclScalarHostImmediate) {
    std::memcpy(&p.bits, scalar, payload::DataTypeSize(p.dtype));
  } else {
    p.addr = reinterpret_cast<uint64_t>(scalar);
  }
  std::lock_guard<std::mutex> lock(comm->mu);
  size_t idx = 0;
  while (idx < comm->redops.size() && comm->redops[idx].used) ++idx;
  try {
    if (idx == comm->redops.size()) comm->redops.push_back(p);
    else comm->redops[idx] = p;
  } catch (...) {
    return ncclSystemError;
  }
  if (idx + ncclNumOps > static_cast<size_t>(ncclMaxRedOp)) return ncclInvalidUsage;
  *op = static_cast<ncclRedOp_t>(ncclNumOps + static_cast<int>(idx));
  return ncclSuccess;
}

ncclResult_t RedOpDestroy(ncclRedOp_t op, Comm* comm) {
  if (comm->real != nullptr) return RealNccl().ncclRedOpDestroy(op, comm->real);
  if (static_cast<int>(op) < ncclNumOps) {
    SetLastError("ncclRedOpDestroy: built-in operators cannot be destroyed");
    return ncclInvalidArgument;
  }
  std::lock_guard<std::mutex> lock(comm->mu);
  size_t idx = static_cast<size_t>(op) - ncclNumOps;
  if (idx >= comm->redops.size() || !comm->redops[idx].used) return ncclInvalidArgument;
  comm->redops[idx].used = false;
  return ncclSuccess;
}

}  // namespace prism::interpose
