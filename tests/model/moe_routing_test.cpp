// The host router of a mixture of experts (model/moe_routing.h): the choices and their order,
// ties, gates, the expert-sorted order, the per-sequence balancing losses' values at balance and
// their sums over parts of the sequences, and both gradients against central finite
// differences of the functions they differentiate.

#include "meshtrain/model/moe_routing.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace meshtrain {
namespace {

MoeSpec spec_of(int64_t experts, int64_t k, bool normalize, double aux = 0.01, double z = 0.001) {
  MoeSpec s;
  s.experts = experts;
  s.top_k = k;
  s.normalize_top_k = normalize;
  s.aux_loss = aux;
  s.z_loss = z;
  return s;
}

std::vector<double> random_logits(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, 1.5);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = d(gen);
  return v;
}

TEST(MoeRouting, ChoosesTheLargestBestFirstAndTiesGoToTheLowerIndex) {
  // Token 0: expert 2 best, then 0 and 3 tied (0 wins). Token 1: all equal: 0, 1.
  const std::vector<double> logits = {1.0, -2.0, 3.0, 1.0, 0.5, 0.5, 0.5, 0.5};
  const Routing r = route_tokens(logits.data(), 2, spec_of(4, 2, true));
  EXPECT_EQ(r.choice, (std::vector<int32_t>{2, 0, 0, 1}));
  // Renormalised over the chosen two: e^3 / (e^3 + e^1) and e^1 / (e^3 + e^1); equal halves.
  const double a = std::exp(3.0), b = std::exp(1.0);
  EXPECT_NEAR(r.gate[0], a / (a + b), 1e-15);
  EXPECT_NEAR(r.gate[1], b / (a + b), 1e-15);
  EXPECT_NEAR(r.gate[2], 0.5, 1e-15);
  EXPECT_NEAR(r.gate[3], 0.5, 1e-15);
  // Expert-sorted: expert 0 holds tokens 0 and 1, expert 1 token 1, expert 2 token 0.
  EXPECT_EQ(r.counts, (std::vector<int64_t>{2, 1, 1, 0}));
  EXPECT_EQ(r.expert_begin, (std::vector<int64_t>{0, 2, 3, 4, 4}));
  EXPECT_EQ(r.token_of_row, (std::vector<int32_t>{0, 1, 1, 0}));
  EXPECT_EQ(r.row_of_choice, (std::vector<int32_t>{3, 0, 1, 2}));
  for (size_t c = 0; c < r.choice.size(); ++c)
    EXPECT_EQ(r.gate_of_row[static_cast<size_t>(r.row_of_choice[c])], r.gate[c]);
}

TEST(MoeRouting, WithoutRenormalisationTheGatesAreTheProbabilities) {
  const std::vector<double> logits = random_logits(5 * 6, 1);
  const Routing r = route_tokens(logits.data(), 5, spec_of(6, 3, false));
  for (int64_t t = 0; t < 5; ++t) {
    double sum = 0;
    for (int64_t e = 0; e < 6; ++e) sum += r.probs[static_cast<size_t>(t * 6 + e)];
    EXPECT_NEAR(sum, 1.0, 1e-14);
    for (int64_t j = 0; j < 3; ++j) {
      const size_t c = static_cast<size_t>(t * 3 + j);
      EXPECT_EQ(r.gate[c], r.probs[static_cast<size_t>(t * 6 + r.choice[c])]);
      if (j > 0) {
        EXPECT_GE(r.gate[c - 1], r.gate[c]);
      }
    }
  }
}

TEST(MoeRouting, RefusesTopKAboveTheExpertsAndNonFiniteLogits) {
  const std::vector<double> logits = {0.0, 1.0};
  EXPECT_THROW(route_tokens(logits.data(), 1, spec_of(2, 3, true)), std::invalid_argument);
  const std::vector<double> bad = {0.0, std::nan("")};
  try {
    route_tokens(bad.data(), 1, spec_of(2, 1, true));
    FAIL() << "a NaN logit was routed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("token 0"), std::string::npos) << e.what();
  }
}

// Tokens t of `sequences` sequences of equal length, in order.
std::vector<int32_t> sequences_of(int64_t tokens, int64_t sequences) {
  std::vector<int32_t> v(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) v[static_cast<size_t>(t)] = static_cast<int32_t>(t * sequences / tokens);
  return v;
}

TEST(MoeRouting, BalancedRoutingCostsAlphaPerSequenceAndSumsAddUpOverParts) {
  const MoeSpec s = spec_of(4, 2, true, 0.05, 0.0);
  const Routing r = route_balanced(8, s);
  for (int64_t n : r.counts) EXPECT_EQ(n, 4);
  const BalancingLosses l = balancing_losses(RouterSums::of(r, sequences_of(8, 2), 2), s);
  EXPECT_NEAR(l.load_balance, 2 * 0.05, 1e-15) << "alpha for each of 2 sequences";
  EXPECT_NEAR(l.per_token, 8 * 0.05, 1e-15) << "as a loss of each of their 8 tokens";
  // The sums of two parts of the sequences add up to the whole's (what the all-reduce over the
  // sequence-parallel and context ranks relies on): here the first 5 and last 7 tokens of 3
  // sequences of 4.
  const std::vector<double> logits = random_logits(12 * 4, 2);
  const std::vector<int32_t> of = sequences_of(12, 3);
  const Routing whole = route_tokens(logits.data(), 12, s);
  const Routing first = route_tokens(logits.data(), 5, s), second = route_tokens(logits.data() + 20, 7, s);
  std::vector<double> a = RouterSums::of(first, {of.begin(), of.begin() + 5}, 3).to_vector();
  const std::vector<double> b = RouterSums::of(second, {of.begin() + 5, of.end()}, 3).to_vector();
  const std::vector<double> w = RouterSums::of(whole, of, 3).to_vector();
  ASSERT_EQ(a.size(), w.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i] + b[i], w[i], 1e-13) << i;
  EXPECT_THROW(RouterSums::of(whole, sequences_of(11, 3), 3), std::logic_error);
}

// weight * the per-token form of the losses, as a function of the logits, the counts held at
// `fixed`'s routing (the loss's gradient treats the counts as constants, as every implementation
// does).
double balancing_objective(const std::vector<double>& logits, int64_t tokens, int64_t sequences,
                           const MoeSpec& s, const RouterSums& fixed, double weight) {
  RouterSums sums = RouterSums::of(route_tokens(logits.data(), tokens, s),
                                   sequences_of(tokens, sequences), sequences);
  sums.counts = fixed.counts;
  return weight * balancing_losses(sums, s).per_token;
}

TEST(MoeRouting, BalancingGradientMatchesFiniteDifferences) {
  const int64_t T = 9, B = 3, E = 5;
  const MoeSpec s = spec_of(E, 2, true, 0.3, 0.2);
  const double weight = 0.37;
  std::vector<double> logits = random_logits(T * E, 3);
  const Routing r = route_tokens(logits.data(), T, s);
  const RouterSums sums = RouterSums::of(r, sequences_of(T, B), B);
  const std::vector<double> g = balancing_logit_gradient(r, sums, sequences_of(T, B), s, weight);
  const double h = 1e-6;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double keep = logits[i];
    logits[i] = keep + h;
    const double up = balancing_objective(logits, T, B, s, sums, weight);
    logits[i] = keep - h;
    const double down = balancing_objective(logits, T, B, s, sums, weight);
    logits[i] = keep;
    EXPECT_NEAR(g[i], (up - down) / (2 * h), 1e-8) << "logit " << i;
  }
}

// sum over choices of dgate * gate, as a function of the logits (the selection held: the
// perturbations are too small to change it).
double gate_objective(const std::vector<double>& logits, int64_t tokens, const MoeSpec& s,
                      const std::vector<double>& dgate) {
  const Routing r = route_tokens(logits.data(), tokens, s);
  double sum = 0;
  for (size_t c = 0; c < r.gate.size(); ++c) sum += dgate[c] * r.gate[c];
  return sum;
}

TEST(MoeRouting, RouterGradientMatchesFiniteDifferencesWithAndWithoutRenormalisation) {
  for (bool normalize : {true, false}) {
    const int64_t T = 6, E = 7, k = 3;
    const MoeSpec s = spec_of(E, k, normalize);
    std::vector<double> logits = random_logits(T * E, normalize ? 4 : 5);
    const std::vector<double> dgate = random_logits(T * k, 6);
    const Routing r = route_tokens(logits.data(), T, s);
    const std::vector<double> extra = random_logits(T * E, 7);
    const std::vector<double> g = router_logit_gradient(r, dgate, s, extra);
    const double h = 1e-6;
    for (size_t i = 0; i < logits.size(); ++i) {
      const double keep = logits[i];
      logits[i] = keep + h;
      const double up = gate_objective(logits, T, s, dgate);
      logits[i] = keep - h;
      const double down = gate_objective(logits, T, s, dgate);
      logits[i] = keep;
      EXPECT_NEAR(g[i] - extra[i], (up - down) / (2 * h), 1e-8)
          << (normalize ? "renormalised" : "plain") << ", logit " << i;
    }
  }
}

}  // namespace
}  // namespace meshtrain
