// The CPU's flash-style attention (src/backend/cpu/flash_attention.cpp) against attention written
// out naively in fp64 (every score, softmax, product and gradient of every row), on cases that
// reach the kernel's edges: T not a multiple of the 64-query block and longer than a 512-key
// chunk (the online softmax merges chunks), B > 1, grouped-query heads, document starts that
// cross blocks and chunks. The stash is the rows' log-sum-exp, checked too. And the bits: the
// same at 1, 2 and 3 threads, forward and backward. Sliding windows (AttentionDims::window)
// against the same naive attention with the band t - W < s <= t as an explicit mask: windows
// shorter than a block, across blocks and chunks (the kernel skips the chunks before a block's
// window), with documents.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/cpu/gemm.h"
#include "meshtrain/tensor/bf16.h"
#include "support/random.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using testing::make_tensor;
using testing::random_normal;
using testing::to_host;
using Vec = std::vector<double>;

struct Case {
  int64_t B, T, NH, KVH, HS;
  bool documents;  // document masking, with starts crossing blocks and chunks
  int64_t window = 0;  // a sliding window of this many keys; 0: none
  int64_t G() const { return NH / KVH; }
  int64_t W() const { return (NH + 2 * KVH) * HS; }
  int64_t C() const { return NH * HS; }
  int64_t N() const { return B * T; }
  std::string name() const {
    return "B" + std::to_string(B) + "_T" + std::to_string(T) + "_NH" + std::to_string(NH) +
           "_KVH" + std::to_string(KVH) + "_HS" + std::to_string(HS) + (documents ? "_docs" : "") +
           (window ? "_W" + std::to_string(window) : "");
  }
};

// Document starts: sequence b's documents begin every (37 + 101 b) tokens, plus one at 600
// (past the first key chunk) when T allows.
std::vector<int32_t> starts_of(const Case& c) {
  std::vector<int32_t> starts(static_cast<size_t>(c.N()), 0);
  if (!c.documents) return starts;
  for (int64_t b = 0; b < c.B; ++b) {
    int32_t start = 0;
    for (int64_t i = 0; i < c.T; ++i) {
      if (i > 0 && (i % (37 + 101 * b) == 0 || i == 600)) start = static_cast<int32_t>(i);
      starts[static_cast<size_t>(b * c.T + i)] = start;
    }
  }
  return starts;
}

struct Result {
  Vec out, lse, dqkv;
};

Result naive(const Case& c, const Vec& qkv, const Vec& dout, const std::vector<int32_t>& starts) {
  Result r{Vec(c.N() * c.C(), 0.0), Vec(c.B * c.NH * c.T, 0.0), Vec(c.N() * c.W(), 0.0)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.HS));
  const auto at = [&](int64_t b, int64_t t, int64_t head, int64_t d) {
    return (b * c.T + t) * c.W() + head * c.HS + d;
  };
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.NH; ++h) {
      const int64_t k = c.NH + h / c.G(), v = c.NH + c.KVH + h / c.G();
      for (int64_t i = 0; i < c.T; ++i) {
        // The explicit band mask: keys from the document's start and, under a window, from
        // i - W + 1 on.
        int64_t lo = starts[static_cast<size_t>(b * c.T + i)];
        if (c.window > 0) lo = std::max(lo, i - c.window + 1);
        Vec p(static_cast<size_t>(c.T), 0.0), dp(static_cast<size_t>(c.T), 0.0);
        double m = -std::numeric_limits<double>::infinity(), sum = 0, dot = 0;
        for (int64_t j = lo; j <= i; ++j) {
          double s = 0;
          for (int64_t d = 0; d < c.HS; ++d) s += qkv[at(b, i, h, d)] * qkv[at(b, j, k, d)];
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        for (int64_t j = lo; j <= i; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (int64_t j = lo; j <= i; ++j) p[j] /= sum;
        r.lse[(b * c.NH + h) * c.T + i] = m + std::log(sum);
        const double* dO = dout.data() + (b * c.T + i) * c.C() + h * c.HS;
        for (int64_t j = lo; j <= i; ++j) {
          for (int64_t d = 0; d < c.HS; ++d) {
            r.out[(b * c.T + i) * c.C() + h * c.HS + d] += p[j] * qkv[at(b, j, v, d)];
            dp[j] += dO[d] * qkv[at(b, j, v, d)];
          }
          dot += p[j] * dp[j];
        }
        for (int64_t j = lo; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - dot) * scale;
          for (int64_t d = 0; d < c.HS; ++d) {
            r.dqkv[at(b, i, h, d)] += ds * qkv[at(b, j, k, d)];
            r.dqkv[at(b, j, k, d)] += ds * qkv[at(b, i, h, d)];
            r.dqkv[at(b, j, v, d)] += p[j] * dO[d];
          }
        }
      }
    }
  return r;
}

Result kernel(CpuBackend& be, DType dt, const Case& c, const Vec& qkv, const Vec& dout,
              const std::vector<int32_t>& starts) {
  const Tensor tstarts = testing::make_tokens(be, starts);
  const Tensor* doc = c.documents ? &tstarts : nullptr;
  Tensor tqkv = make_tensor(be, qkv, {c.N(), c.W()}, dt);
  Tensor out = be.empty({c.N(), c.C()}, dt, MemoryCategory::Workspace);
  Tensor stash = testing::attention_stash(be, c.B, c.T, c.NH, dt);
  be.fill(out, 1e30);  // every entry must be written
  const AttentionDims dims{c.NH, c.KVH, c.HS, 0, 0.0, c.window};
  be.attention_forward(out, stash, tqkv, c.B, c.T, dims, doc);
  Tensor dqkv = be.empty({c.N(), c.W()}, dt, MemoryCategory::Workspace);
  be.fill(dqkv, 1e30);
  be.attention_backward(dqkv, make_tensor(be, dout, {c.N(), c.C()}, dt), tqkv, out, stash, c.B,
                        c.T, dims, doc);
  return {to_host(be, out), to_host(be, stash), to_host(be, dqkv)};
}

double max_relative_error(const Vec& got, const Vec& want) {
  double scale = 0, err = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got[i] - want[i]));
  return scale > 0 ? err / scale : err;
}

// Relative to the largest value: fp64 and fp32 sums, and bf16 (P and dS rounded to bf16 as the
// operands of the products).
double tolerance(DType dt) {
  return dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 2e-5 : 3e-2;
}

Vec representable(Vec v, DType dt) { return testing::representable(std::move(v), dt); }

const Case kCases[] = {
    {2, 7, 3, 3, 4, false},      // shorter than a block
    {2, 150, 4, 2, 16, false},   // ragged last block, grouped-query heads, B > 1
    {1, 700, 2, 1, 8, false},    // two key chunks (online softmax), multi-query
    {2, 650, 4, 2, 8, true},     // documents across blocks and chunks
    {2, 150, 4, 2, 16, false, 1},  // a window of one key: each query sees itself alone
    {1, 1100, 2, 1, 8, false, 200},  // a window across blocks: the first chunks skipped
    {2, 650, 4, 2, 8, true, 70},     // a window and documents, whichever starts later
};

class FlashAttention : public ::testing::TestWithParam<DType> {};

TEST_P(FlashAttention, MatchesNaiveFp64Attention) {
  const DType dt = GetParam();
  if (dt == DType::BF16 && !cpu_runs_bf16()) GTEST_SKIP() << "no bf16 GEMM under this ISA";
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name());
    const Vec qkv = representable(random_normal(c.N() * c.W(), 41), dt);
    const Vec dout = representable(random_normal(c.N() * c.C(), 42), dt);
    const std::vector<int32_t> starts = starts_of(c);
    const Result want = naive(c, qkv, dout, starts);
    CpuBackend be(2);
    std::vector<cpu::GemmLibrary> libraries{cpu::GemmLibrary::Auto};
    if (dt == DType::F32) libraries.push_back(cpu::GemmLibrary::OpenBlas);
    for (cpu::GemmLibrary library : libraries) {
      SCOPED_TRACE(std::string(cpu::gemm_library_name(library)));
      be.gemm().set_library(library);
      const Result got = kernel(be, dt, c, qkv, dout, starts);
      EXPECT_LT(max_relative_error(got.out, want.out), tolerance(dt));
      EXPECT_LT(max_relative_error(got.lse, want.lse), tolerance(dt));
      EXPECT_LT(max_relative_error(got.dqkv, want.dqkv), tolerance(dt));
    }
  }
}

TEST_P(FlashAttention, SameBitsAtAnyThreadCount) {
  const DType dt = GetParam();
  if (dt == DType::BF16 && !cpu_runs_bf16()) GTEST_SKIP() << "no bf16 GEMM under this ISA";
  for (const Case& c : {kCases[1], kCases[3]}) {
    SCOPED_TRACE(c.name());
    const Vec qkv = random_normal(c.N() * c.W(), 43), dout = random_normal(c.N() * c.C(), 44);
    const std::vector<int32_t> starts = starts_of(c);
    CpuBackend one(1);
    const Result first = kernel(one, dt, c, qkv, dout, starts);
    for (int threads : {2, 3}) {
      CpuBackend be(threads);
      const Result got = kernel(be, dt, c, qkv, dout, starts);
      EXPECT_EQ(got.out, first.out) << threads << " threads";
      EXPECT_EQ(got.lse, first.lse) << threads << " threads";
      EXPECT_EQ(got.dqkv, first.dqkv) << threads << " threads";
    }
  }
}

// A window as long as the sequence masks nothing: the bits of full attention.
TEST(FlashAttentionWindow, AsLongAsTheSequenceIsFullAttention) {
  CpuBackend be(2);
  Case full = kCases[2], windowed = kCases[2];
  windowed.window = full.T;
  const Vec qkv = random_normal(full.N() * full.W(), 45), dout = random_normal(full.N() * full.C(), 46);
  const std::vector<int32_t> starts = starts_of(full);
  const Result a = kernel(be, DType::F32, full, qkv, dout, starts);
  const Result b = kernel(be, DType::F32, windowed, qkv, dout, starts);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dqkv, b.dqkv);
}

// The stash is (B, NH, T) in the statistics' dtype, not a (T, T) matrix.
TEST(FlashAttentionStash, IsTheRowsLogSumExp) {
  CpuBackend be(1);
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    const Backend::AttentionStash s = be.attention_stash(3, 1024, 12, dt);
    EXPECT_EQ(s.shape, (Shape{3, 12, 1024}));
    EXPECT_EQ(s.dtype, dt == DType::F64 ? DType::F64 : DType::F32);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FlashAttention,
                         ::testing::Values(DType::F64, DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace meshtrain
