#include "nccl_patch/exchange.h"

#include <cstring>

#include "nccl_patch/dtype_math.h"

namespace prism::payload {
namespace {

bool ValidOp(const ExchangeOp& op) {
  if (op.nranks < 1 || op.root < 0 || op.root >= op.nranks) return false;
  if (DataTypeSize(op.dtype) == 0) return false;
  switch (op.op) {
    case OpKind::kAllReduce: case OpKind::kBroadcast: case OpKind::kReduce: case OpKind::kAllGather:
    case OpKind::kReduceScatter: case OpKind::kAllToAll: case OpKind::kGather: case OpKind::kScatter:
      break;
    default:
      return false;
  }
  const bool reduces = op.op == OpKind::kAllReduce || op.op == OpKind::kReduce || op.op == OpKind::kReduceScatter;
  if (reduces && (static_cast<int>(op.redop) < 0 || static_cast<int>(op.redop) > static_cast<int>(RedOp::kPreMulSum))) {
    return false;
  }
  return true;
}

// Element-wise reduction of `n` inputs (each `count` elements of D starting at element `first`) into dst.
template <int D>
void ReduceInto(uint8_t* dst, const std::vector<const uint8_t*>& in, uint64_t first, uint64_t count, RedOp redop,
                uint64_t scalar_bits) {
  using E = math::Elem<D>;
  using S = typename E::Storage;
  const size_t n = in.size();
  for (uint64_t i = 0; i < count; ++i) {
    S x;
    if constexpr (E::kIsFloat) {
      double scalar = 0;
      if (redop == RedOp::kPreMulSum) {
        S sb;
        std::memcpy(&sb, &scalar_bits, sizeof(S));
        scalar = E::Decode(sb);
      }
      double acc = 0;
      for (size_t j = 0; j < n; ++j) {
        S v;
        std::memcpy(&v, in[j] + (first + i) * sizeof(S), sizeof(S));
        double d = E::Decode(v);
        if (j == 0) {
          acc = redop == RedOp::kPreMulSum ? d * scalar : d;
          continue;
        }
        switch (redop) {
          case RedOp::kSum: case RedOp::kAvg: acc += d; break;
          case RedOp::kProd: acc *= d; break;
          case RedOp::kMax: acc = (d > acc || d != d) ? d : acc; break;
          case RedOp::kMin: acc = (d < acc || d != d) ? d : acc; break;
          case RedOp::kPreMulSum: acc += d * scalar; break;
        }
      }
      if (redop == RedOp::kAvg) acc /= static_cast<double>(n);
      x = E::Encode(acc);
    } else {
      uint64_t acc = 0;
      S sb{};
      std::memcpy(&sb, &scalar_bits, sizeof(S));
      const uint64_t scalar = E::ToU64(sb);
      for (size_t j = 0; j < n; ++j) {
        S v;
        std::memcpy(&v, in[j] + (first + i) * sizeof(S), sizeof(S));
        uint64_t u = E::ToU64(v);
        if (j == 0) {
          acc = redop == RedOp::kPreMulSum ? u * scalar : u;
          continue;
        }
        switch (redop) {
          case RedOp::kSum: case RedOp::kAvg: acc += u; break;
          case RedOp::kProd: acc *= u; break;
          case RedOp::kMax:
            if (E::kSigned ? static_cast<int64_t>(u) > static_cast<int64_t>(acc) : u > acc) acc = u;
            break;
          case RedOp::kMin:
            if (E::kSigned ? static_cast<int64_t>(u) < static_cast<int64_t>(acc) : u < acc) acc = u;
            break;
          case RedOp::kPreMulSum: acc += u * scalar; break;
        }
      }
      if (redop == RedOp::kAvg) {
        // NCCL divides the integer sum by n (truncating toward zero for signed types).
        acc = E::kSigned ? static_cast<uint64_t>(static_cast<int64_t>(E::FromU64(acc)) / static_cast<int64_t>(n))
                         : E::ToU64(E::FromU64(acc)) / n;
      }
      x = E::FromU64(acc);
    }
    std::memcpy(dst + i * sizeof(S), &x, sizeof(S));
  }
}

bool Reduce(uint8_t* dst, const std::vector<const uint8_t*>& in, uint64_t first, uint64_t count, const ExchangeOp& op) {
  bool ok = true;
  PRISM_PAYLOAD_DTYPE_SWITCH(static_cast<int>(op.dtype), D, ok = false,
                             ReduceInto<D>(dst, in, first, count, op.redop, op.premul_scalar_bits))
  return ok;
}

}  // namespace

uint64_t ExchangeInputBytes(const ExchangeOp& op, int32_t r) {
  const uint64_t s = DataTypeSize(op.dtype) * op.count;
  const uint64_t n = static_cast<uint64_t>(op.nranks);
  switch (op.op) {
    case OpKind::kAllReduce: case OpKind::kReduce: case OpKind::kAllGather: case OpKind::kGather: return s;
    case OpKind::kReduceScatter: case OpKind::kAllToAll: return n * s;
    case OpKind::kBroadcast: return r == op.root ? s : 0;
    case OpKind::kScatter: return r == op.root ? n * s : 0;
    default: return 0;
  }
}

uint64_t ExchangeOutputBytes(const ExchangeOp& op, int32_t r) {
  const uint64_t s = DataTypeSize(op.dtype) * op.count;
  const uint64_t n = static_cast<uint64_t>(op.nranks);
  switch (op.op) {
    case OpKind::kAllReduce: case OpKind::kReduceScatter: case OpKind::kBroadcast: case OpKind::kScatter: return s;
    case OpKind::kAllGather: case OpKind::kAllToAll: return n * s;
    case OpKind::kReduce: return r == op.root ? s : 0;
    case OpKind::kGather: return r == op.root ? n * s : 0;
    default: return 0;
  }
}

ExchangeResult ExchangeOutput(const ExchangeOp& op, const std::vector<const uint8_t*>& inputs, int32_t rank,
                              std::vector<uint8_t>* out) {
  out->clear();
  if (!ValidOp(op) || rank < 0 || rank >= op.nranks || inputs.size() != static_cast<size_t>(op.nranks)) {
    return ExchangeResult::kInvalid;
  }
  std::vector<int32_t> real;
  for (int32_t j = 0; j < op.nranks; ++j) {
    if (inputs[static_cast<size_t>(j)] != nullptr) real.push_back(j);
  }
  if (real.empty()) return ExchangeResult::kInvalid;
  // Stand-ins: member j's input, or for the i-th virtual member (rank order) q_{i mod k}'s.
  std::vector<const uint8_t*> in(inputs.size());
  size_t virtual_index = 0;
  for (int32_t j = 0; j < op.nranks; ++j) {
    const uint8_t* own = inputs[static_cast<size_t>(j)];
    in[static_cast<size_t>(j)] = own ? own : inputs[static_cast<size_t>(real[virtual_index++ % real.size()])];
  }
  const uint64_t out_bytes = ExchangeOutputBytes(op, rank);
  if (out_bytes == 0) return ExchangeResult::kNothing;
  const bool root_real = inputs[static_cast<size_t>(op.root)] != nullptr;
  if ((op.op == OpKind::kBroadcast || op.op == OpKind::kScatter) && !root_real) return ExchangeResult::kLocal;
  out->resize(out_bytes);
  const uint64_t esz = DataTypeSize(op.dtype);
  const uint64_t block = esz * op.count;
  switch (op.op) {
    case OpKind::kAllReduce:
    case OpKind::kReduce:
      if (!Reduce(out->data(), in, 0, op.count, op)) return ExchangeResult::kInvalid;
      break;
    case OpKind::kReduceScatter:
      if (!Reduce(out->data(), in, static_cast<uint64_t>(rank) * op.count, op.count, op)) {
        return ExchangeResult::kInvalid;
      }
      break;
    case OpKind::kAllGather:
    case OpKind::kGather:
      for (int32_t j = 0; j < op.nranks; ++j) {
        if (block) std::memcpy(out->data() + static_cast<uint64_t>(j) * block, in[static_cast<size_t>(j)], block);
      }
      break;
    case OpKind::kAllToAll:
      for (int32_t j = 0; j < op.nranks; ++j) {
        if (block) {
          std::memcpy(out->data() + static_cast<uint64_t>(j) * block,
                      in[static_cast<size_t>(j)] + static_cast<uint64_t>(rank) * block, block);
        }
      }
      break;
    case OpKind::kBroadcast:
      if (block) std::memcpy(out->data(), in[static_cast<size_t>(op.root)], block);
      break;
    case OpKind::kScatter:
      if (block) std::memcpy(out->data(), in[static_cast<size_t>(op.root)] + static_cast<uint64_t>(rank) * block, block);
      break;
    default:
      return ExchangeResult::kInvalid;
  }
  return ExchangeResult::kData;
}

}  // namespace prism::payload
