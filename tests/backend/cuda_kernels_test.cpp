// Every CUDA backend op against the CPU backend on the same random inputs, in both dtype modes:
//   fp32  all tensors F32 on both backends;
//   bf16  the CUDA backend's mixed precision (activations and parameters BF16; parameter
//         gradients, statistics and optimizer state F32). Inputs are rounded to bf16 first and
//         the CPU backend runs those same values in fp32, so the error measures what the GPU's
//         bf16 storage and fp32-on-bf16 arithmetic add, not input noise.
// Names read Cuda/<Op>.MatchesCpu/<mode>_<sizes>, e.g. Cuda/LayerNorm.MatchesCpu/bf16_N64_C768.
// Without a GPU every test skips with the reason.
//
// Tolerances, max |cuda - cpu| / max |cpu| per output, in one table:
//   class        fp32   bf16   why
//   pointwise    2e-5   1e-2   same formulas, reassociated (the CPU suite's fp32 bound: row
//                              sums run over up to a vocabulary); bf16 stores outputs with
//                              2^-9 relative rounding
//   gemm         1e-4   1e-2   fp32 GEMMs sum in another order (no TF32); bf16 outputs rounded
//   attention    1e-4   3e-2   bf16 rounds the probabilities before P V (and cuDNN's online
//                              softmax rescales in its own order)
//   grad32       1e-5   1e-4   fp32 parameter gradients summed from identical bf16 inputs
//   reduction    1e-9   1e-9   sum/sum_squares accumulate in double

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/cuda/cuda_backend.h"
#include "meshtrain/tensor/bf16.h"
#include "support/random.h"
#include "support/cuda_vs_cpu.h"
#include "support/skip_without_gpu.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using testing::make_tensor;
using testing::make_tokens;
using testing::max_relative_error;
using testing::random_normal;
using testing::to_host;
using Vec = std::vector<double>;

using testing::Env;
using testing::gpu_backend;
using testing::Mode;
using testing::mode_name;
using testing::row_name;
using testing::RowCase;
using testing::Tolerance;
using testing::kPointwise;
using testing::kGemm;
using testing::kAttention;
using testing::kGrad32;
using testing::kReduction;

// ---- elementwise ----------------------------------------------------------------------------

struct SizeCase {
  Mode mode;
  int64_t n;
};
std::string name_of(const ::testing::TestParamInfo<SizeCase>& i) {
  return mode_name(i.param.mode) + "_n" + std::to_string(i.param.n);
}

class Elementwise : public ::testing::TestWithParam<SizeCase> {};

TEST_P(Elementwise, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, n] = GetParam();
  Env e(mode);
  const Vec a = e.round(random_normal(n, 1)), b = e.round(random_normal(n, 2));

  Tensor ga = e.gpu_act(a, {n}), gb = e.gpu_act(b, {n});
  Tensor ca = e.cpu_t(a, {n}), cb = e.cpu_t(b, {n});

  Tensor gout = e.gpu.empty({n}, e.act(), MemoryCategory::Workspace);
  Tensor cout = e.cpu.empty({n}, DType::F32, MemoryCategory::Workspace);
  e.gpu.residual_forward(gout, ga, gb);
  e.cpu.residual_forward(cout, ca, cb);
  e.expect_close(gout, cout, kPointwise, "residual_forward");

  e.gpu.add_inplace(ga, gb);
  e.cpu.add_inplace(ca, cb);
  e.expect_close(ga, ca, kPointwise, "add_inplace");
  e.gpu.scale_inplace(ga, -0.37);
  e.cpu.scale_inplace(ca, -0.37);
  e.expect_close(ga, ca, kPointwise, "scale_inplace");

  Tensor gcopy = e.gpu.empty({n}, e.act(), MemoryCategory::Workspace);
  e.gpu.copy(gcopy, gb);
  EXPECT_EQ(e.host(gcopy), e.host(gb)) << "copy";
  e.gpu.fill(gcopy, 1.5);
  EXPECT_EQ(e.host(gcopy), Vec(n, 1.5)) << "fill";

  // fp32 <-> bf16 casts round exactly like the host helpers (and like the CPU backend).
  const Vec wide = random_normal(n, 3, 10.0);
  Tensor g32 = e.gpu_f32(wide, {n}), g16 = e.gpu.empty({n}, DType::BF16, MemoryCategory::Workspace);
  e.gpu.cast(g16, g32);
  Tensor c32 = e.cpu_t(wide, {n}), c16 = e.cpu.empty({n}, DType::BF16, MemoryCategory::Workspace);
  e.cpu.cast(c16, c32);
  EXPECT_EQ(e.host(g16), e.host(c16)) << "cast fp32 -> bf16 (bitwise)";
  Tensor back = e.gpu.empty({n}, DType::F32, MemoryCategory::Workspace);
  e.gpu.cast(back, g16);
  EXPECT_EQ(e.host(back), e.host(g16)) << "cast bf16 -> fp32 (exact)";

  if (mode == Mode::Bf16) {  // bf16 gradients into an fp32 accumulator
    Tensor acc = e.gpu_f32(a, {n});
    e.gpu.add_inplace(acc, e.gpu_act(b, {n}));
    Tensor cacc = e.cpu_t(a, {n});
    e.cpu.add_inplace(cacc, e.cpu_t(b, {n}));
    e.expect_close(acc, cacc, kGrad32, "add_inplace fp32 += bf16");
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, Elementwise,
                         ::testing::Values(SizeCase{Mode::Fp32, 4099}, SizeCase{Mode::Bf16, 4099},
                                           SizeCase{Mode::Fp32, 1 << 20},
                                           SizeCase{Mode::Bf16, 1 << 20}),
                         name_of);

class Reductions : public ::testing::TestWithParam<SizeCase> {};

TEST_P(Reductions, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, n] = GetParam();
  Env e(mode);
  const Vec x = e.round(random_normal(n, 4));
  Tensor g = e.gpu_act(x, {n});
  Tensor c = e.cpu_t(x, {n});
  const double ss = e.gpu.sum_squares(g), s = e.gpu.sum(g);
  EXPECT_NEAR(ss, e.cpu.sum_squares(c), kReduction(mode) * std::abs(ss));
  EXPECT_NEAR(s, e.cpu.sum(c), kReduction(mode) * ss);
  EXPECT_EQ(e.gpu.sum_squares(g), ss) << "repeatable bit for bit";
}

INSTANTIATE_TEST_SUITE_P(Cuda, Reductions,
                         ::testing::Values(SizeCase{Mode::Fp32, 100003}, SizeCase{Mode::Bf16, 100003},
                                           SizeCase{Mode::Fp32, 7}),
                         name_of);

// ---- embeddings -------------------------------------------------------------------------------

class Embedding : public ::testing::TestWithParam<RowCase> {};

TEST_P(Embedding, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, N, C] = GetParam();
  Env e(mode);
  const int64_t V = 50, begin = 20, local_v = 15;  // this rank's slice: tokens 20..34
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7) % V);
  tokens[3] = tokens[9] = tokens[N - 1] = 25;  // repeated tokens accumulate
  // A frequent token: its ~N/3 rows span several of the backward's chunks of sorted positions.
  if (N > 200)
    for (int64_t i = 0; i < N; i += 3) tokens[i] = 25;
  const Vec wte = e.round(random_normal(local_v * C, 5)), dy = e.round(random_normal(N * C, 6));
  Tensor gt = make_tokens(e.gpu, tokens), ct = make_tokens(e.cpu, tokens);

  Tensor gout = e.gpu.empty({N, C}, e.act(), MemoryCategory::Workspace);
  Tensor cout = e.cpu.empty({N, C}, DType::F32, MemoryCategory::Workspace);
  e.gpu.embedding_forward(gout, gt, e.gpu_act(wte, {local_v, C}), begin);
  e.cpu.embedding_forward(cout, ct, e.cpu_t(wte, {local_v, C}), begin);
  e.expect_close(gout, cout, kPointwise, "embedding_forward");

  const Vec init = random_normal(local_v * C, 7);  // gradients accumulate onto this
  Tensor gd = e.gpu_f32(init, {local_v, C}), cd = e.cpu_t(init, {local_v, C});
  e.gpu.embedding_backward(gd, e.gpu_act(dy, {N, C}), gt, begin);
  e.cpu.embedding_backward(cd, e.cpu_t(dy, {N, C}), ct, begin);
  e.expect_close(gd, cd, kGrad32, "embedding_backward");
  // Deterministic: the same call again adds exactly the same bits.
  Tensor gd2 = e.gpu_f32(init, {local_v, C});
  e.gpu.embedding_backward(gd2, e.gpu_act(dy, {N, C}), gt, begin);
  EXPECT_EQ(e.host(gd2), e.host(gd)) << "embedding_backward is bitwise repeatable";
}

INSTANTIATE_TEST_SUITE_P(Cuda, Embedding,
                         ::testing::Values(RowCase{Mode::Fp32, 23, 70}, RowCase{Mode::Bf16, 23, 70},
                                           RowCase{Mode::Fp32, 512, 768},
                                           RowCase{Mode::Bf16, 512, 768}),
                         row_name);

class Position : public ::testing::TestWithParam<RowCase> {};

TEST_P(Position, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, N, C] = GetParam();
  Env e(mode);
  const int64_t T = 8, token_begin = 12;  // rows are tokens 12.. of a (B, 8) micro-batch
  const Vec wpe = e.round(random_normal(T * C, 8)), x = e.round(random_normal(N * C, 9));
  const Vec dy = e.round(random_normal(N * C, 10));
  Tensor gx = e.gpu_act(x, {N, C}), cx = e.cpu_t(x, {N, C});
  e.gpu.position_forward(gx, e.gpu_act(wpe, {T, C}), token_begin);
  e.cpu.position_forward(cx, e.cpu_t(wpe, {T, C}), token_begin);
  e.expect_close(gx, cx, kPointwise, "position_forward");
  Tensor gd = e.gpu.zeros({T, C}, DType::F32, MemoryCategory::Workspace);
  Tensor cd = e.cpu.zeros({T, C}, DType::F32, MemoryCategory::Workspace);
  e.gpu.position_backward(gd, e.gpu_act(dy, {N, C}), token_begin);
  e.cpu.position_backward(cd, e.cpu_t(dy, {N, C}), token_begin);
  e.expect_close(gd, cd, kGrad32, "position_backward");
}

INSTANTIATE_TEST_SUITE_P(Cuda, Position,
                         ::testing::Values(RowCase{Mode::Fp32, 12, 33}, RowCase{Mode::Bf16, 12, 33},
                                           RowCase{Mode::Fp32, 4096, 768},
                                           RowCase{Mode::Bf16, 4096, 768}),
                         row_name);

// ---- layers -----------------------------------------------------------------------------------

class LayerNorm : public ::testing::TestWithParam<RowCase> {};

TEST_P(LayerNorm, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, N, C] = GetParam();
  Env e(mode);
  const Vec x = e.round(random_normal(N * C, 11, 2.0)), w = e.round(random_normal(C, 12));
  const Vec b = e.round(random_normal(C, 13)), dy = e.round(random_normal(N * C, 14));
  Tensor gx = e.gpu_act(x, {N, C}), gw = e.gpu_act(w, {C}), gb = e.gpu_act(b, {C});
  Tensor cx = e.cpu_t(x, {N, C}), cw = e.cpu_t(w, {C}), cb = e.cpu_t(b, {C});
  Tensor gout = e.gpu.empty({N, C}, e.act(), MemoryCategory::Workspace);
  Tensor gmean = e.gpu.empty({N}, DType::F32, MemoryCategory::Workspace);
  Tensor grstd = e.gpu.empty({N}, DType::F32, MemoryCategory::Workspace);
  Tensor cout = e.cpu.empty({N, C}, DType::F32, MemoryCategory::Workspace);
  Tensor cmean = e.cpu.empty({N}, DType::F32, MemoryCategory::Workspace);
  Tensor crstd = e.cpu.empty({N}, DType::F32, MemoryCategory::Workspace);
  e.gpu.layernorm_forward(gout, gmean, grstd, gx, gw, gb);
  e.cpu.layernorm_forward(cout, cmean, crstd, cx, cw, cb);
  e.expect_close(gout, cout, kPointwise, "out");
  e.expect_close(gmean, cmean, kGrad32, "mean (fp32)");
  e.expect_close(grstd, crstd, kGrad32, "rstd (fp32)");

  const Vec ones(C, 1.0);  // parameter gradients accumulate: start from ones
  Tensor gdx = e.gpu.empty({N, C}, e.act(), MemoryCategory::Workspace);
  Tensor gdw = e.gpu_f32(ones, {C}), gdb = e.gpu_f32(ones, {C});
  Tensor cdx = e.cpu.empty({N, C}, DType::F32, MemoryCategory::Workspace);
  Tensor cdw = e.cpu_t(ones, {C}), cdb = e.cpu_t(ones, {C});
  e.gpu.layernorm_backward(gdx, gdw, gdb, e.gpu_act(dy, {N, C}), gx, gw, gmean, grstd);
  e.cpu.layernorm_backward(cdx, cdw, cdb, e.cpu_t(dy, {N, C}), cx, cw, cmean, crstd);
  e.expect_close(gdx, cdx, kPointwise, "dinp");
  e.expect_close(gdw, cdw, kGrad32, "dweight");
  e.expect_close(gdb, cdb, kGrad32, "dbias");
}

INSTANTIATE_TEST_SUITE_P(Cuda, LayerNorm,
                         ::testing::Values(RowCase{Mode::Fp32, 37, 96}, RowCase{Mode::Bf16, 37, 96},
                                           RowCase{Mode::Bf16, 37, 100},  // rows not whole packs
                                           RowCase{Mode::Fp32, 64, 768},
                                           RowCase{Mode::Bf16, 64, 768},
                                           RowCase{Mode::Bf16, 2048, 1600}),
                         row_name);

struct MatmulCase {
  Mode mode;
  int64_t N, C, OC;
  bool bias;
};
std::string matmul_name(const ::testing::TestParamInfo<MatmulCase>& i) {
  const auto& p = i.param;
  return mode_name(p.mode) + "_N" + std::to_string(p.N) + "_C" + std::to_string(p.C) + "_OC" +
         std::to_string(p.OC) + (p.bias ? "_bias" : "");
}

class Matmul : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(Matmul, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, N, C, OC, with_bias] = GetParam();
  Env e(mode);
  const Vec x = e.round(random_normal(N * C, 15)), w = e.round(random_normal(OC * C, 16, 0.1));
  const Vec b = e.round(random_normal(OC, 17)), dy = e.round(random_normal(N * OC, 18));
  Tensor gx = e.gpu_act(x, {N, C}), gw = e.gpu_act(w, {OC, C}), gb = e.gpu_act(b, {OC});
  Tensor cx = e.cpu_t(x, {N, C}), cw = e.cpu_t(w, {OC, C}), cb = e.cpu_t(b, {OC});
  Tensor gout = e.gpu.empty({N, OC}, e.act(), MemoryCategory::Workspace);
  Tensor cout = e.cpu.empty({N, OC}, DType::F32, MemoryCategory::Workspace);
  e.gpu.matmul_forward(gout, gx, gw, with_bias ? &gb : nullptr);
  e.cpu.matmul_forward(cout, cx, cw, with_bias ? &cb : nullptr);
  e.expect_close(gout, cout, kGemm, "out");

  const Vec ones_w(OC * C, 1.0), ones_b(OC, 1.0);
  Tensor gdx = e.gpu.empty({N, C}, e.act(), MemoryCategory::Workspace);
  Tensor gdw = e.gpu_f32(ones_w, {OC, C}), gdb = e.gpu_f32(ones_b, {OC});
  Tensor cdx = e.cpu.empty({N, C}, DType::F32, MemoryCategory::Workspace);
  Tensor cdw = e.cpu_t(ones_w, {OC, C}), cdb = e.cpu_t(ones_b, {OC});
  e.gpu.matmul_backward(&gdx, &gdw, with_bias ? &gdb : nullptr, e.gpu_act(dy, {N, OC}), gx, gw);
  e.cpu.matmul_backward(&cdx, &cdw, with_bias ? &cdb : nullptr, e.cpu_t(dy, {N, OC}), cx, cw);
  e.expect_close(gdx, cdx, kGemm, "dinp");
  // dweight: fp32 accumulation of bf16 products, checked at GEMM tolerance in fp32 mode.
  e.expect_close(gdw, cdw, mode == Mode::Fp32 ? kGemm : kGrad32, "dweight (accumulated)");
  if (with_bias) e.expect_close(gdb, cdb, kGrad32, "dbias (accumulated)");

  // Without dinp (the first layer of a stage): only dweight accumulates again.
  e.gpu.matmul_backward(nullptr, &gdw, nullptr, e.gpu_act(dy, {N, OC}), gx, gw);
  e.cpu.matmul_backward(nullptr, &cdw, nullptr, e.cpu_t(dy, {N, OC}), cx, cw);
  e.expect_close(gdw, cdw, mode == Mode::Fp32 ? kGemm : kGrad32, "dweight (twice)");
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, Matmul,
    ::testing::Values(MatmulCase{Mode::Fp32, 33, 48, 72, true}, MatmulCase{Mode::Bf16, 33, 48, 72, true},
                      MatmulCase{Mode::Fp32, 33, 50, 70, false},  // leading dimensions not x8
                      MatmulCase{Mode::Bf16, 33, 50, 70, false},
                      MatmulCase{Mode::Fp32, 256, 768, 2304, true},
                      MatmulCase{Mode::Bf16, 256, 768, 2304, true}),
    matmul_name);

// The MLP's GELU inside cuBLASLt's epilogues (GELU_AUX_BIAS forward, DGELU backward), against
// the CPU backend and against the same GPU's unfused path. Where the epilogue must be offered
// (bf16, 16-byte rows) the fused path has to have run, else the benchmark would measure the
// fallback while claiming the fusion.
struct GeluEpilogueCase {
  Mode mode;
  int64_t N, C, OC;
  bool must_fuse;
};
std::string gelu_epilogue_name(const ::testing::TestParamInfo<GeluEpilogueCase>& i) {
  const auto& p = i.param;
  return mode_name(p.mode) + "_N" + std::to_string(p.N) + "_C" + std::to_string(p.C) + "_OC" +
         std::to_string(p.OC);
}

class MatmulGelu : public ::testing::TestWithParam<GeluEpilogueCase> {};

TEST_P(MatmulGelu, MatchesCpuFusedAndUnfused) {
  SKIP_WITHOUT_GPU();
  const auto [mode, N, C, OC, must_fuse] = GetParam();
  Env e(mode);
  Vec x = e.round(random_normal(N * C, 61)), w = e.round(random_normal(OC * C, 62, 0.1));
  const Vec b = e.round(random_normal(OC, 63)), dy = e.round(random_normal(N * OC, 64));
  Tensor gx = e.gpu_act(x, {N, C}), gw = e.gpu_act(w, {OC, C}), gb = e.gpu_act(b, {OC});
  Tensor cx = e.cpu_t(x, {N, C}), cw = e.cpu_t(w, {OC, C}), cb = e.cpu_t(b, {OC});
  Tensor cpre = e.cpu.empty({N, OC}, DType::F32, MemoryCategory::Workspace);
  Tensor cout = e.cpu.empty({N, OC}, DType::F32, MemoryCategory::Workspace);
  e.cpu.matmul_gelu_forward(cout, cpre, cx, cw, cb);
  // The backward multiplies by the second weight (OC -> C) as the MLP's projection does.
  Tensor cdpre = e.cpu.empty({N, OC}, DType::F32, MemoryCategory::Workspace);
  const Vec w2 = e.round(random_normal(C * OC, 65, 0.1));
  Tensor cw2 = e.cpu_t(w2, {C, OC}), gw2 = e.gpu_act(w2, {C, OC});
  const Vec dz = e.round(random_normal(N * C, 66));
  e.cpu.matmul_gelu_backward(cdpre, e.cpu_t(dz, {N, C}), cw2, cpre);

  Vec fused[3], unfused[3];
  for (bool fuse : {true, false}) {
    e.gpu.set_fused_epilogues(fuse);
    const int64_t before = e.gpu.gelu_epilogues().fused;
    Tensor gpre = e.gpu.empty({N, OC}, e.act(), MemoryCategory::Workspace);
    Tensor gout = e.gpu.empty({N, OC}, e.act(), MemoryCategory::Workspace);
    e.gpu.fill(gpre, std::nan(""));  // every element must be written
    e.gpu.fill(gout, std::nan(""));
    e.gpu.matmul_gelu_forward(gout, gpre, gx, gw, gb);
    Tensor gdpre = e.gpu.empty({N, OC}, e.act(), MemoryCategory::Workspace);
    e.gpu.fill(gdpre, std::nan(""));
    e.gpu.matmul_gelu_backward(gdpre, e.gpu_act(dz, {N, C}), gw2, gpre);
    const int64_t fused_calls = e.gpu.gelu_epilogues().fused - before;
    if (fuse && must_fuse) {
      EXPECT_EQ(fused_calls, 2) << "cuBLASLt refused a GELU epilogue";
    } else if (!fuse) {
      EXPECT_EQ(fused_calls, 0);
    }
    SCOPED_TRACE(fuse ? "fused" : "unfused");
    e.expect_close(gpre, cpre, kGemm, "pre-activation");
    e.expect_close(gout, cout, kGemm, "gelu(pre-activation)");
    e.expect_close(gdpre, cdpre, kGemm, "gradient of the pre-activation");
    Vec* keep = fuse ? fused : unfused;
    keep[0] = e.host(gpre);
    keep[1] = e.host(gout);
    keep[2] = e.host(gdpre);
    for (int i = 0; i < 3; ++i)  // max_relative_error does not see NaN: count the unwritten
      EXPECT_EQ(std::count_if(keep[i].begin(), keep[i].end(), [](double v) { return std::isnan(v); }), 0)
          << "output " << i;
  }
  e.gpu.set_fused_epilogues(true);
  for (int i = 0; i < 3; ++i)
    EXPECT_LT(max_relative_error(fused[i], unfused[i]), kGemm(mode)) << "output " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, MatmulGelu,
    ::testing::Values(GeluEpilogueCase{Mode::Bf16, 256, 768, 3072, true},
                      GeluEpilogueCase{Mode::Bf16, 33, 48, 72, true},
                      GeluEpilogueCase{Mode::Bf16, 33, 50, 70, false},  // rows not 16-byte packs
                      GeluEpilogueCase{Mode::Fp32, 256, 768, 3072, false},
                      GeluEpilogueCase{Mode::Fp32, 33, 50, 70, false}),
    gelu_epilogue_name);

// Which GELU cuBLASLt's epilogues compute: each output against the tanh approximation (the
// model's) and the exact erf form, applied to the pre-activation the epilogue wrote; printed,
// and in fp32 (where the difference between the two forms is far above rounding) checked.
TEST(MatmulGeluEpilogue, ComputesTheTanhApproximation) {
  SKIP_WITHOUT_GPU();
  const int64_t N = 256, C = 768, OC = 3072;
  for (Mode mode : {Mode::Fp32, Mode::Bf16}) {
    Env e(mode);
    const Vec x = e.round(random_normal(N * C, 71)), w = e.round(random_normal(OC * C, 72, 0.05));
    const Vec b = e.round(random_normal(OC, 73)), w2 = e.round(random_normal(C * OC, 74, 0.1));
    const Vec dz = e.round(random_normal(N * C, 75));
    e.gpu.set_fused_epilogues(true);
    const int64_t before = e.gpu.gelu_epilogues().fused;
    Tensor gpre = e.gpu.empty({N, OC}, e.act(), MemoryCategory::Workspace);
    Tensor gout = e.gpu.empty({N, OC}, e.act(), MemoryCategory::Workspace);
    Tensor gdpre = e.gpu.empty({N, OC}, e.act(), MemoryCategory::Workspace);
    Tensor gx = e.gpu_act(x, {N, C}), gw = e.gpu_act(w, {OC, C}), gb = e.gpu_act(b, {OC});
    Tensor gw2 = e.gpu_act(w2, {C, OC}), gdz = e.gpu_act(dz, {N, C});
    e.gpu.matmul_gelu_forward(gout, gpre, gx, gw, gb);
    e.gpu.matmul_gelu_backward(gdpre, gdz, gw2, gpre);
    const int64_t fused = e.gpu.gelu_epilogues().fused - before;
    // The product the backward multiplies by gelu'(pre), in fp32 on the CPU.
    Tensor cprod = e.cpu.empty({N, OC}, DType::F32, MemoryCategory::Workspace);
    Tensor cpre_shape = e.cpu.empty({N, OC}, DType::F32, MemoryCategory::Workspace);
    e.cpu.matmul_backward(&cprod, nullptr, nullptr, e.cpu_t(dz, {N, C}), cpre_shape,
                          e.cpu_t(w2, {C, OC}));
    const Vec pre = e.host(gpre), out = e.host(gout), dpre = e.host(gdpre), prod = e.host(cprod);
    const double k = std::sqrt(2.0 / M_PI);
    auto tanh_gelu = [&](double v) { return 0.5 * v * (1 + std::tanh(k * (v + 0.044715 * v * v * v))); };
    auto erf_gelu = [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); };
    auto slope = [](auto f, double v) { return (f(v + 1e-4) - f(v - 1e-4)) / 2e-4; };
    double ft = 0, fe = 0, bt = 0, be = 0, mean_t = 0, mean_e = 0;
    for (size_t i = 0; i < pre.size(); ++i) {
      ft = std::max(ft, std::abs(out[i] - tanh_gelu(pre[i])));
      fe = std::max(fe, std::abs(out[i] - erf_gelu(pre[i])));
      mean_t += (out[i] - tanh_gelu(pre[i])) / pre.size();
      mean_e += (out[i] - erf_gelu(pre[i])) / pre.size();
      bt = std::max(bt, std::abs(dpre[i] - prod[i] * slope(tanh_gelu, pre[i])) / (1 + std::abs(prod[i])));
      be = std::max(be, std::abs(dpre[i] - prod[i] * slope(erf_gelu, pre[i])) / (1 + std::abs(prod[i])));
    }
    std::printf("GELU epilogue, %s: %s; forward max |out - gelu| tanh %.2e erf %.2e (mean %.2e, "
                "%.2e); backward max |dpre - prod gelu'| / (1 + |prod|) tanh %.2e erf %.2e\n",
                mode_name(mode).c_str(), fused == 2 ? "fused" : "unfused (fallback)", ft, fe,
                mean_t, mean_e, bt, be);
    if (mode == Mode::Fp32) {
      EXPECT_LT(ft, 1e-5) << "the forward is not the tanh approximation";
      EXPECT_LT(bt, 1e-4) << "the backward is not the tanh approximation's slope";
    }
  }
}

class Bias : public ::testing::TestWithParam<RowCase> {};

TEST_P(Bias, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, N, C] = GetParam();
  Env e(mode);
  const Vec x = e.round(random_normal(N * C, 19)), b = e.round(random_normal(C, 20));
  const Vec dy = e.round(random_normal(N * C, 21));
  Tensor gx = e.gpu_act(x, {N, C}), cx = e.cpu_t(x, {N, C});
  e.gpu.bias_forward(gx, e.gpu_act(b, {C}));
  e.cpu.bias_forward(cx, e.cpu_t(b, {C}));
  e.expect_close(gx, cx, kPointwise, "bias_forward");
  const Vec init = random_normal(C, 22);
  Tensor gdb = e.gpu_f32(init, {C}), cdb = e.cpu_t(init, {C});
  e.gpu.bias_backward(gdb, e.gpu_act(dy, {N, C}));
  e.cpu.bias_backward(cdb, e.cpu_t(dy, {N, C}));
  e.expect_close(gdb, cdb, kGrad32, "bias_backward");
}

INSTANTIATE_TEST_SUITE_P(Cuda, Bias,
                         ::testing::Values(RowCase{Mode::Fp32, 19, 300}, RowCase{Mode::Bf16, 19, 300},
                                           RowCase{Mode::Fp32, 8192, 768},
                                           RowCase{Mode::Bf16, 8192, 768}),
                         row_name);

class Gelu : public ::testing::TestWithParam<SizeCase> {};

TEST_P(Gelu, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, n] = GetParam();
  Env e(mode);
  Vec x = random_normal(n, 23, 3.0);
  x[0] = 0.0;
  x[1] = 12.0;  // saturated tanh
  x[2] = -12.0;
  x = e.round(x);
  const Vec dy = e.round(random_normal(n, 24));
  Tensor gout = e.gpu.empty({n}, e.act(), MemoryCategory::Workspace);
  Tensor cout = e.cpu.empty({n}, DType::F32, MemoryCategory::Workspace);
  e.gpu.gelu_forward(gout, e.gpu_act(x, {n}));
  e.cpu.gelu_forward(cout, e.cpu_t(x, {n}));
  e.expect_close(gout, cout, kPointwise, "gelu_forward");
  Tensor gdx = e.gpu.empty({n}, e.act(), MemoryCategory::Workspace);
  Tensor cdx = e.cpu.empty({n}, DType::F32, MemoryCategory::Workspace);
  e.gpu.gelu_backward(gdx, e.gpu_act(x, {n}), e.gpu_act(dy, {n}));
  e.cpu.gelu_backward(cdx, e.cpu_t(x, {n}), e.cpu_t(dy, {n}));
  e.expect_close(gdx, cdx, kPointwise, "gelu_backward");
}

INSTANTIATE_TEST_SUITE_P(Cuda, Gelu,
                         ::testing::Values(SizeCase{Mode::Fp32, 4099}, SizeCase{Mode::Bf16, 4099}),
                         name_of);

// ---- attention --------------------------------------------------------------------------------

struct AttentionCase {
  Mode mode;
  AttentionImpl impl;
  int64_t B, T, NH, KVH, HS;  // KVH < NH: grouped-query attention
  int64_t HV = 0;             // value heads of their own size (multi-head latent attention)
  double scale = 0.0;         // an explicit softmax scale
  AttentionDims dims() const { return {NH, KVH, HS, HV, scale}; }
};
std::string attention_name(const ::testing::TestParamInfo<AttentionCase>& i) {
  const auto& p = i.param;
  return mode_name(p.mode) + "_" + std::string(attention_impl_name(p.impl)) + "_B" +
         std::to_string(p.B) + "_T" + std::to_string(p.T) + "_NH" + std::to_string(p.NH) +
         "_KVH" + std::to_string(p.KVH) + "_HS" + std::to_string(p.HS) +
         (p.HV ? "_HV" + std::to_string(p.HV) : "") + (p.scale != 0.0 ? "_scaled" : "");
}

class Attention : public ::testing::TestWithParam<AttentionCase> {};

// The CPU backend's attention (itself checked against a double reference, grouped-query heads
// included, in gqa_attention_test.cpp) is the reference for both CUDA paths.
TEST_P(Attention, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const AttentionCase& c = GetParam();
  const auto [mode, impl, B, T, NH, KVH, HS, HV_, scale] = c;
  const AttentionDims dims = c.dims();
  Env e(mode, impl);
  // A rejected cuDNN graph skips only where cuDNN is not promised to work; on sm_80/sm_90 with
  // cuDNN 9 it fails (backend/attention_support.h), forced or under Auto alike.
  std::string why;
  if (impl != AttentionImpl::Own && mode == Mode::Bf16 &&
      e.gpu.attention_impl_for(e.act(), B, T, dims, &why) != AttentionImpl::Cudnn) {
    const RejectedAttention r = judge_rejected_attention(e.gpu.cudnn_platform(), e.act(), B, T,
                                                         NH, HS, why, HV_, scale);
    if (r.is_error) FAIL() << r.message;
    if (impl == AttentionImpl::Cudnn) GTEST_SKIP() << r.message;
  }
  const int64_t HV = dims.value_size(), C = NH * HV, W = (NH + KVH) * HS + KVH * HV;
  const Vec qkv = e.round(random_normal(B * T * W, 25)), dout = e.round(random_normal(B * T * C, 26));
  Tensor gqkv = e.gpu_act(qkv, {B * T, W}), cqkv = e.cpu_t(qkv, {B * T, W});
  Tensor gout = e.gpu.empty({B * T, C}, e.act(), MemoryCategory::Workspace);
  Tensor cout = e.cpu.empty({B * T, C}, DType::F32, MemoryCategory::Workspace);
  // Each backend keeps its own stash (the CPU only the row log-sum-exp): out and dqkv compare.
  const Backend::AttentionStash gs = e.gpu.attention_stash(B, T, NH, e.act());
  const Backend::AttentionStash cs = e.cpu.attention_stash(B, T, NH, DType::F32);
  Tensor gstash = e.gpu.empty(gs.shape, gs.dtype, MemoryCategory::Workspace);
  Tensor cstash = e.cpu.empty(cs.shape, cs.dtype, MemoryCategory::Workspace);
  e.gpu.attention_forward(gout, gstash, gqkv, B, T, dims);
  e.cpu.attention_forward(cout, cstash, cqkv, B, T, dims);
  e.expect_close(gout, cout, kAttention, "out");

  Tensor gd = e.gpu.empty({B * T, W}, e.act(), MemoryCategory::Workspace);
  Tensor cd = e.cpu.empty({B * T, W}, DType::F32, MemoryCategory::Workspace);
  e.gpu.attention_backward(gd, e.gpu_act(dout, {B * T, C}), gqkv, gout, gstash, B, T, dims);
  e.cpu.attention_backward(cd, e.cpu_t(dout, {B * T, C}), cqkv, cout, cstash, B, T, dims);
  e.expect_close(gd, cd, kAttention, "dqkv");
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, Attention,
    ::testing::Values(AttentionCase{Mode::Fp32, AttentionImpl::Own, 2, 7, 3, 3, 4},
                      AttentionCase{Mode::Fp32, AttentionImpl::Own, 1, 150, 2, 2, 16},
                      AttentionCase{Mode::Bf16, AttentionImpl::Own, 2, 7, 3, 3, 4},
                      AttentionCase{Mode::Bf16, AttentionImpl::Own, 1, 150, 2, 2, 16},
                      AttentionCase{Mode::Bf16, AttentionImpl::Own, 2, 128, 4, 4, 64},
                      AttentionCase{Mode::Bf16, AttentionImpl::Cudnn, 2, 128, 4, 4, 64},
                      AttentionCase{Mode::Bf16, AttentionImpl::Cudnn, 1, 1024, 12, 12, 64},
                      AttentionCase{Mode::Bf16, AttentionImpl::Cudnn, 2, 150, 2, 2, 32},
                      AttentionCase{Mode::Bf16, AttentionImpl::Auto, 2, 128, 4, 4, 64},
                      // grouped-query heads (KVH < NH), multi-query (KVH 1) included
                      AttentionCase{Mode::Fp32, AttentionImpl::Own, 2, 7, 4, 2, 4},
                      AttentionCase{Mode::Fp32, AttentionImpl::Own, 1, 150, 4, 1, 16},
                      AttentionCase{Mode::Bf16, AttentionImpl::Own, 2, 7, 4, 2, 4},
                      AttentionCase{Mode::Bf16, AttentionImpl::Own, 2, 128, 8, 2, 64},
                      AttentionCase{Mode::Bf16, AttentionImpl::Cudnn, 2, 128, 4, 2, 64},
                      AttentionCase{Mode::Bf16, AttentionImpl::Cudnn, 1, 1024, 12, 4, 64},
                      AttentionCase{Mode::Bf16, AttentionImpl::Cudnn, 2, 128, 8, 1, 64},
                      // value heads of their own size and an explicit scale (multi-head latent
                      // attention: HS 192, HV 128): the own kernels, also under Auto
                      AttentionCase{Mode::Fp32, AttentionImpl::Own, 2, 7, 4, 2, 12, 8, 0.3},
                      AttentionCase{Mode::Fp32, AttentionImpl::Own, 1, 150, 2, 2, 16, 24, 0.2},
                      AttentionCase{Mode::Bf16, AttentionImpl::Own, 2, 7, 4, 4, 12, 8, 0.3},
                      AttentionCase{Mode::Bf16, AttentionImpl::Auto, 2, 256, 4, 4, 192, 128, 0.1},
                      AttentionCase{Mode::Bf16, AttentionImpl::Auto, 2, 128, 4, 4, 64, 0, 0.1}),
    attention_name);

// Multi-head latent attention's packed row on the GPU (Backend's default through copy_columns,
// cast and add_inplace) has the CPU kernel's bits: copies, and the rope key's head-ordered sum
// in fp32 rounded once.
TEST(CudaMlaPack, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const Mode mode : {Mode::Fp32, Mode::Bf16}) {
    Env e(mode, AttentionImpl::Auto);
    const MlaHeads m{4, 6, 4, 5};
    const int64_t N = 9, Dq = m.nope + m.rope, Dkv = m.nope + m.value;
    const int64_t W = 2 * m.heads * Dq + m.heads * m.value;
    const Vec q = e.round(random_normal(N * m.heads * Dq, 27));
    const Vec kv = e.round(random_normal(N * m.heads * Dkv, 28));
    const Vec pe = e.round(random_normal(N * m.rope, 29)), dqkv = e.round(random_normal(N * W, 30));
    const DType a = e.act();
    auto run = [&](Backend& be) {
      auto in = [&](const Vec& v, Shape s) { return make_tensor(be, v, s, a); };
      Tensor qkv = be.empty({N, W}, a, MemoryCategory::Workspace);
      be.mla_pack(qkv, in(q, {N, m.heads * Dq}), in(kv, {N, m.heads * Dkv}), in(pe, {N, m.rope}),
                  m);
      Tensor dq = be.empty({N, m.heads * Dq}, a, MemoryCategory::Workspace);
      Tensor dkv = be.empty({N, m.heads * Dkv}, a, MemoryCategory::Workspace);
      Tensor dpe = be.empty({N, m.rope}, a, MemoryCategory::Workspace);
      be.mla_unpack(dq, dkv, dpe, in(dqkv, {N, W}), m);
      return std::vector<Vec>{to_host(be, qkv), to_host(be, dq), to_host(be, dkv),
                              to_host(be, dpe)};
    };
    EXPECT_EQ(run(e.gpu), run(e.cpu)) << mode_name(mode);
  }
}

// ---- cross-entropy ------------------------------------------------------------------------------

struct VocabCase {
  Mode mode;
  int64_t N, V;
};
std::string vocab_name(const ::testing::TestParamInfo<VocabCase>& i) {
  return mode_name(i.param.mode) + "_N" + std::to_string(i.param.N) + "_V" +
         std::to_string(i.param.V);
}

class CrossEntropy : public ::testing::TestWithParam<VocabCase> {};

// Two "ranks" of a split vocabulary, combined the way the LM head combines them across the
// tensor group, on each backend.
TEST_P(CrossEntropy, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, N, V] = GetParam();
  Env e(mode);
  const int64_t half = V / 2;
  const Vec logits = e.round(random_normal(N * V, 27, 4.0));
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 13) % V);
  const double dloss = 1.0 / 7.0;
  auto run = [&](Backend& be, DType act) {
    Tensor tt = make_tokens(be, targets);
    std::vector<Tensor> part(2), mx(2), se(2), tl(2);
    for (int r = 0; r < 2; ++r) {
      Vec slice(N * half);
      for (int64_t i = 0; i < N; ++i)
        for (int64_t j = 0; j < half; ++j) slice[i * half + j] = logits[i * V + r * half + j];
      part[r] = make_tensor(be, slice, {N, half}, act);
      mx[r] = be.empty({N}, DType::F32, MemoryCategory::Workspace);
      se[r] = be.empty({N}, DType::F32, MemoryCategory::Workspace);
      tl[r] = be.empty({N}, DType::F32, MemoryCategory::Workspace);
      be.crossentropy_stats(mx[r], se[r], part[r]);
      be.crossentropy_target_logit(tl[r], part[r], tt, r * half);
    }
    const Vec m0 = to_host(be, mx[0]), m1 = to_host(be, mx[1]);
    Vec gmax(N);
    for (int64_t i = 0; i < N; ++i) gmax[i] = std::max(m0[i], m1[i]);
    Tensor tg = make_tensor(be, gmax, {N}, DType::F32);
    be.crossentropy_rebase(se[0], mx[0], tg);
    be.crossentropy_rebase(se[1], mx[1], tg);
    const Vec s0 = to_host(be, se[0]), s1 = to_host(be, se[1]);
    const Vec t0 = to_host(be, tl[0]), t1 = to_host(be, tl[1]);
    Vec sum(N), target(N);
    for (int64_t i = 0; i < N; ++i) {
      sum[i] = s0[i] + s1[i];
      target[i] = t0[i] + t1[i];
    }
    Tensor tsum = make_tensor(be, sum, {N}, DType::F32);
    Tensor losses = be.empty({N}, DType::F32, MemoryCategory::Workspace);
    be.crossentropy_losses(losses, tg, tsum, make_tensor(be, target, {N}, DType::F32));
    Vec out = to_host(be, losses);
    for (int r = 0; r < 2; ++r) {
      be.crossentropy_backward(part[r], part[r], tg, tsum, tt, r * half, dloss);  // in place
      const Vec d = to_host(be, part[r]);
      out.insert(out.end(), d.begin(), d.end());
    }
    return out;  // losses, then both halves of dlogits
  };
  const Vec got = run(e.gpu, e.act()), want = run(e.cpu, DType::F32);
  const Vec got_losses(got.begin(), got.begin() + N), want_losses(want.begin(), want.begin() + N);
  EXPECT_LT(max_relative_error(got_losses, want_losses), kGrad32(mode)) << "losses (fp32)";
  const Vec got_d(got.begin() + N, got.end()), want_d(want.begin() + N, want.end());
  EXPECT_LT(max_relative_error(got_d, want_d), kPointwise(mode)) << "dlogits";
}

INSTANTIATE_TEST_SUITE_P(Cuda, CrossEntropy,
                         ::testing::Values(VocabCase{Mode::Fp32, 9, 40}, VocabCase{Mode::Bf16, 9, 40},
                                           VocabCase{Mode::Bf16, 9, 43},  // rows not whole packs
                                           VocabCase{Mode::Fp32, 64, 50304},
                                           VocabCase{Mode::Bf16, 64, 50304}),
                         vocab_name);

// ---- optimizer ----------------------------------------------------------------------------------

// AdamW runs on fp32 master state in both modes, so there is one mode to test.
class AdamW : public ::testing::TestWithParam<SizeCase> {};

TEST_P(AdamW, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, n] = GetParam();
  Env e(mode);
  const Vec p0 = random_normal(n, 28), g1 = random_normal(n, 29), g2 = random_normal(n, 30);
  Tensor gp = e.gpu_f32(p0, {n}), gm = e.gpu.zeros({n}, DType::F32, MemoryCategory::Workspace);
  Tensor gv = e.gpu.zeros({n}, DType::F32, MemoryCategory::Workspace);
  Tensor cp = e.cpu_t(p0, {n}), cm = e.cpu.zeros({n}, DType::F32, MemoryCategory::Workspace);
  Tensor cv = e.cpu.zeros({n}, DType::F32, MemoryCategory::Workspace);
  for (int step = 1; step <= 2; ++step) {
    const Backend::AdamWStep s{1e-2, 0.9, 0.95, 1e-8, 0.1, step, 0.5};
    e.gpu.adamw_update(gp, e.gpu_f32(step == 1 ? g1 : g2, {n}), gm, gv, s);
    e.cpu.adamw_update(cp, e.cpu_t(step == 1 ? g1 : g2, {n}), cm, cv, s);
  }
  e.expect_close(gp, cp, kPointwise, "param");
  e.expect_close(gm, cm, kPointwise, "exp_avg");
  e.expect_close(gv, cv, kPointwise, "exp_avg_sq");
}

INSTANTIATE_TEST_SUITE_P(Cuda, AdamW, ::testing::Values(SizeCase{Mode::Fp32, 100001}), name_of);

// ---- contracts ----------------------------------------------------------------------------------

TEST(CudaBackend, RefusesUnsupportedDtypesByName) {
  SKIP_WITHOUT_GPU();
  CudaBackend& be = *gpu_backend();
  Tensor d = be.empty({4}, DType::F64, MemoryCategory::Workspace);
  try {
    be.scale_inplace(d, 2.0);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& ex) {
    EXPECT_STREQ(ex.what(), "backend 'cuda' does not support scale_inplace for dtype fp64");
  }
  // bf16 parameter gradients are refused, naming the rule.
  Tensor x = be.empty({8, 16}, DType::BF16, MemoryCategory::Workspace);
  Tensor w = be.empty({4, 16}, DType::BF16, MemoryCategory::Workspace);
  Tensor dy = be.empty({8, 4}, DType::BF16, MemoryCategory::Workspace);
  Tensor dw16 = be.empty({4, 16}, DType::BF16, MemoryCategory::Workspace);
  try {
    be.matmul_backward(nullptr, &dw16, nullptr, dy, x, w);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& ex) {
    EXPECT_STREQ(ex.what(),
                 "backend 'cuda' does not support matmul_backward for dtype bf16: dweight is bf16, "
                 "expected fp32 (parameter gradients are fp32)");
  }
}

TEST(CudaBackend, ReportsAGemmCeiling) {
  SKIP_WITHOUT_GPU();
  const double tflops = gpu_backend()->measure_bf16_gemm_peak_tflops(2048, 2048, 2048, 3);
  EXPECT_GT(tflops, 1.0);
  std::printf("bf16 GEMM 2048^3: %.1f TFLOP/s\n", tflops);
}

}  // namespace
}  // namespace meshtrain
