// GEMM ceilings for the step suite: a large square GEMM through the CPU backend's own Gemm
// (the code the training step runs), with the library forced, on the caller's threads. The
// inputs are multiples of 1/8 below 1 in magnitude, exact in bf16, and every partial sum is a
// multiple of 1/64 below 2^11: fp32 accumulation is exact, so a probe must match its fp64 dot
// product for every library and dtype.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/backend/cpu/gemm.h"
#include "meshtrain/tensor/bf16.h"

namespace meshtrain {

std::string_view gemm_ceiling_name(GemmCeiling c) {
  switch (c) {
    case GemmCeiling::OpenBlasF32: return "OpenBLAS sgemm";
    case GemmCeiling::OneDnnF32: return "oneDNN fp32 matmul";
    case GemmCeiling::OneDnnBf16: return "oneDNN bf16 matmul";
  }
  return "?";
}

double measure_gemm_ceiling(GemmCeiling which, int n, int repeats, int& wrong) {
  const size_t nn = static_cast<size_t>(n) * n;
  std::vector<float> a(nn), b(nn), c(nn);
  for (size_t i = 0; i < nn; ++i) {
    a[i] = static_cast<float>(static_cast<int>(i * 7 % 13) - 6) / 8.0f;
    b[i] = static_cast<float>(static_cast<int>(i * 5 % 11) - 5) / 8.0f;
  }
  std::vector<uint16_t> a16, b16;
  if (which == GemmCeiling::OneDnnBf16) {
    a16.resize(nn);
    b16.resize(nn);
    for (size_t i = 0; i < nn; ++i) {
      a16[i] = float_to_bf16_bits(a[i]);
      b16[i] = float_to_bf16_bits(b[i]);
    }
  }
  cpu::Gemm gemm;
  gemm.set_library(which == GemmCeiling::OpenBlasF32 ? cpu::GemmLibrary::OpenBlas
                                                     : cpu::GemmLibrary::OneDnn);
  const cpu::GemmShape s = cpu::GemmShape::dense(cpu::Trans::No, cpu::Trans::No, n, n, n);
  std::vector<double> rates;
  for (int r = 0; r <= repeats; ++r) {  // the first run warms caches, thread pools, primitives
    const auto t0 = std::chrono::steady_clock::now();
    if (which == GemmCeiling::OneDnnBf16) gemm.run_bf16(s, a16.data(), b16.data(), nullptr, c.data());
    else gemm.run(s, a.data(), b.data(), nullptr, c.data());
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) rates.push_back(2.0 * n * static_cast<double>(n) * n / sec / 1e9);
  }
  for (int probe = 0; probe < 16; ++probe) {  // the values must be right, not only fast
    const size_t i = static_cast<size_t>((probe * 977) % n), j = static_cast<size_t>((probe * 389) % n);
    double ref = 0;
    for (size_t k = 0; k < static_cast<size_t>(n); ++k) ref += static_cast<double>(a[i * n + k]) * b[k * n + j];
    if (std::abs(ref - c[i * n + j]) > 1e-3 * (1 + std::abs(ref))) ++wrong;
  }
  return *std::max_element(rates.begin(), rates.end());
}

}  // namespace meshtrain
