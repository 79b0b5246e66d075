// Attention whose value heads differ in size from its query/key heads (HV != HS: multi-head
// latent attention's 192/128), with an explicit softmax scale (backend.h, AttentionDims), on
// the CPU backend's every path — training forward and backward, ring-attention blocks merged
// over several blocks, decode — against a naive fp64 loop written here from the formulas:
//   s_ij = scale q_i . k_j (j <= i),  p = softmax_j s,  out_i = sum_j p_ij v_j,
//   dp_ij = dout_i . v_j,  ds_ij = p_ij (dp_ij - sum_k p_ik dp_ik),
//   dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i,  dv_j = sum_i p_ij dout_i,
// a key/value head's gradients summed over its group of query heads. Every case has HV != HS
// and a scale that is not 1/sqrt(HS), so a kernel that read V as HS wide or ignored the scale
// fails it. Tolerances, relative to the reference's largest magnitude, as gqa_attention_test's:
// fp64 1e-12, fp32 2e-5, bf16 (on bf16-rounded inputs) 1e-2.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "support/random.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using Vec = std::vector<double>;
using testing::make_tensor, testing::max_relative_error, testing::random_normal;
using testing::representable, testing::to_host;

struct Case {
  int64_t B, T, NH, KVH, HS, HV;
  double scale;
  AttentionDims dims() const { return {NH, KVH, HS, HV, scale}; }
  int64_t G() const { return NH / KVH; }
  int64_t W() const { return (NH + KVH) * HS + KVH * HV; }  // a qkv row
  int64_t C() const { return NH * HV; }                     // an out row
  int64_t N() const { return B * T; }
  int64_t q(int64_t h) const { return h * HS; }              // columns of a row's heads
  int64_t k(int64_t g) const { return (NH + g) * HS; }
  int64_t v(int64_t g) const { return (NH + KVH) * HS + g * HV; }
  std::string name() const {
    return "B" + std::to_string(B) + "_T" + std::to_string(T) + "_NH" + std::to_string(NH) +
           "_KVH" + std::to_string(KVH) + "_HS" + std::to_string(HS) + "_HV" + std::to_string(HV);
  }
};

// HV < HS (latent attention's shape) and HV > HS; multi-head, grouped and multi-query; T = 70
// crosses the kernel's 64-row query blocks, T = 530 its 512-key chunks.
const Case kCases[] = {{2, 7, 4, 4, 12, 8, 0.3},
                       {1, 70, 4, 2, 6, 10, 0.2},
                       {2, 9, 3, 1, 8, 4, 0.5},
                       {1, 530, 2, 1, 12, 8, 0.25}};

double tolerance(DType t) {
  switch (t) {
    case DType::F64: return 1e-12;
    case DType::F32: return 2e-5;
    default: return 1e-2;
  }
}

struct Reference {
  Vec out, lse, dqkv;
};

// The naive loop of the header, in double.
Reference reference(const Case& c, const Vec& x, const Vec& dout) {
  Reference r{Vec(c.N() * c.C(), 0.0), Vec(c.B * c.NH * c.T), Vec(c.N() * c.W(), 0.0)};
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.NH; ++h) {
      const int64_t g = h / c.G();
      auto at = [&](int64_t t, int64_t col) { return x[(b * c.T + t) * c.W() + col]; };
      for (int64_t i = 0; i < c.T; ++i) {
        Vec p(i + 1), dp(i + 1);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < c.HS; ++d) s += at(i, c.q(h) + d) * at(j, c.k(g) + d);
          m = std::max(m, p[j] = c.scale * s);
        }
        double sum = 0;
        for (double& e : p) sum += (e = std::exp(e - m));
        for (double& e : p) e /= sum;
        r.lse[(b * c.NH + h) * c.T + i] = m + std::log(sum);
        const int64_t row = b * c.T + i;
        double D = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < c.HV; ++d) {
            r.out[row * c.C() + h * c.HV + d] += p[j] * at(j, c.v(g) + d);
            dot += dout[row * c.C() + h * c.HV + d] * at(j, c.v(g) + d);
          }
          dp[j] = dot;
          D += p[j] * dot;
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - D);
          double* dq = &r.dqkv[row * c.W() + c.q(h)];
          double* dk = &r.dqkv[(b * c.T + j) * c.W() + c.k(g)];
          double* dv = &r.dqkv[(b * c.T + j) * c.W() + c.v(g)];
          for (int64_t d = 0; d < c.HS; ++d) {
            dq[d] += c.scale * ds * at(j, c.k(g) + d);
            dk[d] += c.scale * ds * at(i, c.q(h) + d);
          }
          for (int64_t d = 0; d < c.HV; ++d) dv[d] += p[j] * dout[row * c.C() + h * c.HV + d];
        }
      }
    }
  return r;
}

struct Kernel {
  Vec out, lse, dqkv;
};
Kernel training_path(CpuBackend& be, DType dt, const Case& c, const Vec& qkv, const Vec& dout) {
  Tensor tqkv = make_tensor(be, qkv, {c.N(), c.W()}, dt);
  Tensor out = be.empty({c.N(), c.C()}, dt, MemoryCategory::Workspace);
  const Backend::AttentionStash s = be.attention_stash(c.B, c.T, c.dims(), dt);
  Tensor stash = be.empty(s.shape, s.dtype, MemoryCategory::Workspace);
  be.attention_forward(out, stash, tqkv, c.B, c.T, c.dims());
  Tensor dqkv = be.empty({c.N(), c.W()}, dt, MemoryCategory::Workspace);
  be.attention_backward(dqkv, make_tensor(be, dout, {c.N(), c.C()}, dt), tqkv, out, stash, c.B,
                        c.T, c.dims());
  return {to_host(be, out), to_host(be, stash), to_host(be, dqkv)};
}

class ValueHeads : public ::testing::TestWithParam<DType> {};

TEST_P(ValueHeads, TrainingPathMatchesTheNaiveLoop) {
  const DType dt = GetParam();
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name());
    const Vec qkv = representable(random_normal(c.N() * c.W(), 71), dt);
    const Vec dout = representable(random_normal(c.N() * c.C(), 72), dt);
    const Reference want = reference(c, qkv, dout);
    CpuBackend be(2);
    const Kernel got = training_path(be, dt, c, qkv, dout);
    EXPECT_LT(max_relative_error(got.out, want.out), tolerance(dt));
    EXPECT_LT(max_relative_error(got.lse, want.lse), tolerance(dt));
    EXPECT_LT(max_relative_error(got.dqkv, want.dqkv), tolerance(dt));
  }
}

// Scale 0 is 1/sqrt(HS), the HS of the queries and keys, not of the values.
TEST(ValueHeadsScale, ZeroIsOneOverTheSquareRootOfTheKeyHeadSize) {
  Case c = kCases[0];
  const Vec qkv = random_normal(c.N() * c.W(), 73), dout = random_normal(c.N() * c.C(), 74);
  CpuBackend be(2);
  c.scale = 0.0;
  const Kernel got = training_path(be, DType::F64, c, qkv, dout);
  c.scale = 1.0 / std::sqrt(static_cast<double>(c.HS));
  const Reference want = reference(c, qkv, dout);
  EXPECT_LT(max_relative_error(got.out, want.out), 1e-12);
  EXPECT_LT(max_relative_error(got.dqkv, want.dqkv), 1e-12);
  EXPECT_EQ(AttentionDims{}.value_size(), 0);
  EXPECT_EQ((AttentionDims{1, 1, 16, 0, 0.0}.value_size()), 16);
  EXPECT_EQ((AttentionDims{1, 1, 16, 0, 0.0}.softmax_scale()), 0.25);
  EXPECT_EQ((AttentionDims{1, 1, 16, 4, 0.5}.softmax_scale()), 0.5);
}

// The causal lower triangle of the pairs of `chunks` chunks of L rows: square causal blocks on
// the diagonal, full ones below.
std::vector<Backend::AttentionBlock> chunk_pairs(int64_t L, int64_t chunks) {
  std::vector<Backend::AttentionBlock> pairs;
  for (int64_t qc = 0; qc < chunks; ++qc)
    for (int64_t kc = 0; kc <= qc; ++kc) pairs.push_back({qc * L, L, kc * L, L, kc == qc});
  return pairs;
}

// Ring-attention blocks: kv rows of KVH * HS keys then KVH * HV values (one copy_columns of
// qkv's key and value columns), the causal lower triangle of 4 chunks' pairs in shuffled
// orders, merged by log-sum-exp, against the naive loop.
TEST_P(ValueHeads, RingBlocksMergeToTheNaiveLoop) {
  const DType dt = GetParam();
  for (const Case& c : {Case{2, 12, 4, 2, 6, 4, 0.3}, Case{1, 8, 2, 2, 4, 6, 0.6}}) {
    SCOPED_TRACE(c.name());
    const int64_t chunks = 4, KV = c.KVH * (c.HS + c.HV), Q = c.NH * c.HS;
    const Vec qkv = representable(random_normal(c.N() * c.W(), 77), dt);
    const Vec dout = representable(random_normal(c.N() * c.C(), 78), dt);
    const Reference want = reference(c, qkv, dout);
    CpuBackend be(2);
    std::vector<Backend::AttentionBlock> blocks = chunk_pairs(c.T / chunks, chunks);
    std::mt19937 rng(9);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    Tensor tqkv = make_tensor(be, qkv, {c.N(), c.W()}, dt);
    Tensor kv = be.empty({c.N(), KV}, dt, MemoryCategory::Workspace);
    be.copy_columns(kv, 0, tqkv, Q, KV);
    Tensor out = be.zeros({c.N(), c.C()}, dt, MemoryCategory::Workspace);
    Tensor lse = make_tensor(be, Vec(c.B * c.NH * c.T, -std::numeric_limits<double>::infinity()),
                             {c.B, c.NH, c.T}, dt == DType::BF16 ? DType::F32 : dt);
    for (const Backend::AttentionBlock& blk : blocks)
      be.attention_block_forward(out, lse, tqkv, kv, c.B, c.dims(), blk);
    Tensor dqkv = be.zeros({c.N(), c.W()}, dt, MemoryCategory::Workspace);
    Tensor dkv = be.zeros({c.N(), KV}, dt, MemoryCategory::Workspace);
    Tensor tdout = make_tensor(be, dout, {c.N(), c.C()}, dt);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (const Backend::AttentionBlock& blk : blocks)
      be.attention_block_backward(dqkv, dkv, tdout, out, lse, tqkv, kv, c.B, c.dims(), blk);
    be.copy_columns(dqkv, Q, dkv, 0, KV);
    EXPECT_LT(max_relative_error(to_host(be, out), want.out), tolerance(dt));
    EXPECT_LT(max_relative_error(to_host(be, lse), want.lse), tolerance(dt));
    EXPECT_LT(max_relative_error(to_host(be, dqkv), want.dqkv), tolerance(dt));
  }
}

// Decode: the last token's query against caches k (KVH, T_max, HS) and v (KVH, T_max, HV)
// gives the naive loop's last row, at the explicit scale.
TEST_P(ValueHeads, DecodeMatchesTheNaiveLoopsLastRow) {
  const DType dt = GetParam();
  const Case c{1, 9, 4, 2, 6, 4, 0.35};
  const int64_t T_max = 12;
  const Vec qkv = representable(random_normal(c.N() * c.W(), 79), dt);
  const Reference want = reference(c, qkv, Vec(c.N() * c.C(), 0.0));
  Vec k(c.KVH * T_max * c.HS, 0.0), v(c.KVH * T_max * c.HV, 0.0), q(c.NH * c.HS);
  for (int64_t g = 0; g < c.KVH; ++g)
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t d = 0; d < c.HS; ++d)
        k[(g * T_max + t) * c.HS + d] = qkv[t * c.W() + c.k(g) + d];
      for (int64_t d = 0; d < c.HV; ++d)
        v[(g * T_max + t) * c.HV + d] = qkv[t * c.W() + c.v(g) + d];
    }
  for (int64_t i = 0; i < c.NH * c.HS; ++i) q[i] = qkv[(c.T - 1) * c.W() + i];
  CpuBackend be(2);
  Tensor out = be.empty({c.NH, c.HV}, dt, MemoryCategory::Workspace);
  be.attention_decode(out, make_tensor(be, q, {c.NH, c.HS}, dt),
                      make_tensor(be, k, {c.KVH, T_max, c.HS}, dt),
                      make_tensor(be, v, {c.KVH, T_max, c.HV}, dt), c.T, c.scale);
  const Vec last(want.out.end() - c.C(), want.out.end());
  // Computed in double on the host, rounded once on store.
  EXPECT_LT(max_relative_error(to_host(be, out), last), dt == DType::BF16 ? 8e-3 : tolerance(dt));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ValueHeads, ::testing::Values(DType::F64, DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace meshtrain
