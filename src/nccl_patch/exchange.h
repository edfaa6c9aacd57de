// Real data between real members of a communicator ("exchange"): when two or more members of a communicator are
// real, the coordinator gathers their inputs on the host and computes what each real member's output is, so a
// tensor-parallel pair of real ranks agrees on its all-reduce and a real broadcast root reaches real receivers.
// Virtual members still contribute something: each stands in with the input of one real member (below).
//
// Rule (docs/payload.md "Exchange"): let the real members in communicator-rank order be q_0 < q_1 < ... < q_{k-1}.
// The i-th virtual member (i = 0, 1, ... in communicator-rank order) contributes the input of q_{i mod k}. Then the operation is computed as NCCL defines it over
// all n inputs:
//   all-reduce / reduce (root) / reduce-scatter: element-wise reduction in communicator-rank order; floats are
//     widened to double, reduced, rounded once to the element type (dtype_math.h rounding); integers wrap;
//     AVG = sum / n (integer division for integer types, as NCCL); PreMulSum = sum(scalar * x_i).
//   all-gather / gather (root): block j is member j's input.  all-to-all: block j is member j's block for me.
//   broadcast: the root's input, when the root is real; a virtual root has no data (ExchangeResult::kLocal).
//   scatter: my block of the root's input when the root is real, else kLocal.
// A receiver for which nothing is defined by real data gets kLocal: the shim applies the run's local policy
// (mirror, recorded, ...). Why q_{i mod k} and not "each real rank mirrors itself": every real member must see
// the same result (a tensor-parallel group must agree), and the stand-ins spread over the real inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "nccl_patch/semantics.h"

namespace prism::payload {

struct ExchangeOp {
  OpKind op = OpKind::kInvalid;  // collectives only (not kSend/kRecv: p2p moves bytes unchanged)
  DataType dtype = DataType::kFloat32;
  RedOp redop = RedOp::kSum;
  uint64_t premul_scalar_bits = 0;  // kPreMulSum: the scalar's bits (one element of dtype)
  int32_t nranks = 0;
  int32_t root = 0;
  uint64_t count = 0;  // NCCL's count argument (see OpKind)
};

enum class ExchangeResult : int32_t {
  kData = 0,     // `out` holds this member's output bytes
  kLocal = 1,    // nothing to write from real data: apply the local policy
  kNothing = 2,  // this member has no output (non-root of reduce/gather)
  kInvalid = 3,  // bad arguments (sizes, op, dtype)
};

// Input bytes member `r` sends for `op` (0 for members that send nothing, e.g. non-roots of broadcast).
uint64_t ExchangeInputBytes(const ExchangeOp& op, int32_t r);
// Output bytes member `r` receives (0 when none).
uint64_t ExchangeOutputBytes(const ExchangeOp& op, int32_t r);

// `inputs[j]` is member j's input (ExchangeInputBytes(op, j) bytes) or nullptr when member j is virtual; at least
// one must be non-null. Computes member `rank`'s output into `out` (resized).
ExchangeResult ExchangeOutput(const ExchangeOp& op, const std::vector<const uint8_t*>& inputs, int32_t rank,
                              std::vector<uint8_t>* out);

// ExchangeOutput in two steps, so a caller can compute an output in pieces straight into its own buffers (the
// coordinator writes it into the result's frames): what member `rank` gets (kData with *bytes = its output size,
// kLocal, kNothing, kInvalid), then bytes [offset, offset + len) of that output into dst (offset and len multiples of
// the element size; false when the output is not kData or the range is outside it). Any split writes the same
// bytes as one ExchangeOutput.
ExchangeResult ExchangePlanOutput(const ExchangeOp& op, const std::vector<const uint8_t*>& inputs, int32_t rank,
                                  uint64_t* bytes);
bool ExchangeOutputRange(const ExchangeOp& op, const std::vector<const uint8_t*>& inputs, int32_t rank,
                         uint64_t offset, uint64_t len, uint8_t* dst);

// The element-wise reduction ExchangeOutput does for all-reduce, reduce and reduce-scatter: `in[j]` is member j's
// input with stand-ins already resolved (every entry non-null), elements [first, first + count) of each are reduced
// into `dst` (count elements). ExchangeReduce is the fast path (compile-time dtype and operation, blocks, several
// threads for large inputs: PRISM_EXCHANGE_THREADS, default half the cores, at most 8); ExchangeReduceReference the
// one-element-at-a-time code it replaced, kept for the tests, which compare the two byte for byte. False: bad op.
bool ExchangeReduce(const ExchangeOp& op, const std::vector<const uint8_t*>& in, uint64_t first, uint64_t count,
                    uint8_t* dst);
bool ExchangeReduceReference(const ExchangeOp& op, const std::vector<const uint8_t*>& in, uint64_t first,
                             uint64_t count, uint8_t* dst);
// Tests: split every reduction over `threads` threads whatever its size (0: back to the default).
void SetExchangeReduceThreadsForTest(int threads);

// Whether every member gets the same answer (all-reduce, all-gather, broadcast): the coordinator computes it once
// and sends it to every real member.
bool ExchangeOutputIsShared(const ExchangeOp& op);

}  // namespace prism::payload
