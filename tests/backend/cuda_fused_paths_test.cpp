// The CUDA backend's batched and fused paths against the unbatched, unfused calls they replace,
// on the same device and inputs:
//   - reduce_pieces_into and adamw_update_pieces (one launch for many pieces of a flat buffer)
//     give the bits of one reduce_into or adamw_update per piece;
//   - layernorm_backward_add gives the bits of layernorm_backward then add_inplace;
//   - bias_backward's wide-access path gives the bits of its element-by-element path;
//   - crossentropy_loss_and_backward gives the bits of the four cross-entropy calls;
//   - matmul_forward_add (the residual as the GEMM's C) follows matmul_forward then add_inplace
//     within one output rounding, and the CPU within the GEMM tolerance.
// Without a GPU every test skips with the reason.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/cuda/cuda_backend.h"
#include "support/random.h"
#include "support/skip_without_gpu.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using testing::make_tensor;
using testing::max_relative_error;
using testing::random_normal;
using testing::to_host;
using Vec = std::vector<double>;

CudaBackend& gpu() {
  static std::unique_ptr<CudaBackend> be = std::make_unique<CudaBackend>(CudaBackendOptions{});
  return *be;
}

// Positions where a and b differ, with the first few named: bitwise comparisons (to_host
// converts exactly, so equal doubles are equal bits; NaN differs from everything).
void expect_same_bits(const Vec& got, const Vec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t differing = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i])) {
      if (++differing <= 3)
        first += " [" + std::to_string(i) + "] " + std::to_string(got[i]) + " vs " +
                 std::to_string(want[i]);
    }
  EXPECT_EQ(differing, 0) << what << ":" << first;
}

Tensor fresh(DType dtype, const Vec& values) {
  return make_tensor(gpu(), values, {static_cast<int64_t>(values.size())}, dtype);
}

// Pieces of a flat buffer of `total` elements, more of them than one launch takes (96), of
// sizes from 0 to several reduction chunks, with gaps between some: like a model's parameters.
std::vector<FlatPiece> many_pieces(int64_t& total) {
  std::vector<FlatPiece> pieces;
  int64_t at = 0;
  for (int k = 0; k < 150; ++k) {
    const int64_t count = k % 17 == 0 ? 0 : (k % 5 == 0 ? 20000 + 37 * k : 1 + (k * 131) % 3000);
    if (k % 7 == 3) at += 5;  // padding no piece covers
    pieces.push_back({at, count});
    at += count;
  }
  total = at + 3;
  return pieces;
}

class FusedPaths : public ::testing::TestWithParam<DType> {};

TEST_P(FusedPaths, ReducePiecesMatchesOneReductionPerPiece) {
  SKIP_WITHOUT_GPU();
  const DType dtype = GetParam();
  int64_t total = 0;
  const std::vector<FlatPiece> pieces = many_pieces(total);
  const Tensor t = fresh(dtype, random_normal(total, 41));
  const auto n = static_cast<int64_t>(pieces.size());
  for (Reduction what : {Reduction::Sum, Reduction::SumSquares}) {
    Tensor batched = gpu().empty({n + 2}, DType::F64, MemoryCategory::Workspace);
    Tensor single = gpu().empty({n + 2}, DType::F64, MemoryCategory::Workspace);
    gpu().fill(batched, -1.0);
    gpu().fill(single, -1.0);
    gpu().reduce_pieces_into(batched, 1, t, pieces, what);
    for (int64_t k = 0; k < n; ++k)
      gpu().reduce_into(single, 1 + k, t.view(pieces[k].offset, {pieces[k].count}), what);
    const Vec b = to_host(gpu(), batched), s = to_host(gpu(), single);
    expect_same_bits(b, s, what == Reduction::Sum ? "sum" : "sum of squares");
    EXPECT_EQ(b.front(), -1.0) << "a slot before the first was written";
    EXPECT_EQ(b.back(), -1.0) << "a slot after the last was written";
  }
}

TEST_P(FusedPaths, AdamWPiecesMatchesOneUpdatePerPiece) {
  SKIP_WITHOUT_GPU();
  if (GetParam() != DType::F32) GTEST_SKIP() << "AdamW state is fp32 in both modes";
  int64_t total = 0;
  const std::vector<FlatPiece> pieces = many_pieces(total);
  std::vector<double> decays;
  for (size_t k = 0; k < pieces.size(); ++k) decays.push_back(k % 3 == 0 ? 0.0 : 0.1);
  const Vec p0 = random_normal(total, 42), m0 = random_normal(total, 43);
  Vec v0 = random_normal(total, 44);
  for (double& v : v0) v = v * v;
  Tensor bp = fresh(DType::F32, p0), bm = fresh(DType::F32, m0), bv = fresh(DType::F32, v0);
  Tensor sp = fresh(DType::F32, p0), sm = fresh(DType::F32, m0), sv = fresh(DType::F32, v0);
  for (int step = 1; step <= 2; ++step) {
    const Tensor g = fresh(DType::F32, random_normal(total, 45 + step));
    const Backend::AdamWStep s{1e-2, 0.9, 0.95, 1e-8, 0.0, step, 0.7};
    gpu().adamw_update_pieces(bp, g, bm, bv, pieces, decays, s);
    for (size_t k = 0; k < pieces.size(); ++k) {
      const FlatPiece& piece = pieces[k];
      Tensor p = sp.view(piece.offset, {piece.count}), m = sm.view(piece.offset, {piece.count});
      Tensor v = sv.view(piece.offset, {piece.count});
      Backend::AdamWStep one = s;
      one.weight_decay = decays[k];
      gpu().adamw_update(p, g.view(piece.offset, {piece.count}), m, v, one);
    }
  }
  // Same bits everywhere, and the padding between pieces untouched by either.
  expect_same_bits(to_host(gpu(), bp), to_host(gpu(), sp), "param");
  expect_same_bits(to_host(gpu(), bm), to_host(gpu(), sm), "exp_avg");
  expect_same_bits(to_host(gpu(), bv), to_host(gpu(), sv), "exp_avg_sq");
  const Vec p = to_host(gpu(), bp);
  EXPECT_EQ(p[static_cast<size_t>(total - 1)], static_cast<double>(static_cast<float>(p0.back())))
      << "the tail outside every piece changed";
}

TEST_P(FusedPaths, LayerNormBackwardAddMatchesTheTwoCalls) {
  SKIP_WITHOUT_GPU();
  const DType dtype = GetParam();
  // 768: the one-pass kernel; 1100: the two-pass one; 36 x 37: element by element.
  for (auto [N, C] : {std::pair<int64_t, int64_t>{300, 768}, {70, 1100}, {36, 37}}) {
    const Tensor inp = make_tensor(gpu(), random_normal(N * C, 50), {N, C}, dtype);
    const Tensor dout = make_tensor(gpu(), random_normal(N * C, 51), {N, C}, dtype);
    const Tensor residual = make_tensor(gpu(), random_normal(N * C, 52), {N, C}, dtype);
    const Tensor weight = make_tensor(gpu(), random_normal(C, 53), {C}, dtype);
    const Tensor bias = make_tensor(gpu(), random_normal(C, 54), {C}, dtype);
    Tensor out = gpu().empty({N, C}, dtype, MemoryCategory::Workspace);
    Tensor mean = gpu().empty({N}, DType::F32, MemoryCategory::Workspace);
    Tensor rstd = gpu().empty({N}, DType::F32, MemoryCategory::Workspace);
    gpu().layernorm_forward(out, mean, rstd, inp, weight, bias);
    Tensor fused = gpu().empty({N, C}, dtype, MemoryCategory::Workspace);
    Tensor apart = gpu().empty({N, C}, dtype, MemoryCategory::Workspace);
    gpu().fill(fused, std::nan(""));
    // Gradients accumulate: both start from the same nonzero values.
    const Vec dw0 = random_normal(C, 55), db0 = random_normal(C, 56);
    Tensor fdw = make_tensor(gpu(), dw0, {C}, DType::F32), fdb = make_tensor(gpu(), db0, {C}, DType::F32);
    Tensor adw = make_tensor(gpu(), dw0, {C}, DType::F32), adb = make_tensor(gpu(), db0, {C}, DType::F32);
    gpu().layernorm_backward_add(fused, fdw, fdb, dout, inp, weight, mean, rstd, residual);
    gpu().layernorm_backward(apart, adw, adb, dout, inp, weight, mean, rstd);
    gpu().add_inplace(apart, residual);
    const std::string at = " (N " + std::to_string(N) + ", C " + std::to_string(C) + ")";
    expect_same_bits(to_host(gpu(), fused), to_host(gpu(), apart), "dinp" + at);
    expect_same_bits(to_host(gpu(), fdw), to_host(gpu(), adw), "dweight" + at);
    expect_same_bits(to_host(gpu(), fdb), to_host(gpu(), adb), "dbias" + at);
  }
}

TEST_P(FusedPaths, BiasBackwardWideAccessesKeepTheBits) {
  SKIP_WITHOUT_GPU();
  const DType dtype = GetParam();
  const int64_t N = 2051, C = 768;  // rows: not a multiple of the chunk or of the unrolling
  const Vec values = random_normal(N * C + 1, 60);
  // The same rows twice: at the start of an allocation (aligned: wide accesses) and one
  // element in (misaligned: element by element).
  const Tensor aligned = make_tensor(gpu(), Vec(values.begin(), values.end() - 1), {N, C}, dtype);
  Vec shifted(values.size());
  shifted[0] = 0;
  std::copy(values.begin(), values.end() - 1, shifted.begin() + 1);
  const Tensor holder = make_tensor(gpu(), shifted, {N * C + 1}, dtype);
  const Tensor misaligned = holder.view(1, {N, C});
  const Vec start = random_normal(C, 61);
  Tensor wide = make_tensor(gpu(), start, {C}, DType::F32);
  Tensor narrow = make_tensor(gpu(), start, {C}, DType::F32);
  gpu().bias_backward(wide, aligned);
  gpu().bias_backward(narrow, misaligned);
  expect_same_bits(to_host(gpu(), wide), to_host(gpu(), narrow), "dbias");
}

TEST_P(FusedPaths, MatmulForwardAddFollowsTheTwoCalls) {
  SKIP_WITHOUT_GPU();
  const DType dtype = GetParam();
  const int64_t N = 256, C = 192, OC = 320;
  const Vec x = random_normal(N * C, 70), w = random_normal(OC * C, 71), b = random_normal(OC, 72);
  const Vec r = random_normal(N * OC, 73);
  const Tensor inp = make_tensor(gpu(), x, {N, C}, dtype), weight = make_tensor(gpu(), w, {OC, C}, dtype);
  const Tensor bias = make_tensor(gpu(), b, {OC}, dtype), residual = make_tensor(gpu(), r, {N, OC}, dtype);
  const Vec residual_before = to_host(gpu(), residual);
  Tensor fused = gpu().empty({N, OC}, dtype, MemoryCategory::Workspace);
  gpu().fill(fused, std::nan(""));
  const int64_t before = gpu().residual_epilogues().fused;
  gpu().matmul_forward_add(fused, inp, weight, &bias, residual);
  if (dtype == DType::BF16) {
    EXPECT_EQ(gpu().residual_epilogues().fused, before + 1) << "bf16 took the unfused path";
  }
  Tensor apart = gpu().empty({N, OC}, dtype, MemoryCategory::Workspace);
  gpu().set_fused_epilogues(false);
  gpu().matmul_forward_add(apart, inp, weight, &bias, residual);
  gpu().set_fused_epilogues(true);
  // The residual is read, not written: the GEMM's C is not its D.
  expect_same_bits(to_host(gpu(), residual), residual_before, "residual");
  // One rounding of the sum against two: within two output roundings of each other.
  const double rounding = dtype == DType::BF16 ? 2.0 * 0x1p-8 : 1e-5;
  const Vec f = to_host(gpu(), fused), a = to_host(gpu(), apart);
  EXPECT_LT(max_relative_error(f, a), rounding);
  // And the CPU's fp32 product of the same (rounded) values.
  CpuBackend cpu(1);
  const auto held = [&](const Tensor& t, Shape s) {
    return make_tensor(cpu, to_host(gpu(), t), s, DType::F32);
  };
  Tensor want = cpu.empty({N, OC}, DType::F32, MemoryCategory::Workspace);
  const Tensor cb = held(bias, {OC});
  cpu.matmul_forward(want, held(inp, {N, C}), held(weight, {OC, C}), &cb);
  cpu.add_inplace(want, held(residual, {N, OC}));
  EXPECT_LT(max_relative_error(f, to_host(cpu, want)), dtype == DType::BF16 ? 1e-2 : 1e-4);
}

TEST_P(FusedPaths, CrossEntropyInOnePassMatchesTheFourCalls) {
  SKIP_WITHOUT_GPU();
  const DType dtype = GetParam();
  const int64_t N = 37;
  for (int64_t V : {1000, 1001}) {  // whole packs, and element by element
    const Vec values = random_normal(N * V, 80);
    std::vector<int32_t> targets;
    for (int64_t i = 0; i < N; ++i) targets.push_back(static_cast<int32_t>((i * 7919) % V));
    targets[0] = 0;
    targets[1] = static_cast<int32_t>(V - 1);
    const Tensor t = testing::make_tokens(gpu(), targets);
    // The four calls, out of place.
    const Tensor logits = make_tensor(gpu(), values, {N, V}, dtype);
    Tensor row_max = gpu().empty({N}, DType::F32, MemoryCategory::Workspace);
    Tensor row_sumexp = gpu().empty({N}, DType::F32, MemoryCategory::Workspace);
    Tensor target_logit = gpu().empty({N}, DType::F32, MemoryCategory::Workspace);
    Tensor want_losses = gpu().empty({N}, DType::F32, MemoryCategory::Workspace);
    Tensor want = gpu().empty({N, V}, dtype, MemoryCategory::Workspace);
    gpu().crossentropy_stats(row_max, row_sumexp, logits);
    gpu().crossentropy_target_logit(target_logit, logits, t, 0);
    gpu().crossentropy_losses(want_losses, row_max, row_sumexp, target_logit);
    gpu().crossentropy_backward(want, logits, row_max, row_sumexp, t, 0, 1.0 / 3000);
    // One pass, in place as the language-model head runs it.
    Tensor in_place = make_tensor(gpu(), values, {N, V}, dtype);
    Tensor losses = gpu().empty({N}, DType::F32, MemoryCategory::Workspace);
    gpu().fill(losses, std::nan(""));
    gpu().crossentropy_loss_and_backward(in_place, losses, in_place, t, 1.0 / 3000);
    const std::string at = " (V " + std::to_string(V) + ")";
    expect_same_bits(to_host(gpu(), losses), to_host(gpu(), want_losses), "losses" + at);
    expect_same_bits(to_host(gpu(), in_place), to_host(gpu(), want), "dlogits" + at);
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, FusedPaths, ::testing::Values(DType::F32, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return i.param == DType::F32 ? std::string("fp32") : std::string("bf16");
                         });

}  // namespace
}  // namespace meshtrain
