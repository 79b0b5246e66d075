#include "meshtrain/tensor/philox.h"

#include <gtest/gtest.h>

#include <cmath>

namespace meshtrain {
namespace {

// Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
TEST(Philox, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(Philox::philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (Philox::Block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(Philox::philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                  {0xffffffffu, 0xffffffffu}),
            (Philox::Block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(Philox::philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                                  {0xa4093822u, 0x299f31d0u}),
            (Philox::Block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, ValueDependsOnlyOnSeedNameAndIndex) {
  const Philox a(42, "h.0.mlp.fc.weight"), b(42, "h.0.mlp.fc.weight");
  const Philox other_name(42, "h.1.mlp.fc.weight"), other_seed(43, "h.0.mlp.fc.weight");
  EXPECT_EQ(a.normal(12345), b.normal(12345));
  EXPECT_NE(a.normal(12345), other_name.normal(12345));
  EXPECT_NE(a.normal(12345), other_seed.normal(12345));
  EXPECT_NE(a.normal(12345), a.normal(12346));
}

TEST(Philox, NormalHasUnitMoments) {
  const Philox rng(7, "moments");
  const int n = 200000;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = rng.normal(i);
    s += z;
    s2 += z * z;
  }
  // Standard errors: 1/sqrt(n) = 0.0022 for the mean, sqrt(2/n) = 0.0032 for the variance.
  EXPECT_NEAR(s / n, 0.0, 0.012);
  EXPECT_NEAR(s2 / n, 1.0, 0.016);
}

}  // namespace
}  // namespace meshtrain
