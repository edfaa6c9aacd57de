// Element math of the payload steps, shared by the CPU executor (semantics_cpu.cc) and the GPU kernels
// (src/interpose/kernels/payload.cu) so both write the same bits. Plain C++ plus __host__ __device__ under nvcc;
// no CUDA headers (no cuda_fp16.h / cuda_fp8.h: the narrow float formats are encoded by hand).
//
// Rounding (docs/payload.md "Rounding"):
//   - A float element is widened exactly to double, the operation is done in double, and the double is rounded
//     ONCE to the element type, round-to-nearest-even.
//     scale: x * n      exact in double for fp32 and narrower while n < 2^29, so the result is the correctly rounded
//                       n*x (for fp64: the correctly rounded product of two doubles).
//     mul_scalar: x * s exact in double for fp32 and narrower (24+24 bits); correctly rounded for fp64.
//     power: x^n        right-to-left binary exponentiation in double (result *= base on a set bit, base *= base),
//                       then one rounding; exact whenever every partial product fits 53 bits.
//   - Overflow: fp16, bf16, fp32, fp64 round to +-Inf (IEEE); fp8 e4m3 and e5m2 saturate to +-max finite (448,
//     57344) and +-Inf input saturates too, as cuda_fp8.h's __NV_SATFINITE conversions NCCL uses.
//   - NaN in, canonical NaN out: fp16 0x7E00, bf16 0x7FC0, fp32 0x7FC00000, fp64 0x7FF8000000000000, fp8 0x7F.
//     Why: host and device propagate NaN payloads differently; a fixed pattern keeps CPU and GPU identical.
//   - Integers: two's-complement wrapping (computed in uint64, truncated).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define PRISM_HD __host__ __device__ __forceinline__
#else
#define PRISM_HD inline
#endif

namespace prism::payload::math {

// Same values as ncclDataType_t and payload::DataType.
enum : int {
  kDtInt8 = 0,
  kDtUint8 = 1,
  kDtInt32 = 2,
  kDtUint32 = 3,
  kDtInt64 = 4,
  kDtUint64 = 5,
  kDtFloat16 = 6,
  kDtFloat32 = 7,
  kDtFloat64 = 8,
  kDtBfloat16 = 9,
  kDtFloat8e4m3 = 10,
  kDtFloat8e5m2 = 11,
};

// ---- bit casts -------------------------------------------------------------------------------------------------
// Device code uses CUDA's intrinsics, host code BitCast.

template <typename To, typename From>
PRISM_HD To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To to;
  __builtin_memcpy(&to, &from, sizeof(to));
  return to;
}

#if defined(__CUDA_ARCH__)
PRISM_HD uint64_t DoubleToBits(double d) { return static_cast<uint64_t>(__double_as_longlong(d)); }
PRISM_HD double BitsToDouble(uint64_t u) { return __longlong_as_double(static_cast<long long>(u)); }
PRISM_HD uint32_t FloatToBits(float f) { return __float_as_uint(f); }
PRISM_HD float BitsToFloat(uint32_t u) { return __uint_as_float(u); }
#else
PRISM_HD uint64_t DoubleToBits(double d) { return BitCast<uint64_t>(d); }
PRISM_HD double BitsToDouble(uint64_t u) { return BitCast<double>(u); }
PRISM_HD uint32_t FloatToBits(float f) { return BitCast<uint32_t>(f); }
PRISM_HD float BitsToFloat(uint32_t u) { return BitCast<float>(u); }
#endif

// 2^k as a double, for k in the normal double range [-1022, 1023].
PRISM_HD double Pow2(int k) { return BitsToDouble(static_cast<uint64_t>(k + 1023) << 52); }

// ---- narrow float formats --------------------------------------------------------------------------------------

struct SmallFloatFormat {
  int exp_bits;
  int man_bits;
  int bias;
  bool has_inf;     // IEEE-style: all-ones exponent is Inf (mantissa 0) or NaN; else only all-ones code is NaN
  bool saturate;    // overflow and Inf -> max finite (fp8, as __NV_SATFINITE)
  uint32_t nan_code;
};

// Why functions, not constexpr variables: a namespace-scope variable is host-only in device code.
PRISM_HD constexpr SmallFloatFormat FormatF16() { return {5, 10, 15, true, false, 0x7E00u}; }
PRISM_HD constexpr SmallFloatFormat FormatBf16() { return {8, 7, 127, true, false, 0x7FC0u}; }
PRISM_HD constexpr SmallFloatFormat FormatE4m3() { return {4, 3, 7, false, true, 0x7Fu}; }
PRISM_HD constexpr SmallFloatFormat FormatE5m2() { return {5, 2, 15, true, true, 0x7Fu}; }

// Exact value of a narrow float code.
PRISM_HD double DecodeSmallFloat(uint32_t code, SmallFloatFormat f) {
  const uint32_t exp_all = (1u << f.exp_bits) - 1u;
  const uint32_t man_all = (1u << f.man_bits) - 1u;
  const bool negative = ((code >> (f.exp_bits + f.man_bits)) & 1u) != 0;
  const uint32_t exp = (code >> f.man_bits) & exp_all;
  const uint32_t man = code & man_all;
  const uint64_t sign_bit = negative ? (1ull << 63) : 0ull;
  if (f.has_inf && exp == exp_all) {
    return BitsToDouble(man != 0 ? 0x7FF8000000000000ull : (sign_bit | 0x7FF0000000000000ull));
  }
  if (!f.has_inf && exp == exp_all && man == man_all) return BitsToDouble(0x7FF8000000000000ull);
  const int emin = 1 - f.bias;
  double mag;
  if (exp == 0) {
    mag = static_cast<double>(man) * Pow2(emin - f.man_bits);
  } else {
    mag = static_cast<double>(man | (1u << f.man_bits)) * Pow2(static_cast<int>(exp) - f.bias - f.man_bits);
  }
  return negative ? -mag : mag;
}

// Rounds a double to the nearest code, ties to even (see the header comment for overflow and NaN).
PRISM_HD uint32_t EncodeSmallFloat(double v, SmallFloatFormat f) {
  const uint64_t b = DoubleToBits(v);
  const uint32_t sign = static_cast<uint32_t>(b >> 63) << (f.exp_bits + f.man_bits);
  const int dexp = static_cast<int>((b >> 52) & 0x7FFu);
  const uint64_t dman = b & 0xFFFFFFFFFFFFFull;
  const uint32_t exp_all = (1u << f.exp_bits) - 1u;
  const uint32_t inf_code = exp_all << f.man_bits;
  const uint32_t max_finite = f.has_inf ? inf_code - 1u : (inf_code | ((1u << f.man_bits) - 1u)) - 1u;
  const uint32_t overflow_code = (f.has_inf && !f.saturate) ? inf_code : max_finite;
  if (dexp == 0x7FF) return dman != 0 ? f.nan_code : (sign | overflow_code);
  // Zero, or a double subnormal: far below half the smallest subnormal of every narrow format.
  if (dexp == 0) return sign;
  const int e = dexp - 1023;
  const uint64_t sig = (1ull << 52) | dman;  // value = sig * 2^(e - 52)
  const int emin = 1 - f.bias;
  // Low bits of sig that do not fit: 52 - man_bits for a normal result, more for a subnormal one.
  const int shift = 52 - f.man_bits + (e < emin ? emin - e : 0);
  if (shift > 53) return sign;  // below half the smallest subnormal: rounds to zero
  uint64_t q = sig >> shift;
  const uint64_t rem = sig & ((1ull << shift) - 1ull);
  const uint64_t half = 1ull << (shift - 1);
  if (rem > half || (rem == half && (q & 1ull) != 0)) ++q;
  // Subnormal: the code is q (a carry to 2^man_bits is exactly the smallest normal). Normal: exponent field
  // plus the fraction; a carry of q to 2^(man_bits+1) moves into the exponent by the addition.
  uint64_t code;
  if (e < emin) {
    code = q;
  } else {
    if (e + f.bias > static_cast<int>(exp_all)) return sign | overflow_code;
    code = (static_cast<uint64_t>(e + f.bias) << f.man_bits) + (q - (1ull << f.man_bits));
  }
  if (code > max_finite) return sign | overflow_code;
  return sign | static_cast<uint32_t>(code);
}

PRISM_HD uint32_t EncodeFloat32(double v) {
  if (v != v) return 0x7FC00000u;
  return FloatToBits(static_cast<float>(v));  // round-to-nearest-even on host (SSE) and device (cvt.rn)
}
PRISM_HD uint64_t EncodeFloat64(double v) {
  if (v != v) return 0x7FF8000000000000ull;
  return DoubleToBits(v);
}

// ---- per-dtype element traits ----------------------------------------------------------------------------------

template <int D>
struct Elem;

#define PRISM_PAYLOAD_INT_ELEM(D, S, SIGNED)                                                       \
  template <>                                                                                      \
  struct Elem<D> {                                                                                 \
    using Storage = S;                                                                             \
    static constexpr bool kIsFloat = false;                                                        \
    static constexpr bool kSigned = SIGNED;                                                        \
    PRISM_HD static uint64_t ToU64(S x) {                                                          \
      return SIGNED ? static_cast<uint64_t>(static_cast<int64_t>(x)) : static_cast<uint64_t>(x);   \
    }                                                                                              \
    PRISM_HD static S FromU64(uint64_t v) { return static_cast<S>(v); }                            \
  };
PRISM_PAYLOAD_INT_ELEM(kDtInt8, int8_t, true)
PRISM_PAYLOAD_INT_ELEM(kDtUint8, uint8_t, false)
PRISM_PAYLOAD_INT_ELEM(kDtInt32, int32_t, true)
PRISM_PAYLOAD_INT_ELEM(kDtUint32, uint32_t, false)
PRISM_PAYLOAD_INT_ELEM(kDtInt64, int64_t, true)
PRISM_PAYLOAD_INT_ELEM(kDtUint64, uint64_t, false)
#undef PRISM_PAYLOAD_INT_ELEM

template <>
struct Elem<kDtFloat32> {
  using Storage = uint32_t;
  static constexpr bool kIsFloat = true;
  static constexpr int kManBits = 23;
  PRISM_HD static double Decode(uint32_t x) { return static_cast<double>(BitsToFloat(x)); }
  PRISM_HD static uint32_t Encode(double v) { return EncodeFloat32(v); }
};
template <>
struct Elem<kDtFloat64> {
  using Storage = uint64_t;
  static constexpr bool kIsFloat = true;
  static constexpr int kManBits = 52;
  PRISM_HD static double Decode(uint64_t x) { return BitsToDouble(x); }
  PRISM_HD static uint64_t Encode(double v) { return EncodeFloat64(v); }
};

#define PRISM_PAYLOAD_SMALL_FLOAT_ELEM(D, S, FMT)                                                  \
  template <>                                                                                      \
  struct Elem<D> {                                                                                 \
    using Storage = S;                                                                             \
    static constexpr bool kIsFloat = true;                                                         \
    static constexpr int kManBits = FMT().man_bits;                                                  \
    PRISM_HD static double Decode(S x) { return DecodeSmallFloat(x, FMT()); }                        \
    PRISM_HD static S Encode(double v) { return static_cast<S>(EncodeSmallFloat(v, FMT())); }        \
  };
PRISM_PAYLOAD_SMALL_FLOAT_ELEM(kDtFloat16, uint16_t, FormatF16)
PRISM_PAYLOAD_SMALL_FLOAT_ELEM(kDtBfloat16, uint16_t, FormatBf16)
PRISM_PAYLOAD_SMALL_FLOAT_ELEM(kDtFloat8e4m3, uint8_t, FormatE4m3)
PRISM_PAYLOAD_SMALL_FLOAT_ELEM(kDtFloat8e5m2, uint8_t, FormatE5m2)
#undef PRISM_PAYLOAD_SMALL_FLOAT_ELEM

// ---- scalar operations -------------------------------------------------------------------------------------------

// Right-to-left binary exponentiation; n >= 1. T is double (floats) or uint64_t (integers, wrapping).
template <typename T>
PRISM_HD T Pow(T x, uint64_t n) {
  T result = 1;
  T base = x;
  while (n != 0) {
    if ((n & 1ull) != 0) result *= base;
    n >>= 1;
    if (n != 0) base *= base;
  }
  return result;
}

// Random: SplitMix64 (Steele, Lea, Flood 2014): the finalizer and the golden-ratio increment.
inline constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
PRISM_HD uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
PRISM_HD uint64_t SplitMix64(uint64_t x) { return Mix64(x + kGolden); }
// Key of one operation; element i's 64 random bits are Mix64(key + (i + 1) * kGolden), i.e. the (i+1)-th output of
// a SplitMix64 generator started at `key` -- counter-based, so any element is computed on its own.
PRISM_HD uint64_t RandomKeyOf(uint64_t seed, uint64_t comm_id, uint64_t seq) {
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ comm_id) ^ seq);
}
PRISM_HD uint64_t RandomBits(uint64_t key, uint64_t index) { return Mix64(key + (index + 1ull) * kGolden); }

// ---- elementwise bodies: one element i ----------------------------------------------------------------------------

template <int D>
PRISM_HD void ScaleAt(void* dst, const void* src, uint64_t i, uint64_t n) {
  using E = Elem<D>;
  using S = typename E::Storage;
  const S x = static_cast<const S*>(src)[i];
  if constexpr (E::kIsFloat) {
    static_cast<S*>(dst)[i] = E::Encode(E::Decode(x) * static_cast<double>(n));
  } else {
    static_cast<S*>(dst)[i] = E::FromU64(E::ToU64(x) * n);
  }
}

template <int D>
PRISM_HD void PowerAt(void* dst, const void* src, uint64_t i, uint64_t n) {
  using E = Elem<D>;
  using S = typename E::Storage;
  const S x = static_cast<const S*>(src)[i];
  if constexpr (E::kIsFloat) {
    static_cast<S*>(dst)[i] = E::Encode(Pow<double>(E::Decode(x), n));
  } else {
    static_cast<S*>(dst)[i] = E::FromU64(Pow<uint64_t>(E::ToU64(x), n));
  }
}

// `scalar` holds one element of type D in its low bytes.
template <int D>
PRISM_HD void MulScalarAt(void* dst, const void* src, uint64_t i, uint64_t scalar) {
  using E = Elem<D>;
  using S = typename E::Storage;
  const S x = static_cast<const S*>(src)[i];
  const S s = static_cast<S>(scalar);
  if constexpr (E::kIsFloat) {
    static_cast<S*>(dst)[i] = E::Encode(E::Decode(x) * E::Decode(s));
  } else {
    static_cast<S*>(dst)[i] = E::FromU64(E::ToU64(x) * E::ToU64(s));
  }
}

// Floats: j * 2^-k with k = mantissa bits and j uniform in [-2^k, 2^k): exactly representable, in [-1, 1).
// Signed ints: [-8, 8); unsigned: [0, 16).
template <int D>
PRISM_HD void RandomAt(void* dst, uint64_t i, uint64_t key, uint64_t index_base) {
  using E = Elem<D>;
  using S = typename E::Storage;
  const uint64_t h = RandomBits(key, index_base + i);
  if constexpr (E::kIsFloat) {
    constexpr int k = E::kManBits;
    const int64_t j = static_cast<int64_t>(h >> (63 - k)) - (int64_t{1} << k);
    static_cast<S*>(dst)[i] = E::Encode(static_cast<double>(j) * Pow2(-k));
  } else if constexpr (E::kSigned) {
    static_cast<S*>(dst)[i] = static_cast<S>(static_cast<int64_t>(h >> 60) - 8);
  } else {
    static_cast<S*>(dst)[i] = static_cast<S>(h >> 60);
  }
}

// Loops over i = begin, begin + stride, ... < end: the CPU calls them with (0, count, 1), a kernel with its
// grid-stride indices, so both run the same element code.
template <int D>
PRISM_HD void ScaleRange(void* dst, const void* src, uint64_t begin, uint64_t end, uint64_t stride, uint64_t n) {
  for (uint64_t i = begin; i < end; i += stride) ScaleAt<D>(dst, src, i, n);
}
template <int D>
PRISM_HD void PowerRange(void* dst, const void* src, uint64_t begin, uint64_t end, uint64_t stride, uint64_t n) {
  for (uint64_t i = begin; i < end; i += stride) PowerAt<D>(dst, src, i, n);
}
template <int D>
PRISM_HD void MulScalarRange(void* dst, const void* src, uint64_t begin, uint64_t end, uint64_t stride,
                             uint64_t scalar) {
  for (uint64_t i = begin; i < end; i += stride) MulScalarAt<D>(dst, src, i, scalar);
}
template <int D>
PRISM_HD void RandomRange(void* dst, uint64_t begin, uint64_t end, uint64_t stride, uint64_t key,
                          uint64_t index_base) {
  for (uint64_t i = begin; i < end; i += stride) RandomAt<D>(dst, i, key, index_base);
}

// Tile: dst[j] = src[j % tile] over `bytes`, in words of W bytes (the caller checks alignment and multiples).
template <typename W>
PRISM_HD void TileRange(void* dst, const void* src, uint64_t begin, uint64_t end, uint64_t stride,
                        uint64_t tile_words) {
  W* d = static_cast<W*>(dst);
  const W* s = static_cast<const W*>(src);
  for (uint64_t j = begin; j < end; j += stride) d[j] = s[j % tile_words];
}

// Reads the scalar of a kMulScalar step: from `ptr` (one element of dtype) when non-null, else `bits`.
PRISM_HD uint64_t LoadScalarBits(int dtype, uint64_t bits, const void* ptr) {
  if (ptr == nullptr) return bits;
  switch (dtype) {
    case kDtInt8: case kDtUint8: case kDtFloat8e4m3: case kDtFloat8e5m2:
      return *static_cast<const uint8_t*>(ptr);
    case kDtFloat16: case kDtBfloat16:
      return *static_cast<const uint16_t*>(ptr);
    case kDtInt32: case kDtUint32: case kDtFloat32:
      return *static_cast<const uint32_t*>(ptr);
    default:
      return *static_cast<const uint64_t*>(ptr);
  }
}

}  // namespace prism::payload::math

// Runs BODY with a constexpr int NAME bound to the runtime dtype value; `default:` runs DEFAULT.
#define PRISM_PAYLOAD_DTYPE_SWITCH(dtype, NAME, DEFAULT, ...)                                        \
  switch (dtype) {                                                                                 \
    case 0: { constexpr int NAME = 0; __VA_ARGS__; } break;                                        \
    case 1: { constexpr int NAME = 1; __VA_ARGS__; } break;                                        \
    case 2: { constexpr int NAME = 2; __VA_ARGS__; } break;                                        \
    case 3: { constexpr int NAME = 3; __VA_ARGS__; } break;                                        \
    case 4: { constexpr int NAME = 4; __VA_ARGS__; } break;                                        \
    case 5: { constexpr int NAME = 5; __VA_ARGS__; } break;                                        \
    case 6: { constexpr int NAME = 6; __VA_ARGS__; } break;                                        \
    case 7: { constexpr int NAME = 7; __VA_ARGS__; } break;                                        \
    case 8: { constexpr int NAME = 8; __VA_ARGS__; } break;                                        \
    case 9: { constexpr int NAME = 9; __VA_ARGS__; } break;                                        \
    case 10: { constexpr int NAME = 10; __VA_ARGS__; } break;                                      \
    case 11: { constexpr int NAME = 11; __VA_ARGS__; } break;                                      \
    default: { DEFAULT; } break;                                                                   \
  }
