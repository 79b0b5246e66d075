// The grouped matrix products over expert-sorted rows (backend.h: grouped_matmul_forward and
// grouped_matmul_backward) on the CPU backend, in fp64, fp32 and bf16 mixed precision:
//   - the same bits as one matmul_forward / matmul_backward per group on its rows, which is what
//     the mixture-of-experts layer ran before (so its training is unchanged bit for bit);
//   - against a double-precision formula written here (fp64, to round-off), so that the loop is
//     not only consistent with itself;
//   - groups without rows (first, middle and last), a call with no rows at all, the weight
//     gradients accumulated (+=) and an empty group's left as they were, a weight-gradient-only
//     call without the weights (ZeRO-3 has released them by then);
//   - the refusals of bad calls, by the front, with the words that name what is wrong.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "support/random.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using testing::make_tensor;
using testing::random_normal;
using testing::representable;
using testing::to_host;
using Vec = std::vector<double>;
using Rows = std::vector<int64_t>;

DType wide(DType t) { return t == DType::BF16 ? DType::F32 : t; }

// The operands of one grouped call: G groups of rows[g] rows of K inputs, N outputs.
struct Operands {
  int64_t R, K, N, G;
  Rows rows;
  Vec inp, weights, dout, dweights0;
};

Operands operands(const Rows& rows, int64_t K, int64_t N, DType t) {
  Operands o;
  o.rows = rows;
  o.R = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  o.K = K;
  o.N = N;
  o.G = static_cast<int64_t>(rows.size());
  o.inp = representable(random_normal(o.R * K, 71), t);
  o.weights = representable(random_normal(o.G * N * K, 72, 0.2), t);
  o.dout = representable(random_normal(o.R * N, 73), t);
  // Gradients already there (an earlier micro-batch's): the call must add to them.
  o.dweights0 = representable(random_normal(o.G * N * K, 74, 0.5), wide(t));
  return o;
}

struct Results {
  Vec out, dinp, dweights;
};

// One matmul_forward and one matmul_backward per group with rows: what moe_layer.cpp ran.
Results per_group_loop(CpuBackend& be, const Operands& o, DType t) {
  Tensor inp = make_tensor(be, o.inp, {o.R, o.K}, t);
  Tensor weights = make_tensor(be, o.weights, {o.G, o.N, o.K}, t);
  Tensor dout = make_tensor(be, o.dout, {o.R, o.N}, t);
  Tensor dweights = make_tensor(be, o.dweights0, {o.G, o.N, o.K}, wide(t));
  Tensor out = be.zeros({o.R, o.N}, t, MemoryCategory::Workspace);
  Tensor dinp = be.zeros({o.R, o.K}, t, MemoryCategory::Workspace);
  int64_t b = 0;
  for (int64_t g = 0; g < o.G; ++g) {
    const int64_t e = b + o.rows[static_cast<size_t>(g)];
    if (e > b) {
      Tensor w = weights.view(g * o.N * o.K, {o.N, o.K});
      Tensor dw = dweights.view(g * o.N * o.K, {o.N, o.K});
      Tensor y = out.rows(b, e), dx = dinp.rows(b, e);
      be.matmul_forward(y, inp.rows(b, e), w, nullptr);
      be.matmul_backward(&dx, nullptr, nullptr, dout.rows(b, e), inp.rows(b, e), w);
      be.matmul_backward(nullptr, &dw, nullptr, dout.rows(b, e), inp.rows(b, e), Tensor{});
    }
    b = e;
  }
  return {to_host(be, out), to_host(be, dinp), to_host(be, dweights)};
}

// The grouped calls, as moe_layer.cpp makes them: the input gradient with the weights, the
// weight gradient later without them.
Results grouped(CpuBackend& be, const Operands& o, DType t) {
  Tensor inp = make_tensor(be, o.inp, {o.R, o.K}, t);
  Tensor weights = make_tensor(be, o.weights, {o.G, o.N, o.K}, t);
  Tensor dout = make_tensor(be, o.dout, {o.R, o.N}, t);
  Tensor dweights = make_tensor(be, o.dweights0, {o.G, o.N, o.K}, wide(t));
  Tensor out = be.zeros({o.R, o.N}, t, MemoryCategory::Workspace);
  Tensor dinp = be.zeros({o.R, o.K}, t, MemoryCategory::Workspace);
  be.grouped_matmul_forward(out, inp, weights, o.rows);
  be.grouped_matmul_backward(&dinp, nullptr, dout, inp, weights, o.rows);
  be.grouped_matmul_backward(nullptr, &dweights, dout, inp, Tensor{}, o.rows);
  return {to_host(be, out), to_host(be, dinp), to_host(be, dweights)};
}

// The products in double.
Results reference(const Operands& o) {
  Results r{Vec(o.R * o.N, 0.0), Vec(o.R * o.K, 0.0), o.dweights0};
  int64_t b = 0;
  for (int64_t g = 0; g < o.G; ++g) {
    const double* w = &o.weights[g * o.N * o.K];
    for (int64_t i = b; i < b + o.rows[static_cast<size_t>(g)]; ++i)
      for (int64_t n = 0; n < o.N; ++n)
        for (int64_t k = 0; k < o.K; ++k) {
          r.out[i * o.N + n] += o.inp[i * o.K + k] * w[n * o.K + k];
          r.dinp[i * o.K + k] += o.dout[i * o.N + n] * w[n * o.K + k];
          r.dweights[g * o.N * o.K + n * o.K + k] += o.dout[i * o.N + n] * o.inp[i * o.K + k];
        }
    b += o.rows[static_cast<size_t>(g)];
  }
  return r;
}

double max_abs_difference(const Vec& a, const Vec& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

class GroupedMatmul : public ::testing::TestWithParam<DType> {};

// Empty groups first, in the middle and last; sizes that are not multiples of a vector's width.
const Rows kRows = {0, 7, 0, 13, 1, 0};

TEST_P(GroupedMatmul, SameBitsAsOneMatmulPerGroup) {
  const DType t = GetParam();
  CpuBackend be(2);
  const Operands o = operands(kRows, 24, 40, t);
  const Results loop = per_group_loop(be, o, t), got = grouped(be, o, t);
  EXPECT_EQ(got.out, loop.out) << "forward";
  EXPECT_EQ(got.dinp, loop.dinp) << "input gradient";
  EXPECT_EQ(got.dweights, loop.dweights) << "weight gradient";
  // Empty groups' gradients are the ones already there, untouched.
  for (int64_t g : {0, 2, 5}) {
    for (int64_t i = g * o.N * o.K; i < (g + 1) * o.N * o.K; ++i) {
      ASSERT_EQ(got.dweights[static_cast<size_t>(i)], o.dweights0[static_cast<size_t>(i)])
          << "group " << g << " has no rows";
    }
  }
}

TEST_P(GroupedMatmul, FollowsTheFormula) {
  const DType t = GetParam();
  CpuBackend be(2);
  const Operands o = operands(kRows, 24, 40, t);
  const Results got = grouped(be, o, t), want = reference(o);
  // fp64: round-off; fp32: the CPU suite's bound on sums of <= 40 products of |x| ~ 1; bf16: one
  // rounding of outputs of |y| <~ 4 to 8 bits (fp32 accumulation), the fp32 gradients as fp32.
  const double bound = t == DType::F64 ? 1e-12 : t == DType::F32 ? 2e-5 : 4.0 / 128;
  EXPECT_LT(max_abs_difference(got.out, want.out), bound);
  EXPECT_LT(max_abs_difference(got.dinp, want.dinp), bound);
  EXPECT_LT(max_abs_difference(got.dweights, want.dweights), t == DType::F64 ? 1e-12 : 1e-4);
}

TEST_P(GroupedMatmul, NoRowsAtAllTouchesNothing) {
  const DType t = GetParam();
  CpuBackend be(1);
  const Rows none = {0, 0, 0};
  Tensor inp = be.empty({0, 8}, t, MemoryCategory::Workspace);
  Tensor out = be.empty({0, 4}, t, MemoryCategory::Workspace);
  Tensor weights = make_tensor(be, Vec(3 * 4 * 8, 0.5), {3, 4, 8}, t);
  Tensor dweights = make_tensor(be, Vec(3 * 4 * 8, 1.5), {3, 4, 8}, wide(t));
  be.grouped_matmul_forward(out, inp, weights, none);
  be.grouped_matmul_backward(&inp, &dweights, out, inp, weights, none);
  EXPECT_EQ(to_host(be, dweights), Vec(3 * 4 * 8, 1.5));
}

INSTANTIATE_TEST_SUITE_P(Cpu, GroupedMatmul,
                         ::testing::Values(DType::F64, DType::F32, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// Refused by the front, naming what is wrong.
void expect_refusal(const std::function<void()>& call, const std::string& words) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected a refusal saying '" << words << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("grouped_matmul"), std::string::npos) << e.what();
  }
}

TEST(GroupedMatmulFront, RefusesBadCalls) {
  CpuBackend be(1);
  const DType t = DType::F32;
  Tensor inp = be.zeros({5, 8}, t, MemoryCategory::Workspace);
  Tensor out = be.zeros({5, 4}, t, MemoryCategory::Workspace);
  Tensor weights = be.zeros({2, 4, 8}, t, MemoryCategory::Workspace);
  Tensor dweights = be.zeros({2, 4, 8}, t, MemoryCategory::Workspace);
  Tensor flat = be.zeros({8, 8}, t, MemoryCategory::Workspace);
  Tensor narrow = be.zeros({5, 3}, t, MemoryCategory::Workspace);
  Tensor bf16_grads = be.zeros({2, 4, 8}, DType::BF16, MemoryCategory::Workspace);
  expect_refusal([&] { be.grouped_matmul_forward(out, inp, weights, {2, 2}); },
                 "sum to 4, not to the 5 rows");
  expect_refusal([&] { be.grouped_matmul_forward(out, inp, weights, {6, -1}); },
                 "group 1 has -1 rows");
  expect_refusal([&] { be.grouped_matmul_forward(out, inp, weights, {5}); },
                 "1 group row counts for 2 groups");
  expect_refusal([&] { be.grouped_matmul_forward(out, inp, flat, {5}); },
                 "weights must be (G, N, K)");
  expect_refusal([&] { be.grouped_matmul_forward(narrow, inp, weights, {2, 3}); },
                 "is out (R, N)");
  expect_refusal(
      [&] { be.grouped_matmul_backward(nullptr, &dweights, narrow, inp, Tensor{}, {2, 3}); },
      "dout (R, N)");
  expect_refusal(
      [&] { be.grouped_matmul_backward(nullptr, &bf16_grads, out, inp, Tensor{}, {2, 3}); },
      "dweights is bf16, expected fp32");
  expect_refusal(
      [&] { be.grouped_matmul_backward(nullptr, &dweights, out, inp, Tensor{}, {3, 3}); },
      "sum to 6");
}

}  // namespace
}  // namespace meshtrain
