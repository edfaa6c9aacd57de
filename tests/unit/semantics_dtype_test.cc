// Element math shared by the CPU executor and the GPU kernels (nccl_patch/dtype_math.h): narrow-float encoding
// and decoding, the rounding of scale / power / mul_scalar, random values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "nccl_patch/dtype_math.h"
#include "nccl_patch/semantics.h"
#include "semantics_reference.h"

namespace prism::payload {
namespace {

namespace m = math;

m::SmallFloatFormat FormatFor(DataType t) {
  switch (t) {
    case DataType::kFloat16: return m::FormatF16();
    case DataType::kBfloat16: return m::FormatBf16();
    case DataType::kFloat8e4m3: return m::FormatE4m3();
    default: return m::FormatE5m2();
  }
}

const DataType kNarrow[] = {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};

TEST(SemanticsDtype, DecodeMatchesReferenceForEveryCode) {
  for (DataType t : kNarrow) {
    const ref::Format f = ref::FormatOf(t);
    const uint32_t codes = 1u << (1 + f.e + f.m);
    for (uint32_t c = 0; c < codes; ++c) {
      const double got = m::DecodeSmallFloat(c, FormatFor(t));
      const long double want = ref::DecodeNarrow(c, f);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << DataTypeName(t) << " code " << c;
      } else {
        EXPECT_EQ(static_cast<long double>(got), want) << DataTypeName(t) << " code " << c;
        EXPECT_EQ(std::signbit(got), std::signbit(want)) << DataTypeName(t) << " code " << c;
      }
    }
  }
}

TEST(SemanticsDtype, EncodeRoundTripsEveryFiniteCode) {
  for (DataType t : kNarrow) {
    const ref::Format f = ref::FormatOf(t);
    const uint32_t codes = 1u << (1 + f.e + f.m);
    for (uint32_t c = 0; c < codes; ++c) {
      const double v = m::DecodeSmallFloat(c, FormatFor(t));
      if (std::isnan(v)) continue;
      if (std::isinf(v) && f.sat) continue;  // Inf does not exist in e5m2 under saturation
      EXPECT_EQ(m::EncodeSmallFloat(v, FormatFor(t)), c) << DataTypeName(t) << " code " << c;
    }
  }
}

// Midpoints between neighbours are ties (to the even code); a hair either side goes to the nearer one.
TEST(SemanticsDtype, EncodeTiesToEvenAndNearest) {
  for (DataType t : kNarrow) {
    const ref::Table& tab = ref::TableOf(t);
    for (size_t i = 0; i + 1 < tab.values.size(); ++i) {
      const double lo = static_cast<double>(tab.values[i]);
      const double hi = static_cast<double>(tab.values[i + 1]);
      const double mid = (lo + hi) / 2;  // exact: both have few bits
      const uint32_t even = (tab.codes[i] % 2 == 0) ? tab.codes[i] : tab.codes[i + 1];
      EXPECT_EQ(m::EncodeSmallFloat(mid, FormatFor(t)), even) << DataTypeName(t) << " mid " << mid;
      EXPECT_EQ(m::EncodeSmallFloat(std::nextafter(mid, 0.0), FormatFor(t)), tab.codes[i]) << DataTypeName(t);
      EXPECT_EQ(m::EncodeSmallFloat(std::nextafter(mid, 1e300), FormatFor(t)), tab.codes[i + 1]) << DataTypeName(t);
      const uint32_t neg = 1u << (ref::FormatOf(t).e + ref::FormatOf(t).m);
      EXPECT_EQ(m::EncodeSmallFloat(-mid, FormatFor(t)), neg | even) << DataTypeName(t);
    }
  }
}

TEST(SemanticsDtype, EncodeMatchesReferenceOnRandomDoubles) {
  std::mt19937_64 gen(7);
  for (DataType t : kNarrow) {
    for (int i = 0; i < 200000; ++i) {
      // Random sign, exponent across (and beyond) the format's range, random mantissa.
      const int exp = static_cast<int>(gen() % 80) - 40 + (t == DataType::kBfloat16 ? static_cast<int>(gen() % 200) - 100 : 0);
      const double mant = 1.0 + static_cast<double>(gen() >> 12) * 0x1p-52;
      const double v = ((gen() & 1) ? -1.0 : 1.0) * std::ldexp(mant, exp);
      EXPECT_EQ(m::EncodeSmallFloat(v, FormatFor(t)), ref::RoundNarrow(v, t)) << DataTypeName(t) << " v " << v;
    }
  }
}

TEST(SemanticsDtype, Float16AgreesWithCompilerFloat16) {
  std::mt19937_64 gen(11);
  for (int i = 0; i < 200000; ++i) {
    const int exp = static_cast<int>(gen() % 50) - 30;
    const double v = ((gen() & 1) ? -1.0 : 1.0) * std::ldexp(1.0 + static_cast<double>(gen() >> 12) * 0x1p-52, exp);
    const _Float16 h = static_cast<_Float16>(v);
    uint16_t bits;
    std::memcpy(&bits, &h, 2);
    EXPECT_EQ(m::EncodeSmallFloat(v, m::FormatF16()), bits) << v;
  }
}

TEST(SemanticsDtype, OverflowNanAndSaturation) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // fp16: 65504 is max; 65520 (max + half ulp) rounds to Inf; Inf stays Inf.
  EXPECT_EQ(m::EncodeSmallFloat(65504.0, m::FormatF16()), 0x7BFFu);
  EXPECT_EQ(m::EncodeSmallFloat(65519.99, m::FormatF16()), 0x7BFFu);
  EXPECT_EQ(m::EncodeSmallFloat(65520.0, m::FormatF16()), 0x7C00u);
  EXPECT_EQ(m::EncodeSmallFloat(-inf, m::FormatF16()), 0xFC00u);
  EXPECT_EQ(m::EncodeSmallFloat(nan, m::FormatF16()), 0x7E00u);
  EXPECT_EQ(m::EncodeSmallFloat(1e300, m::FormatBf16()), 0x7F80u);
  EXPECT_EQ(m::EncodeSmallFloat(nan, m::FormatBf16()), 0x7FC0u);
  // fp8 e4m3: max 448 (0x7E), 0x7F is NaN; saturating.
  EXPECT_EQ(m::EncodeSmallFloat(448.0, m::FormatE4m3()), 0x7Eu);
  EXPECT_EQ(m::EncodeSmallFloat(1e6, m::FormatE4m3()), 0x7Eu);
  EXPECT_EQ(m::EncodeSmallFloat(-inf, m::FormatE4m3()), 0xFEu);
  EXPECT_EQ(m::EncodeSmallFloat(nan, m::FormatE4m3()), 0x7Fu);
  EXPECT_EQ(m::DecodeSmallFloat(0x7E, m::FormatE4m3()), 448.0);
  // fp8 e5m2: max 57344 (0x7B); Inf saturates.
  EXPECT_EQ(m::EncodeSmallFloat(57344.0, m::FormatE5m2()), 0x7Bu);
  EXPECT_EQ(m::EncodeSmallFloat(inf, m::FormatE5m2()), 0x7Bu);
  EXPECT_EQ(m::EncodeSmallFloat(nan, m::FormatE5m2()), 0x7Fu);
  // Smallest subnormals and underflow to signed zero.
  EXPECT_EQ(m::EncodeSmallFloat(0x1p-24, m::FormatF16()), 0x0001u);
  EXPECT_EQ(m::EncodeSmallFloat(0x1p-25, m::FormatF16()), 0x0000u);              // tie -> even (0)
  EXPECT_EQ(m::EncodeSmallFloat(0x1.000001p-25, m::FormatF16()), 0x0001u);
  EXPECT_EQ(m::EncodeSmallFloat(-1e-30, m::FormatF16()), 0x8000u);
  EXPECT_EQ(m::EncodeSmallFloat(0x1p-9, m::FormatE4m3()), 0x01u);                // e4m3 smallest subnormal
  EXPECT_EQ(m::EncodeFloat32(nan), 0x7FC00000u);
  EXPECT_EQ(m::EncodeFloat64(-nan), 0x7FF8000000000000ull);
}

// The worked examples of docs/payload.md "Rounding".
TEST(SemanticsDtype, ScaleRoundsOnceToNearestEven) {
  // bf16: 3 x 1.0078125 = 3.0234375 = 1.51171875 * 2: halfway between bf16 1.5078125*2 and 1.515625*2 -> even.
  uint16_t x = static_cast<uint16_t>(m::EncodeSmallFloat(1.0078125, m::FormatBf16()));
  uint16_t y = 0;
  m::ScaleAt<m::kDtBfloat16>(&y, &x, 0, 3);
  EXPECT_EQ(m::DecodeSmallFloat(y, m::FormatBf16()), 3.03125);
  // fp16: 3 x (1 + 2^-10) = 3 + 3*2^-10 -> 1.5 + 1.5*2^-10 in [2,4): ulp 2^-9 -> halfway, even -> 3 + 2^-8.
  x = static_cast<uint16_t>(m::EncodeSmallFloat(1.0 + 0x1p-10, m::FormatF16()));
  m::ScaleAt<m::kDtFloat16>(&y, &x, 0, 3);
  EXPECT_EQ(m::DecodeSmallFloat(y, m::FormatF16()), 3.0 + 0x1p-8);
  // fp32: 3 x (1 + 2^-23) is exact in double, rounded once: 3 + 3*2^-23 -> ulp 2^-22 in [2,4): tie -> even.
  float xf = 1.0f + 0x1p-23f;
  float yf = 0;
  m::ScaleAt<m::kDtFloat32>(&yf, &xf, 0, 3);
  EXPECT_EQ(yf, 3.0f + 0x1p-21f);
  // fp8 e4m3: 100 x 8 = 800 -> saturates to 448.
  uint8_t x8 = static_cast<uint8_t>(m::EncodeSmallFloat(8.0, m::FormatE4m3()));
  uint8_t y8 = 0;
  m::ScaleAt<m::kDtFloat8e4m3>(&y8, &x8, 0, 100);
  EXPECT_EQ(y8, 0x7Eu);
  // int8 wraps: 100 x 3 = 300 = 44 mod 256.
  int8_t xi = 100;
  int8_t yi = 0;
  m::ScaleAt<m::kDtInt8>(&yi, &xi, 0, 3);
  EXPECT_EQ(yi, 44);
  // uint64 wraps.
  uint64_t xu = 0x8000000000000001ull;
  uint64_t yu = 0;
  m::ScaleAt<m::kDtUint64>(&yu, &xu, 0, 2);
  EXPECT_EQ(yu, 2u);
}

TEST(SemanticsDtype, PowerIsBinaryExponentiationInDouble) {
  // 1.1^5 by square-and-multiply in double: ((1.1^2)^2) * 1.1 with double roundings, then rounded to fp32.
  float x = 1.1f;
  float y = 0;
  m::PowerAt<m::kDtFloat32>(&y, &x, 0, 5);
  const double b = static_cast<double>(x);
  const double b2 = b * b;
  const double b4 = b2 * b2;
  EXPECT_EQ(y, static_cast<float>(b * b4));
  int32_t xi = -3;
  int32_t yi = 0;
  m::PowerAt<m::kDtInt32>(&yi, &xi, 0, 3);
  EXPECT_EQ(yi, -27);
  int8_t x8 = 3;
  int8_t y8 = 0;
  m::PowerAt<m::kDtInt8>(&y8, &x8, 0, 5);  // 243 -> -13
  EXPECT_EQ(y8, -13);
}

TEST(SemanticsDtype, RandomValuesInRangeAndNeverNanOrInf) {
  const uint64_t key = m::RandomKeyOf(1, 2, 3);
  for (int d = 0; d < kNumDataTypes; ++d) {
    const DataType t = static_cast<DataType>(d);
    const size_t es = DataTypeSize(t);
    std::vector<uint8_t> buf(es * 4096);
    PRISM_PAYLOAD_DTYPE_SWITCH(d, D, FAIL(), m::RandomRange<D>(buf.data(), 0, 4096, 1, key, 0))
    int negatives = 0;
    for (size_t i = 0; i < 4096; ++i) {
      const void* p = buf.data() + i * es;
      if (ref::IsFloat(t)) {
        const long double v = ref::LoadFloat(p, t);
        ASSERT_TRUE(std::isfinite(v)) << DataTypeName(t);
        ASSERT_GE(v, -1.0L) << DataTypeName(t);
        ASSERT_LT(v, 1.0L) << DataTypeName(t);
        negatives += v < 0;
      } else {
        const __int128 v = ref::LoadInt(p, t);
        if (ref::IsSignedInt(t)) {
          ASSERT_GE(v, -8);
          ASSERT_LT(v, 8);
          negatives += v < 0;
        } else {
          ASSERT_GE(v, 0);
          ASSERT_LT(v, 16);
          negatives += 1;  // not applicable
        }
      }
      std::vector<uint8_t> want(es);
      ref::RefRandomElement(want.data(), t, key, i);
      ASSERT_EQ(std::memcmp(p, want.data(), es), 0) << DataTypeName(t) << " element " << i;
    }
    // Both signs appear (a broken generator would give one).
    EXPECT_GT(negatives, 1000) << DataTypeName(t);
    if (ref::IsFloat(t) || ref::IsSignedInt(t)) {
      EXPECT_LT(negatives, 3096) << DataTypeName(t);
    }
  }
}

TEST(SemanticsDtype, RandomKeyDependsOnEveryInput) {
  const uint64_t k = m::RandomKeyOf(1, 2, 3);
  EXPECT_EQ(k, ref::RefKey(1, 2, 3));
  EXPECT_EQ(k, RandomKey(1, 2, 3));
  EXPECT_NE(k, m::RandomKeyOf(2, 2, 3));
  EXPECT_NE(k, m::RandomKeyOf(1, 3, 3));
  EXPECT_NE(k, m::RandomKeyOf(1, 2, 4));
}

}  // namespace
}  // namespace prism::payload
