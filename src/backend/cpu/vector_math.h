#pragma once
// Elementary functions the compiler can vectorise inside `#pragma omp simd` loops. glibc's
// vector math is only used under -ffast-math, which would also drop NaN/Inf semantics that the
// trainer relies on to detect divergence; so the float exponential is written here, branch-free.
// The double versions call libm: double is the verification path, where accuracy matters and
// speed does not.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace meshtrain::cpu {

// exp(x) for float, Cephes-style: x = n ln2 + r with |r| <= ln2/2, a degree-6 polynomial for
// e^r, and 2^n put into the exponent bits. Max relative error about 2 ulp on [-87, 88]; inputs
// are clamped there, so results never overflow and underflow to ~1e-38 rather than 0.
#pragma omp declare simd notinbranch
inline float exp_fast(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

#pragma omp declare simd notinbranch
inline float tanh_fast(float x) { return 1.0f - 2.0f / (exp_fast(2.0f * x) + 1.0f); }

// The larger of m and x for a running maximum in a `#pragma omp simd reduction(max : m)` loop.
// Written as x > m ? x : m, the form GCC turns into vmaxps/vmaxpd; std::max(m, x), which is
// m < x ? x : m, it leaves scalar there (one maxss per element, a four-cycle chain). Both
// keep m when x is NaN.
template <class T> inline T vmax(T m, T x) { return x > m ? x : m; }

template <class T> inline T vexp(T x);
template <> inline float vexp<float>(float x) { return exp_fast(x); }
template <> inline double vexp<double>(double x) { return std::exp(x); }

template <class T> inline T vtanh(T x);
template <> inline float vtanh<float>(float x) { return tanh_fast(x); }
template <> inline double vtanh<double>(double x) { return std::tanh(x); }

}  // namespace meshtrain::cpu
