#include "meshtrain/model/moe_routing.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace meshtrain {

namespace {

void check_spec(const MoeSpec& spec) {
  if (spec.experts < 1 || spec.top_k < 1 || spec.top_k > spec.experts)
    throw std::invalid_argument("moe routing: top_k " + std::to_string(spec.top_k) +
                                " of " + std::to_string(spec.experts) +
                                " experts (need 1 <= top_k <= experts)");
  if (spec.groups == 1 && spec.top_groups == 1) return;
  // The deck refuses these first (config/deck.cpp), naming its keys.
  const bool grouped_ok = spec.router == RouterKind::Sigmoid && spec.groups >= 1 &&
                          spec.experts % spec.groups == 0 && spec.experts / spec.groups >= 2 &&
                          spec.top_groups >= 1 && spec.top_groups <= spec.groups &&
                          spec.top_groups * (spec.experts / spec.groups) >= spec.top_k;
  if (!grouped_ok)
    throw std::invalid_argument("moe routing: " + std::to_string(spec.experts) + " experts in " +
                                std::to_string(spec.groups) + " groups, top " +
                                std::to_string(spec.top_groups) + " groups, top_k " +
                                std::to_string(spec.top_k) +
                                " (need the sigmoid router, groups of >= 2 experts dividing them, "
                                "1 <= top_groups <= groups and top_k within the top groups)");
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// DeepSeek-V3's group limit (noaux_tc; Hugging Face's DeepseekV3MoE.route_tokens_to_experts):
// a group's score is the sum of its two largest keys, the top_groups best groups stay eligible
// (the larger score first, the lower group index among equals: Hugging Face's topk leaves ties
// unspecified), and every other expert's key becomes -inf, so that the top-k below never takes it.
void keep_best_groups(std::vector<double>& key, const MoeSpec& spec, std::vector<int32_t>& group_order,
                      std::vector<double>& group_score) {
  const int64_t G = spec.groups, size = spec.experts / G;
  for (int64_t g = 0; g < G; ++g) {
    const double* k = key.data() + g * size;
    double first = -kInf, second = -kInf;
    for (int64_t e = 0; e < size; ++e)
      if (k[e] > first) {
        second = first;
        first = k[e];
      } else if (k[e] > second) {
        second = k[e];
      }
    group_score[static_cast<size_t>(g)] = first + second;
  }
  std::iota(group_order.begin(), group_order.end(), 0);
  std::partial_sort(group_order.begin(), group_order.begin() + spec.top_groups, group_order.end(),
                    [&](int32_t a, int32_t b) {
                      const double sa = group_score[static_cast<size_t>(a)], sb = group_score[static_cast<size_t>(b)];
                      return sa > sb || (sa == sb && a < b);
                    });
  for (int64_t j = spec.top_groups; j < G; ++j) {
    const int64_t g = group_order[static_cast<size_t>(j)];
    std::fill(key.begin() + g * size, key.begin() + (g + 1) * size, -kInf);
  }
}

// The expert-sorted order from the choices: counting sort by expert, tokens in order within one.
// An expert chosen more than `capacity` times keeps its choices of the highest gates (equal
// gates: the earlier token); the others are dropped.
void sort_by_expert(Routing& r, int64_t capacity) {
  const int64_t E = r.experts, k = r.top_k, N = r.tokens;
  std::vector<char> kept(static_cast<size_t>(N * k), 1);
  r.dropped = 0;
  // A token chooses an expert once at most: a capacity of N drops nothing.
  if (capacity < N) {
    std::vector<std::vector<int64_t>> chosen(static_cast<size_t>(E));  // choice indices, token order
    for (int64_t c = 0; c < N * k; ++c) chosen[static_cast<size_t>(r.choice[static_cast<size_t>(c)])].push_back(c);
    for (std::vector<int64_t>& list : chosen) {
      if (static_cast<int64_t>(list.size()) <= capacity) continue;
      // Stable: equal gates keep token order, the earlier token first.
      std::stable_sort(list.begin(), list.end(), [&](int64_t a, int64_t b) {
        return r.gate[static_cast<size_t>(a)] > r.gate[static_cast<size_t>(b)];
      });
      for (size_t i = static_cast<size_t>(capacity); i < list.size(); ++i) kept[static_cast<size_t>(list[i])] = 0;
      r.dropped += static_cast<int64_t>(list.size()) - capacity;
    }
  }
  r.counts.assign(static_cast<size_t>(E), 0);
  for (int64_t c = 0; c < N * k; ++c)
    if (kept[static_cast<size_t>(c)]) ++r.counts[static_cast<size_t>(r.choice[static_cast<size_t>(c)])];
  r.expert_begin.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e)
    r.expert_begin[static_cast<size_t>(e + 1)] = r.expert_begin[static_cast<size_t>(e)] + r.counts[static_cast<size_t>(e)];
  const size_t M = static_cast<size_t>(N * k - r.dropped);
  std::vector<int64_t> next(r.expert_begin.begin(), r.expert_begin.end() - 1);
  r.token_of_row.assign(M, 0);
  r.gate_of_row.assign(M, 0.0);
  r.row_of_choice.assign(static_cast<size_t>(N * k), -1);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const size_t c = static_cast<size_t>(t * k + j);
      if (!kept[c]) continue;
      const int64_t row = next[static_cast<size_t>(r.choice[c])]++;
      r.token_of_row[static_cast<size_t>(row)] = static_cast<int32_t>(t);
      r.gate_of_row[static_cast<size_t>(row)] = r.gate[c];
      r.row_of_choice[c] = static_cast<int32_t>(row);
    }
}

}  // namespace

Routing route_tokens(const double* logits, int64_t tokens, const MoeSpec& spec,
                     const double* expert_bias) {
  check_spec(spec);
  if (tokens * spec.top_k > INT32_MAX)
    throw std::invalid_argument("moe routing: " + std::to_string(tokens) + " tokens x top_k " +
                                std::to_string(spec.top_k) + " rows exceed the int32 row index");
  Routing r;
  const int64_t E = spec.experts, k = spec.top_k;
  const bool sigmoid = spec.router == RouterKind::Sigmoid;
  const bool z_softmax = sigmoid && spec.z_loss != 0;
  r.router = spec.router;
  r.tokens = tokens;
  r.experts = E;
  r.top_k = k;
  r.probs.resize(static_cast<size_t>(tokens * E));
  if (sigmoid) r.scores.resize(static_cast<size_t>(tokens * E));
  if (z_softmax) r.softmax.resize(static_cast<size_t>(tokens * E));
  r.lse.resize(static_cast<size_t>(tokens));
  r.choice.resize(static_cast<size_t>(tokens * k));
  r.gate.resize(static_cast<size_t>(tokens * k));
  std::vector<int32_t> order(static_cast<size_t>(E));
  std::vector<double> key(static_cast<size_t>(E));
  std::vector<int32_t> group_order(static_cast<size_t>(spec.groups));
  std::vector<double> group_score(static_cast<size_t>(spec.groups));
  for (int64_t t = 0; t < tokens; ++t) {
    const double* l = logits + t * E;
    double* p = r.probs.data() + t * E;
    // Every logit: a NaN compares false and would hide from the maximum.
    for (int64_t e = 0; e < E; ++e)
      if (!std::isfinite(l[e]))
        throw std::runtime_error("moe routing: token " + std::to_string(t) + " has a non-finite "
                                 "router logit (" + std::to_string(l[e]) + ", expert " +
                                 std::to_string(e) + ")");
    const double m = *std::max_element(l, l + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - m));
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    r.lse[static_cast<size_t>(t)] = m + std::log(sum);
    // The scores the gates take: the softmax's, or the sigmoid's (then P is them normalised).
    const double* score = p;
    if (sigmoid) {
      if (z_softmax) std::copy(p, p + E, r.softmax.data() + t * E);
      double* s = r.scores.data() + t * E;
      double total = 0;
      for (int64_t e = 0; e < E; ++e) {
        // exp of a negative number only: no overflow either side.
        const double x = std::exp(-std::abs(l[e]));
        total += (s[e] = l[e] >= 0 ? 1.0 / (1.0 + x) : x / (1.0 + x));
      }
      for (int64_t e = 0; e < E; ++e) p[e] = s[e] / total;
      score = s;
    }
    // Chosen on the logits for the softmax (it keeps their order, and equal logits stay
    // equal), on score plus bias for the sigmoid: the larger first, the lower index among equals.
    for (int64_t e = 0; e < E; ++e)
      key[static_cast<size_t>(e)] = sigmoid ? score[e] + (expert_bias ? expert_bias[e] : 0.0) : l[e];
    if (spec.groups > 1) keep_best_groups(key, spec, group_order, group_score);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      const double ka = key[static_cast<size_t>(a)], kb = key[static_cast<size_t>(b)];
      return ka > kb || (ka == kb && a < b);
    });
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += score[order[static_cast<size_t>(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[static_cast<size_t>(j)];
      r.choice[static_cast<size_t>(t * k + j)] = e;
      r.gate[static_cast<size_t>(t * k + j)] =
          spec.route_scale * (spec.normalize_top_k ? score[e] / chosen : score[e]);
    }
  }
  sort_by_expert(r, expert_capacity(spec, tokens));
  return r;
}

int64_t expert_capacity(const MoeSpec& spec, int64_t tokens) {
  if (spec.capacity_factor <= 0) return tokens;
  const double slots = spec.capacity_factor * static_cast<double>(tokens) * static_cast<double>(spec.top_k) /
                       static_cast<double>(spec.experts);
  return std::min(tokens, static_cast<int64_t>(std::ceil(slots)));
}

Routing route_balanced(int64_t tokens, const MoeSpec& spec) {
  check_spec(spec);
  Routing r;
  const int64_t E = spec.experts, k = spec.top_k;
  r.tokens = tokens;
  r.experts = E;
  r.top_k = k;
  r.router = spec.router;
  r.probs.assign(static_cast<size_t>(tokens * E), 1.0 / static_cast<double>(E));
  // All logits 0: every sigmoid score one half, the softmax uniform.
  if (spec.router == RouterKind::Sigmoid) r.scores.assign(static_cast<size_t>(tokens * E), 0.5);
  if (spec.router == RouterKind::Sigmoid && spec.z_loss != 0) r.softmax = r.probs;
  r.lse.assign(static_cast<size_t>(tokens), std::log(static_cast<double>(E)));
  r.choice.resize(static_cast<size_t>(tokens * k));
  r.gate.assign(static_cast<size_t>(tokens * k), 1.0 / static_cast<double>(k));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j)
      r.choice[static_cast<size_t>(t * k + j)] = static_cast<int32_t>((t * k + j) % E);
  sort_by_expert(r, tokens);  // every choice: the planner prices a capacity's most
  return r;
}

RouterSums RouterSums::of(const Routing& r, const std::vector<int32_t>& sequence_of,
                          int64_t sequences) {
  if (static_cast<int64_t>(sequence_of.size()) != r.tokens)
    throw std::logic_error("moe routing: " + std::to_string(sequence_of.size()) +
                           " sequence indices for " + std::to_string(r.tokens) + " tokens");
  RouterSums s;
  const int64_t E = r.experts;
  s.sequences = sequences;
  s.experts = E;
  s.counts.assign(static_cast<size_t>(sequences * E), 0.0);
  s.prob_sums.assign(static_cast<size_t>(sequences * E), 0.0);
  s.tokens.assign(static_cast<size_t>(sequences), 0.0);
  for (int64_t t = 0; t < r.tokens; ++t) {
    const int64_t b = sequence_of[static_cast<size_t>(t)];
    if (b < 0 || b >= sequences)
      throw std::logic_error("moe routing: token " + std::to_string(t) + " of sequence " +
                             std::to_string(b) + " of " + std::to_string(sequences));
    s.tokens[static_cast<size_t>(b)] += 1;
    for (int64_t e = 0; e < E; ++e)
      s.prob_sums[static_cast<size_t>(b * E + e)] += r.probs[static_cast<size_t>(t * E + e)];
    for (int64_t j = 0; j < r.top_k; ++j)
      s.counts[static_cast<size_t>(b * E + r.choice[static_cast<size_t>(t * r.top_k + j)])] += 1;
    s.lse_squares += r.lse[static_cast<size_t>(t)] * r.lse[static_cast<size_t>(t)];
  }
  s.dropped = static_cast<double>(r.dropped);
  return s;
}

std::vector<double> RouterSums::to_vector() const {
  std::vector<double> v(counts);
  v.insert(v.end(), prob_sums.begin(), prob_sums.end());
  v.insert(v.end(), tokens.begin(), tokens.end());
  v.push_back(lse_squares);
  v.push_back(dropped);
  return v;
}

RouterSums RouterSums::from_vector(const std::vector<double>& v, int64_t sequences, int64_t experts) {
  const size_t SE = static_cast<size_t>(sequences * experts), S = static_cast<size_t>(sequences);
  if (v.size() != 2 * SE + S + 2)
    throw std::logic_error("moe routing: router sums of " + std::to_string(v.size()) +
                           " values for " + std::to_string(sequences) + " sequences of " +
                           std::to_string(experts) + " experts");
  RouterSums s;
  s.sequences = sequences;
  s.experts = experts;
  const auto at = [&](size_t i) { return v.begin() + static_cast<std::ptrdiff_t>(i); };
  s.counts.assign(at(0), at(SE));
  s.prob_sums.assign(at(SE), at(2 * SE));
  s.tokens.assign(at(2 * SE), at(2 * SE + S));
  s.lse_squares = v[2 * SE + S];
  s.dropped = v[2 * SE + S + 1];
  return s;
}

std::vector<double> RouterSums::expert_counts() const {
  std::vector<double> out(static_cast<size_t>(experts), 0.0);
  for (int64_t b = 0; b < sequences; ++b)
    for (int64_t e = 0; e < experts; ++e) out[static_cast<size_t>(e)] += counts[static_cast<size_t>(b * experts + e)];
  return out;
}

double RouterSums::token_count() const {
  double n = 0;
  for (double t : tokens) n += t;
  return n;
}

BalancingLosses balancing_losses(const RouterSums& s, const MoeSpec& spec) {
  BalancingLosses l;
  const double k = static_cast<double>(spec.top_k), E = static_cast<double>(spec.experts);
  for (int64_t b = 0; b < s.sequences; ++b) {
    const double T = s.tokens[static_cast<size_t>(b)];
    if (T <= 0) continue;
    double fp = 0;
    for (int64_t e = 0; e < s.experts; ++e) {
      const size_t i = static_cast<size_t>(b * s.experts + e);
      fp += (s.counts[i] / (T * k)) * (s.prob_sums[i] / T);
    }
    const double sequence_loss = spec.aux_loss * E * fp;
    l.load_balance += sequence_loss;
    l.per_token += sequence_loss * T;
  }
  l.z = spec.z_loss * s.lse_squares;
  l.per_token += l.z;
  return l;
}

std::vector<double> balancing_logit_gradient(const Routing& r, const RouterSums& s,
                                             const std::vector<int32_t>& sequence_of,
                                             const MoeSpec& spec, double weight) {
  const int64_t E = r.experts;
  std::vector<double> d(static_cast<size_t>(r.tokens * E), 0.0);
  if (weight == 0) return d;
  const double k = static_cast<double>(spec.top_k);
  const bool sigmoid = r.router == RouterKind::Sigmoid;
  // A sequence's L_aux weighs T per-token losses: d(T L_aux) / dp_te = alpha E f_e, the same
  // for each of its tokens. Through the softmax, dlogit_ti = p_ti (g_i - sum_e p_te g_e); through
  // the sigmoid's normalised scores p = s / S, dlogit_ti = s_ti (1 - s_ti) / S (g_i - sum_e p_te g_e).
  std::vector<double> g(static_cast<size_t>(E));
  for (int64_t t = 0; t < r.tokens; ++t) {
    const int64_t b = sequence_of[static_cast<size_t>(t)];
    const double T = s.tokens[static_cast<size_t>(b)];
    for (int64_t e = 0; e < E; ++e)
      g[static_cast<size_t>(e)] = weight * spec.aux_loss * static_cast<double>(E) *
                                  s.counts[static_cast<size_t>(b * E + e)] / (T * k);
    const double* p = r.probs.data() + t * E;
    double* out = d.data() + t * E;
    double mean = 0;
    for (int64_t e = 0; e < E; ++e) mean += p[e] * g[static_cast<size_t>(e)];
    // d(beta lse_t^2) / dlogit_ti = 2 beta lse_t softmax_ti.
    const double z = weight * spec.z_loss * 2.0 * r.lse[static_cast<size_t>(t)];
    if (!sigmoid) {
      for (int64_t e = 0; e < E; ++e) out[e] = p[e] * (g[static_cast<size_t>(e)] - mean) + z * p[e];
      continue;
    }
    const double* sc = r.scores.data() + t * E;
    double total = 0;
    for (int64_t e = 0; e < E; ++e) total += sc[e];
    for (int64_t e = 0; e < E; ++e)
      out[e] = sc[e] * (1.0 - sc[e]) / total * (g[static_cast<size_t>(e)] - mean);
    if (spec.z_loss != 0)
      for (int64_t e = 0; e < E; ++e) out[e] += z * r.softmax[static_cast<size_t>(t * E + e)];
  }
  return d;
}

std::vector<double> router_logit_gradient(const Routing& r, const std::vector<double>& dgate,
                                          const MoeSpec& spec, const std::vector<double>& add) {
  const int64_t E = r.experts, k = r.top_k;
  const bool sigmoid = r.router == RouterKind::Sigmoid;
  std::vector<double> d(static_cast<size_t>(r.tokens * E), 0.0);
  std::vector<double> dscore(static_cast<size_t>(E));
  for (int64_t t = 0; t < r.tokens; ++t) {
    const double* score = (sigmoid ? r.scores.data() : r.probs.data()) + t * E;
    const double* dg = dgate.data() + t * k;
    const int32_t* c = r.choice.data() + t * k;
    std::fill(dscore.begin(), dscore.end(), 0.0);
    if (spec.normalize_top_k) {
      // g_j = scale s_j / S over the chosen: ds_i = (scale dg_i - sum_j dg_j g_j) / S.
      double S = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) S += score[c[j]];
      for (int64_t j = 0; j < k; ++j) dot += dg[j] * r.gate[static_cast<size_t>(t * k + j)];
      for (int64_t j = 0; j < k; ++j)
        dscore[static_cast<size_t>(c[j])] = (spec.route_scale * dg[j] - dot) / S;
    } else {
      for (int64_t j = 0; j < k; ++j) dscore[static_cast<size_t>(c[j])] = spec.route_scale * dg[j];
    }
    double* out = d.data() + t * E;
    if (sigmoid) {
      for (int64_t e = 0; e < E; ++e) out[e] = score[e] * (1.0 - score[e]) * dscore[static_cast<size_t>(e)];
    } else {
      double mean = 0;
      for (int64_t e = 0; e < E; ++e) mean += score[e] * dscore[static_cast<size_t>(e)];
      for (int64_t e = 0; e < E; ++e) out[e] = score[e] * (dscore[static_cast<size_t>(e)] - mean);
    }
    if (!add.empty())
      for (int64_t e = 0; e < E; ++e) out[e] += add[static_cast<size_t>(t * E + e)];
  }
  return d;
}

}  // namespace meshtrain
