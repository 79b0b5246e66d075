// The CUDA backend's grouped products over expert-sorted rows (grouped_matmul_forward/backward,
// cuBLAS's grouped GEMM) against the per-expert loop they replace: one matmul_forward /
// matmul_backward (cuBLASLt) per group on its rows, on the same GPU and inputs, in fp32 and bf16
// mixed precision; part of cuda_kernels_test (support/cuda_vs_cpu.h). The two paths run other
// kernels, so they agree within the GEMM bounds (fp32 accumulation in both), not bit for bit;
// what must hold exactly: an expert without rows keeps its weight gradient, and the gradients
// are added to (+=). The backend's counts say which path ran: the grouped call for the forward
// and input-gradient products (and fp32 weight gradients), per-group GEMMs for bf16 weight
// gradients (a type pair the grouped call lacks) and for row views off its 16-byte alignment.
// Without a GPU every test skips with the reason.

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "support/cuda_vs_cpu.h"
#include "support/skip_without_gpu.h"

namespace meshtrain {
namespace {

using testing::Env;
using testing::kGemm;
using testing::make_tensor;
using testing::Mode;
using testing::mode_name;
using testing::random_normal;
using Vec = std::vector<double>;
using Rows = std::vector<int64_t>;

struct GroupedCase {
  Mode mode;
  Rows rows;
  int64_t K, N;
  std::string name;
};
std::string case_name(const ::testing::TestParamInfo<GroupedCase>& i) {
  return mode_name(i.param.mode) + "_" + i.param.name;
}

struct Outputs {
  Tensor out, dinp, dweights;
};

class CudaGroupedMatmul : public ::testing::TestWithParam<GroupedCase> {};

TEST_P(CudaGroupedMatmul, FollowsThePerExpertLoop) {
  SKIP_WITHOUT_GPU();
  const GroupedCase& c = GetParam();
  Env e(c.mode);
  const int64_t G = static_cast<int64_t>(c.rows.size()), K = c.K, N = c.N;
  const int64_t R = std::accumulate(c.rows.begin(), c.rows.end(), int64_t{0});
  const Vec inp = e.round(random_normal(R * K, 81)), dout = e.round(random_normal(R * N, 82));
  const Vec weights = e.round(random_normal(G * N * K, 83, 0.05));
  const Vec dweights0 = testing::representable(random_normal(G * N * K, 84, 0.5), DType::F32);
  Tensor x = e.gpu_act(inp, {R, K}), w = e.gpu_act(weights, {G, N, K});
  Tensor dy = e.gpu_act(dout, {R, N});
  const auto fresh = [&] {
    return Outputs{e.gpu.zeros({R, N}, e.act(), MemoryCategory::Workspace),
                   e.gpu.zeros({R, K}, e.act(), MemoryCategory::Workspace),
                   e.gpu_f32(dweights0, {G, N, K})};
  };

  Outputs loop = fresh();
  int64_t b = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t end = b + c.rows[static_cast<size_t>(g)];
    if (end > b) {
      Tensor wg = w.view(g * N * K, {N, K}), dwg = loop.dweights.view(g * N * K, {N, K});
      Tensor y = loop.out.rows(b, end), dx = loop.dinp.rows(b, end);
      e.gpu.matmul_forward(y, x.rows(b, end), wg, nullptr);
      e.gpu.matmul_backward(&dx, nullptr, nullptr, dy.rows(b, end), x.rows(b, end), wg);
      e.gpu.matmul_backward(nullptr, &dwg, nullptr, dy.rows(b, end), x.rows(b, end), Tensor{});
    }
    b = end;
  }

  const CudaBackend::GroupedCounts before = e.gpu.grouped_matmuls();
  Outputs got = fresh();
  e.gpu.grouped_matmul_forward(got.out, x, w, c.rows);
  e.gpu.grouped_matmul_backward(&got.dinp, nullptr, dy, x, w, c.rows);
  e.gpu.grouped_matmul_backward(nullptr, &got.dweights, dy, x, Tensor{}, c.rows);
  const CudaBackend::GroupedCounts after = e.gpu.grouped_matmuls();

  e.expect_close(got.out, loop.out, kGemm, "forward");
  e.expect_close(got.dinp, loop.dinp, kGemm, "input gradient");
  e.expect_close(got.dweights, loop.dweights, kGemm, "weight gradient");
  const Vec dw = e.host(got.dweights);
  for (int64_t g = 0; g < G; ++g) {
    if (c.rows[static_cast<size_t>(g)] != 0) continue;
    for (int64_t i = g * N * K; i < (g + 1) * N * K; ++i) {
      ASSERT_EQ(dw[static_cast<size_t>(i)], dweights0[static_cast<size_t>(i)])
          << "expert " << g << " has no rows: its gradient stays as it was";
    }
  }

  // Which path ran: row views 16-byte aligned (K and N whole packs of 8) take the grouped call.
  const bool aligned = K % 8 == 0 && N % 8 == 0;
  const int64_t grouped = after.grouped - before.grouped, looped = after.per_group - before.per_group;
  const int64_t want_grouped = !aligned ? 0 : c.mode == Mode::Fp32 ? 3 : 2;
  EXPECT_EQ(grouped, want_grouped) << "products run as one grouped GEMM";
  EXPECT_EQ(looped, 3 - want_grouped) << "products run one GEMM per expert";
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, CudaGroupedMatmul,
    ::testing::Values(
        GroupedCase{Mode::Fp32, {0, 37, 0, 120, 1, 0}, 64, 96, "empty_experts"},
        GroupedCase{Mode::Bf16, {0, 37, 0, 120, 1, 0}, 64, 96, "empty_experts"},
        GroupedCase{Mode::Bf16, {300, 17, 512, 0, 1, 250, 64, 99}, 512, 1408, "eight_experts"},
        GroupedCase{Mode::Fp32, {300, 17, 512, 0, 1, 250, 64, 99}, 512, 1408, "eight_experts"},
        // Rows of 100 bf16 channels are 200 bytes: views off 16-byte alignment, one per expert.
        GroupedCase{Mode::Bf16, {5, 0, 9}, 100, 36, "unaligned_rows"}),
    case_name);

// No rows at all (a rank that no token's expert is on): nothing is written.
TEST(CudaGroupedMatmulEdges, NoRows) {
  SKIP_WITHOUT_GPU();
  Env e(Mode::Bf16);
  const Rows none = {0, 0};
  Tensor x = e.gpu.empty({0, 16}, DType::BF16, MemoryCategory::Workspace);
  Tensor y = e.gpu.empty({0, 8}, DType::BF16, MemoryCategory::Workspace);
  Tensor w = e.gpu_act(Vec(2 * 8 * 16, 0.25), {2, 8, 16});
  Tensor dw = e.gpu_f32(Vec(2 * 8 * 16, 3.0), {2, 8, 16});
  e.gpu.grouped_matmul_forward(y, x, w, none);
  e.gpu.grouped_matmul_backward(&x, &dw, y, x, w, none);
  EXPECT_EQ(e.host(dw), Vec(2 * 8 * 16, 3.0));
}

}  // namespace
}  // namespace meshtrain
