#pragma once
// The CUDA kernel tests' comparison with the CPU backend (cuda_kernels_test.cpp and
// cuda_llama_kernels_test.cpp, one binary): the two dtype modes, the tolerance table that
// cuda_kernels_test.cpp argues, one GPU and one CPU backend shared by every test, and the
// rounding of inputs to what the activation dtype holds.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/cuda/cuda_backend.h"
#include "meshtrain/tensor/bf16.h"
#include "support/random.h"
#include "support/tensors.h"

namespace meshtrain::testing {

enum class Mode { Fp32, Bf16 };
inline std::string mode_name(Mode m) { return m == Mode::Fp32 ? "fp32" : "bf16"; }

struct Tolerance {
  double fp32, bf16;
  double operator()(Mode m) const { return m == Mode::Fp32 ? fp32 : bf16; }
};
constexpr Tolerance kPointwise{2e-5, 1e-2};
constexpr Tolerance kGemm{1e-4, 1e-2};
constexpr Tolerance kAttention{1e-4, 3e-2};
constexpr Tolerance kGrad32{1e-5, 1e-4};
constexpr Tolerance kReduction{1e-9, 1e-9};

// One backend per attention implementation, created on first use and shared by all tests.
inline CudaBackend* gpu_backend(AttentionImpl attention = AttentionImpl::Auto) {
  static std::unique_ptr<CudaBackend> backends[3];
  auto& be = backends[static_cast<int>(attention)];
  if (!be) {
    CudaBackendOptions options;
    options.attention = attention;
    be = std::make_unique<CudaBackend>(options);
  }
  return be.get();
}

inline CpuBackend& cpu_backend() {
  static CpuBackend be(2);
  return be;
}

// What each test needs: both backends, the mode's dtypes, and rounding of inputs.
struct Env {
  Mode mode;
  CpuBackend& cpu = cpu_backend();
  CudaBackend& gpu;

  explicit Env(Mode m, AttentionImpl attention = AttentionImpl::Auto)
      : mode(m), gpu(*gpu_backend(attention)) {}

  DType act() const { return mode == Mode::Fp32 ? DType::F32 : DType::BF16; }
  // The values the activation dtype can hold (what both backends then compute with).
  std::vector<double> round(std::vector<double> v) const {
    for (double& x : v)
      x = mode == Mode::Fp32 ? static_cast<double>(static_cast<float>(x))
                             : static_cast<double>(bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(x))));
    return v;
  }
  Tensor cpu_t(const std::vector<double>& v, Shape s) { return make_tensor(cpu, v, s, DType::F32); }
  Tensor gpu_act(const std::vector<double>& v, Shape s) { return make_tensor(gpu, v, s, act()); }
  Tensor gpu_f32(const std::vector<double>& v, Shape s) { return make_tensor(gpu, v, s, DType::F32); }
  std::vector<double> host(const Tensor& t) {
    return t.device() == Device::Cuda ? to_host(gpu, t) : to_host(cpu, t);
  }
  void expect_close(const Tensor& got, const Tensor& want, Tolerance tol, const char* what) {
    EXPECT_LT(max_relative_error(host(got), host(want)), tol(mode)) << what;
  }
};

// Rows of N x C in one mode: test names read <mode>_N<N>_C<C>.
struct RowCase {
  Mode mode;
  int64_t N, C;
};
inline std::string row_name(const ::testing::TestParamInfo<RowCase>& i) {
  return mode_name(i.param.mode) + "_N" + std::to_string(i.param.N) + "_C" +
         std::to_string(i.param.C);
}

}  // namespace meshtrain::testing
