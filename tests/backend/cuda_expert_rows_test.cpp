// The CUDA backend's mixture-of-experts row operations (gather_rows, gathered_row_dots) against
// the CPU backend on the same inputs, in fp32 and bf16 mixed precision; part of
// cuda_kernels_test (support/cuda_vs_cpu.h). Here the CPU backend runs the mode's own dtype (bf16
// too), since both devices compute gather_rows alike: each product and each sum rounded once in
// fp32, in index order, from the first kept term, then rounded once to the stored dtype; so its
// rows must match bit for bit. The dots sum over the channels in each device's own order:
// within the grad32 bound. Also what only the device does: an index outside [-1, M) leaves its
// term out (the CPU refuses it). Without a GPU every test skips with the reason.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/cuda_vs_cpu.h"
#include "support/skip_without_gpu.h"

namespace meshtrain {
namespace {

using testing::Env;
using testing::kGrad32;
using testing::make_int32;
using testing::make_tensor;
using testing::Mode;
using testing::mode_name;
using testing::random_normal;
using Vec = std::vector<double>;
using Index = std::vector<int32_t>;

// R rows of C channels gathering K terms each from M source rows; weighted or not.
struct GatherCase {
  Mode mode;
  int64_t R, C, K, M;
  bool weighted;
};
std::string gather_name(const ::testing::TestParamInfo<GatherCase>& i) {
  const GatherCase& c = i.param;
  return mode_name(c.mode) + "_R" + std::to_string(c.R) + "_C" + std::to_string(c.C) + "_K" +
         std::to_string(c.K) + "_M" + std::to_string(c.M) + (c.weighted ? "_weighted" : "");
}

// A fixed pseudo-random index with every fifth term dropped (-1) and row 1 dropped whole.
Index make_index(int64_t R, int64_t K, int64_t M) {
  Index index(R * K);
  for (int64_t i = 0; i < R * K; ++i) index[i] = static_cast<int32_t>((i * 13 + 5) % M);
  for (int64_t i = 0; i < R * K; i += 5) index[i] = -1;
  if (R > 1)
    for (int64_t j = 0; j < K; ++j) index[K + j] = -1;
  return index;
}

class ExpertRowGather : public ::testing::TestWithParam<GatherCase> {};

TEST_P(ExpertRowGather, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mode, R, C, K, M, weighted] = GetParam();
  Env e(mode);
  const Vec src = e.round(random_normal(M * C, 51)), a = e.round(random_normal(R * C, 52));
  const Vec w = testing::representable(random_normal(R * K, 53, 0.5), DType::F32);
  const Index index = make_index(R, K, M);
  Tensor gsrc = make_tensor(e.gpu, src, {M, C}, e.act());
  Tensor csrc = make_tensor(e.cpu, src, {M, C}, e.act());
  Tensor gidx = make_int32(e.gpu, index, {R, K}), cidx = make_int32(e.cpu, index, {R, K});
  Tensor gw = e.gpu_f32(w, {R, K}), cw = make_tensor(e.cpu, w, {R, K}, DType::F32);
  Tensor gout = e.gpu.empty({R, C}, e.act(), MemoryCategory::Workspace);
  Tensor cout = e.cpu.empty({R, C}, e.act(), MemoryCategory::Workspace);
  e.gpu.gather_rows(gout, gsrc, gidx, weighted ? &gw : nullptr);
  e.cpu.gather_rows(cout, csrc, cidx, weighted ? &cw : nullptr);
  EXPECT_EQ(e.host(gout), e.host(cout)) << "gather_rows, bit for bit";

  Tensor ga = make_tensor(e.gpu, a, {R, C}, e.act()), ca = make_tensor(e.cpu, a, {R, C}, e.act());
  Tensor gdots = e.gpu.empty({R, K}, DType::F32, MemoryCategory::Workspace);
  Tensor cdots = e.cpu.empty({R, K}, DType::F32, MemoryCategory::Workspace);
  e.gpu.gathered_row_dots(gdots, ga, gsrc, gidx);
  e.cpu.gathered_row_dots(cdots, ca, csrc, cidx);
  e.expect_close(gdots, cdots, kGrad32, "gathered_row_dots");
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, ExpertRowGather,
    ::testing::Values(GatherCase{Mode::Fp32, 37, 96, 1, 37, false},   // dispatch
                      GatherCase{Mode::Bf16, 37, 96, 1, 37, false},
                      GatherCase{Mode::Fp32, 37, 96, 1, 29, true},    // combine's gradient
                      GatherCase{Mode::Bf16, 37, 96, 2, 80, true},    // combine, top-2
                      GatherCase{Mode::Bf16, 37, 100, 3, 50, true},   // rows not whole packs
                      GatherCase{Mode::Fp32, 37, 100, 3, 50, false},  // dispatch's gradient
                      GatherCase{Mode::Bf16, 4096, 2048, 2, 8192, true}),
    gather_name);

// The device cannot refuse an index without the host waiting: an entry outside [-1, M) is left
// out like -1, in both ops, and a row of nothing but such entries is zero.
TEST(CudaExpertRows, IndexOutsideTheSourceIsLeftOut) {
  SKIP_WITHOUT_GPU();
  Env e(Mode::Fp32);
  const int64_t M = 3, C = 8, R = 3, K = 2;
  const Vec src = random_normal(M * C, 54);
  Tensor gsrc = e.gpu_f32(src, {M, C});
  Tensor stray = make_int32(e.gpu, {1, 3, -7, 2, 9, -2}, {R, K});
  Tensor out = e.gpu.empty({R, C}, DType::F32, MemoryCategory::Workspace);
  e.gpu.gather_rows(out, gsrc, stray, nullptr);
  Tensor dots = e.gpu.empty({R, K}, DType::F32, MemoryCategory::Workspace);
  e.gpu.gathered_row_dots(dots, gsrc, gsrc, stray);
  const Vec rows = e.host(out), d = e.host(dots);
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(rows[c], static_cast<double>(static_cast<float>(src[C + c]))) << "row 0 = src 1";
    EXPECT_EQ(rows[C + c], static_cast<double>(static_cast<float>(src[2 * C + c]))) << "row 1";
    EXPECT_EQ(rows[2 * C + c], 0.0) << "row 2: both terms outside";
  }
  EXPECT_EQ(d[1], 0.0);
  EXPECT_EQ(d[2], 0.0);
  EXPECT_EQ(d[4], 0.0);
  EXPECT_EQ(d[5], 0.0);
  EXPECT_NE(d[0], 0.0);
}

// No rows (a rank no token reached) and no source rows (experts that received nothing).
TEST(CudaExpertRows, EmptySides) {
  SKIP_WITHOUT_GPU();
  Env e(Mode::Bf16);
  const int64_t C = 16, K = 2;
  Tensor src = e.gpu.empty({4, C}, DType::BF16, MemoryCategory::Workspace);
  Tensor none = e.gpu.empty({0, C}, DType::BF16, MemoryCategory::Workspace);
  Tensor no_index = e.gpu.empty({0, K}, DType::I32, MemoryCategory::Workspace);
  e.gpu.gather_rows(none, src, no_index, nullptr);
  Tensor no_dots = e.gpu.empty({0, K}, DType::F32, MemoryCategory::Workspace);
  e.gpu.gathered_row_dots(no_dots, none, src, no_index);
  Tensor out = e.gpu_act(Vec(3 * C, 7.0), {3, C});
  Tensor dropped = make_int32(e.gpu, Index(3 * K, -1), {3, K});
  e.gpu.gather_rows(out, none, dropped, nullptr);
  EXPECT_EQ(e.host(out), Vec(3 * C, 0.0));
}

}  // namespace
}  // namespace meshtrain
