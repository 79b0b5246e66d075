// The CPU backend's RMSNorm, SwiGLU and rotary-embedding kernels in fp64, fp32 and bf16 mixed
// precision: forward against plain double-precision formulas written here,
// backward against the same formulas' gradients and, in fp64, against central finite
// differences of the backend's own forward pass.
//
// Inputs are first rounded to what the dtype holds, so the reference sees the kernel's inputs and
// the error measures the kernel's arithmetic alone. Tolerances, max |got - want| / max |want|:
//   fp64: 1e-12, round-off of sums over at most a few hundred terms;
//   fp32: 2e-5, the CPU suite's fp32 bound (fp32 sums over C <= 96 terms, ~C * 2^-24 ~ 6e-6);
//   bf16 outputs (activations and their gradients): each element is computed in fp32 and rounded
//     once to bf16, a relative error of at most 2^-9 of its own magnitude, so at most 2^-9 of the
//     largest; 2^-8 leaves a factor 2 for the fp32 work before the rounding;
//   bf16 models' fp32 tensors (rstd, dweight): fp32 arithmetic on exact bf16 inputs, as fp32.
// Finite differences: step 1e-6 in double; truncation O(h^2) ~ 1e-12 and rounding
// ~ 1e-16 / 1e-6 = 1e-10 against gradients of order 1, so 1e-7 relative to the largest gradient
// leaves margin while a wrong term shows as an error of the gradient's own size.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <numbers>
#include <utility>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/rotary_table.h"
#include "meshtrain/tensor/bf16.h"
#include "support/counting_backend.h"
#include "support/random.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using testing::make_tensor;
using testing::max_relative_error;
using testing::random_normal;
using testing::representable;
using testing::to_host;
using Vec = std::vector<double>;

constexpr double kBf16Output = 1.0 / 256;  // 2^-8

double activation_tolerance(DType t) {
  return t == DType::F64 ? 1e-12 : t == DType::F32 ? 2e-5 : kBf16Output;
}
double wide_tolerance(DType t) { return t == DType::F64 ? 1e-12 : 2e-5; }
DType wide(DType t) { return t == DType::BF16 ? DType::F32 : t; }

// ---- references, in double ------------------------------------------------------------------

void rmsnorm_reference(Vec& out, Vec& rstd, const Vec& x, const Vec& w, double eps, int64_t N,
                       int64_t C) {
  out.assign(N * C, 0.0);
  rstd.assign(N, 0.0);
  for (int64_t i = 0; i < N; ++i) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += x[i * C + c] * x[i * C + c] / static_cast<double>(C);
    rstd[i] = 1.0 / std::sqrt(ms + eps);
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = x[i * C + c] * rstd[i] * w[c];
  }
}

// d/dx of sum(dy * y) with y_c = x_c r w_c, r = (mean x^2 + eps)^(-1/2): the direct term
// dy_c w_c r and, through r, -x_c r^3 / C * sum_k dy_k w_k x_k.
void rmsnorm_backward_reference(Vec& dx, Vec& dw, const Vec& dy, const Vec& x, const Vec& w,
                                double eps, int64_t N, int64_t C) {
  Vec out, rstd;
  rmsnorm_reference(out, rstd, x, w, eps, N, C);
  dx.assign(N * C, 0.0);
  for (int64_t i = 0; i < N; ++i) {
    const double r = rstd[i];
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += dy[i * C + c] * w[c] * x[i * C + c];
    for (int64_t c = 0; c < C; ++c) {
      dx[i * C + c] = dy[i * C + c] * w[c] * r - x[i * C + c] * r * r * r * dot / C;
      dw[c] += dy[i * C + c] * x[i * C + c] * r;
    }
  }
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

// Hugging Face's rotate-half rotation of one head (D channels) by angles p * inv_freq.
void rotate_reference(double* head, int64_t D, double p, const Vec& inv_freq) {
  const int64_t h = D / 2;
  Vec out(D);
  for (int64_t i = 0; i < D; ++i) {
    const double angle = p * inv_freq[i % h];  // emb = cat(freqs, freqs)
    const double rotated_half = i < h ? -head[i + h] : head[i - h];
    out[i] = head[i] * std::cos(angle) + rotated_half * std::sin(angle);
  }
  std::copy(out.begin(), out.end(), head);
}

// Central finite differences of f(x) . dy with respect to every element of x.
Vec finite_difference(const std::function<Vec(const Vec&)>& f, Vec x, const Vec& dy) {
  const double h = 1e-6;
  Vec grad(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    const double keep = x[k];
    double plus = 0, minus = 0;
    x[k] = keep + h;
    const Vec up = f(x);
    x[k] = keep - h;
    const Vec down = f(x);
    x[k] = keep;
    for (size_t j = 0; j < dy.size(); ++j) {
      plus += up[j] * dy[j];
      minus += down[j] * dy[j];
    }
    grad[k] = (plus - minus) / (2 * h);
  }
  return grad;
}

class LlamaKernels : public ::testing::TestWithParam<DType> {
 protected:
  CpuBackend be{2};
  DType dt = GetParam();
  Tensor T(const Vec& v, Shape s) { return make_tensor(be, v, s, dt); }
  Tensor W(const Vec& v, Shape s) { return make_tensor(be, v, s, wide(dt)); }
  Tensor empty(Shape s) { return be.empty(s, dt, MemoryCategory::Workspace); }
  Vec H(const Tensor& t) { return to_host(be, t); }
  Vec R(const Vec& v) { return representable(v, dt); }
};

// ---- RMSNorm --------------------------------------------------------------------------------

TEST_P(LlamaKernels, RmsNormMatchesTheFormula) {
  const int64_t N = 37, C = 96;
  const double eps = 1e-5;
  const Vec x = R(random_normal(N * C, 1, 2.0)), w = R(random_normal(C, 2)),
            dy = R(random_normal(N * C, 3));
  Vec out, rstd, dx, dw(C, 1.0);  // dweight accumulates onto ones
  rmsnorm_reference(out, rstd, x, w, eps, N, C);
  rmsnorm_backward_reference(dx, dw, dy, x, w, eps, N, C);

  Tensor tx = T(x, {N, C}), tw = T(w, {C}), tout = empty({N, C});
  Tensor trstd = be.empty({N}, wide(dt), MemoryCategory::Workspace);
  be.rmsnorm_forward(tout, trstd, tx, tw, eps);
  EXPECT_LT(max_relative_error(H(tout), out), activation_tolerance(dt));
  EXPECT_LT(max_relative_error(H(trstd), rstd), wide_tolerance(dt));

  Tensor tdx = empty({N, C}), tdw = W(Vec(C, 1.0), {C});
  be.rmsnorm_backward(tdx, tdw, T(dy, {N, C}), tx, tw, trstd);
  EXPECT_LT(max_relative_error(H(tdx), dx), activation_tolerance(dt));
  EXPECT_LT(max_relative_error(H(tdw), dw), wide_tolerance(dt));
}

// eps is the caller's, not LayerNorm's fixed 1e-5: rows of tiny values show it.
TEST_P(LlamaKernels, RmsNormTakesEpsFromTheCaller) {
  const int64_t N = 4, C = 16;
  const Vec x = R(random_normal(N * C, 4, 1e-3)), w = R(Vec(C, 1.0));
  for (const double eps : {1e-6, 1e-5, 1e-2}) {
    Vec out, rstd;
    rmsnorm_reference(out, rstd, x, w, eps, N, C);
    Tensor tout = empty({N, C}), trstd = be.empty({N}, wide(dt), MemoryCategory::Workspace);
    be.rmsnorm_forward(tout, trstd, T(x, {N, C}), T(w, {C}), eps);
    EXPECT_LT(max_relative_error(H(trstd), rstd), wide_tolerance(dt)) << "eps " << eps;
  }
}

// Qwen 3's per-head q/k norm: rows of head_dim channels, many rows, one weight of head_dim.
TEST_P(LlamaKernels, RmsNormOverHeadRows) {
  const int64_t tokens = 9, heads = 6, D = 16, N = tokens * heads;
  const Vec x = R(random_normal(N * D, 5)), w = R(random_normal(D, 6));
  Vec out, rstd;
  rmsnorm_reference(out, rstd, x, w, 1e-6, N, D);
  Tensor tout = empty({tokens, heads, D}), trstd = be.empty({N}, wide(dt), MemoryCategory::Workspace);
  be.rmsnorm_forward(tout, trstd, T(x, {N, D}), T(w, {D}), 1e-6);
  EXPECT_LT(max_relative_error(H(tout), out), activation_tolerance(dt));
}

// rmsnorm_backward_add has the bits of rmsnorm_backward and then add_inplace (backend.h).
TEST_P(LlamaKernels, RmsNormBackwardAddHasTheBitsOfTheTwoCalls) {
  const int64_t N = 13, C = 40;
  Tensor tx = T(random_normal(N * C, 7), {N, C}), tw = T(random_normal(C, 8), {C});
  Tensor tdy = T(random_normal(N * C, 9), {N, C}), tres = T(random_normal(N * C, 10), {N, C});
  Tensor tout = empty({N, C}), trstd = be.empty({N}, wide(dt), MemoryCategory::Workspace);
  be.rmsnorm_forward(tout, trstd, tx, tw, 1e-5);
  Tensor dx_two = empty({N, C}), dw_two = be.zeros({C}, wide(dt), MemoryCategory::Workspace);
  be.rmsnorm_backward(dx_two, dw_two, tdy, tx, tw, trstd);
  be.add_inplace(dx_two, tres);
  Tensor dx_one = empty({N, C}), dw_one = be.zeros({C}, wide(dt), MemoryCategory::Workspace);
  be.rmsnorm_backward_add(dx_one, dw_one, tdy, tx, tw, trstd, tres);
  EXPECT_EQ(H(dx_one), H(dx_two));
  EXPECT_EQ(H(dw_one), H(dw_two));
}

// ---- SwiGLU ---------------------------------------------------------------------------------

TEST_P(LlamaKernels, SwigluMatchesTheFormula) {
  const int64_t N = 7, F = 587;  // F not a multiple of the vector width
  Vec gate = random_normal(N * F, 11, 3.0);
  gate[0] = 0.0;
  gate[1] = 30.0;   // sigmoid saturated at 1
  gate[2] = -30.0;  // and at 0
  gate = R(gate);
  const Vec up = R(random_normal(N * F, 12)), dy = R(random_normal(N * F, 13));
  Vec out(N * F), dgate(N * F), dup(N * F);
  for (int64_t i = 0; i < N * F; ++i) {
    const double g = gate[i], s = 1.0 / (1.0 + std::exp(-g));
    out[i] = silu(g) * up[i];
    dgate[i] = dy[i] * up[i] * (s + g * s * (1.0 - s));  // d/dg of g * sigmoid(g)
    dup[i] = dy[i] * silu(g);
  }
  Tensor tg = T(gate, {N, F}), tu = T(up, {N, F}), tout = empty({N, F});
  be.swiglu_forward(tout, tg, tu);
  EXPECT_LT(max_relative_error(H(tout), out), activation_tolerance(dt));
  Tensor tdg = empty({N, F}), tdu = empty({N, F});
  be.swiglu_backward(tdg, tdu, T(dy, {N, F}), tg, tu);
  EXPECT_LT(max_relative_error(H(tdg), dgate), activation_tolerance(dt));
  EXPECT_LT(max_relative_error(H(tdu), dup), activation_tolerance(dt));
}

// The packed form (gate's columns then up's in each row of one product) gives the bits of the
// two halves, in place on this backend and through the front's default (copies out and back,
// which the CUDA backend runs), which CountingBackend, overriding none of it, takes.
TEST_P(LlamaKernels, SwigluPackedIsTheHalvesBitForBit) {
  const int64_t N = 5, F = 37;
  const Vec gate = R(random_normal(N * F, 31, 3.0)), up = R(random_normal(N * F, 32)),
            dy = R(random_normal(N * F, 33));
  Vec packed(N * 2 * F);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < F; ++c) {
      packed[r * 2 * F + c] = gate[r * F + c];
      packed[r * 2 * F + F + c] = up[r * F + c];
    }
  Tensor out = empty({N, F}), dgate = empty({N, F}), dup = empty({N, F});
  be.swiglu_forward(out, T(gate, {N, F}), T(up, {N, F}));
  be.swiglu_backward(dgate, dup, T(dy, {N, F}), T(gate, {N, F}), T(up, {N, F}));
  Vec want_grad(N * 2 * F);
  const Vec dg = H(dgate), du = H(dup);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < F; ++c) {
      want_grad[r * 2 * F + c] = dg[r * F + c];
      want_grad[r * 2 * F + F + c] = du[r * F + c];
    }
  testing::CountingBackend by_default(2);
  for (Backend* b : std::initializer_list<Backend*>{&be, &by_default}) {
    SCOPED_TRACE(b->name());
    Tensor gu = make_tensor(*b, packed, {N, 2 * F}, dt);
    Tensor o = b->empty({N, F}, dt, MemoryCategory::Workspace);
    b->swiglu_forward_packed(o, gu);
    EXPECT_EQ(to_host(*b, o), H(out));
    Tensor dgu = b->empty({N, 2 * F}, dt, MemoryCategory::Workspace);
    b->swiglu_backward_packed(dgu, make_tensor(*b, dy, {N, F}, dt), gu);
    EXPECT_EQ(to_host(*b, dgu), want_grad);
  }
  Tensor wrong = empty({N, F + 1});
  EXPECT_THROW(be.swiglu_forward_packed(wrong, T(packed, {N, 2 * F})), std::invalid_argument);
}

// ---- rotary ---------------------------------------------------------------------------------

// A packed row of (q: 4 heads, k: 2 heads, v: 2 heads) x head_dim 8; q and k rotate in one call
// from column 0, v stays. Positions are not contiguous (a context-parallel rank's two chunks).
struct RotaryCase {
  int64_t N = 6, D = 8, heads = 6, width = 8 * 8;
  std::vector<int32_t> positions{0, 1, 2, 13, 14, 15};
  Vec inv_freq = rope_inverse_frequencies(8, RopeFrequencies{10000.0, {}});
};

TEST_P(LlamaKernels, RotaryMatchesHuggingFacesRotateHalf) {
  const RotaryCase k;
  const Vec x = R(random_normal(k.N * k.width, 14));
  Vec want = x;
  for (int64_t n = 0; n < k.N; ++n)
    for (int64_t h = 0; h < k.heads; ++h)
      rotate_reference(&want[n * k.width + h * k.D], k.D, k.positions[n], k.inv_freq);
  const RotaryTable table = make_rotary_table(be, k.inv_freq, 16, dt, MemoryCategory::Workspace);
  Tensor tx = T(x, {k.N, k.width}), pos = testing::make_tokens(be, k.positions);
  be.rotary_forward(tx, pos, table.cos, table.sin, {0, k.heads, k.D});
  const Vec got = H(tx);
  EXPECT_LT(max_relative_error(got, want), activation_tolerance(dt));
  // v, the columns after the rotated heads, keeps its bits.
  for (int64_t n = 0; n < k.N; ++n)
    for (int64_t c = k.heads * k.D; c < k.width; ++c)
      ASSERT_EQ(got[n * k.width + c], x[n * k.width + c]) << "row " << n << " column " << c;
}

// Backward is the transpose, i.e. the inverse rotation: forward then backward gives x back, to
// round-off in fp64 and fp32 (two roundings of each element in bf16).
TEST_P(LlamaKernels, RotaryBackwardUndoesForward) {
  const RotaryCase k;
  const Vec x = R(random_normal(k.N * k.width, 15));
  const RotaryTable table = make_rotary_table(be, k.inv_freq, 16, dt, MemoryCategory::Workspace);
  Tensor tx = T(x, {k.N, k.width}), pos = testing::make_tokens(be, k.positions);
  // k alone this time: heads 4 and 5, from column 4 * D.
  const Backend::RotaryHeads keys{4 * k.D, 2, k.D};
  be.rotary_forward(tx, pos, table.cos, table.sin, keys);
  EXPECT_GT(max_relative_error(H(tx), x), 1e-3);  // it did turn
  be.rotary_backward(tx, pos, table.cos, table.sin, keys);
  EXPECT_LT(max_relative_error(H(tx), x), dt == DType::F64   ? 1e-14
                                          : dt == DType::F32 ? 1e-6
                                                             : 2 * kBf16Output);
}

// Heads `stride` apart (multi-head latent attention's rope tails: the last D channels of each
// nope + D query head): one call with the stride has the bits of one call per head, and the
// channels between the rotated heads keep theirs. Forward and backward.
TEST_P(LlamaKernels, RotaryWithAStrideIsOneCallPerHead) {
  const RotaryCase k;
  const int64_t nope = 6, stride = nope + k.D, heads = 3, width = heads * stride + 5;
  const Vec x = R(random_normal(k.N * width, 16));
  const RotaryTable table = make_rotary_table(be, k.inv_freq, 16, dt, MemoryCategory::Workspace);
  Tensor pos = testing::make_tokens(be, k.positions);
  for (const bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "backward" : "forward");
    auto rotate = [&](Tensor& t, const Backend::RotaryHeads& where) {
      if (backward)
        be.rotary_backward(t, pos, table.cos, table.sin, where);
      else
        be.rotary_forward(t, pos, table.cos, table.sin, where);
    };
    Tensor strided = T(x, {k.N, width}), per_head = T(x, {k.N, width});
    rotate(strided, {nope, heads, k.D, stride});
    for (int64_t h = 0; h < heads; ++h) rotate(per_head, {nope + h * stride, 1, k.D});
    const Vec got = H(strided);
    EXPECT_EQ(got, H(per_head));
    EXPECT_GT(max_relative_error(got, x), 1e-3);  // it did turn
    for (int64_t n = 0; n < k.N; ++n)
      for (int64_t c = 0; c < width; ++c) {
        if (c < heads * stride && c % stride >= nope) continue;  // a rotated channel
        ASSERT_EQ(got[n * width + c], x[n * width + c]) << "row " << n << " column " << c;
      }
  }
}

TEST_P(LlamaKernels, RotaryRefusesAPositionOutsideItsTable) {
  const RotaryCase k;
  const RotaryTable table = make_rotary_table(be, k.inv_freq, 15, dt, MemoryCategory::Workspace);
  Tensor tx = T(Vec(k.N * k.width, 1.0), {k.N, k.width});
  Tensor pos = testing::make_tokens(be, k.positions);  // 15 at row 5: one past the table
  try {
    be.rotary_forward(tx, pos, table.cos, table.sin, {0, k.heads, k.D});
    ADD_FAILURE() << "not refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rotary_forward: position 15 of row 5 is outside the "
                                         "rotary table's 15 positions"),
              std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LlamaKernels,
                         ::testing::Values(DType::F64, DType::F32, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// ---- fp64 backward passes against finite differences of the forward passes -------------------

class LlamaGradients : public ::testing::Test {
 protected:
  CpuBackend be{2};
  Tensor T(const Vec& v, Shape s) { return make_tensor(be, v, s, DType::F64); }
  Tensor empty(Shape s) { return be.empty(s, DType::F64, MemoryCategory::Workspace); }
  Vec H(const Tensor& t) { return to_host(be, t); }
};

constexpr double kFiniteDifference = 1e-7;

TEST_F(LlamaGradients, RmsNorm) {
  const int64_t N = 5, C = 12;
  const double eps = 1e-5;
  const Vec x = random_normal(N * C, 21), w = random_normal(C, 22), dy = random_normal(N * C, 23);
  const auto forward = [&](const Vec& xs, const Vec& ws) {
    Tensor out = empty({N, C}), rstd = empty({N});
    be.rmsnorm_forward(out, rstd, T(xs, {N, C}), T(ws, {C}), eps);
    return H(out);
  };
  Tensor tx = T(x, {N, C}), tw = T(w, {C}), out = empty({N, C}), rstd = empty({N});
  be.rmsnorm_forward(out, rstd, tx, tw, eps);
  Tensor dx = empty({N, C}), dw = be.zeros({C}, DType::F64, MemoryCategory::Workspace);
  be.rmsnorm_backward(dx, dw, T(dy, {N, C}), tx, tw, rstd);
  EXPECT_LT(max_relative_error(H(dx), finite_difference([&](const Vec& v) { return forward(v, w); },
                                                         x, dy)),
            kFiniteDifference);
  EXPECT_LT(max_relative_error(H(dw), finite_difference([&](const Vec& v) { return forward(x, v); },
                                                         w, dy)),
            kFiniteDifference);
}

TEST_F(LlamaGradients, Swiglu) {
  const int64_t N = 4, F = 10;
  const Vec gate = random_normal(N * F, 24, 2.0), up = random_normal(N * F, 25),
            dy = random_normal(N * F, 26);
  const auto forward = [&](const Vec& g, const Vec& u) {
    Tensor out = empty({N, F});
    be.swiglu_forward(out, T(g, {N, F}), T(u, {N, F}));
    return H(out);
  };
  Tensor dgate = empty({N, F}), dup = empty({N, F});
  be.swiglu_backward(dgate, dup, T(dy, {N, F}), T(gate, {N, F}), T(up, {N, F}));
  EXPECT_LT(max_relative_error(H(dgate), finite_difference(
                                             [&](const Vec& v) { return forward(v, up); }, gate, dy)),
            kFiniteDifference);
  EXPECT_LT(max_relative_error(H(dup), finite_difference(
                                           [&](const Vec& v) { return forward(gate, v); }, up, dy)),
            kFiniteDifference);
}

TEST_F(LlamaGradients, Rotary) {
  const RotaryCase k;
  const RotaryTable table = make_rotary_table(be, k.inv_freq, 16, DType::F64,
                                              MemoryCategory::Workspace);
  Tensor pos = testing::make_tokens(be, k.positions);
  const Backend::RotaryHeads qk{0, k.heads, k.D};
  const Vec x = random_normal(k.N * k.width, 27), dy = random_normal(k.N * k.width, 28);
  const auto forward = [&](const Vec& xs) {
    Tensor t = T(xs, {k.N, k.width});
    be.rotary_forward(t, pos, table.cos, table.sin, qk);
    return H(t);
  };
  Tensor dx = T(dy, {k.N, k.width});
  be.rotary_backward(dx, pos, table.cos, table.sin, qk);
  EXPECT_LT(max_relative_error(H(dx), finite_difference(forward, x, dy)), kFiniteDifference);
}

// ---- the angle table ------------------------------------------------------------------------

// Hugging Face's rope_type "llama3" (modeling_rope_utils.py), restated from its description:
// wavelengths above original / low_freq_factor are divided by factor, then the band between
// original / high_freq_factor and original / low_freq_factor takes the smoothed blend.
Vec hf_llama3_inv_freq(int64_t dim, double theta, double factor, double low, double high,
                       double original) {
  Vec out;
  for (int64_t j = 0; j < dim; j += 2) {
    const double inv = std::pow(theta, -static_cast<double>(j) / static_cast<double>(dim));
    const double wavelen = 2 * std::numbers::pi / inv;
    double scaled = wavelen > original / low ? inv / factor : inv;
    const bool medium = !(wavelen < original / high) && !(wavelen > original / low);
    const double smooth = (original / wavelen - low) / (high - low);
    if (medium) scaled = (1 - smooth) * scaled / factor + smooth * scaled;
    out.push_back(scaled);
  }
  return out;
}

TEST(RopeFrequencies, DefaultIsThetaToTheMinusTwoIOverD) {
  const Vec f = rope_inverse_frequencies(128, RopeFrequencies{500000.0, {}});
  ASSERT_EQ(f.size(), 64u);
  EXPECT_EQ(f[0], 1.0);
  EXPECT_NEAR(f[1], 1.0 / std::pow(500000.0, 2.0 / 128), 1e-17);
  EXPECT_NEAR(f[63], 1.0 / std::pow(500000.0, 126.0 / 128), 1e-22);
}

TEST(RopeFrequencies, Llama3ScalingMatchesHuggingFace) {
  struct Model {
    const char* name;
    int64_t head_dim;
    double factor;
  };
  // Llama 3.1 (8B, 70B, 405B) and Llama 3.2 (1B, 3B): theta 500000, low 1, high 4, 8192.
  for (const Model m : {Model{"llama-3.1", 128, 8.0}, Model{"llama-3.2", 64, 32.0}}) {
    const Vec want = hf_llama3_inv_freq(m.head_dim, 500000.0, m.factor, 1.0, 4.0, 8192.0);
    const Vec got = rope_inverse_frequencies(
        m.head_dim, RopeFrequencies{500000.0, Llama3RopeScaling{m.factor, 1.0, 4.0, 8192}});
    ASSERT_EQ(got.size(), want.size()) << m.name;
    int kept = 0, divided = 0, blended = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-15 * want[i]) << m.name << " i=" << i;
      const double plain = std::pow(500000.0, -2.0 * i / m.head_dim);
      if (got[i] == plain) ++kept;
      else if (std::abs(got[i] - plain / m.factor) < 1e-15 * plain) ++divided;
      else ++blended;
    }
    // All three bands occur: short wavelengths kept, long ones divided, a few blended.
    EXPECT_GT(kept, 0) << m.name;
    EXPECT_GT(divided, 0) << m.name;
    EXPECT_GT(blended, 0) << m.name;
  }
}

// Llama 3.1's table at a few channel pairs, as Hugging Face's formula gives them in fp64 (a
// Python transcription of _compute_llama3_parameters, run once): pair 0 kept, 29 to 34 blended
// (wavelengths between 2048 and 8192 tokens), 35 and above divided by 8.
TEST(RopeFrequencies, Llama31SpotValues) {
  const Vec f = rope_inverse_frequencies(
      128, RopeFrequencies{500000.0, Llama3RopeScaling{8.0, 1.0, 4.0, 8192}});
  const std::pair<int, double> want[] = {{0, 1.0},
                                         {29, 0.002166570763503359},
                                         {30, 0.0013718935677611381},
                                         {34, 0.00017850781276799638},
                                         {35, 9.556212353964683e-05},
                                         {63, 3.068925988914511e-07}};
  for (const auto& [i, v] : want) EXPECT_NEAR(f[i], v, 1e-14 * v) << "pair " << i;
}

TEST(RopeFrequencies, RefusesSettingsWithWhatWouldBeAccepted) {
  const auto refused = [](int64_t head_dim, const RopeFrequencies& rope, const char* words) {
    try {
      rope_inverse_frequencies(head_dim, rope);
      ADD_FAILURE() << "not refused: " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(127, {}, "head_dim = 127 is not accepted (an even number > 0");
  refused(64, RopeFrequencies{0.0, {}}, "rope_theta = 0 is not accepted");
  refused(64, RopeFrequencies{5e5, Llama3RopeScaling{0.0, 1.0, 4.0, 8192}},
          "rope_scaling.factor = 0");
  refused(64, RopeFrequencies{5e5, Llama3RopeScaling{8.0, 4.0, 4.0, 8192}},
          "rope_scaling.high_freq_factor = 4 is not accepted (a number above low_freq_factor 4");
  refused(64, RopeFrequencies{5e5, Llama3RopeScaling{8.0, 1.0, 4.0, 0}},
          "rope_scaling.original_max_position_embeddings = 0");
}

// The table holds cos and sin of p * inv_freq computed in fp64: exact to round-off in fp64,
// rounded once in fp32, also at long positions where an fp32 product would be off.
TEST(RotaryTable, HoldsTheAnglesOfEveryPosition) {
  CpuBackend be(1);
  const Vec inv_freq = rope_inverse_frequencies(
      16, RopeFrequencies{500000.0, Llama3RopeScaling{8.0, 1.0, 4.0, 8192}});
  const int64_t P = 70000, half = 8;
  for (const DType dt : {DType::F64, DType::F32, DType::BF16}) {
    const RotaryTable t = make_rotary_table(be, inv_freq, P, dt, MemoryCategory::Workspace);
    EXPECT_EQ(t.cos.dtype(), wide(dt));
    EXPECT_EQ(t.cos.shape(), (Shape{P, half}));
    const Vec cos = to_host(be, t.cos), sin = to_host(be, t.sin);
    for (const int64_t p : {int64_t{0}, int64_t{1}, int64_t{8191}, P - 1})
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(p) * inv_freq[i];
        const double tol = dt == DType::F64 ? 0.0 : 6e-8;  // one fp32 rounding of a value <= 1
        EXPECT_NEAR(cos[p * half + i], std::cos(angle), tol) << "p " << p << " i " << i;
        EXPECT_NEAR(sin[p * half + i], std::sin(angle), tol) << "p " << p << " i " << i;
      }
  }
}

// The planner's dry run (Execution::Plan) passes every call through the front's checks and makes
// the allocations a step would make (rmsnorm_backward's per-thread dweight partials, the rotary
// table), with no data to compute on.
TEST(LlamaKernelsPlanning, ChecksAndAllocatesWithoutComputing) {
  CpuBackend be(2, Execution::Plan);
  const int64_t N = 64, C = 128, F = 96, D = 16;  // sizes that are whole 512-byte granules
  const DType d = DType::BF16;
  const auto make = [&](Shape s, DType t) { return be.empty(s, t, MemoryCategory::Activations); };
  Tensor x = make({N, C}, d), out = make({N, C}, d), w = make({C}, d), rstd = make({N}, DType::F32);
  Tensor dw = make({C}, DType::F32);
  be.rmsnorm_forward(out, rstd, x, w, 1e-5);
  be.memory().reset_peaks();
  be.rmsnorm_backward(out, dw, out, x, w, rstd);
  EXPECT_EQ(be.memory().peak(MemoryCategory::Workspace), size_t{2} * C * sizeof(float));
  be.rmsnorm_backward_add(out, dw, out, x, w, rstd, x);
  Tensor gate = make({N, F}, d), up = make({N, F}, d), h = make({N, F}, d);
  be.swiglu_forward(h, gate, up);
  be.swiglu_backward(gate, up, h, gate, up);
  Tensor gate_up = make({N, 2 * F}, d);
  be.swiglu_forward_packed(h, gate_up);
  be.swiglu_backward_packed(gate_up, h, gate_up);
  const RotaryTable t = make_rotary_table(be, rope_inverse_frequencies(D, {}), 128, d,
                                          MemoryCategory::Parameters);
  EXPECT_EQ(be.memory().current(MemoryCategory::Parameters), size_t{2} * 128 * (D / 2) * 4);
  Tensor positions = make({N}, DType::I32);  // planned: no values to check against the table
  be.rotary_forward(x, positions, t.cos, t.sin, {0, 2, D});
  be.rotary_backward(x, positions, t.cos, t.sin, {0, 2, D});
  EXPECT_THROW(be.rotary_forward(x, positions, t.cos, t.sin, {C - D / 2, 1, D}), std::invalid_argument);
}

}  // namespace
}  // namespace meshtrain
