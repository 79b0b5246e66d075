// Every CPU kernel against a naive double-precision reference (tests/support/reference_kernels.h),
// in fp32 and fp64 (bf16 mixed precision: cpu_bf16_test.cpp). Tolerances are relative to the reference's largest magnitude and live in one
// table: fp32 kernels accumulate in fp32 over at most a few hundred terms here, so ~1e-5 holds
// with margin; fp64 must agree to ~1e-12.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

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

double tolerance(DType t) { return t == DType::F32 ? 2e-5 : 1e-11; }

class CpuKernels : public ::testing::TestWithParam<DType> {
 protected:
  CpuBackend be{2};
  DType dt = GetParam();
  Tensor T(const Vec& v, Shape s) { return make_tensor(be, v, s, dt); }
  Vec H(const Tensor& t) { return to_host(be, t); }
};

TEST_P(CpuKernels, LayerNorm) {
  const int64_t N = 37, C = 96;
  const Vec x = random_normal(N * C, 1, 2.0), w = random_normal(C, 2), b = random_normal(C, 3);
  const Vec dy = random_normal(N * C, 4);
  Vec out, mean, rstd, dx, dw(C, 0.0), db(C, 0.0);
  reference::layernorm_forward(out, mean, rstd, x, w, b, N, C);
  reference::layernorm_backward(dx, dw, db, dy, x, w, N, C);

  Tensor tx = T(x, {N, C}), tw = T(w, {C}), tb = T(b, {C});
  Tensor tout = be.empty({N, C}, dt, MemoryCategory::Workspace);
  Tensor tmean = be.empty({N}, dt, MemoryCategory::Workspace), trstd = be.empty({N}, dt, MemoryCategory::Workspace);
  be.layernorm_forward(tout, tmean, trstd, tx, tw, tb);
  EXPECT_LT(max_relative_error(H(tout), out), tolerance(dt));
  EXPECT_LT(max_relative_error(H(tmean), mean), tolerance(dt));
  EXPECT_LT(max_relative_error(H(trstd), rstd), tolerance(dt));

  Tensor tdx = be.empty({N, C}, dt, MemoryCategory::Workspace);
  Tensor tdw = be.zeros({C}, dt, MemoryCategory::Workspace), tdb = be.zeros({C}, dt, MemoryCategory::Workspace);
  be.layernorm_backward(tdx, tdw, tdb, T(dy, {N, C}), tx, tw, tmean, trstd);
  EXPECT_LT(max_relative_error(H(tdx), dx), tolerance(dt));
  EXPECT_LT(max_relative_error(H(tdw), dw), tolerance(dt));
  EXPECT_LT(max_relative_error(H(tdb), db), tolerance(dt));
}

// layernorm_backward_add adds the residual inside the kernel, with the bits of layernorm_backward
// and then add_inplace (backend.h).
TEST_P(CpuKernels, LayerNormBackwardAddHasTheBitsOfTheTwoCalls) {
  const int64_t N = 37, C = 96;
  Tensor tx = T(random_normal(N * C, 1, 2.0), {N, C}), tw = T(random_normal(C, 2), {C});
  Tensor tb = T(random_normal(C, 3), {C}), tdy = T(random_normal(N * C, 4), {N, C});
  Tensor tres = T(random_normal(N * C, 5), {N, C});
  Tensor tout = be.empty({N, C}, dt, MemoryCategory::Workspace);
  Tensor tmean = be.empty({N}, dt, MemoryCategory::Workspace), trstd = be.empty({N}, dt, MemoryCategory::Workspace);
  be.layernorm_forward(tout, tmean, trstd, tx, tw, tb);
  const auto zeros = [&](Shape s) { return be.zeros(s, dt, MemoryCategory::Workspace); };
  Tensor dx_two = zeros({N, C}), dw_two = zeros({C}), db_two = zeros({C});
  be.layernorm_backward(dx_two, dw_two, db_two, tdy, tx, tw, tmean, trstd);
  be.add_inplace(dx_two, tres);
  Tensor dx_one = zeros({N, C}), dw_one = zeros({C}), db_one = zeros({C});
  be.layernorm_backward_add(dx_one, dw_one, db_one, tdy, tx, tw, tmean, trstd, tres);
  EXPECT_EQ(H(dx_one), H(dx_two));
  EXPECT_EQ(H(dw_one), H(dw_two));
  EXPECT_EQ(H(db_one), H(db_two));
}

// matmul_forward_add: the residual added inside the GEMM (a oneDNN post-op, or after OpenBLAS).
TEST_P(CpuKernels, MatmulForwardAddsTheResidual) {
  const int64_t N = 33, C = 48, OC = 72;
  const Vec x = random_normal(N * C, 5), w = random_normal(OC * C, 6), b = random_normal(OC, 7);
  const Vec res = random_normal(N * OC, 8);
  Vec out;
  reference::matmul_forward(out, x, w, &b, N, C, OC);
  for (size_t i = 0; i < out.size(); ++i) out[i] += res[i];
  Tensor tx = T(x, {N, C}), tw = T(w, {OC, C}), tb = T(b, {OC}), tres = T(res, {N, OC});
  for (const Tensor* bias : {static_cast<const Tensor*>(&tb), static_cast<const Tensor*>(nullptr)}) {
    Tensor tout = be.empty({N, OC}, dt, MemoryCategory::Workspace);
    be.matmul_forward_add(tout, tx, tw, bias, tres);
    Vec expect = out;
    if (!bias)
      for (int64_t i = 0; i < N * OC; ++i) expect[i] -= b[i % OC];
    EXPECT_LT(max_relative_error(H(tout), expect), tolerance(dt));
  }
}

// matmul_gelu_backward without a workspace: the bits of matmul_backward's input gradient and
// then gelu_backward (the backend.h default).
TEST_P(CpuKernels, MatmulGeluBackwardHasTheBitsOfTheTwoCalls) {
  const int64_t N = 33, C = 96, OC = 40;  // pre (N, C), weight (OC, C), dout (N, OC)
  Tensor pre = T(random_normal(N * C, 5, 2.0), {N, C}), w = T(random_normal(OC * C, 6), {OC, C});
  Tensor dout = T(random_normal(N * OC, 7), {N, OC});
  Tensor product = be.empty({N, C}, dt, MemoryCategory::Workspace);
  Tensor two = be.empty({N, C}, dt, MemoryCategory::Workspace), one = be.empty({N, C}, dt, MemoryCategory::Workspace);
  be.matmul_backward(&product, nullptr, nullptr, dout, pre, w);
  be.gelu_backward(two, pre, product);
  be.matmul_gelu_backward(one, dout, w, pre);
  EXPECT_EQ(H(one), H(two));
}

TEST_P(CpuKernels, MatmulForwardBackwardAccumulates) {
  const int64_t N = 33, C = 48, OC = 72;
  const Vec x = random_normal(N * C, 5), w = random_normal(OC * C, 6), b = random_normal(OC, 7);
  const Vec dy = random_normal(N * OC, 8);
  Vec out, dx, dw(OC * C, 0.0), db(OC, 0.0);
  reference::matmul_forward(out, x, w, &b, N, C, OC);
  reference::matmul_backward(dx, dw, db, dy, x, w, N, C, OC);

  Tensor tx = T(x, {N, C}), tw = T(w, {OC, C}), tb = T(b, {OC});
  Tensor tout = be.empty({N, OC}, dt, MemoryCategory::Workspace);
  be.matmul_forward(tout, tx, tw, &tb);
  EXPECT_LT(max_relative_error(H(tout), out), tolerance(dt));

  // Parameter gradients accumulate: start from ones and expect reference + 1.
  Tensor tdx = be.empty({N, C}, dt, MemoryCategory::Workspace);
  Tensor tdw = T(Vec(OC * C, 1.0), {OC, C}), tdb = T(Vec(OC, 1.0), {OC});
  be.matmul_backward(&tdx, &tdw, &tdb, T(dy, {N, OC}), tx, tw);
  for (double& v : dw) v += 1.0;
  for (double& v : db) v += 1.0;
  EXPECT_LT(max_relative_error(H(tdx), dx), tolerance(dt));
  EXPECT_LT(max_relative_error(H(tdw), dw), tolerance(dt));
  EXPECT_LT(max_relative_error(H(tdb), db), tolerance(dt));
}

TEST_P(CpuKernels, BiasForwardBackward) {
  const int64_t N = 19, C = 300;
  const Vec x = random_normal(N * C, 9), b = random_normal(C, 10), dy = random_normal(N * C, 11);
  Tensor tx = T(x, {N, C});
  be.bias_forward(tx, T(b, {C}));
  Vec expect = x, db(C, 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) {
      expect[i * C + c] += b[c];
      db[c] += dy[i * C + c];
    }
  EXPECT_LT(max_relative_error(H(tx), expect), tolerance(dt));
  Tensor tdb = be.zeros({C}, dt, MemoryCategory::Workspace);
  be.bias_backward(tdb, T(dy, {N, C}));
  EXPECT_LT(max_relative_error(H(tdb), db), tolerance(dt));
}

TEST_P(CpuKernels, Gelu) {
  const int64_t n = 4099;  // not a multiple of the vector width
  Vec x = random_normal(n, 12, 3.0);
  x[0] = 0.0;
  x[1] = 12.0;  // saturated tanh
  x[2] = -12.0;
  const Vec dy = random_normal(n, 13);
  Vec out(n), dx(n);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = reference::gelu(x[i]);
    dx[i] = reference::gelu_grad(x[i]) * dy[i];
  }
  Tensor tx = T(x, {n}), tout = be.empty({n}, dt, MemoryCategory::Workspace), tdx = be.empty({n}, dt, MemoryCategory::Workspace);
  be.gelu_forward(tout, tx);
  be.gelu_backward(tdx, tx, T(dy, {n}));
  EXPECT_LT(max_relative_error(H(tout), out), tolerance(dt));
  EXPECT_LT(max_relative_error(H(tdx), dx), tolerance(dt));
}

struct AttentionCase {
  int64_t B, T, NH, HS;
};

TEST_P(CpuKernels, CausalAttention) {
  // T = 150 crosses the kernel's 64-row causal blocks at a ragged edge.
  for (const AttentionCase c : {AttentionCase{2, 7, 3, 4}, AttentionCase{1, 150, 2, 16}}) {
    SCOPED_TRACE("B" + std::to_string(c.B) + "_T" + std::to_string(c.T));
    const int64_t C = c.NH * c.HS;
    const Vec qkv = random_normal(c.B * c.T * 3 * C, 14), dout = random_normal(c.B * c.T * C, 15);
    Vec out, probs, dqkv;
    reference::attention_forward(out, probs, qkv, c.B, c.T, c.NH, c.HS);
    reference::attention_backward(dqkv, dout, qkv, c.B, c.T, c.NH, c.HS);

    Tensor tqkv = T(qkv, {c.B * c.T, 3 * C});
    Tensor tout = be.empty({c.B * c.T, C}, dt, MemoryCategory::Workspace);
    Tensor stash = testing::attention_stash(be, c.B, c.T, c.NH, dt);
    be.attention_forward(tout, stash, tqkv, c.B, c.T, c.NH, c.NH, c.HS);
    EXPECT_LT(max_relative_error(H(tout), out), tolerance(dt));

    Tensor tdqkv = be.empty({c.B * c.T, 3 * C}, dt, MemoryCategory::Workspace);
    be.attention_backward(tdqkv, T(dout, {c.B * c.T, C}), tqkv, tout, stash, c.B, c.T, c.NH,
                          c.NH, c.HS);
    EXPECT_LT(max_relative_error(H(tdqkv), dqkv), tolerance(dt));
  }
}

// fp32 attention's block products run on oneDNN (the default) or OpenBLAS (when forced, as fp64
// always does). Both against the reference, with B > 1 and several heads so that the strides
// matter.
TEST(CpuAttention, OneDnnAndOpenBlasProductsMatchTheReference) {
  const AttentionCase c{3, 150, 4, 16};
  const int64_t C = c.NH * c.HS;
  const Vec qkv = random_normal(c.B * c.T * 3 * C, 31), dout = random_normal(c.B * c.T * C, 32);
  Vec out, probs, dqkv;
  reference::attention_forward(out, probs, qkv, c.B, c.T, c.NH, c.HS);
  reference::attention_backward(dqkv, dout, qkv, c.B, c.T, c.NH, c.HS);
  for (cpu::GemmLibrary library : {cpu::GemmLibrary::Auto, cpu::GemmLibrary::OpenBlas}) {
    SCOPED_TRACE(std::string(cpu::gemm_library_name(library)));
    CpuBackend be(2);
    be.gemm().set_library(library);
    const DType dt = DType::F32;
    Tensor tqkv = make_tensor(be, qkv, {c.B * c.T, 3 * C}, dt);
    Tensor tout = be.empty({c.B * c.T, C}, dt, MemoryCategory::Workspace);
    Tensor stash = testing::attention_stash(be, c.B, c.T, c.NH, dt);
    be.attention_forward(tout, stash, tqkv, c.B, c.T, c.NH, c.NH, c.HS);
    EXPECT_LT(max_relative_error(to_host(be, tout), out), tolerance(dt));
    Tensor tdqkv = be.empty({c.B * c.T, 3 * C}, dt, MemoryCategory::Workspace);
    be.attention_backward(tdqkv, make_tensor(be, dout, {c.B * c.T, C}, dt), tqkv, tout, stash,
                          c.B, c.T, c.NH, c.NH, c.HS);
    EXPECT_LT(max_relative_error(to_host(be, tdqkv), dqkv), tolerance(dt));
  }
}

TEST_P(CpuKernels, EmbeddingSliceOfVocabulary) {
  const int64_t V = 50, C = 70, N = 23, begin = 20, local_v = 15;  // this rank: tokens 20..34
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7) % V);
  tokens[3] = tokens[9] = 25;  // a repeated token accumulates twice
  const Vec wte = random_normal(local_v * C, 16), dy = random_normal(N * C, 17);
  Vec out(N * C, 0.0), dwte(local_v * C, 0.0);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t r = tokens[i] - begin;
    if (r < 0 || r >= local_v) continue;
    for (int64_t c = 0; c < C; ++c) {
      out[i * C + c] = wte[r * C + c];
      dwte[r * C + c] += dy[i * C + c];
    }
  }
  Tensor tt = make_tokens(be, tokens), tout = be.empty({N, C}, dt, MemoryCategory::Workspace);
  be.embedding_forward(tout, tt, T(wte, {local_v, C}), begin);
  EXPECT_LT(max_relative_error(H(tout), out), tolerance(dt));
  Tensor tdwte = be.zeros({local_v, C}, dt, MemoryCategory::Workspace);
  be.embedding_backward(tdwte, T(dy, {N, C}), tt, begin);
  EXPECT_LT(max_relative_error(H(tdwte), dwte), tolerance(dt));
}

TEST_P(CpuKernels, PositionEmbeddingFromTokenOffset) {
  const int64_t Tlen = 8, C = 33, N = 12, token_begin = 12;  // rows are tokens 12..23 of (B, 8)
  const Vec wpe = random_normal(Tlen * C, 18), x = random_normal(N * C, 19), dy = random_normal(N * C, 20);
  Vec out = x, dwpe(Tlen * C, 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) {
      out[i * C + c] += wpe[((token_begin + i) % Tlen) * C + c];
      dwpe[((token_begin + i) % Tlen) * C + c] += dy[i * C + c];
    }
  Tensor tx = T(x, {N, C});
  be.position_forward(tx, T(wpe, {Tlen, C}), token_begin);
  EXPECT_LT(max_relative_error(H(tx), out), tolerance(dt));
  Tensor tdwpe = be.zeros({Tlen, C}, dt, MemoryCategory::Workspace);
  be.position_backward(tdwpe, T(dy, {N, C}), token_begin);
  EXPECT_LT(max_relative_error(H(tdwpe), dwpe), tolerance(dt));
}

// The vocabulary-parallel pieces, run as two "ranks" of a split vocabulary and combined the way
// the LM head combines them across the tensor group, must equal the full softmax cross-entropy.
TEST_P(CpuKernels, CrossEntropySplitVocabularyEqualsFull) {
  const int64_t N = 9, V = 40, half = 20;
  const Vec logits = random_normal(N * V, 21, 4.0);
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
    part[r] = T(slice, {N, half});
    mx[r] = be.empty({N}, dt, MemoryCategory::Workspace);
    se[r] = be.empty({N}, dt, MemoryCategory::Workspace);
    tl[r] = be.empty({N}, dt, MemoryCategory::Workspace);
    be.crossentropy_stats(mx[r], se[r], part[r]);
    be.crossentropy_target_logit(tl[r], part[r], tt, r * half);
  }
  // "all-reduce" by hand: max, re-based sums, target logits.
  Vec m0 = H(mx[0]), m1 = H(mx[1]), gmax(N);
  for (int64_t i = 0; i < N; ++i) gmax[i] = std::max(m0[i], m1[i]);
  Tensor tg = T(gmax, {N});
  be.crossentropy_rebase(se[0], mx[0], tg);
  be.crossentropy_rebase(se[1], mx[1], tg);
  Vec s0 = H(se[0]), s1 = H(se[1]), t0 = H(tl[0]), t1 = H(tl[1]), sum(N), target(N);
  for (int64_t i = 0; i < N; ++i) {
    sum[i] = s0[i] + s1[i];
    target[i] = t0[i] + t1[i];
  }
  Tensor tsum = T(sum, {N}), ttarget = T(target, {N}), tlosses = be.empty({N}, dt, MemoryCategory::Workspace);
  be.crossentropy_losses(tlosses, tg, tsum, ttarget);
  EXPECT_LT(max_relative_error(H(tlosses), losses), tolerance(dt));

  for (int r = 0; r < 2; ++r) {
    be.crossentropy_backward(part[r], part[r], tg, tsum, tt, r * half, dloss);  // in place
    const Vec got = H(part[r]);
    Vec want(N * half);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < half; ++j) want[i * half + j] = dlogits[i * V + r * half + j];
    EXPECT_LT(max_relative_error(got, want), tolerance(dt)) << "vocabulary half " << r;
  }
}

TEST_P(CpuKernels, AdamWTwoSteps) {
  const int64_t n = 1001;
  const Vec p0 = random_normal(n, 22), g1 = random_normal(n, 23), g2 = random_normal(n, 24);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
  Vec p = p0, m(n, 0.0), v(n, 0.0);
  for (int step = 1; step <= 2; ++step) {
    const Vec& g = step == 1 ? g1 : g2;
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i] * gs;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double mh = m[i] / (1 - std::pow(b1, step)), vh = v[i] / (1 - std::pow(b2, step));
      p[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * p[i]);
    }
  }
  Tensor tp = T(p0, {n}), tm = be.zeros({n}, dt, MemoryCategory::Workspace), tv = be.zeros({n}, dt, MemoryCategory::Workspace);
  for (int step = 1; step <= 2; ++step)
    be.adamw_update(tp, T(step == 1 ? g1 : g2, {n}), tm, tv, {lr, b1, b2, eps, wd, step, gs});
  EXPECT_LT(max_relative_error(H(tp), p), tolerance(dt));
  EXPECT_LT(max_relative_error(H(tm), m), tolerance(dt));
  EXPECT_LT(max_relative_error(H(tv), v), tolerance(dt));
}

TEST_P(CpuKernels, ReductionsAreExactAndThreadIndependent) {
  const int64_t n = 100003;
  const Vec x = random_normal(n, 25);
  double ss = 0, s = 0;
  for (double v : x) {
    const double f = dt == DType::F32 ? static_cast<double>(static_cast<float>(v)) : v;
    ss += f * f;
    s += f;
  }
  Tensor t = T(x, {n});
  EXPECT_NEAR(be.sum_squares(t), ss, 1e-9 * ss);
  EXPECT_NEAR(be.sum(t), s, 1e-9 * std::abs(ss));
  const double with_two = be.sum_squares(t);
  CpuBackend one_thread(1);
  Tensor t1 = make_tensor(one_thread, x, {n}, dt);
  EXPECT_EQ(one_thread.sum_squares(t1), with_two);  // bitwise
  CpuBackend restore(2);
}

// reduce_into queues what sum/sum_squares return (no host round trip on a GPU): same bits.
TEST_P(CpuKernels, ReduceIntoSlotsEqualsSumAndSumSquares) {
  const int64_t n = 4099;
  Tensor t = T(random_normal(n, 26), {n});
  Tensor slots = be.zeros({3}, DType::F64, MemoryCategory::Workspace);
  be.reduce_into(slots, 2, t, Reduction::Sum);
  be.reduce_into(slots, 0, t, Reduction::SumSquares);
  const Vec got = H(slots);
  EXPECT_EQ(got[0], be.sum_squares(t));
  EXPECT_EQ(got[1], 0.0) << "an untouched slot changed";
  EXPECT_EQ(got[2], be.sum(t));
  EXPECT_THROW(be.reduce_into(slots, 3, t, Reduction::Sum), std::invalid_argument);
}

TEST(CpuBackend, CopyFromHostAsyncLandsAndChecksSizes) {
  CpuBackend be(1);
  Tensor host = be.empty_host({4}, DType::I32, MemoryCategory::Activations);
  for (int i = 0; i < 4; ++i) host.data<int32_t>()[i] = 10 + i;
  Tensor dst = be.empty({4}, DType::I32, MemoryCategory::Activations);
  be.copy_from_host_async(dst, host);
  be.synchronize();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(dst.data<int32_t>()[i], 10 + i);
  Tensor small = be.empty({3}, DType::I32, MemoryCategory::Activations);
  EXPECT_THROW(be.copy_from_host_async(small, host), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuKernels, ::testing::Values(DType::F32, DType::F64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CpuBackend, RefusesUnsupportedDtypeByName) {
  CpuBackend be(1);
  Tensor t = be.empty({4}, DType::F16, MemoryCategory::Workspace);
  try {
    be.scale_inplace(t, 2.0);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "backend 'cpu' does not support scale_inplace for dtype fp16");
  }
}

// fp32 -> bf16 keeps the upper 16 bits after rounding to nearest, ties to even; bf16 -> fp32 is
// exact. Cases: exact values, both kinds of tie, just above a tie, negative, overflow to
// infinity, NaN, and the fp32 <-> fp64 pair.
TEST(CpuBackend, CastRoundsToNearestEven) {
  CpuBackend be(1);
  const float tiny = std::ldexp(1.0f, -20);
  const std::vector<float> in = {
      1.0f,
      1.0f + std::ldexp(1.0f, -8),          // tie between 0x3f80 (even) and 0x3f81: down
      1.0f + 3 * std::ldexp(1.0f, -8),      // tie between 0x3f81 and 0x3f82 (even): up
      1.0f + std::ldexp(1.0f, -8) + tiny,   // just above the tie: up
      -2.5f,
      std::numeric_limits<float>::max(),    // beyond the largest bf16 + half an ulp: infinity
      std::numeric_limits<float>::quiet_NaN(),
      0.0f};
  const std::vector<uint16_t> want = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xc020, 0x7f80, 0, 0x0000};
  const int64_t n = static_cast<int64_t>(in.size());
  Tensor f = be.empty({n}, DType::F32, MemoryCategory::Workspace);
  be.copy_from_host(f, in.data());
  Tensor b = be.empty({n}, DType::BF16, MemoryCategory::Workspace);
  be.cast(b, f);
  std::vector<uint16_t> got(in.size());
  be.copy_to_host(got.data(), b);
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::isnan(in[i])) {
      EXPECT_TRUE(std::isnan(bf16_bits_to_float(got[i]))) << "element " << i;
      continue;
    }
    EXPECT_EQ(got[i], want[i]) << "element " << i << " = " << in[i];
    EXPECT_EQ(got[i], float_to_bf16_bits(in[i])) << "host helper, element " << i;
  }
  // bf16 -> fp32 is exact: the widened values are the bf16 values.
  Tensor back = be.empty({n}, DType::F32, MemoryCategory::Workspace);
  be.cast(back, b);
  std::vector<float> widened(in.size());
  be.copy_to_host(widened.data(), back);
  EXPECT_EQ(widened[2], 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(widened[4], -2.5f);
  EXPECT_TRUE(std::isinf(widened[5]));

  // fp32 -> fp64 is exact; fp64 -> fp32 rounds to nearest.
  Tensor d = be.empty({n}, DType::F64, MemoryCategory::Workspace);
  be.cast(d, f);
  std::vector<double> wide(in.size());
  be.copy_to_host(wide.data(), d);
  EXPECT_EQ(wide[3], static_cast<double>(in[3]));
  const std::vector<double> precise = {1.0 / 3.0, -1e-40, 1e300};
  Tensor pd = be.empty({3}, DType::F64, MemoryCategory::Workspace);
  be.copy_from_host(pd, precise.data());
  Tensor pf = be.empty({3}, DType::F32, MemoryCategory::Workspace);
  be.cast(pf, pd);
  std::vector<float> narrowed(3);
  be.copy_to_host(narrowed.data(), pf);
  EXPECT_EQ(narrowed[0], static_cast<float>(1.0 / 3.0));
  EXPECT_EQ(narrowed[1], static_cast<float>(-1e-40));  // subnormal
  EXPECT_TRUE(std::isinf(narrowed[2]));
}

TEST(CpuBackend, CastRefusesUnsupportedPairsByName) {
  CpuBackend be(1);
  Tensor b = be.empty({4}, DType::BF16, MemoryCategory::Workspace);
  Tensor d = be.empty({4}, DType::F64, MemoryCategory::Workspace);
  try {
    be.cast(d, b);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "backend 'cpu' does not support cast for dtype bf16 -> fp64 (supported: fp32 <-> "
                 "fp64, fp32 <-> bf16)");
  }
  Tensor f = be.empty({5}, DType::F32, MemoryCategory::Workspace);
  EXPECT_THROW(be.cast(f, b), std::invalid_argument);  // element counts differ
}

}  // namespace
}  // namespace meshtrain
