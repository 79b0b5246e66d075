// BlendSchedule: Megatron's blending rule keeps every source's count within the bounds
// io/blend_schedule.h states at every prefix of the stream, draws sources of weight 0 never, is a function
// of the counts alone (so a stream cut anywhere and continued from its counts is the same
// stream), and its recorded position reads back or is refused with a reason.

#include "meshtrain/io/blend_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace meshtrain {
namespace {

const std::vector<std::vector<double>> kWeightVectors = {
    {1.0},
    {0.7, 0.3},
    {0.5, 0.5},
    {1, 2, 3},
    {0.01, 0.99},
    {0.1, 0.2, 0.3, 0.4},
    {3.0, 0.0, 1.0},
    {1e-3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0},
    {0.333333, 0.333333, 0.333334},
    {5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
};

// The bounds of blend_schedule.h: never a sample ahead; behind by less than K - 1, and by less
// than one sample with 2 or 3 sources.
TEST(BlendSchedule, EveryPrefixStaysWithinTheStatedBounds) {
  for (const std::vector<double>& w : kWeightVectors) {
    const double total = std::accumulate(w.begin(), w.end(), 0.0);
    const BlendSchedule s(w);
    std::vector<int64_t> drawn(w.size(), 0);
    double ahead = 0, behind = 0;
    for (int64_t n = 1; n <= 10000; ++n) {
      s.draw(drawn, 1);
      for (size_t k = 0; k < w.size(); ++k) {
        const double error = static_cast<double>(drawn[k]) - w[k] / total * static_cast<double>(n);
        ahead = std::max(ahead, error);
        behind = std::max(behind, -error);
      }
    }
    const auto sources = static_cast<double>(w.size());
    EXPECT_LT(ahead, 1.0) << "weights " << ::testing::PrintToString(w);
    EXPECT_LT(behind, w.size() <= 3 ? 1.0 : sources - 1) << "weights " << ::testing::PrintToString(w);
    for (size_t k = 0; k < w.size(); ++k)
      if (w[k] == 0) EXPECT_EQ(drawn[k], 0) << "source " << k << " has weight 0";
  }
}

TEST(BlendSchedule, ContinuesFromItsCountsAlone) {
  const BlendSchedule s({0.6, 0.25, 0.15});
  std::vector<int64_t> whole(3, 0), cut(3, 0);
  std::vector<BlendDraw> all, first, rest;
  s.draw(whole, 1000, &all);
  s.draw(cut, 377, &first);
  std::vector<int64_t> recorded = parse_blend_position(blend_position_text(cut), 3);
  s.draw(recorded, 1000 - 377, &rest);
  first.insert(first.end(), rest.begin(), rest.end());
  ASSERT_EQ(first.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(first[i].source, all[i].source) << i;
    EXPECT_EQ(first[i].position, all[i].position) << i;
  }
  EXPECT_EQ(recorded, whole);
}

TEST(BlendSchedule, EachSourceCountsItsOwnPositions) {
  const BlendSchedule s({0.5, 0.5});
  std::vector<int64_t> drawn(2, 0);
  std::vector<BlendDraw> out;
  s.draw(drawn, 6, &out);
  // Ties go to the lowest index: 0 1 0 1 0 1.
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(out[i].source, i % 2);
    EXPECT_EQ(out[i].position, i / 2);
  }
}

TEST(BlendSchedule, RefusesARecordedPositionThatDoesNotFit) {
  EXPECT_EQ(parse_blend_position("blend_position 1\n4 5\n", 2), (std::vector<int64_t>{4, 5}));
  for (const char* bad : {"", "blend_position 2\n4 5\n", "blend_position 1\n4\n",
                          "blend_position 1\n4 5 6\n", "blend_position 1\n4 -5\n",
                          "blend_position 1\n4 x\n", "blend_position 1\n4 5\nmore",
                          "blend_position 1\n9223372036854775807 9223372036854775807\n"})
    EXPECT_THROW(parse_blend_position(bad, 2), std::runtime_error) << bad;
}

}  // namespace
}  // namespace meshtrain
