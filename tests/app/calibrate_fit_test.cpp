// The alpha-beta fit of calibrate: exact data gives the model back, latency below resolution is
// clamped at 0, and the reported error is the largest relative one.

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "meshtrain/app/calibrate.h"

namespace meshtrain {
namespace {

std::vector<LinkSample> samples_of(const AlphaBeta& truth, CollectiveKind kind, int ranks) {
  std::vector<LinkSample> out;
  for (double bytes = 4096; bytes <= 16 << 20; bytes *= 4)
    out.push_back({bytes, truth.seconds(kind, bytes, ranks)});
  return out;
}

TEST(FitAlphaBeta, RecoversTheModelOfExactData) {
  const AlphaBeta truth{4e-6, 2.5e10};
  for (CollectiveKind kind : {CollectiveKind::AllReduce, CollectiveKind::AllGather,
                              CollectiveKind::ReduceScatter, CollectiveKind::PointToPoint,
                              CollectiveKind::AllToAll}) {
    for (int ranks : {2, 3, 8}) {
      const AlphaBetaFit fit = fit_alpha_beta(kind, ranks, samples_of(truth, kind, ranks));
      EXPECT_NEAR(fit.model.alpha, truth.alpha, 1e-12) << collective_name(kind) << " " << ranks;
      EXPECT_NEAR(fit.model.bus_bytes_per_s / truth.bus_bytes_per_s, 1, 1e-9);
      EXPECT_LT(fit.max_relative_error, 1e-9);
    }
  }
}

TEST(FitAlphaBeta, ClampsANegativeLatencyAtZero) {
  // Time proportional to bytes, with the small messages faster than the line through the large
  // ones (a cache): the unconstrained fit would give alpha < 0.
  std::vector<LinkSample> s = samples_of(AlphaBeta{0, 1e10}, CollectiveKind::AllReduce, 2);
  s[0].seconds *= 0.5;
  s[1].seconds *= 0.7;
  const AlphaBetaFit fit = fit_alpha_beta(CollectiveKind::AllReduce, 2, s);
  EXPECT_EQ(fit.model.alpha, 0);
  EXPECT_GT(fit.model.bus_bytes_per_s, 0);
  double worst = 0;
  for (const LinkSample& x : s)
    worst = std::max(worst, std::abs(fit.model.seconds(CollectiveKind::AllReduce, x.bytes, 2) / x.seconds - 1));
  EXPECT_DOUBLE_EQ(fit.max_relative_error, worst);
  EXPECT_GT(worst, 0.1);
}

TEST(FitAlphaBeta, FlatTimesStillGiveAPositiveBandwidth) {
  std::vector<LinkSample> s = {{4096, 1e-3}, {65536, 0.9e-3}, {1 << 20, 1e-3}};
  const AlphaBetaFit fit = fit_alpha_beta(CollectiveKind::PointToPoint, 2, s);
  EXPECT_GE(fit.model.alpha, 0);
  EXPECT_GT(fit.model.bus_bytes_per_s, 0);
  EXPECT_TRUE(std::isfinite(fit.max_relative_error));
}

TEST(FitAlphaBeta, RefusesWhatCannotBeFitted) {
  EXPECT_THROW(fit_alpha_beta(CollectiveKind::AllReduce, 2, {{4096, 1e-5}}), std::invalid_argument);
  EXPECT_THROW(fit_alpha_beta(CollectiveKind::AllReduce, 1, {{4096, 1e-5}, {8192, 2e-5}}),
               std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain
