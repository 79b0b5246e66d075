// The CUDA backend's RMSNorm, SwiGLU and rotary-embedding kernels against the CPU
// backend on the same inputs, in fp32 and bf16 mixed precision, with cuda_kernels_test.cpp's
// tolerance table (support/cuda_vs_cpu.h); and the fused rmsnorm_backward_add against the two
// calls it replaces, bit for bit, on the device. Names read Cuda/<Op>.MatchesCpu/<mode>_<sizes>.
// Without a GPU every test skips with the reason.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "meshtrain/backend/rotary_table.h"
#include "support/cuda_vs_cpu.h"
#include "support/skip_without_gpu.h"

namespace meshtrain {
namespace {

using testing::Env;
using testing::kGrad32;
using testing::kPointwise;
using testing::Mode;
using testing::mode_name;
using testing::random_normal;
using testing::row_name;
using testing::RowCase;
using Vec = std::vector<double>;

class RmsNorm : public ::testing::TestWithParam<RowCase> {};

TEST_P(RmsNorm, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, N, C] = GetParam();
  Env e(mode);
  const double eps = 1e-6;
  const Vec x = e.round(random_normal(N * C, 31, 2.0)), w = e.round(random_normal(C, 32));
  const Vec dy = e.round(random_normal(N * C, 33)), res = e.round(random_normal(N * C, 34));
  Tensor gx = e.gpu_act(x, {N, C}), gw = e.gpu_act(w, {C});
  Tensor cx = e.cpu_t(x, {N, C}), cw = e.cpu_t(w, {C});
  Tensor gout = e.gpu.empty({N, C}, e.act(), MemoryCategory::Workspace);
  Tensor grstd = e.gpu.empty({N}, DType::F32, MemoryCategory::Workspace);
  Tensor cout = e.cpu.empty({N, C}, DType::F32, MemoryCategory::Workspace);
  Tensor crstd = e.cpu.empty({N}, DType::F32, MemoryCategory::Workspace);
  e.gpu.rmsnorm_forward(gout, grstd, gx, gw, eps);
  e.cpu.rmsnorm_forward(cout, crstd, cx, cw, eps);
  e.expect_close(gout, cout, kPointwise, "out");
  e.expect_close(grstd, crstd, kGrad32, "rstd (fp32)");

  const Vec ones(C, 1.0);  // dweight accumulates: start from ones
  Tensor gdx = e.gpu.empty({N, C}, e.act(), MemoryCategory::Workspace), gdw = e.gpu_f32(ones, {C});
  Tensor cdx = e.cpu.empty({N, C}, DType::F32, MemoryCategory::Workspace), cdw = e.cpu_t(ones, {C});
  Tensor gdy = e.gpu_act(dy, {N, C});
  e.gpu.rmsnorm_backward(gdx, gdw, gdy, gx, gw, grstd);
  e.cpu.rmsnorm_backward(cdx, cdw, e.cpu_t(dy, {N, C}), cx, cw, crstd);
  e.expect_close(gdx, cdx, kPointwise, "dinp");
  e.expect_close(gdw, cdw, kGrad32, "dweight");

  // The fused residual path: the bits of rmsnorm_backward then add_inplace, on the device.
  Tensor gres = e.gpu_act(res, {N, C});
  Tensor fused = e.gpu.empty({N, C}, e.act(), MemoryCategory::Workspace);
  Tensor fused_dw = e.gpu_f32(ones, {C}), two_dw = e.gpu_f32(ones, {C});
  e.gpu.rmsnorm_backward_add(fused, fused_dw, gdy, gx, gw, grstd, gres);
  e.gpu.rmsnorm_backward(gdx, two_dw, gdy, gx, gw, grstd);
  e.gpu.add_inplace(gdx, gres);
  EXPECT_EQ(e.host(fused), e.host(gdx)) << "rmsnorm_backward_add vs the two calls";
  EXPECT_EQ(e.host(fused_dw), e.host(two_dw)) << "dweight of rmsnorm_backward_add";
}

INSTANTIATE_TEST_SUITE_P(Cuda, RmsNorm,
                         ::testing::Values(RowCase{Mode::Fp32, 37, 96}, RowCase{Mode::Bf16, 37, 96},
                                           RowCase{Mode::Bf16, 37, 100},  // rows not whole packs
                                           RowCase{Mode::Bf16, 384, 128},  // per-head q/k norm
                                           RowCase{Mode::Fp32, 64, 2048},
                                           RowCase{Mode::Bf16, 2048, 2048}),
                         row_name);

class Swiglu : public ::testing::TestWithParam<RowCase> {};

TEST_P(Swiglu, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, N, F] = GetParam();
  Env e(mode);
  Vec gate = random_normal(N * F, 35, 3.0);
  gate[0] = 40.0;  // sigmoid saturated at 1 and at 0
  gate[1] = -40.0;
  gate = e.round(gate);
  const Vec up = e.round(random_normal(N * F, 36)), dy = e.round(random_normal(N * F, 37));
  Tensor gg = e.gpu_act(gate, {N, F}), gu = e.gpu_act(up, {N, F});
  Tensor cg = e.cpu_t(gate, {N, F}), cu = e.cpu_t(up, {N, F});
  Tensor gout = e.gpu.empty({N, F}, e.act(), MemoryCategory::Workspace);
  Tensor cout = e.cpu.empty({N, F}, DType::F32, MemoryCategory::Workspace);
  e.gpu.swiglu_forward(gout, gg, gu);
  e.cpu.swiglu_forward(cout, cg, cu);
  e.expect_close(gout, cout, kPointwise, "out");
  Tensor gdg = e.gpu.empty({N, F}, e.act(), MemoryCategory::Workspace);
  Tensor gdu = e.gpu.empty({N, F}, e.act(), MemoryCategory::Workspace);
  Tensor cdg = e.cpu.empty({N, F}, DType::F32, MemoryCategory::Workspace);
  Tensor cdu = e.cpu.empty({N, F}, DType::F32, MemoryCategory::Workspace);
  e.gpu.swiglu_backward(gdg, gdu, e.gpu_act(dy, {N, F}), gg, gu);
  e.cpu.swiglu_backward(cdg, cdu, e.cpu_t(dy, {N, F}), cg, cu);
  e.expect_close(gdg, cdg, kPointwise, "dgate");
  e.expect_close(gdu, cdu, kPointwise, "dup");
}

INSTANTIATE_TEST_SUITE_P(Cuda, Swiglu,
                         ::testing::Values(RowCase{Mode::Fp32, 7, 587}, RowCase{Mode::Bf16, 7, 587},
                                           RowCase{Mode::Bf16, 512, 8192}),
                         row_name);

// A packed (B * T, (heads + 2 * kv_heads) * head_dim) qkv row; queries and keys rotate in one
// call from column 0 at positions of two non-contiguous chunks (context parallelism), values not.
struct RotaryCase {
  Mode mode;
  int64_t N, heads, kv_heads, head_dim;
};
std::string rotary_name(const ::testing::TestParamInfo<RotaryCase>& i) {
  return mode_name(i.param.mode) + "_N" + std::to_string(i.param.N) + "_H" +
         std::to_string(i.param.heads) + "_KV" + std::to_string(i.param.kv_heads) + "_D" +
         std::to_string(i.param.head_dim);
}

class Rotary : public ::testing::TestWithParam<RotaryCase> {};

TEST_P(Rotary, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, N, heads, kv_heads, D] = GetParam();
  Env e(mode);
  const int64_t W = (heads + 2 * kv_heads) * D, P = 2 * N;
  std::vector<int32_t> positions(N);
  for (int64_t n = 0; n < N; ++n)
    positions[n] = static_cast<int32_t>(n < N / 2 ? n : n + N);  // two chunks, a gap between
  const Vec inv_freq = rope_inverse_frequencies(
      D, RopeFrequencies{500000.0, Llama3RopeScaling{8.0, 1.0, 4.0, 8192}});
  const RotaryTable gt = make_rotary_table(e.gpu, inv_freq, P, e.act(), MemoryCategory::Workspace);
  const RotaryTable ct = make_rotary_table(e.cpu, inv_freq, P, DType::F32, MemoryCategory::Workspace);
  Tensor gpos = testing::make_tokens(e.gpu, positions), cpos = testing::make_tokens(e.cpu, positions);
  const Vec x = e.round(random_normal(N * W, 38));
  Tensor gx = e.gpu_act(x, {N, W}), cx = e.cpu_t(x, {N, W});
  const Backend::RotaryHeads qk{0, heads + kv_heads, D};
  e.gpu.rotary_forward(gx, gpos, gt.cos, gt.sin, qk);
  e.cpu.rotary_forward(cx, cpos, ct.cos, ct.sin, qk);
  e.expect_close(gx, cx, kPointwise, "rotary_forward");
  e.gpu.rotary_backward(gx, gpos, gt.cos, gt.sin, qk);
  e.cpu.rotary_backward(cx, cpos, ct.cos, ct.sin, qk);
  e.expect_close(gx, cx, kPointwise, "rotary_backward");
}

INSTANTIATE_TEST_SUITE_P(Cuda, Rotary,
                         ::testing::Values(RotaryCase{Mode::Fp32, 16, 4, 2, 64},
                                           RotaryCase{Mode::Bf16, 16, 4, 2, 64},
                                           RotaryCase{Mode::Bf16, 4096, 32, 8, 128}),
                         rotary_name);

// Heads `stride` apart (multi-head latent attention's query tails: rope channels at the end of
// each nope + rope head), forward and backward, as the CPU backend rotates them; the channels
// between the heads keep their bits.
TEST(CudaRotary, StridedHeadsMatchCpu) {
  SKIP_WITHOUT_GPU();
  for (const Mode mode : {Mode::Fp32, Mode::Bf16}) {
    Env e(mode);
    const int64_t N = 12, heads = 4, nope = 16, D = 8, stride = nope + D, W = heads * stride;
    std::vector<int32_t> positions(N);
    for (int64_t n = 0; n < N; ++n) positions[n] = static_cast<int32_t>(n);
    const Vec inv_freq = rope_inverse_frequencies(D, {});
    const RotaryTable gt = make_rotary_table(e.gpu, inv_freq, N, e.act(), MemoryCategory::Workspace);
    const RotaryTable ct = make_rotary_table(e.cpu, inv_freq, N, DType::F32, MemoryCategory::Workspace);
    Tensor gpos = testing::make_tokens(e.gpu, positions), cpos = testing::make_tokens(e.cpu, positions);
    const Vec x = e.round(random_normal(N * W, 39));
    Tensor gx = e.gpu_act(x, {N, W}), cx = e.cpu_t(x, {N, W});
    const Backend::RotaryHeads tails{nope, heads, D, stride};
    e.gpu.rotary_forward(gx, gpos, gt.cos, gt.sin, tails);
    e.cpu.rotary_forward(cx, cpos, ct.cos, ct.sin, tails);
    e.expect_close(gx, cx, kPointwise, "rotary_forward");
    const Vec got = e.host(gx);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < W; ++c)
        if (c % stride < nope) ASSERT_EQ(got[n * W + c], x[n * W + c]) << n << ", " << c;
    e.gpu.rotary_backward(gx, gpos, gt.cos, gt.sin, tails);
    e.cpu.rotary_backward(cx, cpos, ct.cos, ct.sin, tails);
    e.expect_close(gx, cx, kPointwise, "rotary_backward");
  }
}

// A position past the table cannot be refused on the device without the host waiting: the
// kernel writes NaN into that row's rotated heads, and leaves the other rows alone (backend.h).
TEST(CudaRotary, PositionOutsideTheTableGivesNan) {
  SKIP_WITHOUT_GPU();
  Env e(Mode::Fp32);
  const int64_t N = 3, D = 8;
  const RotaryTable t = make_rotary_table(e.gpu, rope_inverse_frequencies(D, {}), 4, DType::F32,
                                          MemoryCategory::Workspace);
  Tensor pos = testing::make_tokens(e.gpu, {0, 4, 3});
  Tensor x = e.gpu_f32(Vec(N * D, 1.0), {N, D});
  e.gpu.rotary_forward(x, pos, t.cos, t.sin, {0, 1, D});
  const Vec got = e.host(x);
  for (int64_t c = 0; c < D; ++c) {
    EXPECT_FALSE(std::isnan(got[c])) << "row 0";
    EXPECT_TRUE(std::isnan(got[D + c])) << "row 1, position 4 of a 4-row table";
    EXPECT_FALSE(std::isnan(got[2 * D + c])) << "row 2";
  }
}

}  // namespace
}  // namespace meshtrain
