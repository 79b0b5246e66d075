// Grouped-query attention on the CPU backend (backend.h: qkv rows of NH + 2 KVH heads, query head
// h reading key/value head h / (NH / KVH)), on every path: the training forward and backward
// (oneDNN batched and OpenBLAS per-head), the ring-attention blocks and decode. The reference
// here repeats each key/value head over its group explicitly (the kernels must not; the test may)
// and runs the multi-head reference of reference_kernels.h, folding the repeated heads'
// gradients back by summing over each group. KVH == NH is the path GPT-2 takes: the existing
// attention tests (cpu_kernels_test, cpu_bf16_test, attention_blocks_test) and the layout
// parity tests cover it unchanged.
//
// Tolerances, relative to the reference's largest magnitude:
//  - fp64: 1e-12 (the same sums in another order);
//  - fp32: 2e-5 (cpu_kernels_test.cpp's bound for sums of a few hundred fp32 terms; a group sum
//    adds G = NH / KVH <= 4 such sums, in fp32);
//  - bf16 on bf16-rounded inputs against the double reference: 1e-2, cpu_bf16_test.cpp's attention
//    bound. The probabilities and dS are rounded to bf16 as GEMM operands (2^-9 relative each)
//    and every output once on store (2^-9); a key/value head's gradient is summed over its group
//    in fp32 and rounded once, so grouping adds no rounding beyond the multi-head case. The ring
//    blocks round out, dK and dV at each of up to 2n merges (attention_blocks_test.cpp's 1e-2).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/cpu/gemm.h"
#include "meshtrain/tensor/bf16.h"
#include "support/random.h"
#include "support/reference_kernels.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using testing::make_tensor;
using testing::max_relative_error;
using testing::random_normal;
using testing::to_host;
using Vec = std::vector<double>;
using Block = Backend::AttentionBlock;

struct Case {
  int64_t B, T, NH, KVH, HS;
  int64_t G() const { return NH / KVH; }
  int64_t W() const { return (NH + 2 * KVH) * HS; }  // a qkv row
  int64_t C() const { return NH * HS; }
  int64_t N() const { return B * T; }
  std::string name() const {
    return "B" + std::to_string(B) + "_T" + std::to_string(T) + "_NH" + std::to_string(NH) +
           "_KVH" + std::to_string(KVH) + "_HS" + std::to_string(HS);
  }
};

// T = 70 crosses the per-head kernel's 64-row causal tiles; KVH 2 and 1 (multi-query) of NH 4.
const Case kCases[] = {{2, 7, 4, 2, 4}, {1, 70, 4, 1, 8}, {2, 9, 6, 3, 4}};

double tolerance(DType t) {
  switch (t) {
    case DType::F64: return 1e-12;
    case DType::F32: return 2e-5;
    default: return 1e-2;
  }
}

Vec in_bf16(Vec v) {
  for (double& x : v) x = bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(x)));
  return v;
}

// The reference's view: every query head with its own copy of its group's key/value head,
// (B, T, 3, NH, HS).
Vec repeat_kv(const Case& c, const Vec& qkv) {
  const int64_t C = c.C();
  Vec full(c.N() * 3 * C);
  for (int64_t n = 0; n < c.N(); ++n)
    for (int64_t h = 0; h < c.NH; ++h)
      for (int64_t d = 0; d < c.HS; ++d) {
        const double* row = qkv.data() + n * c.W();
        const int64_t g = h / c.G();
        full[(n * 3 + 0) * C + h * c.HS + d] = row[h * c.HS + d];
        full[(n * 3 + 1) * C + h * c.HS + d] = row[(c.NH + g) * c.HS + d];
        full[(n * 3 + 2) * C + h * c.HS + d] = row[(c.NH + c.KVH + g) * c.HS + d];
      }
  return full;
}

// The gradient of the repeated view folded back onto the grouped one: dQ as is, dK and dV of a
// key/value head summed over its group.
Vec fold_kv(const Case& c, const Vec& dfull) {
  const int64_t C = c.C();
  Vec d(c.N() * c.W(), 0.0);
  for (int64_t n = 0; n < c.N(); ++n)
    for (int64_t h = 0; h < c.NH; ++h)
      for (int64_t e = 0; e < c.HS; ++e) {
        double* row = d.data() + n * c.W();
        const int64_t g = h / c.G();
        row[h * c.HS + e] = dfull[(n * 3 + 0) * C + h * c.HS + e];
        row[(c.NH + g) * c.HS + e] += dfull[(n * 3 + 1) * C + h * c.HS + e];
        row[(c.NH + c.KVH + g) * c.HS + e] += dfull[(n * 3 + 2) * C + h * c.HS + e];
      }
  return d;
}

struct Reference {
  Vec out, probs, dqkv;
};
Reference reference_attention(const Case& c, const Vec& qkv, const Vec& dout) {
  const Vec full = repeat_kv(c, qkv);
  Reference r;
  Vec dfull;
  reference::attention_forward(r.out, r.probs, full, c.B, c.T, c.NH, c.HS);
  reference::attention_backward(dfull, dout, full, c.B, c.T, c.NH, c.HS);
  r.dqkv = fold_kv(c, dfull);
  return r;
}

struct Kernel {
  Vec out, dqkv;
};
Kernel kernel_attention(CpuBackend& be, DType dt, const Case& c, const Vec& qkv, const Vec& dout) {
  Tensor tqkv = make_tensor(be, qkv, {c.N(), c.W()}, dt);
  Tensor out = be.empty({c.N(), c.C()}, dt, MemoryCategory::Workspace);
  Tensor stash = testing::attention_stash(be, c.B, c.T, c.NH, dt);
  be.attention_forward(out, stash, tqkv, c.B, c.T, c.NH, c.KVH, c.HS);
  Tensor dqkv = be.empty({c.N(), c.W()}, dt, MemoryCategory::Workspace);
  be.attention_backward(dqkv, make_tensor(be, dout, {c.N(), c.C()}, dt), tqkv, out, stash, c.B,
                        c.T, c.NH, c.KVH, c.HS);
  return {to_host(be, out), to_host(be, dqkv)};
}

class GqaAttention : public ::testing::TestWithParam<DType> {};

TEST_P(GqaAttention, TrainingPathMatchesRepeatedKeysValues) {
  const DType dt = GetParam();
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name());
    Vec qkv = random_normal(c.N() * c.W(), 31), dout = random_normal(c.N() * c.C(), 32);
    if (dt == DType::BF16) qkv = in_bf16(qkv), dout = in_bf16(dout);
    const Reference want = reference_attention(c, qkv, dout);
    CpuBackend be(2);
    // Both CPU product libraries: oneDNN (Auto) and OpenBLAS (fp64 always takes it; bf16 has no
    // OpenBLAS path).
    std::vector<cpu::GemmLibrary> libraries{cpu::GemmLibrary::Auto};
    if (dt == DType::F32) libraries.push_back(cpu::GemmLibrary::OpenBlas);
    for (cpu::GemmLibrary library : libraries) {
      SCOPED_TRACE(std::string(cpu::gemm_library_name(library)));
      be.gemm().set_library(library);
      const Kernel got = kernel_attention(be, dt, c, qkv, dout);
      EXPECT_LT(max_relative_error(got.out, want.out), tolerance(dt));
      EXPECT_LT(max_relative_error(got.dqkv, want.dqkv), tolerance(dt));
      // The group sums run in a fixed order: a second call gives the same bits.
      EXPECT_EQ(kernel_attention(be, dt, c, qkv, dout).dqkv, got.dqkv);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GqaAttention,
                         ::testing::Values(DType::F64, DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The backward against central finite differences of L = sum(out * w), in fp64, independently of
// the reference's analytic backward: every key and value element and a stride of query elements.
TEST(GqaAttentionGradient, MatchesFiniteDifferences) {
  for (const Case& c : {Case{1, 5, 4, 2, 3}, Case{2, 4, 4, 1, 3}}) {
    SCOPED_TRACE(c.name());
    CpuBackend be(2);
    const Vec qkv = random_normal(c.N() * c.W(), 41), w = random_normal(c.N() * c.C(), 42);
    auto loss = [&](const Vec& x) {
      const Kernel k = kernel_attention(be, DType::F64, c, x, w);
      double sum = 0;
      for (size_t i = 0; i < w.size(); ++i) sum += k.out[i] * w[i];
      return sum;
    };
    const Vec grad = kernel_attention(be, DType::F64, c, qkv, w).dqkv;
    const double eps = 1e-6;
    double worst = 0, scale = 1e-12;
    for (int64_t i = 0; i < static_cast<int64_t>(qkv.size()); ++i) {
      const bool key_or_value = i % c.W() >= c.C();
      if (!key_or_value && i % 3 != 0) continue;
      Vec plus = qkv, minus = qkv;
      plus[i] += eps;
      minus[i] -= eps;
      const double fd = (loss(plus) - loss(minus)) / (2 * eps);
      worst = std::max(worst, std::abs(fd - grad[i]));
      scale = std::max(scale, std::abs(fd));
    }
    // Central differences: O(eps^2) truncation plus ~1e-16 / eps rounding of L.
    EXPECT_LT(worst / scale, 1e-7);
  }
}

// Ring-attention blocks with kv rows of 2 KVH heads, the causal lower triangle of 2n chunk pairs
// in shuffled orders, against the one-shot attention (as attention_blocks_test.cpp for KVH == NH).
TEST_P(GqaAttention, RingBlocksMergeToTheFullAttention) {
  const DType dt = GetParam();
  for (const Case& c : {Case{2, 12, 4, 2, 4}, Case{1, 8, 4, 1, 8}}) {
    SCOPED_TRACE(c.name());
    const int64_t chunks = 4, L = c.T / chunks, KC = c.KVH * c.HS;
    Vec qkv = random_normal(c.N() * c.W(), 51), dout = random_normal(c.N() * c.C(), 52);
    if (dt == DType::BF16) qkv = in_bf16(qkv), dout = in_bf16(dout);
    const Reference want = reference_attention(c, qkv, dout);
    CpuBackend be(2);
    Tensor tqkv = make_tensor(be, qkv, {c.N(), c.W()}, dt);
    Tensor kv = be.empty({c.N(), 2 * KC}, dt, MemoryCategory::Workspace);
    be.copy_columns(kv, 0, tqkv, c.C(), 2 * KC);
    std::vector<Block> blocks;
    for (int64_t qc = 0; qc < chunks; ++qc)
      for (int64_t kc = 0; kc <= qc; ++kc) blocks.push_back({qc * L, L, kc * L, L, kc == qc});
    std::mt19937 rng(7);
    const DType stats = dt == DType::BF16 ? DType::F32 : dt;
    Tensor out = be.zeros({c.N(), c.C()}, dt, MemoryCategory::Workspace);
    Tensor lse = be.empty({c.B, c.NH, c.T}, stats, MemoryCategory::Workspace);
    be.fill(lse, -std::numeric_limits<double>::infinity());
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (const Block& blk : blocks)
      be.attention_block_forward(out, lse, tqkv, kv, c.B, c.NH, c.KVH, c.HS, blk);
    Tensor dqkv = be.zeros({c.N(), c.W()}, dt, MemoryCategory::Workspace);
    Tensor dkv = be.zeros({c.N(), 2 * KC}, dt, MemoryCategory::Workspace);
    Tensor tdout = make_tensor(be, dout, {c.N(), c.C()}, dt);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (const Block& blk : blocks)
      be.attention_block_backward(dqkv, dkv, tdout, out, lse, tqkv, kv, c.B, c.NH, c.KVH, c.HS,
                                  blk);
    be.copy_columns(dqkv, c.C(), dkv, 0, 2 * KC);
    EXPECT_LT(max_relative_error(to_host(be, out), want.out), tolerance(dt));
    EXPECT_LT(max_relative_error(to_host(be, dqkv), want.dqkv), tolerance(dt));
  }
}

// Decode: the last token's query against caches of KVH heads (KVH, T_max, HS), filled with the
// sequence's keys and values, gives the full forward's last row.
TEST_P(GqaAttention, DecodeMatchesTheFullForwardsLastRow) {
  const DType dt = GetParam();
  const Case c{1, 9, 4, 2, 4};
  const int64_t T_max = 12;
  Vec qkv = random_normal(c.N() * c.W(), 61);
  if (dt == DType::BF16) qkv = in_bf16(qkv);
  const Reference want = reference_attention(c, qkv, Vec(c.N() * c.C(), 0.0));
  Vec k(c.KVH * T_max * c.HS, 0.0), v(k.size(), 0.0), q(c.C());
  for (int64_t g = 0; g < c.KVH; ++g)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t d = 0; d < c.HS; ++d) {
        k[(g * T_max + t) * c.HS + d] = qkv[t * c.W() + (c.NH + g) * c.HS + d];
        v[(g * T_max + t) * c.HS + d] = qkv[t * c.W() + (c.NH + c.KVH + g) * c.HS + d];
      }
  for (int64_t i = 0; i < c.C(); ++i) q[i] = qkv[(c.T - 1) * c.W() + i];
  CpuBackend be(2);
  Tensor out = be.empty({c.NH, c.HS}, dt, MemoryCategory::Workspace);
  be.attention_decode(out, make_tensor(be, q, {c.NH, c.HS}, dt),
                      make_tensor(be, k, {c.KVH, T_max, c.HS}, dt),
                      make_tensor(be, v, {c.KVH, T_max, c.HS}, dt), c.T);
  const Vec last(want.out.end() - c.C(), want.out.end());
  // Computed in double on the host, rounded once on store.
  EXPECT_LT(max_relative_error(to_host(be, out), last), dt == DType::BF16 ? 8e-3 : tolerance(dt));
}

}  // namespace
}  // namespace meshtrain
