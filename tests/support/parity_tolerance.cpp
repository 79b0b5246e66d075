#include "support/parity_tolerance.h"

#include <algorithm>
#include <cmath>

namespace meshtrain::testing {

namespace {
constexpr double kLambda = 2.0;  // one realisation of the rounding against another
}  // namespace

Tolerances rounding_effect(const Reference& coarse, const Reference& fine, double scale) {
  Tolerances r{0, 0, 0, 0};
  for (size_t s = 0; s < std::min(coarse.losses.size(), fine.losses.size()); ++s)
    r.loss = std::max(r.loss, std::abs(coarse.losses[s] - fine.losses[s]) / std::abs(fine.losses[s]));
  double all_diff2 = 0, all_ref2 = 0;
  for (const auto& [name, want] : fine.params) {
    const std::vector<double>& got = coarse.params.at(name);
    double diff2 = 0, ref2 = 0, largest = 1e-300, worst = 0;
    for (double v : want) largest = std::max(largest, std::abs(v));
    for (size_t i = 0; i < want.size(); ++i) {
      const double d = got[i] - want[i];
      diff2 += d * d;
      ref2 += want[i] * want[i];
      worst = std::max(worst, std::abs(d));
    }
    all_diff2 += diff2;
    all_ref2 += ref2;
    r.each_tensor = std::max(r.each_tensor, std::sqrt(diff2 / std::max(ref2, 1e-300)));
    r.each_element = std::max(r.each_element, worst / largest);
  }
  r.params = std::sqrt(all_diff2 / std::max(all_ref2, 1e-300));
  return {r.loss * scale, r.params * scale, r.each_tensor * scale, r.each_element * scale};
}

Tolerances parity_tolerances(const Tolerances& r, int roundings, double accumulation_roundoff,
                             double tokens) {
  const double factor = kLambda * (roundings + 1);
  const double u = std::sqrt(tokens) * accumulation_roundoff;
  return {factor * std::max(r.loss, u), factor * std::max(r.params, u),
          factor * std::max(r.each_tensor, u), factor * std::max(r.each_element, u)};
}

}  // namespace meshtrain::testing
