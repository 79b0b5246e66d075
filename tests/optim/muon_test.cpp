// Muon's arithmetic on one matrix (optim/muon.h), against values computed by hand: on a diagonal
// matrix (or one padded with zero rows or columns) the Newton-Schulz quintic acts on each
// singular value alone, s <- a s + b s^3 + c s^5, so its result is known without a GEMM.
// The whole update on real matrices is held to the fp64 NumPy reference written from the papers
// (tests/reference/muon_reference.py, muon_reference_test.py).

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/optim/muon.h"

namespace meshtrain {
namespace {

Tensor matrix(Backend& be, int64_t rows, int64_t cols, const std::vector<double>& values) {
  Tensor t = be.empty({rows, cols}, DType::F64, MemoryCategory::Workspace);
  be.copy_from_host(t, values.data());
  return t;
}

std::vector<double> host(Backend& be, const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  be.copy_to_host(out.data(), t);
  return out;
}

// What the iterations make of one singular value s of the normalised matrix.
double quintic(double s, const MuonHyper& h) {
  for (int i = 0; i < h.ns_steps; ++i) s = h.ns_a * s + h.ns_b * s * s * s + h.ns_c * s * s * s * s * s;
  return s;
}

// diag(3, 1, 0.5) with a zero row below (tall) or a zero column beside (wide): the singular
// values over the Frobenius norm, each through the quintic, in their places.
TEST(Muon, NewtonSchulzActsOnEachSingularValue) {
  CpuBackend be(1);
  const MuonHyper h;
  const double norm = std::sqrt(9.0 + 1.0 + 0.25);
  for (bool tall : {true, false}) {
    SCOPED_TRACE(tall ? "4 x 3" : "3 x 4");
    const int64_t rows = tall ? 4 : 3, cols = tall ? 3 : 4;
    std::vector<double> v(12, 0.0);
    const double d[3] = {3.0, 1.0, 0.5};
    for (int i = 0; i < 3; ++i) v[static_cast<size_t>(i * cols + i)] = d[i];
    Tensor x = matrix(be, rows, cols, v);
    newton_schulz(be, x, h);
    const std::vector<double> out = host(be, x);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const double want = r == c ? quintic(d[r] / (norm + 1e-7), h) : 0.0;
        EXPECT_NEAR(out[static_cast<size_t>(r * cols + c)], want, 1e-12) << r << "," << c;
      }
  }
}

// The quintic's published coefficients take every singular value of a normalised matrix from
// 2e-3 to 1 into roughly [0.7, 1.2] in 5 steps (not to 1: Keller Jordan's trade of accuracy for
// speed): the "orthogonalisation" that Muon is named for.
TEST(Muon, PublishedCoefficientsOrthogonaliseWithinTheirBand) {
  const MuonHyper h;
  for (double s : {2e-3, 5e-3, 0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0}) {
    EXPECT_GT(quintic(s, h), 0.6) << s;
    EXPECT_LT(quintic(s, h), 1.25) << s;
  }
}

// M <- 0.95 M + scale G; U <- scale G + 0.95 M (Nesterov) or M; then W <- (1 - lr wd) W -
// lr 0.2 sqrt(max(rows, cols)) O.
TEST(Muon, MomentumNesterovAndTheScaledUpdate) {
  CpuBackend be(1);
  MuonHyper h;
  Tensor m = matrix(be, 1, 2, {1.0, -2.0});
  Tensor g = matrix(be, 1, 2, {4.0, 8.0});
  Tensor u = be.empty({1, 2}, DType::F64, MemoryCategory::Workspace);
  muon_momentum(be, m, g, 0.5, h, u);
  EXPECT_EQ(host(be, m), (std::vector<double>{0.95 + 2.0, -1.9 + 4.0}));
  EXPECT_EQ(host(be, u), (std::vector<double>{2.0 + 0.95 * 2.95, 4.0 + 0.95 * 2.1}));
  h.nesterov = false;
  muon_momentum(be, m, g, 1.0, h, u);
  EXPECT_EQ(host(be, u), host(be, m));

  h.weight_decay = 0.1;
  Tensor w = matrix(be, 1, 2, {1.0, 2.0});
  Tensor o = matrix(be, 1, 2, {0.5, -0.5});
  muon_apply(be, w, o, 0.01, h);
  const double scale = 0.01 * 0.2 * std::sqrt(2.0);
  const std::vector<double> got = host(be, w);
  EXPECT_DOUBLE_EQ(got[0], 1.0 * (1 - 0.001) - scale * 0.5);
  EXPECT_DOUBLE_EQ(got[1], 2.0 * (1 - 0.001) + scale * 0.5);
}

}  // namespace
}  // namespace meshtrain
