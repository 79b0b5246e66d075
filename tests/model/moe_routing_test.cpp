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

MoeSpec spec_of(int64_t experts, int64_t k, bool normalize, double aux = 0.01, double z = 0.001,
                RouterKind router = RouterKind::Softmax, double scale = 1.0) {
  MoeSpec s;
  s.router = router;
  s.route_scale = scale;
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
                           const MoeSpec& s, const RouterSums& fixed, double weight,
                           const double* bias = nullptr) {
  RouterSums sums = RouterSums::of(route_tokens(logits.data(), tokens, s, bias),
                                   sequences_of(tokens, sequences), sequences);
  sums.counts = fixed.counts;
  return weight * balancing_losses(sums, s).per_token;
}

// The sigmoid router's cases choose with a bias that changes choices (model/expert_bias.h).
const std::vector<double> kBias = {0.4, -0.3, 0.0, 0.25, -0.1, 0.2, -0.45};

TEST(MoeRouting, BalancingGradientMatchesFiniteDifferences) {
  for (RouterKind router : {RouterKind::Softmax, RouterKind::Sigmoid}) {
    const int64_t T = 9, B = 3, E = 5;
    const MoeSpec s = spec_of(E, 2, true, 0.3, 0.2, router, 1.7);
    const double* bias = router == RouterKind::Sigmoid ? kBias.data() : nullptr;
    const double weight = 0.37;
    std::vector<double> logits = random_logits(T * E, 3);
    const Routing r = route_tokens(logits.data(), T, s, bias);
    const RouterSums sums = RouterSums::of(r, sequences_of(T, B), B);
    const std::vector<double> g = balancing_logit_gradient(r, sums, sequences_of(T, B), s, weight);
    const double h = 1e-6;
    for (size_t i = 0; i < logits.size(); ++i) {
      const double keep = logits[i];
      logits[i] = keep + h;
      const double up = balancing_objective(logits, T, B, s, sums, weight, bias);
      logits[i] = keep - h;
      const double down = balancing_objective(logits, T, B, s, sums, weight, bias);
      logits[i] = keep;
      EXPECT_NEAR(g[i], (up - down) / (2 * h), 1e-8) << router_name(router) << ", logit " << i;
    }
  }
}

// sum over choices of dgate * gate, as a function of the logits (the selection held: the
// perturbations are too small to change it).
double gate_objective(const std::vector<double>& logits, int64_t tokens, const MoeSpec& s,
                      const std::vector<double>& dgate, const double* bias = nullptr) {
  const Routing r = route_tokens(logits.data(), tokens, s, bias);
  double sum = 0;
  for (size_t c = 0; c < r.gate.size(); ++c) sum += dgate[c] * r.gate[c];
  return sum;
}

TEST(MoeRouting, RouterGradientMatchesFiniteDifferencesWithAndWithoutRenormalisation) {
  for (RouterKind router : {RouterKind::Softmax, RouterKind::Sigmoid})
    for (bool normalize : {true, false}) {
      const int64_t T = 6, E = 7, k = 3;
      const MoeSpec s = spec_of(E, k, normalize, 0.01, 0.001, router, router == RouterKind::Sigmoid ? 2.5 : 1.0);
      const double* bias = router == RouterKind::Sigmoid ? kBias.data() : nullptr;
      std::vector<double> logits = random_logits(T * E, normalize ? 4 : 5);
      const std::vector<double> dgate = random_logits(T * k, 6);
      const Routing r = route_tokens(logits.data(), T, s, bias);
      const std::vector<double> extra = random_logits(T * E, 7);
      const std::vector<double> g = router_logit_gradient(r, dgate, s, extra);
      const double h = 1e-6;
      for (size_t i = 0; i < logits.size(); ++i) {
        const double keep = logits[i];
        logits[i] = keep + h;
        const double up = gate_objective(logits, T, s, dgate, bias);
        logits[i] = keep - h;
        const double down = gate_objective(logits, T, s, dgate, bias);
        logits[i] = keep;
        EXPECT_NEAR(g[i] - extra[i], (up - down) / (2 * h), 1e-8)
            << router_name(router) << (normalize ? ", renormalised" : ", plain") << ", logit " << i;
      }
    }
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(MoeRouting, SigmoidBiasChangesTheChoiceButNotTheGates) {
  // Scores s = sigmoid(logits): expert 1 best, then 0, 2, 3. A bias lifting expert 3 past
  // expert 0 makes the choice {1, 3}; the gates stay the chosen scores (normalised, scaled).
  const std::vector<double> logits = {1.0, 2.0, 0.5, 0.0};
  MoeSpec s = spec_of(4, 2, true, 0.0, 0.0, RouterKind::Sigmoid, 2.5);
  const Routing plain = route_tokens(logits.data(), 1, s);
  EXPECT_EQ(plain.choice, (std::vector<int32_t>{1, 0}));
  const std::vector<double> bias = {0.0, 0.0, 0.0, 0.3};
  const Routing biased = route_tokens(logits.data(), 1, s, bias.data());
  // sigmoid(0) + 0.3 = 0.8 > sigmoid(1) = 0.731: expert 3 second.
  EXPECT_EQ(biased.choice, (std::vector<int32_t>{1, 3}));
  const double s1 = sigmoid(2.0), s3 = sigmoid(0.0);
  EXPECT_NEAR(biased.gate[0], 2.5 * s1 / (s1 + s3), 1e-15);
  EXPECT_NEAR(biased.gate[1], 2.5 * s3 / (s1 + s3), 1e-15);
  EXPECT_EQ(biased.counts, (std::vector<int64_t>{0, 1, 0, 1}));
  // A bias large enough to reorder the best: expert 2 first, by its biased score.
  const std::vector<double> lift = {0.0, 0.0, 0.9, 0.0};
  EXPECT_EQ(route_tokens(logits.data(), 1, s, lift.data()).choice, (std::vector<int32_t>{2, 1}));
  // Without renormalisation each gate is its score times the scale.
  s.normalize_top_k = false;
  const Routing raw = route_tokens(logits.data(), 1, s, bias.data());
  EXPECT_NEAR(raw.gate[0], 2.5 * s1, 1e-15);
  EXPECT_NEAR(raw.gate[1], 2.5 * s3, 1e-15);
  // The balancing loss's probabilities are the scores normalised over every expert.
  double total = 0;
  for (double l : logits) total += sigmoid(l);
  for (size_t e = 0; e < 4; ++e) EXPECT_NEAR(biased.probs[e], sigmoid(logits[e]) / total, 1e-15) << e;
}

TEST(MoeRouting, SigmoidTiesOnScorePlusBiasGoToTheLowerIndex) {
  // Equal logits, and a bias that makes experts 2 and 3 tie with 0 on score plus bias: the
  // lower index wins each tie, and the choices are ordered by score plus bias.
  const std::vector<double> logits = {0.0, 0.0, 0.0, 0.0, 0.0};
  const MoeSpec s = spec_of(5, 3, true, 0.0, 0.0, RouterKind::Sigmoid);
  const std::vector<double> bias = {0.125, -0.5, 0.125, 0.125, 0.25};
  const Routing r = route_tokens(logits.data(), 1, s, bias.data());
  EXPECT_EQ(r.choice, (std::vector<int32_t>{4, 0, 2}));
  for (double g : r.gate) EXPECT_NEAR(g, 1.0 / 3.0, 1e-15);
  // With no bias every score ties: experts 0, 1, 2.
  EXPECT_EQ(route_tokens(logits.data(), 1, s).choice, (std::vector<int32_t>{0, 1, 2}));
}

// Group-limited routing (DeepSeek-V3's noaux_tc): 8 experts in 4 groups of 2, the experts of
// the best 2 groups eligible, a group scored by the sum of its two keys.
MoeSpec grouped(double scale = 1.0, bool normalize = true) {
  MoeSpec s = spec_of(8, 2, normalize, 0.0, 0.0, RouterKind::Sigmoid, scale);
  s.groups = 4;
  s.top_groups = 2;
  return s;
}

TEST(MoeRouting, GroupsOfTwoGoodExpertsBeatAGroupWithTheOneBest) {
  // Group 0 holds the best expert (3.0) beside a poor one: 0.953 + 0.047 = 1.0. Groups 1
  // (2 x 0.731 = 1.462) and 2 (0.622 + 0.599 = 1.221) score higher, group 3 lower (0.388).
  const std::vector<double> logits = {3.0, -3.0, 1.0, 1.0, 0.5, 0.4, -1.0, -2.0};
  MoeSpec plain = grouped();
  plain.groups = plain.top_groups = 1;
  EXPECT_EQ(route_tokens(logits.data(), 1, plain).choice, (std::vector<int32_t>{0, 2}));
  const Routing r = route_tokens(logits.data(), 1, grouped());
  EXPECT_EQ(r.choice, (std::vector<int32_t>{2, 3}));
  // Three eligible groups: group 0's best expert is back.
  MoeSpec three = grouped();
  three.top_groups = 3;
  EXPECT_EQ(route_tokens(logits.data(), 1, three).choice, (std::vector<int32_t>{0, 2}));
  // The other experts' keys are out of reach, whatever their score: with top_k 4 the two
  // eligible groups give all four choices, ordered by key.
  MoeSpec four = grouped();
  four.top_k = 4;
  EXPECT_EQ(route_tokens(logits.data(), 1, four).choice, (std::vector<int32_t>{2, 3, 4, 5}));
}

TEST(MoeRouting, EqualGroupScoresGoToTheLowerGroup) {
  // Every score 0.5; biases (exact in binary) give groups 0, 1 and 2 the same score, 1.25
  // (0.75 + 0.5 twice, 0.875 + 0.375), group 3 less. Groups 0 and 1 are kept: experts 0 and 3
  // (keys 0.75). Groups 0 and 2 would give experts 4 and 0, groups 1 and 2 experts 4 and 3, and
  // no group limit experts 4 and 0.
  const std::vector<double> logits(8, 0.0);
  const std::vector<double> bias = {0.25, 0.0, 0.0, 0.25, 0.375, -0.125, -0.5, -0.5};
  EXPECT_EQ(route_tokens(logits.data(), 1, grouped(), bias.data()).choice, (std::vector<int32_t>{0, 3}));
  // Every key equal: groups 0 and 1, experts 0 and 1.
  const std::vector<double> flat(8, 0.25);
  EXPECT_EQ(route_tokens(flat.data(), 1, grouped()).choice, (std::vector<int32_t>{0, 1}));
}

TEST(MoeRouting, GroupsAreRankedWithTheBiasButTheGatesAreUnbiasedAndScaled) {
  const std::vector<double> logits = {3.0, -3.0, 1.0, 1.0, 0.5, 0.4, -1.0, -2.0};
  // A bias making group 3 the best (0.269 + 0.119 + 0.5 + 0.7 = 1.588, before group 1's 1.462),
  // and expert 7 the best within it: of the eligible experts 2, 3, 6 and 7 the choice is 7 and
  // 6, in that order (keys 0.819 and 0.769 against 0.731).
  const std::vector<double> bias = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.7};
  const Routing r = route_tokens(logits.data(), 1, grouped(2.5), bias.data());
  EXPECT_EQ(r.choice, (std::vector<int32_t>{7, 6}));
  const double s6 = sigmoid(-1.0), s7 = sigmoid(-2.0);
  EXPECT_NEAR(r.gate[0], 2.5 * s7 / (s6 + s7), 1e-15);
  EXPECT_NEAR(r.gate[1], 2.5 * s6 / (s6 + s7), 1e-15);
  const Routing raw = route_tokens(logits.data(), 1, grouped(2.5, false), bias.data());
  EXPECT_NEAR(raw.gate[0], 2.5 * s7, 1e-15);
  EXPECT_NEAR(raw.gate[1], 2.5 * s6, 1e-15);
  // The balancing loss's probabilities still cover every expert.
  double total = 0;
  for (double l : logits) total += sigmoid(l);
  EXPECT_NEAR(r.probs[0], sigmoid(3.0) / total, 1e-15);
}

TEST(MoeRouting, RefusesGroupsItCannotRoute) {
  const std::vector<double> logits(8, 0.0);
  const auto refused = [&](void (*change)(MoeSpec&)) {
    MoeSpec s = grouped();
    change(s);
    EXPECT_THROW(route_tokens(logits.data(), 1, s), std::invalid_argument);
  };
  refused([](MoeSpec& s) { s.router = RouterKind::Softmax; });
  refused([](MoeSpec& s) { s.groups = 3; });         // 8 experts do not split in 3
  refused([](MoeSpec& s) { s.groups = 8; });         // groups of one expert have no top two
  refused([](MoeSpec& s) { s.top_groups = 5; });     // more than the groups
  refused([](MoeSpec& s) { s.top_groups = 1; s.top_k = 3; });  // 2 eligible experts for 3
}

TEST(MoeRouting, SigmoidScoresAreExactForLargeLogitsOfEitherSign) {
  // No overflow either side: a logit of -800 scores 0 (not NaN), one of 800 scores 1.
  const std::vector<double> logits = {-800.0, 800.0, 0.0};
  const Routing r = route_tokens(logits.data(), 1, spec_of(3, 1, false, 0.0, 0.0, RouterKind::Sigmoid));
  EXPECT_EQ(r.scores, (std::vector<double>{0.0, 1.0, 0.5}));
  EXPECT_EQ(r.choice, (std::vector<int32_t>{1}));
}

// Logits whose softmax over 2 experts gives expert 0 the probability p.
std::vector<double> towards_expert_0(const std::vector<double>& p) {
  std::vector<double> logits;
  for (double q : p) logits.insert(logits.end(), {std::log(q), std::log(1 - q)});
  return logits;
}

TEST(MoeRouting, CapacityIsTheCeilingOfFactorTimesSlotsPerExpert) {
  MoeSpec s = spec_of(4, 2, true);
  EXPECT_EQ(expert_capacity(s, 10), 10) << "dropless: a token chooses an expert once at most";
  s.capacity_factor = 1.25;
  EXPECT_EQ(expert_capacity(s, 10), 7) << "ceil(1.25 x 10 x 2 / 4)";
  s.capacity_factor = 1.0;
  EXPECT_EQ(expert_capacity(s, 8), 4);
  s.capacity_factor = 1.9;
  EXPECT_EQ(expert_capacity(s, 3), 3) << "never more than the tokens";
}

TEST(MoeRouting, CapacityDropsTheLowestGatesAndTheLaterOfEqualOnes) {
  // Top 1 of 2 experts, 4 tokens all on expert 0, capacity ceil(1.0 x 4 / 2) = 2: the two
  // highest gates stay (tokens 1 and 3), the others lose their only expert.
  MoeSpec s = spec_of(2, 1, false, 0.01, 0.0);
  s.capacity_factor = 1.0;
  const std::vector<double> logits = towards_expert_0({0.6, 0.9, 0.7, 0.8});
  const Routing r = route_tokens(logits.data(), 4, s);
  EXPECT_EQ(r.choice, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(r.dropped, 2);
  EXPECT_EQ(r.counts, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(r.expert_begin, (std::vector<int64_t>{0, 2, 2}));
  EXPECT_EQ(r.token_of_row, (std::vector<int32_t>{1, 3})) << "kept rows in token order";
  EXPECT_EQ(r.row_of_choice, (std::vector<int32_t>{-1, 0, -1, 1}));
  EXPECT_NEAR(r.gate_of_row[0], 0.9, 1e-12);
  EXPECT_NEAR(r.gate_of_row[1], 0.8, 1e-12);
  // The balancing losses count what the router chose, the dropped choices too.
  const RouterSums sums = RouterSums::of(r, sequences_of(4, 1), 1);
  EXPECT_EQ(sums.expert_counts(), (std::vector<double>{4, 0}));
  EXPECT_EQ(sums.dropped, 2);
  EXPECT_EQ(RouterSums::from_vector(sums.to_vector(), 1, 2).dropped, 2);
  // Equal gates: the earlier token stays.
  const std::vector<double> equal = towards_expert_0({0.7, 0.7, 0.7, 0.7});
  EXPECT_EQ(route_tokens(equal.data(), 4, s).row_of_choice, (std::vector<int32_t>{0, 1, -1, -1}));
  // Dropless: every choice has a row.
  s.capacity_factor = 0;
  const Routing all = route_tokens(logits.data(), 4, s);
  EXPECT_EQ(all.dropped, 0);
  EXPECT_EQ(all.row_of_choice, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(MoeRouting, CapacityKeepsTheOtherGatesAsTheyWere) {
  // Top 2 of 4, renormalised: a token whose second expert is full keeps its first gate as
  // computed over both (not renormalised to 1), and its dropped choice has no row.
  for (RouterKind router : {RouterKind::Softmax, RouterKind::Sigmoid}) {
    MoeSpec s = spec_of(4, 2, true, 0.01, 0.0, router, 1.5);
    s.capacity_factor = 1.0;
    const int64_t T = 12;
    const std::vector<double> logits = random_logits(T * 4, 9);
    MoeSpec dropless = s;
    dropless.capacity_factor = 0;
    const Routing r = route_tokens(logits.data(), T, s), all = route_tokens(logits.data(), T, dropless);
    EXPECT_GT(r.dropped, 0) << router_name(router) << ": the case drops nothing";
    EXPECT_EQ(r.gate, all.gate) << router_name(router);
    EXPECT_EQ(r.choice, all.choice) << router_name(router);
    EXPECT_EQ(static_cast<int64_t>(r.token_of_row.size()), T * 2 - r.dropped);
    for (int64_t e = 0; e < 4; ++e) EXPECT_LE(r.counts[static_cast<size_t>(e)], expert_capacity(s, T));
    int64_t dropped = 0;
    for (size_t c = 0; c < r.row_of_choice.size(); ++c) {
      if (r.row_of_choice[c] < 0) {
        ++dropped;
        continue;
      }
      EXPECT_EQ(r.gate_of_row[static_cast<size_t>(r.row_of_choice[c])], r.gate[c]);
      EXPECT_EQ(r.token_of_row[static_cast<size_t>(r.row_of_choice[c])], static_cast<int32_t>(c / 2));
    }
    EXPECT_EQ(dropped, r.dropped);
  }
}

// The dropped choices add nothing to the output: the gates' gradient is zero there (the
// backend's gathered_row_dots gives 0 for row -1), and the logits' gradient still matches the
// kept gates' sum, whose renormalisation counts the dropped scores.
TEST(MoeRouting, RouterGradientWithDropsMatchesFiniteDifferences) {
  for (RouterKind router : {RouterKind::Softmax, RouterKind::Sigmoid}) {
    const int64_t T = 10, E = 4, k = 2;
    MoeSpec s = spec_of(E, k, true, 0.01, 0.0, router, 1.5);
    s.capacity_factor = 1.0;
    std::vector<double> logits = random_logits(T * E, 11);
    std::vector<double> dgate = random_logits(T * k, 12);
    const Routing r = route_tokens(logits.data(), T, s);
    ASSERT_GT(r.dropped, 0);
    for (size_t c = 0; c < dgate.size(); ++c)
      if (r.row_of_choice[c] < 0) dgate[c] = 0;
    const std::vector<double> g = router_logit_gradient(r, dgate, s, {});
    const double h = 1e-6;
    for (size_t i = 0; i < logits.size(); ++i) {
      const double keep = logits[i];
      logits[i] = keep + h;
      const double up = gate_objective(logits, T, s, dgate);
      logits[i] = keep - h;
      const double down = gate_objective(logits, T, s, dgate);
      logits[i] = keep;
      EXPECT_NEAR(g[i], (up - down) / (2 * h), 1e-8) << router_name(router) << ", logit " << i;
    }
  }
}

}  // namespace
}  // namespace meshtrain
