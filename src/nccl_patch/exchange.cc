#include "nccl_patch/exchange.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

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

// The reference: element-wise reduction of `n` inputs (each `count` elements of D starting at element `first`) into
// dst, one element at a time through dtype_math.h. The fast paths below must write the same bytes (tests compare).
template <int D>
void ReduceIntoReference(uint8_t* dst, const std::vector<const uint8_t*>& in, uint64_t first, uint64_t count, RedOp redop,
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

bool ReduceReference(uint8_t* dst, const std::vector<const uint8_t*>& in, uint64_t first, uint64_t count, const ExchangeOp& op) {
  bool ok = true;
  PRISM_PAYLOAD_DTYPE_SWITCH(static_cast<int>(op.dtype), D, ok = false,
                             ReduceIntoReference<D>(dst, in, first, count, op.redop, op.premul_scalar_bits))
  return ok;
}

// ---- fast paths ------------------------------------------------------------------------------------------------
// The same arithmetic as the reference (each element widened exactly to double, reduced in member order, rounded
// once), with the dtype and the operation fixed at compile time and elements taken in blocks, so the compiler
// hoists the dispatch and vectorises widening and accumulation; exact shortcuts for widening narrow floats (bf16 is
// the upper half of an fp32; fp16 and fp8 by a table built from dtype_math.h) and for rounding to bf16/fp16 in their
// normal range. Everything else (subnormal results, overflow, NaN, fp8) goes through dtype_math.h.

template <int D>
struct Fast {
  using E = math::Elem<D>;
  using S = typename E::Storage;
  static double Widen(S x) { return E::Decode(x); }
  static void NarrowBlock(const double* acc, S* v, uint64_t m) {
    for (uint64_t i = 0; i < m; ++i) v[i] = E::Encode(acc[i]);
  }
};

template <int D, int kTableBits>
const double* WidenTable() {
  static const std::vector<double> table = [] {
    std::vector<double> t(size_t{1} << kTableBits);
    for (size_t c = 0; c < t.size(); ++c) t[c] = math::Elem<D>::Decode(static_cast<typename math::Elem<D>::Storage>(c));
    return t;
  }();
  return table.data();
}

// Round to nearest even for an IEEE format with `kMan` mantissa bits and bias `kBias` (bf16, fp16), whose largest
// finite code is just below the Inf code, so a carry out of the largest finite value gives Inf as the reference does.
// A block at a time without branches (the usual add-half-minus-one-plus-lsb rounding on the bits); elements outside
// the format's normal range (subnormal results, overflow of the exponent, zero, Inf, NaN) are redone by the reference.
template <int kMan, int kBias>
inline void NarrowIeeeBlock(const double* acc, uint16_t* v, uint64_t m, math::SmallFloatFormat f) {
  constexpr int kExpBits = kMan == 7 ? 8 : 5;
  constexpr uint64_t kLo = 1023 + 1 - kBias, kHi = 1023 + ((1 << kExpBits) - 2) - kBias;
  constexpr int kShift = 52 - kMan;
  constexpr uint64_t kHalfMinusOne = (uint64_t{1} << (kShift - 1)) - 1;
  uint64_t outside = 0;
  for (uint64_t i = 0; i < m; ++i) {
    const uint64_t b = math::DoubleToBits(acc[i]);
    const uint64_t dexp = (b >> 52) & 0x7FF;
    uint64_t t = ((dexp - 1023 + kBias) << 52) | (b & ((uint64_t{1} << 52) - 1));
    t += kHalfMinusOne + ((t >> kShift) & 1);
    v[i] = static_cast<uint16_t>((((b >> 63) << (kExpBits + kMan)) | (t >> kShift)) & 0xFFFF);
    outside |= static_cast<uint64_t>(dexp - kLo > kHi - kLo);  // one unsigned compare: below kLo wraps around
  }
  if (outside == 0) return;
  for (uint64_t i = 0; i < m; ++i) {
    const uint64_t dexp = (math::DoubleToBits(acc[i]) >> 52) & 0x7FF;
    if (dexp < kLo || dexp > kHi) v[i] = static_cast<uint16_t>(math::EncodeSmallFloat(acc[i], f));
  }
}

template <>
struct Fast<math::kDtBfloat16> {
  using S = uint16_t;
  static double Widen(S x) { return static_cast<double>(math::BitsToFloat(static_cast<uint32_t>(x) << 16)); }
  static void NarrowBlock(const double* acc, S* v, uint64_t m) { NarrowIeeeBlock<7, 127>(acc, v, m, math::FormatBf16()); }
};
template <>
struct Fast<math::kDtFloat16> {
  using S = uint16_t;
  static double Widen(S x) { return WidenTable<math::kDtFloat16, 16>()[x]; }
  static void NarrowBlock(const double* acc, S* v, uint64_t m) { NarrowIeeeBlock<10, 15>(acc, v, m, math::FormatF16()); }
};
template <>
struct Fast<math::kDtFloat8e4m3> {
  using S = uint8_t;
  static double Widen(S x) { return WidenTable<math::kDtFloat8e4m3, 8>()[x]; }
  static void NarrowBlock(const double* acc, S* v, uint64_t m) {
    for (uint64_t i = 0; i < m; ++i) v[i] = math::Elem<math::kDtFloat8e4m3>::Encode(acc[i]);
  }
};
template <>
struct Fast<math::kDtFloat8e5m2> {
  using S = uint8_t;
  static double Widen(S x) { return WidenTable<math::kDtFloat8e5m2, 8>()[x]; }
  static void NarrowBlock(const double* acc, S* v, uint64_t m) {
    for (uint64_t i = 0; i < m; ++i) v[i] = math::Elem<math::kDtFloat8e5m2>::Encode(acc[i]);
  }
};

constexpr uint64_t kBlock = 1024;

template <int D, RedOp R>
void ReduceFloatFast(uint8_t* dst, const std::vector<const uint8_t*>& in, uint64_t first, uint64_t count,
                     uint64_t scalar_bits) {
  using F = Fast<D>;
  using S = typename math::Elem<D>::Storage;
  const size_t n = in.size();
  double scalar = 0;
  if constexpr (R == RedOp::kPreMulSum) {
    S sb;
    std::memcpy(&sb, &scalar_bits, sizeof(S));
    scalar = math::Elem<D>::Decode(sb);
  }
  double acc[kBlock];
  S v[kBlock];
  // Why element loads through memcpy: inputs need not be aligned to the element; the compiler emits plain loads.
  auto load = [](const uint8_t* p, uint64_t i) {
    S x;
    std::memcpy(&x, p + i * sizeof(S), sizeof(S));
    return x;
  };
  for (uint64_t b = 0; b < count; b += kBlock) {
    const uint64_t m = std::min(kBlock, count - b);
    const uint8_t* p0 = in[0] + (first + b) * sizeof(S);
    for (uint64_t i = 0; i < m; ++i) {
      const double d = F::Widen(load(p0, i));
      acc[i] = R == RedOp::kPreMulSum ? d * scalar : d;
    }
    for (size_t j = 1; j < n; ++j) {
      const uint8_t* pj = in[j] + (first + b) * sizeof(S);
      for (uint64_t i = 0; i < m; ++i) {
        const double d = F::Widen(load(pj, i));
        if constexpr (R == RedOp::kSum || R == RedOp::kAvg) acc[i] += d;
        if constexpr (R == RedOp::kProd) acc[i] *= d;
        if constexpr (R == RedOp::kMax) acc[i] = (d > acc[i] || d != d) ? d : acc[i];
        if constexpr (R == RedOp::kMin) acc[i] = (d < acc[i] || d != d) ? d : acc[i];
        if constexpr (R == RedOp::kPreMulSum) acc[i] += d * scalar;
      }
    }
    if constexpr (R == RedOp::kAvg) {
      for (uint64_t i = 0; i < m; ++i) acc[i] /= static_cast<double>(n);
    }
    F::NarrowBlock(acc, v, m);
    std::memcpy(dst + b * sizeof(S), v, m * sizeof(S));
  }
}

template <int D, RedOp R>
void ReduceIntFast(uint8_t* dst, const std::vector<const uint8_t*>& in, uint64_t first, uint64_t count,
                   uint64_t scalar_bits) {
  using E = math::Elem<D>;
  using S = typename E::Storage;
  const size_t n = in.size();
  S sb{};
  std::memcpy(&sb, &scalar_bits, sizeof(S));
  const uint64_t scalar = E::ToU64(sb);
  uint64_t acc[kBlock];
  S v[kBlock];
  for (uint64_t b = 0; b < count; b += kBlock) {
    const uint64_t m = std::min(kBlock, count - b);
    std::memcpy(v, in[0] + (first + b) * sizeof(S), m * sizeof(S));
    for (uint64_t i = 0; i < m; ++i) acc[i] = R == RedOp::kPreMulSum ? E::ToU64(v[i]) * scalar : E::ToU64(v[i]);
    for (size_t j = 1; j < n; ++j) {
      std::memcpy(v, in[j] + (first + b) * sizeof(S), m * sizeof(S));
      for (uint64_t i = 0; i < m; ++i) {
        const uint64_t u = E::ToU64(v[i]);
        if constexpr (R == RedOp::kSum || R == RedOp::kAvg) acc[i] += u;
        if constexpr (R == RedOp::kProd) acc[i] *= u;
        if constexpr (R == RedOp::kMax) {
          if (E::kSigned ? static_cast<int64_t>(u) > static_cast<int64_t>(acc[i]) : u > acc[i]) acc[i] = u;
        }
        if constexpr (R == RedOp::kMin) {
          if (E::kSigned ? static_cast<int64_t>(u) < static_cast<int64_t>(acc[i]) : u < acc[i]) acc[i] = u;
        }
        if constexpr (R == RedOp::kPreMulSum) acc[i] += u * scalar;
      }
    }
    for (uint64_t i = 0; i < m; ++i) {
      uint64_t a = acc[i];
      if constexpr (R == RedOp::kAvg) {
        a = E::kSigned ? static_cast<uint64_t>(static_cast<int64_t>(E::FromU64(a)) / static_cast<int64_t>(n))
                       : E::ToU64(E::FromU64(a)) / n;
      }
      v[i] = E::FromU64(a);
    }
    std::memcpy(dst + b * sizeof(S), v, m * sizeof(S));
  }
}

template <int D>
void ReduceFastTyped(uint8_t* dst, const std::vector<const uint8_t*>& in, uint64_t first, uint64_t count, RedOp redop,
                     uint64_t scalar_bits) {
#define PRISM_X_REDOP(R)                                                          \
  case R:                                                                         \
    if constexpr (math::Elem<D>::kIsFloat) {                                      \
      ReduceFloatFast<D, R>(dst, in, first, count, scalar_bits);                  \
    } else {                                                                      \
      ReduceIntFast<D, R>(dst, in, first, count, scalar_bits);                    \
    }                                                                             \
    break;
  switch (redop) {
    PRISM_X_REDOP(RedOp::kSum)
    PRISM_X_REDOP(RedOp::kProd)
    PRISM_X_REDOP(RedOp::kMax)
    PRISM_X_REDOP(RedOp::kMin)
    PRISM_X_REDOP(RedOp::kAvg)
    PRISM_X_REDOP(RedOp::kPreMulSum)
  }
#undef PRISM_X_REDOP
}

// Threads for one large reduction: PRISM_EXCHANGE_THREADS, else half the cores (at most 8). Each thread takes a
// contiguous range of elements; every element's arithmetic is the same whatever the split.
std::atomic<int> g_threads_override{0};
int ReduceThreads() {
  if (int t = g_threads_override.load(std::memory_order_relaxed); t > 0) return t;
  static const int threads = [] {
    if (const char* e = std::getenv("PRISM_EXCHANGE_THREADS"); e != nullptr && std::atoi(e) > 0) {
      return std::min(64, std::atoi(e));
    }
    return static_cast<int>(std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u));
  }();
  return threads;
}

bool ReduceFast(uint8_t* dst, const std::vector<const uint8_t*>& in, uint64_t first, uint64_t count,
                const ExchangeOp& op) {
  const uint64_t esz = DataTypeSize(op.dtype);
  if (esz == 0 || static_cast<int>(op.dtype) > math::kDtFloat8e5m2 || static_cast<int>(op.dtype) < 0) return false;
  auto run = [&](uint64_t begin, uint64_t end) {
    PRISM_PAYLOAD_DTYPE_SWITCH(static_cast<int>(op.dtype), D, (void)0,
                               ReduceFastTyped<D>(dst + begin * esz, in, first + begin, end - begin, op.redop,
                                                  op.premul_scalar_bits))
  };
  // Why 4 MiB of input per thread: below that, starting threads costs more than it saves.
  const uint64_t kMinBytesPerThread = g_threads_override.load(std::memory_order_relaxed) > 0 ? 1 : (4u << 20);
  const uint64_t work = count * esz * in.size();
  const int threads = static_cast<int>(std::min<uint64_t>(ReduceThreads(), std::max<uint64_t>(1, work / kMinBytesPerThread)));
  if (threads <= 1) {
    run(0, count);
    return true;
  }
  std::vector<std::thread> pool;
  const uint64_t per = (count + static_cast<uint64_t>(threads) - 1) / static_cast<uint64_t>(threads);
  for (int t = 1; t < threads; ++t) {
    const uint64_t b = std::min(count, per * static_cast<uint64_t>(t)), e = std::min(count, b + per);
    if (b < e) pool.emplace_back(run, b, e);
  }
  run(0, std::min(count, per));
  for (std::thread& th : pool) th.join();
  return true;
}

bool Reduce(uint8_t* dst, const std::vector<const uint8_t*>& in, uint64_t first, uint64_t count, const ExchangeOp& op) {
  return ReduceFast(dst, in, first, count, op);
}

}  // namespace

bool ExchangeReduce(const ExchangeOp& op, const std::vector<const uint8_t*>& in, uint64_t first, uint64_t count,
                    uint8_t* dst) {
  return ValidOp(op) && ReduceFast(dst, in, first, count, op);
}
bool ExchangeReduceReference(const ExchangeOp& op, const std::vector<const uint8_t*>& in, uint64_t first,
                             uint64_t count, uint8_t* dst) {
  return ValidOp(op) && ReduceReference(dst, in, first, count, op);
}
void SetExchangeReduceThreadsForTest(int threads) { g_threads_override.store(threads); }

bool ExchangeOutputIsShared(const ExchangeOp& op) {
  switch (op.op) {
    case OpKind::kAllReduce: case OpKind::kAllGather: case OpKind::kBroadcast:
      return true;
    default:
      return false;
  }
}

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

namespace {
// Member j's input, or for the i-th virtual member (rank order) q_{i mod k}'s. False when no member is real.
bool StandIns(const ExchangeOp& op, const std::vector<const uint8_t*>& inputs, std::vector<const uint8_t*>* in) {
  std::vector<int32_t> real;
  for (int32_t j = 0; j < op.nranks; ++j) {
    if (inputs[static_cast<size_t>(j)] != nullptr) real.push_back(j);
  }
  if (real.empty()) return false;
  in->assign(inputs.size(), nullptr);
  size_t virtual_index = 0;
  for (int32_t j = 0; j < op.nranks; ++j) {
    const uint8_t* own = inputs[static_cast<size_t>(j)];
    (*in)[static_cast<size_t>(j)] = own ? own : inputs[static_cast<size_t>(real[virtual_index++ % real.size()])];
  }
  return true;
}

// Copies bytes [offset, offset + len) of a concatenation of `nblocks` blocks of `block` bytes, block j at
// src(j), to dst.
template <typename Src>
void CopyBlocks(uint64_t block, uint64_t offset, uint64_t len, uint8_t* dst, Src src) {
  while (len > 0 && block > 0) {
    const uint64_t j = offset / block, at = offset % block, n = std::min(len, block - at);
    std::memcpy(dst, src(j) + at, n);
    dst += n;
    offset += n;
    len -= n;
  }
}
}  // namespace

ExchangeResult ExchangePlanOutput(const ExchangeOp& op, const std::vector<const uint8_t*>& inputs, int32_t rank,
                                  uint64_t* bytes) {
  *bytes = 0;
  if (!ValidOp(op) || rank < 0 || rank >= op.nranks || inputs.size() != static_cast<size_t>(op.nranks)) {
    return ExchangeResult::kInvalid;
  }
  if (std::none_of(inputs.begin(), inputs.end(), [](const uint8_t* p) { return p != nullptr; })) {
    return ExchangeResult::kInvalid;
  }
  const uint64_t out_bytes = ExchangeOutputBytes(op, rank);
  if (out_bytes == 0) return ExchangeResult::kNothing;
  const bool root_real = inputs[static_cast<size_t>(op.root)] != nullptr;
  if ((op.op == OpKind::kBroadcast || op.op == OpKind::kScatter) && !root_real) return ExchangeResult::kLocal;
  *bytes = out_bytes;
  return ExchangeResult::kData;
}

bool ExchangeOutputRange(const ExchangeOp& op, const std::vector<const uint8_t*>& inputs, int32_t rank,
                         uint64_t offset, uint64_t len, uint8_t* dst) {
  uint64_t total = 0;
  if (ExchangePlanOutput(op, inputs, rank, &total) != ExchangeResult::kData) return false;
  const uint64_t esz = DataTypeSize(op.dtype);
  if (offset > total || len > total - offset || offset % esz != 0 || len % esz != 0) return false;
  if (len == 0) return true;
  std::vector<const uint8_t*> in;
  if (!StandIns(op, inputs, &in)) return false;
  const uint64_t block = esz * op.count;
  switch (op.op) {
    case OpKind::kAllReduce:
    case OpKind::kReduce:
      return Reduce(dst, in, offset / esz, len / esz, op);
    case OpKind::kReduceScatter:
      return Reduce(dst, in, static_cast<uint64_t>(rank) * op.count + offset / esz, len / esz, op);
    case OpKind::kAllGather:
    case OpKind::kGather:
      CopyBlocks(block, offset, len, dst, [&](uint64_t j) { return in[j]; });
      return true;
    case OpKind::kAllToAll:
      CopyBlocks(block, offset, len, dst, [&](uint64_t j) { return in[j] + static_cast<uint64_t>(rank) * block; });
      return true;
    case OpKind::kBroadcast:
      std::memcpy(dst, in[static_cast<size_t>(op.root)] + offset, len);
      return true;
    case OpKind::kScatter:
      std::memcpy(dst, in[static_cast<size_t>(op.root)] + static_cast<uint64_t>(rank) * block + offset, len);
      return true;
    default:
      return false;
  }
}

ExchangeResult ExchangeOutput(const ExchangeOp& op, const std::vector<const uint8_t*>& inputs, int32_t rank,
                              std::vector<uint8_t>* out) {
  out->clear();
  uint64_t bytes = 0;
  const ExchangeResult r = ExchangePlanOutput(op, inputs, rank, &bytes);
  if (r != ExchangeResult::kData) return r;
  out->resize(bytes);
  if (!ExchangeOutputRange(op, inputs, rank, 0, bytes, out->data())) {
    out->clear();
    return ExchangeResult::kInvalid;
  }
  return ExchangeResult::kData;
}

}  // namespace prism::payload
