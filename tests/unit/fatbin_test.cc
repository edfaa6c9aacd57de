#include <gtest/gtest.h>

#include "interpose/kernels.h"

TEST(Fatbin, EmbeddedKernelsArePresent) {
  ASSERT_GT(prism_kernels_fatbin_size, 16u) << "own kernels' fatbin is empty: was nvcc found at build time?";
  EXPECT_TRUE(prism::interpose::FatbinPresent());
}
