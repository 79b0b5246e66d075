// Sampler: every epoch visits every sample exactly once, the order depends only on
// (seed, step), and any data-parallel split of a batch reads exactly the single-rank batch.

#include "meshtrain/io/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

namespace meshtrain {
namespace {

// The samples of stream positions [first, first + n), read batch by batch.
std::vector<int64_t> stream(const Sampler& s, int64_t global_batch, int64_t first, int64_t n) {
  std::vector<int64_t> out;
  for (int64_t g = first; g < first + n; ++g) {
    out.push_back(s.index(g / global_batch, global_batch, g % global_batch));
  }
  return out;
}

bool is_permutation_of_range(std::vector<int64_t> v, int64_t n) {
  std::sort(v.begin(), v.end());
  std::vector<int64_t> want(n);
  std::iota(want.begin(), want.end(), 0);
  return v == want;
}

TEST(Sampler, EveryEpochVisitsEverySampleOnce) {
  for (int64_t samples : {1, 2, 3, 5, 7, 10, 100, 257, 1000, 1023, 1025, 4097}) {
    const Sampler s(samples, 1234);
    for (int64_t global_batch : {1, 3, 8, 64}) {
      for (int64_t epoch : {0, 1, 5}) {
        EXPECT_TRUE(
            is_permutation_of_range(stream(s, global_batch, epoch * samples, samples), samples))
            << "samples " << samples << " batch " << global_batch << " epoch " << epoch;
      }
    }
  }
}

TEST(Sampler, OrderIsShuffledAndChangesEveryEpoch) {
  const int64_t n = 1000;
  const Sampler s(n, 7);
  int fixed_points = 0, same_as_next_epoch = 0, ascending_pairs = 0;
  for (int64_t p = 0; p < n; ++p) {
    fixed_points += s.permute(p, 0) == p;
    same_as_next_epoch += s.permute(p, 0) == s.permute(p, 1);
    if (p > 0) ascending_pairs += s.permute(p, 0) > s.permute(p - 1, 0);
  }
  // A random permutation has about 1 fixed point and about 1 position in common with another
  // one; about half of its neighbouring pairs ascend.
  EXPECT_LT(fixed_points, 10);
  EXPECT_LT(same_as_next_epoch, 10);
  EXPECT_GT(ascending_pairs, 400);
  EXPECT_LT(ascending_pairs, 600);
}

TEST(Sampler, DeterministicForSeedAndStep) {
  const Sampler a(5000, 42), b(5000, 42);
  for (int64_t step : {0, 1, 17, 1000}) {
    for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(a.index(step, 32, i), b.index(step, 32, i));
  }
}

TEST(Sampler, DifferentSeedsGiveDifferentOrders) {
  const Sampler a(5000, 42), b(5000, 43);
  int same = 0;
  for (int64_t i = 0; i < 256; ++i) same += a.index(3, 256, i) == b.index(3, 256, i);
  EXPECT_LT(same, 5);
}

// Rank r of dp with micro-batch b reads positions r*G/dp + j*b + [0, b) of each global batch
// (the trainer's split). Whatever dp and b, the ranks' batches laid side by side in rank order
// are the single-rank batch: nothing read twice, nothing missed, nothing reordered.
TEST(Sampler, DataParallelSplitReadsTheSingleRankBatch) {
  const int64_t samples = 97, G = 24;  // 97 is prime: batches straddle epochs
  const Sampler s(samples, 2024);
  for (int64_t step = 0; step < 12; ++step) {
    std::vector<int64_t> single;
    for (int64_t i = 0; i < G; ++i) single.push_back(s.index(step, G, i));
    for (int64_t dp : {1, 2, 3, 4, 6, 8, 12, 24}) {
      const int64_t per_rank = G / dp;
      for (int64_t b = 1; b <= per_rank; ++b) {
        if (per_rank % b != 0) continue;
        std::vector<int64_t> all;
        for (int64_t r = 0; r < dp; ++r) {
          for (int64_t j = 0; j < per_rank / b; ++j) {
            for (int64_t t = 0; t < b; ++t)
              all.push_back(s.index(step, G, r * per_rank + j * b + t));
          }
        }
        EXPECT_EQ(all, single) << "step " << step << " dp " << dp << " micro-batch " << b;
      }
    }
  }
}

TEST(Sampler, EpochBoundaryInsideABatch) {
  const Sampler s(10, 5);
  // Global batch 4: step 2 holds stream positions 8, 9 (epoch 0) and 10, 11 (epoch 1).
  EXPECT_EQ(s.epoch(2, 4), 0);
  EXPECT_EQ(s.epoch(3, 4), 1);
  EXPECT_EQ(s.index(2, 4, 1), s.permute(9, 0));
  EXPECT_EQ(s.index(2, 4, 2), s.permute(0, 1));
  EXPECT_EQ(s.index(2, 4, 3), s.permute(1, 1));
  // Epoch 0 is steps 0, 1 and the first half of step 2.
  std::vector<int64_t> epoch0;
  for (int64_t step = 0; step < 3; ++step) {
    for (int64_t i = 0; i < 4 && step * 4 + i < 10; ++i) epoch0.push_back(s.index(step, 4, i));
  }
  EXPECT_TRUE(is_permutation_of_range(epoch0, 10));
}

TEST(Sampler, HugeDatasetsNeedNoTable) {
  const int64_t n = (int64_t{1} << 40) + 3;  // a terabyte-token corpus, 2^40 + 3 samples
  const Sampler s(n, 9);
  std::vector<int64_t> v;
  for (int64_t i = 0; i < 1000; ++i) {
    const int64_t x = s.index(123456789, 1000, i);
    ASSERT_GE(x, 0);
    ASSERT_LT(x, n);
    v.push_back(x);
  }
  std::sort(v.begin(), v.end());
  EXPECT_EQ(std::unique(v.begin(), v.end()), v.end());  // a permutation never repeats
}

TEST(Sampler, RefusesBadArguments) {
  EXPECT_THROW(Sampler(0, 1), std::invalid_argument);
  const Sampler s(10, 1);
  EXPECT_THROW(s.index(0, 4, 4), std::out_of_range);
  EXPECT_THROW(s.index(-1, 4, 0), std::out_of_range);
  EXPECT_THROW(s.index(0, 0, 0), std::out_of_range);
  EXPECT_THROW(s.permute(10, 0), std::out_of_range);
}

}  // namespace
}  // namespace meshtrain
