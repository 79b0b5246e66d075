// The CPU backend's mixture-of-experts row operations (backend.h: gather_rows, gathered_row_dots)
// in fp64, fp32 and bf16 mixed precision, against plain double-precision formulas written here;
// the identities that make them each other's gradients (fp64, to round-off); the same bits at 1
// and 2 threads; and the refusals of bad calls.
//
// Inputs are first rounded to what their dtype holds, so the reference sees the kernel's inputs
// and the error measures the kernel's arithmetic alone. Tolerances, max |got - want| / max |want|:
//   fp64: 1e-12, round-off of sums of at most C = 48 products;
//   fp32: 2e-5, the CPU suite's fp32 bound (sums of at most 48 terms, ~48 * 2^-24 ~ 3e-6);
//   bf16 rows (gather_rows' out): computed in fp32 and rounded once to bf16, at most 2^-9 of
//     the largest value; 2^-8 leaves a factor 2 for the fp32 work before the rounding;
//   bf16 models' fp32 dots: fp32 arithmetic on exact bf16 inputs, as fp32.

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
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
using testing::max_relative_error;
using testing::random_normal;
using testing::representable;
using testing::to_host;
using Vec = std::vector<double>;
using Index = std::vector<int32_t>;

constexpr double kBf16Output = 1.0 / 256;  // 2^-8

DType wide(DType t) { return t == DType::BF16 ? DType::F32 : t; }
double row_tolerance(DType t) {
  return t == DType::F64 ? 1e-12 : t == DType::F32 ? 2e-5 : kBf16Output;
}
double dot_tolerance(DType t) { return t == DType::F64 ? 1e-12 : 2e-5; }

// ---- references, in double ------------------------------------------------------------------

// out (R, C) row r = sum over j of w[r, j] * src[index[r, j]] (w empty: 1), -1 terms left out.
Vec gather_reference(const Vec& src, const Index& index, const Vec& w, int64_t R, int64_t C,
                     int64_t K) {
  Vec out(R * C, 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t m = index[r * K + j];
      if (m < 0) continue;
      const double weight = w.empty() ? 1.0 : w[r * K + j];
      for (int64_t c = 0; c < C; ++c) out[r * C + c] += weight * src[m * C + c];
    }
  return out;
}

Vec dots_reference(const Vec& a, const Vec& b, const Index& index, int64_t R, int64_t C,
                   int64_t K) {
  Vec out(R * K, 0.0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t m = index[r * K + j];
      if (m < 0) continue;
      for (int64_t c = 0; c < C; ++c) out[r * K + j] += a[r * C + c] * b[m * C + c];
    }
  return out;
}

double inner(const Vec& x, const Vec& y) {
  return std::inner_product(x.begin(), x.end(), y.begin(), 0.0);
}

// ---- routing ---------------------------------------------------------------------------------

// T tokens each routed to top_k distinct of E experts (a fixed pseudo-random choice), laid out as
// an MoE layer does: the T * top_k (token, expert) pairs sorted by expert, then by token.
struct Routing {
  int64_t T = 0, top_k = 0;
  Index dispatch;  // (T * top_k, 1): the token of each expert-sorted row
  Index combine;   // (T, top_k): the expert-sorted row of each of a token's choices
};

Routing route(int64_t T, int64_t E, int64_t top_k) {
  Routing r{T, top_k, {}, Index(T * top_k)};
  std::vector<std::vector<int32_t>> rows_of_expert(E);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < top_k; ++j)  // distinct experts: a start and a stride of 1
      rows_of_expert[(t * 7 + t / 3 + j) % E].push_back(static_cast<int32_t>(t * top_k + j));
  for (const auto& pairs : rows_of_expert)
    for (const int32_t pair : pairs) {
      r.combine[pair] = static_cast<int32_t>(r.dispatch.size());
      r.dispatch.push_back(pair / static_cast<int32_t>(top_k));
    }
  return r;
}

// ---- fixture ---------------------------------------------------------------------------------

class ExpertRows : public ::testing::TestWithParam<DType> {
 protected:
  DType dt = GetParam();
  CpuBackend be{2};

  Tensor act(const Vec& v, int64_t rows, int64_t cols) {
    return make_tensor(be, v, {rows, cols}, dt);
  }
  Tensor wide_t(const Vec& v, int64_t rows, int64_t cols) {
    return make_tensor(be, v, {rows, cols}, wide(dt));
  }
  Tensor index_t(const Index& v, int64_t rows, int64_t cols) {
    return testing::make_int32(be, v, {rows, cols});
  }
  // The values an activation and a routing weight hold.
  Vec act_values(size_t n, uint64_t seed) { return representable(random_normal(n, seed), dt); }
  Vec weight_values(size_t n, uint64_t seed) {
    return representable(random_normal(n, seed, 0.5), wide(dt));
  }
  // gather_rows into a new (R, C) tensor (first filled with 7s, which every row must overwrite).
  Vec gather(const Vec& src, int64_t M, const Index& index, const Vec* w, int64_t R, int64_t C,
             int64_t K) {
    Tensor out = act(Vec(R * C, 7.0), R, C), s = act(src, M, C), i = index_t(index, R, K);
    if (w == nullptr) {
      be.gather_rows(out, s, i, nullptr);
    } else {
      const Tensor wt = wide_t(*w, R, K);
      be.gather_rows(out, s, i, &wt);
    }
    return to_host(be, out);
  }
  Vec dots(const Vec& a, const Vec& b, int64_t M, const Index& index, int64_t R, int64_t C,
           int64_t K) {
    Tensor out = wide_t(Vec(R * K, 7.0), R, K);
    be.gathered_row_dots(out, act(a, R, C), act(b, M, C), index_t(index, R, K));
    return to_host(be, out);
  }
};

// Dispatch: K = 1, each row a token's copy; without weights an exact copy in every dtype (a
// permutation moves values, never rounds them), with weights (combine's gradient) each row
// scaled by its gate.
TEST_P(ExpertRows, DispatchCopiesRowsExactlyAndScalesThemByWeights) {
  const int64_t M = 11, C = 48, R = 13;
  Vec src = act_values(M * C, 1);
  src[0] = -0.0;  // source row 0, gathered into row 4: a copy keeps the sign of a zero
  Index index(R);
  for (int64_t r = 0; r < R; ++r) index[r] = static_cast<int32_t>((r * 5 + 2) % M);
  ASSERT_EQ(index[4], 0);
  index[7] = -1;  // a dropped row: zero
  const Vec got = gather(src, M, index, nullptr, R, C, 1);
  EXPECT_EQ(got, gather_reference(src, index, {}, R, C, 1));
  EXPECT_TRUE(std::signbit(got[4 * C])) << "-0 copied as +0";

  const Vec w = weight_values(R, 2);
  EXPECT_LT(max_relative_error(gather(src, M, index, &w, R, C, 1),
                               gather_reference(src, index, w, R, C, 1)),
            row_tolerance(dt));
}

// Combine: K = top-k terms a row, weighted, some skipped; a row with every term skipped is zero.
TEST_P(ExpertRows, CombineSumsWeightedTermsInOrderAndSkipsDroppedOnes) {
  const int64_t M = 17, C = 48, R = 9;
  const Vec src = act_values(M * C, 3);
  for (const int64_t K : {2, 3}) {
    SCOPED_TRACE("K = " + std::to_string(K));
    Index index(R * K);
    for (int64_t i = 0; i < R * K; ++i) index[i] = static_cast<int32_t>((i * 7 + 3) % M);
    index[1] = -1;                                        // one term of row 0
    for (int64_t j = 0; j < K; ++j) index[2 * K + j] = -1;  // every term of row 2
    const Vec w = weight_values(R * K, 4 + K);
    const Vec got = gather(src, M, index, &w, R, C, K);
    EXPECT_LT(max_relative_error(got, gather_reference(src, index, w, R, C, K)),
              row_tolerance(dt));
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(got[2 * C + c], 0.0) << "all-skipped row 2";
    // Unweighted (dispatch's gradient): the plain sum.
    EXPECT_LT(max_relative_error(gather(src, M, index, nullptr, R, C, K),
                                 gather_reference(src, index, {}, R, C, K)),
              row_tolerance(dt));
  }
}

TEST_P(ExpertRows, DotsOfRowsWithTheirGatheredRows) {
  const int64_t M = 10, C = 48, R = 12, K = 3;
  const Vec a = act_values(R * C, 6), b = act_values(M * C, 7);
  Index index(R * K);
  for (int64_t i = 0; i < R * K; ++i) index[i] = static_cast<int32_t>((i * 3 + 1) % M);
  index[4] = -1;
  const Vec got = dots(a, b, M, index, R, C, K);
  EXPECT_LT(max_relative_error(got, dots_reference(a, b, index, R, C, K)), dot_tolerance(dt));
  EXPECT_EQ(got[4], 0.0) << "a skipped term's dot";
}

// A rank no token reached (R = 0), and one whose experts received nothing (M = 0, every index
// -1): no rows read, the rows written zero.
TEST_P(ExpertRows, EmptySidesAreNoOpsOrZeros) {
  const int64_t C = 8, K = 2;
  EXPECT_TRUE(gather(Vec(4 * C, 1.0), 4, {}, nullptr, 0, C, K).empty());
  EXPECT_TRUE(dots({}, Vec(4 * C, 1.0), 4, {}, 0, C, K).empty());
  const Index none(3 * K, -1);
  const Vec w(3 * K, 0.5);
  EXPECT_EQ(gather({}, 0, none, &w, 3, C, K), Vec(3 * C, 0.0));
  EXPECT_EQ(dots(Vec(3 * C, 1.0), {}, 0, none, 3, C, K), Vec(3 * K, 0.0));
}

// One MoE layer's movement of rows and its gradients, as the layer uses the two ops:
//   dispatch  y = gather(x, D)          (T * k rows, K = 1),
//   combine   z = gather(y, P, g)       (T rows, K = k, gates g),
// and their gradients, each the adjoint of its op:
//   dispatch's: dx = gather(dy, P)      (K = k, no weights),
//   combine's:  dy = gather(dz, D', g') (K = 1, each sorted row's own gate; D' = the sorted row's
//               token), dg = gathered_row_dots(dz, y, P).
// fp64: <op(u), v> = <u, adjoint(v)> to round-off. In every dtype, dispatch then its gradient
// recovers the sum of a token's copies (k x, exact).
TEST_P(ExpertRows, DispatchAndCombineGradientsAreTheirAdjoints) {
  const int64_t T = 21, E = 4, k = 2, C = 16;
  const Routing r = route(T, E, k);
  const int64_t S = T * k;
  const Vec x = act_values(T * C, 8);
  const Vec y = gather(x, T, r.dispatch, nullptr, S, C, 1);
  const Vec twice = gather(y, S, r.combine, nullptr, T, C, k);
  for (int64_t i = 0; i < T * C; ++i) ASSERT_EQ(twice[i], 2 * x[i]) << "element " << i;
  if (dt != DType::F64) return;  // the adjoint identities, to fp64 round-off

  const Vec dy = act_values(S * C, 9), dz = act_values(T * C, 10), g = weight_values(T * k, 11);
  const Vec dx = gather(dy, S, r.combine, nullptr, T, C, k);
  EXPECT_NEAR(inner(y, dy), inner(x, dx), 1e-12 * std::abs(inner(y, dy)) + 1e-12);

  Vec sorted_gate(S);  // g' : each sorted row's gate
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) sorted_gate[r.combine[t * k + j]] = g[t * k + j];
  const Vec z = gather(y, S, r.combine, &g, T, C, k);
  const Vec dy_combine = gather(dz, T, r.dispatch, &sorted_gate, S, C, 1);
  EXPECT_NEAR(inner(z, dz), inner(y, dy_combine), 1e-12 * std::abs(inner(z, dz)));
  // z is linear in g: <z, dz> = sum over (t, j) of g[t, j] * dg[t, j].
  const Vec dg = dots(dz, y, S, r.combine, T, C, k);
  EXPECT_NEAR(inner(z, dz), inner(g, dg), 1e-12 * std::abs(inner(z, dz)));
}

// Each output row is one thread's: 1 and 2 threads give the same bits.
TEST_P(ExpertRows, SameBitsAtOneAndTwoThreads) {
  const int64_t M = 64, C = 100, R = 257, K = 3;
  const Vec src = act_values(M * C, 12), a = act_values(R * C, 13), w = weight_values(R * K, 14);
  Index index(R * K);
  for (int64_t i = 0; i < R * K; ++i) index[i] = static_cast<int32_t>((i * 13 + 5) % M);
  for (int64_t i = 0; i < R * K; i += 5) index[i] = -1;
  const int threads_before = omp_get_max_threads();
  omp_set_num_threads(1);
  const Vec rows1 = gather(src, M, index, &w, R, C, K), dots1 = dots(a, src, M, index, R, C, K);
  omp_set_num_threads(2);
  const Vec rows2 = gather(src, M, index, &w, R, C, K), dots2 = dots(a, src, M, index, R, C, K);
  omp_set_num_threads(threads_before);
  EXPECT_EQ(rows1, rows2);
  EXPECT_EQ(dots1, dots2);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ExpertRows,
                         ::testing::Values(DType::F64, DType::F32, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// ---- refusals --------------------------------------------------------------------------------

class ExpertRowsRefusals : public ::testing::Test {
 protected:
  CpuBackend be{1};
  Tensor t(Shape s, DType d = DType::F32) { return be.zeros(s, d, MemoryCategory::Workspace); }
  Tensor index(const Index& v, int64_t rows, int64_t cols) {
    return testing::make_int32(be, v, {rows, cols});
  }
  void expect_refused(const std::function<void()>& call, std::initializer_list<const char*> words) {
    try {
      call();
      ADD_FAILURE() << "not refused; expected: " << *words.begin();
    } catch (const std::invalid_argument& e) {
      for (const char* w : words)
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
            << "'" << w << "' not in: " << e.what();
    }
  }
};

TEST_F(ExpertRowsRefusals, IndexOutsideTheSourceRowsNamesTheRowAndValue) {
  Tensor out = t({3, 4}), src = t({5, 4});
  Tensor past = index({0, 1, 2, -1, 5, 0}, 3, 2);
  expect_refused([&] { be.gather_rows(out, src, past, nullptr); },
                 {"backend 'cpu': gather_rows: index 5 of row 2 (term 0) is outside [-1, 5)",
                  "one of the 5 rows of src"});
  Tensor below = index({0, -2, 2, 3, 4, 0}, 3, 2);
  Tensor dots = t({3, 2});
  expect_refused([&] { be.gathered_row_dots(dots, out, src, below); },
                 {"gathered_row_dots: index -2 of row 0 (term 1)", "rows of b"});
  // Nothing to index: M = 0 leaves only -1.
  Tensor empty_src = t({0, 4}), stray = index({-1, -1, 0, -1, -1, -1}, 3, 2);
  expect_refused([&] { be.gather_rows(out, empty_src, stray, nullptr); },
                 {"index 0 of row 1 (term 0) is outside [-1, 0)"});
}

TEST_F(ExpertRowsRefusals, DtypesOfIndexWeightsAndOutputs) {
  Tensor src = t({5, 4}), out = t({3, 4});
  Tensor idx = index({0, 1, 2, 3, 4, 0}, 3, 2);
  expect_refused([&] { be.gather_rows(out, src, t({3, 2}), nullptr); },
                 {"does not support gather_rows for dtype fp32: index is fp32, expected int32 "
                  "(row indices are int32)"});
  Tensor src16 = t({5, 4}, DType::BF16), out16 = t({3, 4}, DType::BF16);
  Tensor w16 = t({3, 2}, DType::BF16);
  expect_refused([&] { be.gather_rows(out16, src16, idx, &w16); },
                 {"gather_rows for dtype bf16: weights is bf16, expected fp32 (routing weights "
                  "are fp32)"});
  Tensor src64 = t({5, 4}, DType::F64), out64 = t({3, 4}, DType::F64), w32 = t({3, 2});
  expect_refused([&] { be.gather_rows(out64, src64, idx, &w32); },
                 {"weights is fp32, expected fp64"});
  expect_refused([&] { be.gather_rows(out16, src, idx, nullptr); },
                 {"gather_rows for dtype fp32: out is bf16, expected fp32"});
  Tensor dots16 = t({3, 2}, DType::BF16), dots = t({3, 2});
  expect_refused([&] { be.gathered_row_dots(dots16, out16, src16, idx); },
                 {"gathered_row_dots for dtype bf16: out is bf16, expected fp32 (routing "
                  "weights' gradients are fp32)"});
  expect_refused([&] { be.gathered_row_dots(dots, out, src16, idx); },
                 {"gathered_row_dots for dtype fp32: b is bf16, expected fp32"});
}

TEST_F(ExpertRowsRefusals, ShapesThatDisagree) {
  Tensor src = t({5, 4}), out = t({3, 4}), w = t({3, 2});
  Tensor idx = index({0, 1, 2, 3, 4, 0}, 3, 2);
  expect_refused([&] { be.gather_rows(out, t({5, 6}), idx, nullptr); },
                 {"gather_rows: index (R, K) holds the terms of each row of out (R, C), rows of "
                  "src (M, C): out (3, 4) src (5, 6) index (3, 2)"});
  Tensor short_out = t({2, 4});
  expect_refused([&] { be.gather_rows(short_out, src, idx, nullptr); },
                 {"gather_rows: index (R, K)", "out (2, 4)"});
  Tensor w_wrong = t({3, 3});
  expect_refused([&] { be.gather_rows(out, src, idx, &w_wrong); },
                 {"weights must be (R, K) like index, one per term", "weights (3, 3)"});
  Tensor flat = t({12});
  expect_refused([&] { be.gather_rows(flat, src, idx, nullptr); },
                 {"every tensor is a matrix (2-D): out (12)"});
  Tensor no_terms = be.empty({3, 0}, DType::I32, MemoryCategory::Workspace);
  expect_refused([&] { be.gather_rows(out, src, no_terms, nullptr); },
                 {"index (R, K) needs K >= 1 terms per row", "index (3, 0)"});
  Tensor one_dot = t({3, 1});
  expect_refused([&] { be.gathered_row_dots(one_dot, out, src, idx); },
                 {"gathered_row_dots: out must be (R, K) like index, one dot per term",
                  "out (3, 1)"});
  expect_refused([&] { be.gathered_row_dots(w, out, t({5, 3}), idx); },
                 {"gathered_row_dots: index (R, K) holds the terms of each row of a (R, C), rows "
                  "of b (M, C)"});
}

// The planner's dry run makes the calls on memory it never touches: the index is not read.
TEST(ExpertRowsPlan, PlanningBackendSkipsTheArithmetic) {
  CpuBackend plan(1, Execution::Plan);
  Tensor out = plan.empty({3, 4}, DType::BF16, MemoryCategory::Workspace);
  Tensor src = plan.empty({5, 4}, DType::BF16, MemoryCategory::Workspace);
  Tensor idx = plan.empty({3, 2}, DType::I32, MemoryCategory::Workspace);
  Tensor w = plan.empty({3, 2}, DType::F32, MemoryCategory::Workspace);
  EXPECT_NO_THROW(plan.gather_rows(out, src, idx, &w));
  EXPECT_NO_THROW(plan.gathered_row_dots(w, out, src, idx));
}

}  // namespace
}  // namespace meshtrain
