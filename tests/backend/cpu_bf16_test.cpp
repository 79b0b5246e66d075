// The CPU backend's bf16 mixed precision, kernel by kernel, against the naive fp64 reference
// (tests/support/reference_kernels.h), with the dtypes of backend.h: bf16 parameters and
// activations; fp32 parameter gradients, LayerNorm mean/rstd, cross-entropy statistics and
// losses, master weights and moments. Inputs are rounded to bf16 before the reference sees them,
// so each tolerance measures the kernel's own error, relative to the reference's largest
// magnitude. One table:
//  - fp32 results (parameter gradients, statistics, losses): fp32 sums of exact bf16 products
//    over at most a few hundred terms, 2e-5, as the fp32 kernels (cpu_kernels_test.cpp);
//  - bf16 results rounded once from fp32: bf16 keeps 8 significant bits, so rounding to nearest
//    costs at most 2^-8 = 3.9e-3 of the value (just above a power of two); 4e-3 adds the fp32
//    error (~1e-6);
//  - attention: the probabilities (and in backward dS) are rounded to bf16 before the next
//    GEMM, and that error is summed over up to T keys before the output is rounded once more:
//    measured 2-3e-3 (relative to the largest value, as everywhere here); held to 1e-2.
// Then what bf16 adds to the interface: mixed-dtype adds, rounding to nearest even inside the
// kernels, AdamW on fp32 master weights with a bf16 copy, and refusals of wrong dtypes by name.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/tensor/bf16.h"
#include "support/random.h"
#include "support/reference_kernels.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using testing::make_tensor;
using testing::make_tokens;
using testing::max_relative_error;
using testing::random_normal;
using testing::to_host;
using Vec = std::vector<double>;

constexpr double kFp32 = 2e-5;       // fp32 results of bf16 inputs
constexpr double kRounded = 4e-3;    // bf16 results, rounded once
constexpr double kAttention = 1e-2;  // bf16 results of bf16 intermediates

constexpr DType kBf16 = DType::BF16, kF32 = DType::F32;

// The values bf16 can hold nearest to v's (round to nearest even).
Vec in_bf16(Vec v) {
  for (double& x : v) x = bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(x)));
  return v;
}

class CpuBf16 : public ::testing::Test {
 protected:
  CpuBackend be{2};
  Tensor B(const Vec& v, Shape s) { return make_tensor(be, v, s, kBf16); }
  Tensor F(const Vec& v, Shape s) { return make_tensor(be, v, s, kF32); }
  Tensor empty(Shape s, DType t) { return be.empty(s, t, MemoryCategory::Workspace); }
  Tensor zeros(Shape s, DType t) { return be.zeros(s, t, MemoryCategory::Workspace); }
  Vec H(const Tensor& t) { return to_host(be, t); }
};

TEST_F(CpuBf16, LayerNorm) {
  const int64_t N = 37, C = 96;
  const Vec x = in_bf16(random_normal(N * C, 1, 2.0)), w = in_bf16(random_normal(C, 2));
  const Vec b = in_bf16(random_normal(C, 3)), dy = in_bf16(random_normal(N * C, 4));
  Vec out, mean, rstd, dx, dw(C, 0.0), db(C, 0.0);
  reference::layernorm_forward(out, mean, rstd, x, w, b, N, C);
  reference::layernorm_backward(dx, dw, db, dy, x, w, N, C);

  Tensor tx = B(x, {N, C}), tw = B(w, {C}), tout = empty({N, C}, kBf16);
  Tensor tmean = empty({N}, kF32), trstd = empty({N}, kF32);
  be.layernorm_forward(tout, tmean, trstd, tx, tw, B(b, {C}));
  EXPECT_LT(max_relative_error(H(tout), out), kRounded);
  EXPECT_LT(max_relative_error(H(tmean), mean), kFp32);
  EXPECT_LT(max_relative_error(H(trstd), rstd), kFp32);

  Tensor tdx = empty({N, C}, kBf16), tdw = zeros({C}, kF32), tdb = zeros({C}, kF32);
  be.layernorm_backward(tdx, tdw, tdb, B(dy, {N, C}), tx, tw, tmean, trstd);
  EXPECT_LT(max_relative_error(H(tdx), dx), kRounded);
  EXPECT_LT(max_relative_error(H(tdw), dw), kFp32);
  EXPECT_LT(max_relative_error(H(tdb), db), kFp32);
}

TEST_F(CpuBf16, MatmulForwardBackwardAccumulatesInFp32) {
  if (!cpu_runs_bf16()) GTEST_SKIP() << "oneDNN has no bf16 GEMM under this ISA (AVX2)";
  const int64_t N = 33, C = 48, OC = 72;
  const Vec x = in_bf16(random_normal(N * C, 5)), w = in_bf16(random_normal(OC * C, 6));
  const Vec b = in_bf16(random_normal(OC, 7)), dy = in_bf16(random_normal(N * OC, 8));
  Vec out, dx, dw(OC * C, 0.0), db(OC, 0.0);
  reference::matmul_forward(out, x, w, &b, N, C, OC);
  reference::matmul_backward(dx, dw, db, dy, x, w, N, C, OC);

  Tensor tx = B(x, {N, C}), tw = B(w, {OC, C}), tb = B(b, {OC});
  Tensor tout = empty({N, OC}, kBf16);
  be.matmul_forward(tout, tx, tw, &tb);
  EXPECT_LT(max_relative_error(H(tout), out), kRounded);

  // fp32 parameter gradients accumulate: start from ones and expect reference + 1.
  Tensor tdx = empty({N, C}, kBf16);
  Tensor tdw = F(Vec(OC * C, 1.0), {OC, C}), tdb = F(Vec(OC, 1.0), {OC});
  be.matmul_backward(&tdx, &tdw, &tdb, B(dy, {N, OC}), tx, tw);
  for (double& v : dw) v += 1.0;
  for (double& v : db) v += 1.0;
  EXPECT_LT(max_relative_error(H(tdx), dx), kRounded);
  EXPECT_LT(max_relative_error(H(tdw), dw), kFp32);
  EXPECT_LT(max_relative_error(H(tdb), db), kFp32);

  // No input gradient wanted: dW still accumulates.
  Tensor tdw2 = zeros({OC, C}, kF32);
  be.matmul_backward(nullptr, &tdw2, nullptr, B(dy, {N, OC}), tx, tw);
  for (double& v : dw) v -= 1.0;
  EXPECT_LT(max_relative_error(H(tdw2), dw), kFp32);
}

// matmul_forward_add under bf16: product, bias and residual summed in fp32 and rounded once.
TEST_F(CpuBf16, MatmulForwardAddRoundsTheSumOnce) {
  if (!cpu_runs_bf16()) GTEST_SKIP() << "oneDNN has no bf16 GEMM under this ISA (AVX2)";
  const int64_t N = 33, C = 48, OC = 72;
  const Vec x = in_bf16(random_normal(N * C, 5)), w = in_bf16(random_normal(OC * C, 6));
  const Vec b = in_bf16(random_normal(OC, 7)), res = in_bf16(random_normal(N * OC, 8));
  Vec out;
  reference::matmul_forward(out, x, w, &b, N, C, OC);
  for (size_t i = 0; i < out.size(); ++i) out[i] += res[i];
  Tensor tout = empty({N, OC}, kBf16), tb = B(b, {OC});
  be.matmul_forward_add(tout, B(x, {N, C}), B(w, {OC, C}), &tb, B(res, {N, OC}));
  // Within half a bf16 ulp (at most 2^-8 of the value) of the exact sum, give or take fp32
  // accumulation: one rounding. Rounding the product first and the sum again misses this bound
  // for some elements.
  const Vec got = H(tout);
  int64_t off = 0;
  for (size_t i = 0; i < got.size(); ++i)
    off += std::abs(got[i] - out[i]) > std::abs(out[i]) * std::ldexp(1.0, -8) * (1 + 1e-4) + 1e-6;
  EXPECT_EQ(off, 0);
}

TEST_F(CpuBf16, LayerNormBackwardAddHasTheBitsOfTheTwoCalls) {
  const int64_t N = 37, C = 96;
  Tensor tx = B(in_bf16(random_normal(N * C, 1, 2.0)), {N, C}), tw = B(in_bf16(random_normal(C, 2)), {C});
  Tensor tb = B(in_bf16(random_normal(C, 3)), {C}), tdy = B(in_bf16(random_normal(N * C, 4)), {N, C});
  Tensor tres = B(in_bf16(random_normal(N * C, 5)), {N, C});
  Tensor tout = empty({N, C}, kBf16), tmean = empty({N}, kF32), trstd = empty({N}, kF32);
  be.layernorm_forward(tout, tmean, trstd, tx, tw, tb);
  Tensor dx_two = empty({N, C}, kBf16), dw_two = zeros({C}, kF32), db_two = zeros({C}, kF32);
  be.layernorm_backward(dx_two, dw_two, db_two, tdy, tx, tw, tmean, trstd);
  be.add_inplace(dx_two, tres);
  Tensor dx_one = empty({N, C}, kBf16), dw_one = zeros({C}, kF32), db_one = zeros({C}, kF32);
  be.layernorm_backward_add(dx_one, dw_one, db_one, tdy, tx, tw, tmean, trstd, tres);
  EXPECT_EQ(H(dx_one), H(dx_two));
  EXPECT_EQ(H(dw_one), H(dw_two));
  EXPECT_EQ(H(db_one), H(db_two));
}

TEST_F(CpuBf16, BiasForwardBackward) {
  const int64_t N = 19, C = 300;
  const Vec x = in_bf16(random_normal(N * C, 9)), b = in_bf16(random_normal(C, 10));
  const Vec dy = in_bf16(random_normal(N * C, 11));
  Tensor tx = B(x, {N, C});
  be.bias_forward(tx, B(b, {C}));
  Vec expect = x, db(C, 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) {
      expect[i * C + c] += b[c];
      db[c] += dy[i * C + c];
    }
  EXPECT_LT(max_relative_error(H(tx), expect), kRounded);
  Tensor tdb = zeros({C}, kF32);
  be.bias_backward(tdb, B(dy, {N, C}));
  EXPECT_LT(max_relative_error(H(tdb), db), kFp32);
}

TEST_F(CpuBf16, Gelu) {
  const int64_t n = 4099;  // not a multiple of the vector width
  Vec x = in_bf16(random_normal(n, 12, 3.0));
  x[0] = 0.0;
  x[1] = 12.0;
  x[2] = -12.0;
  const Vec dy = in_bf16(random_normal(n, 13));
  Vec out(n), dx(n);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = reference::gelu(x[i]);
    dx[i] = reference::gelu_grad(x[i]) * dy[i];
  }
  Tensor tx = B(x, {n}), tout = empty({n}, kBf16), tdx = empty({n}, kBf16);
  be.gelu_forward(tout, tx);
  be.gelu_backward(tdx, tx, B(dy, {n}));
  EXPECT_LT(max_relative_error(H(tout), out), kRounded);
  EXPECT_LT(max_relative_error(H(tdx), dx), kRounded);
}

TEST_F(CpuBf16, CausalAttention) {
  if (!cpu_runs_bf16()) GTEST_SKIP() << "oneDNN has no bf16 GEMM under this ISA (AVX2)";
  struct Case {
    int64_t B, T, NH, HS;
  };
  for (const Case c : {Case{2, 7, 3, 4}, Case{3, 150, 4, 16}}) {
    SCOPED_TRACE("B" + std::to_string(c.B) + "_T" + std::to_string(c.T));
    const int64_t C = c.NH * c.HS;
    const Vec qkv = in_bf16(random_normal(c.B * c.T * 3 * C, 14));
    const Vec dout = in_bf16(random_normal(c.B * c.T * C, 15));
    Vec out, probs, dqkv;
    reference::attention_forward(out, probs, qkv, c.B, c.T, c.NH, c.HS);
    reference::attention_backward(dqkv, dout, qkv, c.B, c.T, c.NH, c.HS);

    Tensor tqkv = B(qkv, {c.B * c.T, 3 * C});
    Tensor tout = empty({c.B * c.T, C}, kBf16);
    Tensor stash = testing::attention_stash(be, c.B, c.T, c.NH, kBf16);
    be.attention_forward(tout, stash, tqkv, c.B, c.T, c.NH, c.NH, c.HS);
    const double e_out = max_relative_error(H(tout), out);
    EXPECT_LT(e_out, kAttention);

    Tensor tdqkv = empty({c.B * c.T, 3 * C}, kBf16);
    be.attention_backward(tdqkv, B(dout, {c.B * c.T, C}), tqkv, tout, stash, c.B, c.T, c.NH,
                          c.NH, c.HS);
    const double e_dqkv = max_relative_error(H(tdqkv), dqkv);
    EXPECT_LT(e_dqkv, kAttention);
    std::printf("# attention bf16 B%ld T%ld: out %.2e dqkv %.2e\n",
                static_cast<long>(c.B), static_cast<long>(c.T), e_out, e_dqkv);
  }
}

TEST_F(CpuBf16, EmbeddingsGradientsInFp32) {
  const int64_t V = 50, C = 70, N = 23, begin = 20, local_v = 15, Tlen = 8, token_begin = 12;
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7) % V);
  tokens[3] = tokens[9] = 25;  // a repeated token accumulates twice
  const Vec wte = in_bf16(random_normal(local_v * C, 16)), dy = in_bf16(random_normal(N * C, 17));
  const Vec wpe = in_bf16(random_normal(Tlen * C, 18));
  Vec out(N * C, 0.0), dwte(local_v * C, 0.0), dwpe(Tlen * C, 0.0);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t r = tokens[i] - begin;
    for (int64_t c = 0; c < C; ++c) {
      if (r >= 0 && r < local_v) {
        out[i * C + c] = wte[r * C + c];
        dwte[r * C + c] += dy[i * C + c];
      }
      dwpe[((token_begin + i) % Tlen) * C + c] += dy[i * C + c];
    }
  }
  Tensor tt = make_tokens(be, tokens), tout = empty({N, C}, kBf16);
  be.embedding_forward(tout, tt, B(wte, {local_v, C}), begin);
  EXPECT_EQ(H(tout), out);  // a copy: exact
  Tensor tdwte = zeros({local_v, C}, kF32);
  be.embedding_backward(tdwte, B(dy, {N, C}), tt, begin);
  EXPECT_LT(max_relative_error(H(tdwte), dwte), kFp32);

  Vec with_pos = out;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) with_pos[i * C + c] += wpe[((token_begin + i) % Tlen) * C + c];
  be.position_forward(tout, B(wpe, {Tlen, C}), token_begin);
  EXPECT_LT(max_relative_error(H(tout), with_pos), kRounded);
  Tensor tdwpe = zeros({Tlen, C}, kF32);
  be.position_backward(tdwpe, B(dy, {N, C}), token_begin);
  EXPECT_LT(max_relative_error(H(tdwpe), dwpe), kFp32);
}

// bf16 logits, fp32 statistics and losses, bf16 dlogits (in place), over two vocabulary halves
// combined as the tensor group would combine them.
TEST_F(CpuBf16, CrossEntropySplitVocabularyStatisticsInFp32) {
  const int64_t N = 9, V = 40, half = 20;
  const Vec logits = in_bf16(random_normal(N * V, 21, 4.0));
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 13) % V);
  const double dloss = 1.0 / 7.0;
  Vec losses, dlogits;
  reference::crossentropy(losses, dlogits, logits, targets, dloss, N, V);

  Tensor tt = make_tokens(be, targets);
  std::vector<Tensor> part(2), mx(2), se(2), tl(2);
  for (int r = 0; r < 2; ++r) {
    Vec slice(N * half);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < half; ++j) slice[i * half + j] = logits[i * V + r * half + j];
    part[r] = B(slice, {N, half});
    mx[r] = empty({N}, kF32);
    se[r] = empty({N}, kF32);
    tl[r] = empty({N}, kF32);
    be.crossentropy_stats(mx[r], se[r], part[r]);
    be.crossentropy_target_logit(tl[r], part[r], tt, r * half);
  }
  Vec m0 = H(mx[0]), m1 = H(mx[1]), gmax(N);
  for (int64_t i = 0; i < N; ++i) gmax[i] = std::max(m0[i], m1[i]);
  Tensor tg = F(gmax, {N});
  be.crossentropy_rebase(se[0], mx[0], tg);
  be.crossentropy_rebase(se[1], mx[1], tg);
  Vec s0 = H(se[0]), s1 = H(se[1]), t0 = H(tl[0]), t1 = H(tl[1]), sum(N), target(N);
  for (int64_t i = 0; i < N; ++i) {
    sum[i] = s0[i] + s1[i];
    target[i] = t0[i] + t1[i];
  }
  Tensor tsum = F(sum, {N}), tlosses = empty({N}, kF32);
  be.crossentropy_losses(tlosses, tg, tsum, F(target, {N}));
  EXPECT_LT(max_relative_error(H(tlosses), losses), kFp32);
  for (int r = 0; r < 2; ++r) {
    be.crossentropy_backward(part[r], part[r], tg, tsum, tt, r * half, dloss);
    Vec want(N * half);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < half; ++j) want[i * half + j] = dlogits[i * V + r * half + j];
    EXPECT_LT(max_relative_error(H(part[r]), want), kRounded) << "vocabulary half " << r;
  }
}

// Sums and residuals of bf16 tensors are computed in fp32 and rounded once, to nearest even:
// 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 and goes to 1 (even); 1 + 3 * 2^-8 lies halfway
// between 1 + 2^-7 and 1 + 2^-6 and goes up (even).
TEST_F(CpuBf16, ElementwiseRoundOnceToNearestEven) {
  const double u = std::ldexp(1.0, -8);
  const Vec a = {1.0, 1.0 + 2 * u, -3.0, 0.5}, b = {u, u, 1.0, 0.25};
  const Vec rounded = {1.0, 1.0 + 4 * u, -2.0, 0.75};
  Tensor out = empty({4}, kBf16);
  be.residual_forward(out, B(a, {4}), B(b, {4}));
  EXPECT_EQ(H(out), rounded);
  Tensor acc = B(a, {4});
  be.add_inplace(acc, B(b, {4}));
  EXPECT_EQ(H(acc), rounded);
  // bf16 into an fp32 accumulator: exact.
  Tensor wide = F(a, {4});
  be.add_inplace(wide, B(b, {4}));
  EXPECT_EQ(H(wide), (Vec{1.0 + u, 1.0 + 3 * u, -2.0, 0.75}));

  Tensor s = B({1.0, -2.0, 3.0}, {3});
  be.scale_inplace(s, 1.0 + u);  // 1 + 2^-8 rounds to 1; 3 (1 + 2^-8) = 3 + 3 * 2^-8 to 3 + 2^-6
  EXPECT_EQ(H(s), (Vec{1.0, -2.0, 3.0 + 4 * u}));
  be.fill(s, 1.0 + 3 * u);
  EXPECT_EQ(H(s), Vec(3, 1.0 + 4 * u));
}

TEST_F(CpuBf16, ReductionsOfBf16AreExact) {
  const int64_t n = 100003;
  const Vec x = in_bf16(random_normal(n, 25));
  double ss = 0, s = 0;
  for (double v : x) {
    ss += v * v;
    s += v;
  }
  Tensor t = B(x, {n});
  EXPECT_NEAR(be.sum_squares(t), ss, 1e-12 * ss);
  EXPECT_NEAR(be.sum(t), s, 1e-12 * ss);
  Tensor slots = zeros({1}, DType::F64);
  be.reduce_into(slots, 0, t, Reduction::SumSquares);
  EXPECT_EQ(H(slots)[0], be.sum_squares(t));
}

// Mixed precision's optimizer step: AdamW on fp32 master weights and moments, then the bf16
// parameters are the master weights rounded to nearest even (Backend::cast).
TEST_F(CpuBf16, AdamWOnFp32MastersWithABf16Copy) {
  const int64_t n = 1001;
  const Vec p0 = random_normal(n, 22), g = random_normal(n, 23);
  Tensor master = F(p0, {n}), m = zeros({n}, kF32), v = zeros({n}, kF32);
  be.adamw_update(master, F(g, {n}), m, v, {1e-2, 0.9, 0.95, 1e-8, 0.1, 1, 1.0});
  Tensor params = empty({n}, kBf16);
  be.cast(params, master);
  EXPECT_EQ(H(params), in_bf16(H(master)));

  Tensor bf = B(p0, {n});
  try {
    be.adamw_update(bf, F(g, {n}), m, v, {1e-2, 0.9, 0.95, 1e-8, 0.1, 2, 1.0});
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "backend 'cpu' does not support adamw_update for dtype bf16: param is "
                           "bf16, expected fp32 (master parameters, gradients and moments are "
                           "fp32 (or all fp64))");
  }
}

// Tensors that must stay fp32 under bf16 are refused by name when they are not.
TEST_F(CpuBf16, WrongDtypesAreRefusedByName) {
  const int64_t N = 4, C = 8;
  Tensor x = B(Vec(N * C, 1.0), {N, C}), w = B(Vec(C, 1.0), {C}), out = empty({N, C}, kBf16);
  Tensor bf_stat = empty({N}, kBf16), stat = empty({N}, kF32);
  try {
    be.layernorm_forward(out, bf_stat, stat, x, w, w);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "backend 'cpu' does not support layernorm_forward for dtype bf16: mean "
                           "is bf16, expected fp32 (statistics are fp32)");
  }
  Tensor W = B(Vec(C * C, 1.0), {C, C}), bf_grad = zeros({C, C}, kBf16);
  try {
    be.matmul_backward(nullptr, &bf_grad, nullptr, x, x, W);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "backend 'cpu' does not support matmul_backward for dtype bf16: "
                           "dweight is bf16, expected fp32 (parameter gradients are fp32)");
  }
  Tensor wide_out = empty({N, C}, kF32);
  EXPECT_THROW(be.matmul_forward(wide_out, x, W, nullptr), std::invalid_argument);
  Tensor wide = F(Vec(N * C, 1.0), {N, C});
  EXPECT_THROW(be.add_inplace(x, wide), std::invalid_argument);  // fp32 into bf16 would round
  Tensor half = be.empty({4}, DType::F16, MemoryCategory::Workspace);
  try {
    be.scale_inplace(half, 2.0);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "backend 'cpu' does not support scale_inplace for dtype fp16");
  }
}

// bf16 attention runs as oneDNN matmuls only: forcing OpenBLAS, which has no bf16 GEMM, is refused.
TEST(CpuBf16Attention, OpenBlasForcedIsRefused) {
  CpuBackend be(1);
  be.gemm().set_library(cpu::GemmLibrary::OpenBlas);
  Tensor qkv = be.zeros({8, 3 * 4}, kBf16, MemoryCategory::Workspace);
  Tensor out = be.empty({8, 4}, kBf16, MemoryCategory::Workspace);
  Tensor stash = testing::attention_stash(be, 1, 8, 1, kBf16);
  EXPECT_THROW(be.attention_forward(out, stash, qkv, 1, 8, 1, 1, 4), std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain
