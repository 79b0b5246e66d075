// The CPU backend's ring-attention blocks (backend.h: attention_block_forward/backward,
// copy_columns) against its full causal attention (attention_forward/backward, checked against
// the naive reference in cpu_kernels_test.cpp). The sequence is cut into 2n chunks; every pair
// (query chunk qc, key chunk kc <= qc) is one block, causal on the diagonal, run in a shuffled
// order (the log-sum-exp merge must not depend on it). Tolerances, relative to the reference's
// largest magnitude, in one table:
//  - fp64: 1e-12 (the same sums in another order);
//  - fp32: 1e-5 (fp32 sums over at most a few hundred terms, as cpu_kernels_test.cpp's 2e-5);
//  - bf16 against the fp32 reference on the same bf16-rounded inputs: the blocks compute in
//    fp32, but out is rounded to bf16 at each merge and dQ, dK, dV at each accumulation, up to
//    2n = 6 times per row, at most 2^-8 = 3.9e-3 of the value each: measured 2-3e-3, held to
//    1e-2 (cpu_bf16_test.cpp's attention bound).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/tensor/bf16.h"
#include "support/random.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using testing::make_tensor;
using testing::max_relative_error;
using testing::random_normal;
using testing::to_host;
using Vec = std::vector<double>;
using Block = Backend::AttentionBlock;

double tolerance(DType t) {
  switch (t) {
    case DType::F64: return 1e-12;
    case DType::F32: return 1e-5;
    default: return 1e-2;
  }
}
DType stats(DType t) { return t == DType::BF16 ? DType::F32 : t; }

struct Case {
  int64_t B, T, NH, HS;
  int n;  // the sequence is cut into 2n chunks
  std::string name() const {
    return "B" + std::to_string(B) + "_T" + std::to_string(T) + "_NH" + std::to_string(NH) +
           "_HS" + std::to_string(HS) + "_chunks" + std::to_string(2 * n);
  }
};

struct Result {
  Vec out, lse, dqkv;
};

// The full causal attention (out, dqkv) and lse = log sum_j<=i exp(scale q_i k_j), computed in
// double from the values as stored.
Result full_attention(CpuBackend& be, DType dt, const Case& c, const Vec& qkv, const Vec& dout) {
  const int64_t C = c.NH * c.HS, N = c.B * c.T;
  Tensor tqkv = make_tensor(be, qkv, {N, 3 * C}, dt);
  Tensor tout = be.empty({N, C}, dt, MemoryCategory::Workspace);
  Tensor stash = testing::attention_stash(be, c.B, c.T, c.NH, dt);
  be.attention_forward(tout, stash, tqkv, c.B, c.T, c.NH, c.NH, c.HS);
  Tensor tdqkv = be.empty({N, 3 * C}, dt, MemoryCategory::Workspace);
  be.attention_backward(tdqkv, make_tensor(be, dout, {N, C}, dt), tqkv, tout, stash, c.B, c.T,
                        c.NH, c.NH, c.HS);
  Result r{to_host(be, tout), Vec(c.B * c.NH * c.T), to_host(be, tdqkv)};
  const Vec x = to_host(be, tqkv);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.HS));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.NH; ++h)
      for (int64_t i = 0; i < c.T; ++i) {
        Vec s(i + 1);
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < c.HS; ++d)
            dot += x[(b * c.T + i) * 3 * C + h * c.HS + d] *
                   x[(b * c.T + j) * 3 * C + C + h * c.HS + d];
          s[j] = scale * dot;
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double v : s) sum += std::exp(v - m);
        r.lse[(b * c.NH + h) * c.T + i] = m + std::log(sum);
      }
  return r;
}

// The same from blocks: K and V packed into kv with copy_columns, the causal lower triangle of
// chunk pairs in a shuffled order forward and another backward; dK and dV copied back into
// dqkv's columns [C, 3C).
Result ring_blocks(CpuBackend& be, DType dt, const Case& c, const Vec& qkv, const Vec& dout,
                   uint32_t seed) {
  const int64_t C = c.NH * c.HS, N = c.B * c.T, chunks = 2 * c.n, L = c.T / chunks;
  Tensor tqkv = make_tensor(be, qkv, {N, 3 * C}, dt);
  Tensor kv = be.empty({N, 2 * C}, dt, MemoryCategory::Workspace);
  be.copy_columns(kv, 0, tqkv, C, 2 * C);
  std::vector<Block> blocks;
  for (int64_t qc = 0; qc < chunks; ++qc)
    for (int64_t kc = 0; kc <= qc; ++kc) blocks.push_back({qc * L, L, kc * L, L, kc == qc});
  std::mt19937 rng(seed);

  Tensor out = be.zeros({N, C}, dt, MemoryCategory::Workspace);
  Tensor lse = be.empty({c.B, c.NH, c.T}, stats(dt), MemoryCategory::Workspace);
  be.fill(lse, -std::numeric_limits<double>::infinity());
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (const Block& blk : blocks)
    be.attention_block_forward(out, lse, tqkv, kv, c.B, c.NH, c.NH, c.HS, blk);

  Tensor dqkv = be.zeros({N, 3 * C}, dt, MemoryCategory::Workspace);
  Tensor dkv = be.zeros({N, 2 * C}, dt, MemoryCategory::Workspace);
  Tensor tdout = make_tensor(be, dout, {N, C}, dt);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (const Block& blk : blocks)
    be.attention_block_backward(dqkv, dkv, tdout, out, lse, tqkv, kv, c.B, c.NH, c.NH, c.HS, blk);
  be.copy_columns(dqkv, C, dkv, 0, 2 * C);
  return {to_host(be, out), to_host(be, lse), to_host(be, dqkv)};
}

Vec in_bf16(Vec v) {
  for (double& x : v) x = bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(x)));
  return v;
}

class AttentionBlocks : public ::testing::TestWithParam<DType> {};

TEST_P(AttentionBlocks, MatchFullCausalAttentionInAnyOrder) {
  const DType dt = GetParam();
  // T = 300 in two chunks of 150: the kernels' 64-row tiles with a ragged edge, causal too.
  for (const Case c : {Case{2, 48, 3, 8, 2}, Case{2, 48, 3, 8, 3}, Case{1, 300, 2, 16, 1}}) {
    SCOPED_TRACE(c.name());
    CpuBackend be(2);
    const int64_t C = c.NH * c.HS;
    Vec qkv = random_normal(c.B * c.T * 3 * C, 41), dout = random_normal(c.B * c.T * C, 42);
    if (dt == DType::BF16) {
      qkv = in_bf16(qkv);
      dout = in_bf16(dout);
    }
    const Result want = full_attention(be, dt == DType::BF16 ? DType::F32 : dt, c, qkv, dout);
    for (uint32_t seed : {1u, 2u}) {
      const Result got = ring_blocks(be, dt, c, qkv, dout, seed);
      ASSERT_EQ(got.out.size(), want.out.size());
      ASSERT_EQ(got.dqkv.size(), want.dqkv.size());
      const double e_out = max_relative_error(got.out, want.out);
      const double e_lse = max_relative_error(got.lse, want.lse);
      const double e_dqkv = max_relative_error(got.dqkv, want.dqkv);
      EXPECT_LT(e_out, tolerance(dt));
      EXPECT_LT(e_lse, dt == DType::F64 ? 1e-12 : 1e-5);  // lse is fp32 under bf16
      EXPECT_LT(e_dqkv, tolerance(dt));
      std::printf("# %s %s seed %u: out %.2e lse %.2e dqkv %.2e\n",
                  std::string(dtype_name(dt)).c_str(), c.name().c_str(), seed, e_out, e_lse,
                  e_dqkv);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionBlocks,
                         ::testing::Values(DType::F64, DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// A non-causal block sees every key of its block: the last query row against all T keys as one
// block is the last row of full causal attention; the other rows stay untouched.
TEST(AttentionBlocksSingle, OneRowAgainstAllKeys) {
  const Case c{2, 48, 3, 8, 1};
  const int64_t C = c.NH * c.HS, N = c.B * c.T;
  CpuBackend be(2);
  const DType dt = DType::F64;
  const Vec qkv = random_normal(N * 3 * C, 43), dout = random_normal(N * C, 44);
  const Result want = full_attention(be, dt, c, qkv, dout);
  Tensor tqkv = make_tensor(be, qkv, {N, 3 * C}, dt);
  Tensor kv = be.empty({N, 2 * C}, dt, MemoryCategory::Workspace);
  be.copy_columns(kv, 0, tqkv, C, 2 * C);
  Tensor out = be.zeros({N, C}, dt, MemoryCategory::Workspace);
  Tensor lse = be.empty({c.B, c.NH, c.T}, dt, MemoryCategory::Workspace);
  be.fill(lse, -std::numeric_limits<double>::infinity());
  be.attention_block_forward(out, lse, tqkv, kv, c.B, c.NH, c.NH, c.HS,
                             {c.T - 1, 1, 0, c.T, false});
  const Vec got = to_host(be, out), got_lse = to_host(be, lse);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t x = 0; x < C; ++x) {
      const int64_t i = (b * c.T + c.T - 1) * C + x;
      EXPECT_NEAR(got[i], want.out[i], 1e-12);
    }
    for (int64_t h = 0; h < c.NH; ++h) {
      const int64_t i = (b * c.NH + h) * c.T + c.T - 1;
      EXPECT_NEAR(got_lse[i], want.lse[i], 1e-12);
      EXPECT_EQ(got_lse[i - 1], -std::numeric_limits<double>::infinity());  // row untouched
    }
  }
}

// The refusal names the op; each case breaks one rule.
TEST(AttentionBlocksSingle, RefusesBadArgumentsByName) {
  CpuBackend be(1);
  const int64_t B = 2, T = 8, NH = 2, HS = 4, C = NH * HS;
  auto make = [&](Shape s, DType d = DType::F32) {
    return be.zeros(s, d, MemoryCategory::Workspace);
  };
  Tensor qkv = make({B * T, 3 * C}), kv = make({B * T, 2 * C}), out = make({B * T, C});
  Tensor lse = make({B, NH, T}), dqkv = make({B * T, 3 * C}), dkv = make({B * T, 2 * C});
  Tensor dout = make({B * T, C});
  Tensor kv_wide = make({B * T, 3 * C}), lse_f64 = make({B, NH, T}, DType::F64);
  Tensor lse_short = make({B, NH, T - 1}), kv_f64 = make({B * T, 2 * C}, DType::F64);
  const Block ok{0, 4, 0, 4, true};
  auto expect_refused = [](const char* op, auto&& call) {
    try {
      call();
      ADD_FAILURE() << op << " accepted bad arguments";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
      std::printf("# %s\n", e.what());
    }
  };
  // forward(lse, kv, B, block) and backward(dqkv, dkv, dout, lse, block) with one argument
  // changed from the accepted baseline.
  auto forward = [&](Tensor& l, const Tensor& k, int64_t b, const Block& blk) {
    be.attention_block_forward(out, l, qkv, k, b, NH, NH, HS, blk);
  };
  auto backward = [&](Tensor& dq, Tensor& dk, const Tensor& dy, const Tensor& l,
                      const Block& blk) {
    be.attention_block_backward(dq, dk, dy, out, l, qkv, kv, B, NH, NH, HS, blk);
  };
  forward(lse, kv, B, ok);
  backward(dqkv, dkv, dout, lse, ok);
  const char* fwd = "attention_block_forward";
  const char* bwd = "attention_block_backward";
  expect_refused(fwd, [&] { forward(lse, kv_wide, B, ok); });               // kv width
  expect_refused(fwd, [&] { forward(lse, kv, B, {0, 4, 0, 5, true}); });    // causal, not square
  expect_refused(fwd, [&] { forward(lse, kv, B, {6, 4, 0, 4, false}); });   // rows past Tq
  expect_refused(fwd, [&] { forward(lse, kv, B, {0, 4, -1, 4, false}); });  // negative begin
  expect_refused(fwd, [&] { forward(lse, kv, B, {0, 4, 0, 0, false}); });   // no keys
  expect_refused(fwd, [&] { forward(lse_f64, kv, B, ok); });                // lse dtype
  expect_refused(fwd, [&] { forward(lse_short, kv, B, ok); });              // lse shape
  expect_refused(fwd, [&] { forward(lse, kv_f64, B, ok); });                // kv dtype
  expect_refused(fwd, [&] { forward(lse, kv, 3, ok); });                    // B divides no rows
  expect_refused(bwd, [&] { backward(dkv, dkv, dout, lse, ok); });          // dqkv shape
  expect_refused(bwd, [&] { backward(dqkv, dqkv, dout, lse, ok); });        // dkv shape
  expect_refused(bwd, [&] { backward(dqkv, dkv, dqkv, lse, ok); });         // dout shape
  expect_refused(bwd, [&] { backward(dqkv, dkv, dout, lse_f64, ok); });     // lse dtype
  expect_refused(bwd, [&] { backward(dqkv, dkv, dout, lse, {0, 3, 0, 4, true}); });
  Tensor bf = make({B * T, 3 * C}, DType::BF16);
  expect_refused("copy_columns", [&] { be.copy_columns(kv, 0, qkv, C, 2 * C + 1); });
  expect_refused("copy_columns", [&] { be.copy_columns(kv, 1, qkv, C, 2 * C); });
  expect_refused("copy_columns", [&] { be.copy_columns(kv, 0, bf, C, 2 * C); });
  expect_refused("copy_columns", [&] { be.copy_columns(out, 0, lse, 0, 1); });
}

// Planning checks shapes and makes the scratch allocations, with no data to compute on.
TEST(AttentionBlocksSingle, PlanningChecksWithoutComputing) {
  CpuBackend be(2, Execution::Plan);
  const int64_t B = 2, T = 256, NH = 4, HS = 16, C = NH * HS;
  const DType d = DType::BF16;
  Tensor qkv = be.empty({B * T, 3 * C}, d, MemoryCategory::Workspace);
  Tensor kv = be.empty({B * T, 2 * C}, d, MemoryCategory::Workspace);
  Tensor out = be.empty({B * T, C}, d, MemoryCategory::Workspace);
  Tensor lse = be.empty({B, NH, T}, DType::F32, MemoryCategory::Workspace);
  Tensor dqkv = be.empty({B * T, 3 * C}, d, MemoryCategory::Workspace);
  Tensor dkv = be.empty({B * T, 2 * C}, d, MemoryCategory::Workspace);
  be.copy_columns(kv, 0, qkv, C, 2 * C);
  be.attention_block_forward(out, lse, qkv, kv, B, NH, NH, HS, {0, T, 0, T, true});
  be.attention_block_backward(dqkv, dkv, out, out, lse, qkv, kv, B, NH, NH, HS,
                              {0, T, 0, T, true});
  EXPECT_THROW(
      be.attention_block_forward(out, lse, qkv, kv, B, NH, NH, HS, {0, T, 0, T - 1, true}),
      std::invalid_argument);
}

TEST(AttentionBlocksSingle, CopyColumnsRoundTrip) {
  CpuBackend be(2);
  for (const DType dt : {DType::F32, DType::F64, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const int64_t N = 37, W = 10, cols = 4;
    const Vec src = in_bf16(random_normal(N * W, 45));
    Tensor tsrc = make_tensor(be, src, {N, W}, dt);
    Tensor mid = be.zeros({N, 6}, dt, MemoryCategory::Workspace);
    be.copy_columns(mid, 1, tsrc, 3, cols);
    const Vec m = to_host(be, mid);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = 0; j < 6; ++j) {
        const double want = j >= 1 && j < 1 + cols ? src[r * W + 3 + j - 1] : 0.0;
        ASSERT_EQ(m[r * 6 + j], want) << "row " << r << " column " << j;
      }
    Tensor back = make_tensor(be, src, {N, W}, dt);
    be.fill(tsrc, 0.0);
    be.copy_columns(tsrc, 3, mid, 1, cols);
    const Vec b = to_host(be, tsrc);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = 0; j < W; ++j)
        ASSERT_EQ(b[r * W + j], j >= 3 && j < 3 + cols ? src[r * W + j] : 0.0)
            << "row " << r << " column " << j;
    be.copy_columns(tsrc, 0, back, 0, 0);  // zero columns: nothing to do
    EXPECT_EQ(to_host(be, tsrc), b);
  }
}

}  // namespace
}  // namespace meshtrain
