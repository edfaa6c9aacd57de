// Independent reference for the payload semantics tests. Written differently from src/nccl_patch on purpose:
// narrow floats are decoded with ldexp and rounded by searching a sorted table of every finite value, exact sums
// use long double (64-bit significand), random values re-derive SplitMix64 here. Nothing from dtype_math.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "nccl_patch/semantics.h"

namespace prism::payload::ref {

struct Format {
  int e;        // exponent bits
  int m;        // mantissa bits
  int bias;
  bool ieee;    // all-ones exponent = Inf/NaN; else only the all-ones code is NaN (e4m3)
  bool sat;     // overflow saturates to max finite
};

inline Format FormatOf(DataType t) {
  switch (t) {
    case DataType::kFloat16: return {5, 10, 15, true, false};
    case DataType::kBfloat16: return {8, 7, 127, true, false};
    case DataType::kFloat8e4m3: return {4, 3, 7, false, true};
    case DataType::kFloat8e5m2: return {5, 2, 15, true, true};
    default: return {0, 0, 0, false, false};
  }
}

inline bool IsNarrowFloat(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBfloat16 || t == DataType::kFloat8e4m3 ||
         t == DataType::kFloat8e5m2;
}
inline bool IsFloat(DataType t) {
  return IsNarrowFloat(t) || t == DataType::kFloat32 || t == DataType::kFloat64;
}
inline bool IsSignedInt(DataType t) {
  return t == DataType::kInt8 || t == DataType::kInt32 || t == DataType::kInt64;
}

// Value of a narrow-float code (NaN as quiet NaN, Inf as Inf).
inline long double DecodeNarrow(uint32_t code, const Format& f) {
  const uint32_t exp_max = (1u << f.e) - 1;
  const bool neg = (code >> (f.e + f.m)) & 1;
  const uint32_t exp = (code >> f.m) & exp_max;
  const uint32_t man = code & ((1u << f.m) - 1);
  long double v;
  if (f.ieee && exp == exp_max) {
    if (man != 0) return std::numeric_limits<long double>::quiet_NaN();
    v = std::numeric_limits<long double>::infinity();
  } else if (!f.ieee && exp == exp_max && man == (1u << f.m) - 1) {
    return std::numeric_limits<long double>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<long double>(man), 1 - f.bias - f.m);
  } else {
    v = std::ldexp(static_cast<long double>(man + (1u << f.m)), static_cast<int>(exp) - f.bias - f.m);
  }
  return neg ? -v : v;
}

// Sorted non-negative finite values of a narrow format with their codes.
struct Table {
  std::vector<long double> values;
  std::vector<uint32_t> codes;
};
inline const Table& TableOf(DataType t) {
  static Table tables[kNumDataTypes];
  Table& tab = tables[static_cast<int>(t)];
  if (tab.values.empty()) {
    const Format f = FormatOf(t);
    const uint32_t positive_codes = 1u << (f.e + f.m);
    for (uint32_t c = 0; c < positive_codes; ++c) {
      const long double v = DecodeNarrow(c, f);
      if (std::isfinite(v)) {
        tab.values.push_back(v);
        tab.codes.push_back(c);
      }
    }
  }
  return tab;
}

// Round-to-nearest-even into a narrow format, by search.
inline uint32_t RoundNarrow(long double v, DataType t) {
  const Format f = FormatOf(t);
  const uint32_t sign = std::signbit(v) ? (1u << (f.e + f.m)) : 0u;
  if (std::isnan(v)) return f.ieee && !f.sat ? (t == DataType::kFloat16 ? 0x7E00u : 0x7FC0u) : 0x7Fu;
  const Table& tab = TableOf(t);
  const long double a = std::fabs(v);
  const long double max = tab.values.back();
  const uint32_t inf_code = ((1u << f.e) - 1) << f.m;
  if (std::isinf(a)) return sign | (f.sat ? tab.codes.back() : inf_code);
  if (!f.sat) {
    // IEEE: at or beyond max + half an ulp of max, the result is Inf (the tie goes to the even "next" value).
    const long double ulp = max - tab.values[tab.values.size() - 2];
    if (a >= max + ulp / 2) return sign | inf_code;
  }
  if (a >= max) return sign | tab.codes.back();
  const auto it = std::upper_bound(tab.values.begin(), tab.values.end(), a);
  const size_t hi = static_cast<size_t>(it - tab.values.begin());
  const size_t lo = hi - 1;
  const long double dlo = a - tab.values[lo];
  const long double dhi = tab.values[hi] - a;
  size_t pick;
  if (dlo < dhi) pick = lo;
  else if (dhi < dlo) pick = hi;
  else pick = (tab.codes[lo] % 2 == 0) ? lo : hi;
  return sign | tab.codes[pick];
}

// Element value as long double (floats) or as a signed/unsigned integer widened to __int128 (ints).
inline long double LoadFloat(const void* p, DataType t) {
  switch (t) {
    case DataType::kFloat32: { float x; std::memcpy(&x, p, 4); return x; }
    case DataType::kFloat64: { double x; std::memcpy(&x, p, 8); return x; }
    case DataType::kFloat16: case DataType::kBfloat16: {
      uint16_t c; std::memcpy(&c, p, 2); return DecodeNarrow(c, FormatOf(t));
    }
    default: { uint8_t c; std::memcpy(&c, p, 1); return DecodeNarrow(c, FormatOf(t)); }
  }
}
inline __int128 LoadInt(const void* p, DataType t) {
  switch (t) {
    case DataType::kInt8: { int8_t x; std::memcpy(&x, p, 1); return x; }
    case DataType::kUint8: { uint8_t x; std::memcpy(&x, p, 1); return x; }
    case DataType::kInt32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case DataType::kUint32: { uint32_t x; std::memcpy(&x, p, 4); return x; }
    case DataType::kInt64: { int64_t x; std::memcpy(&x, p, 8); return x; }
    default: { uint64_t x; std::memcpy(&x, p, 8); return x; }
  }
}

// Rounds an exact value to the element type and stores it (NaN -> the canonical NaN of docs/payload.md).
inline void StoreFloat(void* p, long double v, DataType t) {
  switch (t) {
    case DataType::kFloat32: {
      uint32_t bits;
      if (std::isnan(v)) bits = 0x7FC00000u;
      else { const float x = static_cast<float>(v); std::memcpy(&bits, &x, 4); }
      std::memcpy(p, &bits, 4);
      return;
    }
    case DataType::kFloat64: {
      uint64_t bits;
      if (std::isnan(v)) bits = 0x7FF8000000000000ull;
      else { const double x = static_cast<double>(v); std::memcpy(&bits, &x, 8); }
      std::memcpy(p, &bits, 8);
      return;
    }
    case DataType::kFloat16: case DataType::kBfloat16: {
      const uint16_t c = static_cast<uint16_t>(RoundNarrow(v, t));
      std::memcpy(p, &c, 2);
      return;
    }
    default: {
      const uint8_t c = static_cast<uint8_t>(RoundNarrow(v, t));
      std::memcpy(p, &c, 1);
      return;
    }
  }
}
// Stores an integer modulo 2^bits (wrapping).
inline void StoreInt(void* p, __int128 v, DataType t) {
  const unsigned __int128 u = static_cast<unsigned __int128>(v);
  const uint64_t low = static_cast<uint64_t>(u);
  std::memcpy(p, &low, DataTypeSize(t));  // little-endian: the low bytes
}

// ---- random, re-derived ------------------------------------------------------------------------------------------

inline uint64_t RefSplitMixNext(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline uint64_t RefKey(uint64_t seed, uint64_t comm, uint64_t seq) {
  uint64_t s = seed;
  uint64_t k = RefSplitMixNext(s);
  s = k ^ comm;
  k = RefSplitMixNext(s);
  s = k ^ seq;
  return RefSplitMixNext(s);
}
// Element `index` of the fill for `key`: the (index+1)-th output of a SplitMix64 generator started at key.
inline void RefRandomElement(void* p, DataType t, uint64_t key, uint64_t index) {
  uint64_t state = key + index * 0x9E3779B97F4A7C15ull;
  const uint64_t h = RefSplitMixNext(state);
  if (IsFloat(t)) {
    int k = 0;
    switch (t) {
      case DataType::kFloat16: k = 10; break;
      case DataType::kBfloat16: k = 7; break;
      case DataType::kFloat32: k = 23; break;
      case DataType::kFloat64: k = 52; break;
      case DataType::kFloat8e4m3: k = 3; break;
      default: k = 2; break;
    }
    // Top k+1 bits -> j in [-2^k, 2^k) -> j / 2^k.
    const int64_t j = static_cast<int64_t>(h >> (63 - k)) - (int64_t{1} << k);
    StoreFloat(p, std::ldexp(static_cast<long double>(j), -k), t);
  } else if (IsSignedInt(t)) {
    StoreInt(p, static_cast<__int128>(h >> 60) - 8, t);
  } else {
    StoreInt(p, static_cast<__int128>(h >> 60), t);
  }
}

}  // namespace prism::payload::ref
