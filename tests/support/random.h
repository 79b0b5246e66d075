#pragma once
// Test helpers: reproducible random host data and error measures.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "meshtrain/tensor/philox.h"

namespace meshtrain::testing {

inline std::vector<double> random_normal(size_t n, uint64_t seed, double scale = 1.0) {
  const Philox rng(seed);
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * rng.normal(i);
  return v;
}

inline std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// max |a - b| / max(max |b|, floor): error relative to the reference's scale.
template <class A, class B>
double max_relative_error(const std::vector<A>& a, const std::vector<B>& b, double floor = 1e-12) {
  double err = 0, scale = floor;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return err / scale;
}

}  // namespace meshtrain::testing
