// The CPU backend's single-pass kernels of the optimizer and the loss:
//  - adamw_update_pieces updates every piece of a flat bucket in one parallel pass, with the bits
//    of one adamw_update per piece (the same formula), leaves the gaps between pieces alone, and
//    under bf16 writes the parameters' bf16 copy in that pass with the bits of a separate cast;
//  - crossentropy_loss_and_backward (the whole vocabulary on one rank) reads the logits once, with
//    the losses and gradient of the naive fp64 reference (tests/support/reference_kernels.h)
//    within each precision's tolerance (as cpu_kernels_test.cpp and cpu_bf16_test.cpp hold them)
//    and of the four separate calls.
// "One pass" is checked through the kernel profile: one operation recorded per call, where the
// per-piece default and the separate calls record one per piece or per step.

#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"
#include "support/random.h"
#include "support/reference_kernels.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using testing::make_tensor;
using testing::make_tokens;
using testing::max_relative_error;
using testing::random_normal;
using testing::to_host;
using Vec = std::vector<double>;

// Operation name -> calls in `profile`.
int64_t calls(const KernelProfile& profile, const std::string& op) {
  for (const KernelProfile::Entry& e : profile.entries())
    if (e.op == op) return e.calls;
  return 0;
}

// A bucket of 1000 elements: pieces of many sizes (one of a single element, one empty, one
// longer than a thread's share), a gap between two of them and padding at the end, each with its
// own weight decay, as a bucket of biases, norms and matrices has them.
const std::vector<FlatPiece> kPieces{{0, 1}, {1, 37}, {38, 0}, {38, 700}, {750, 3}, {753, 200}};
const std::vector<double> kDecays{0.1, 0.0, 0.1, 0.1, 0.0, 0.05};
constexpr int64_t kElements = 1000;

class FusedAdamW : public ::testing::TestWithParam<DType> {
 protected:
  CpuBackend be{2};
  DType dt = GetParam();
  Tensor T(const Vec& v) { return make_tensor(be, v, {static_cast<int64_t>(v.size())}, dt); }
  Tensor zeros() { return be.zeros({kElements}, dt, MemoryCategory::Workspace); }
};

TEST_P(FusedAdamW, PiecesInOnePassHaveTheBitsOfOneUpdatePerPiece) {
  const Vec p0 = random_normal(kElements, 31), g1 = random_normal(kElements, 32),
            g2 = random_normal(kElements, 33);
  Tensor fused = T(p0), fm = zeros(), fv = zeros();
  Tensor each = T(p0), em = zeros(), ev = zeros();
  KernelProfile profile;
  for (int step = 1; step <= 2; ++step) {
    const Tensor g = T(step == 1 ? g1 : g2);
    const Backend::AdamWStep s{1e-2, 0.9, 0.95, 1e-8, 0.0, step, 0.5};
    be.set_profile(&profile);
    be.adamw_update_pieces(fused, g, fm, fv, kPieces, kDecays, s);
    be.set_profile(nullptr);
    for (size_t k = 0; k < kPieces.size(); ++k) {
      const FlatPiece& piece = kPieces[k];
      if (piece.count == 0) continue;
      Tensor p = each.view(piece.offset, {piece.count}), m = em.view(piece.offset, {piece.count}),
             v = ev.view(piece.offset, {piece.count});
      Backend::AdamWStep one = s;
      one.weight_decay = kDecays[k];
      be.adamw_update(p, g.view(piece.offset, {piece.count}), m, v, one);
    }
  }
  EXPECT_EQ(to_host(be, fused), to_host(be, each));
  EXPECT_EQ(to_host(be, fm), to_host(be, em));
  EXPECT_EQ(to_host(be, fv), to_host(be, ev));
  // The gap [738, 750) and the padding [953, 1000) kept their values (p0 in the tensor's dtype).
  const Vec got = to_host(be, fused), start = to_host(be, T(p0));
  for (int64_t i : {int64_t{738}, int64_t{749}, int64_t{953}, kElements - 1})
    EXPECT_EQ(got[i], start[i]) << "element " << i;
  EXPECT_NE(got[0], start[0]);
  EXPECT_EQ(calls(profile, "adamw_update"), 2) << "one pass per step, not one per piece";
}

INSTANTIATE_TEST_SUITE_P(Precisions, FusedAdamW, ::testing::Values(DType::F32, DType::F64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Mixed precision: fp32 masters, and the bf16 parameters written in the update's pass with the
// bits Backend::cast gives; a bf16 element outside every piece is not written.
TEST(FusedAdamWBf16, WritesTheBf16CopyWithTheBitsOfACast) {
  CpuBackend be{2};
  const Vec p0 = random_normal(kElements, 41), g = random_normal(kElements, 42);
  auto f32 = [&](const Vec& v) { return make_tensor(be, v, {kElements}, DType::F32); };
  Tensor master = f32(p0), m = f32(Vec(kElements, 0.0)), v = f32(Vec(kElements, 0.0));
  Tensor copy = make_tensor(be, Vec(kElements, 7.0), {kElements}, DType::BF16);
  KernelProfile profile;
  be.set_profile(&profile);
  be.adamw_update_pieces(master, f32(g), m, v, kPieces, kDecays,
                         {1e-2, 0.9, 0.95, 1e-8, 0.0, 1, 1.0}, &copy);
  be.set_profile(nullptr);
  Tensor cast = be.empty({kElements}, DType::BF16, MemoryCategory::Workspace);
  be.cast(cast, master);
  const Vec got = to_host(be, copy), want = to_host(be, cast);
  for (const FlatPiece& piece : kPieces)
    for (int64_t i = piece.offset; i < piece.offset + piece.count; ++i)
      ASSERT_EQ(got[i], want[i]) << "element " << i;
  EXPECT_EQ(got[745], 7.0);  // in the gap
  EXPECT_EQ(got[kElements - 1], 7.0);  // padding
  EXPECT_EQ(calls(profile, "adamw_update"), 1);
  EXPECT_EQ(calls(profile, "cast"), 0) << "the bf16 copy is written by the update, no cast";

  // The copy is bf16 and the masters fp32: anything else is refused by name.
  Tensor wrong = f32(Vec(kElements, 0.0));
  try {
    be.adamw_update_pieces(master, f32(g), m, v, kPieces, kDecays,
                           {1e-2, 0.9, 0.95, 1e-8, 0.0, 2, 1.0}, &wrong);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rounded is fp32, expected bf16"), std::string::npos)
        << e.what();
  }
}

// ---- cross-entropy ------------------------------------------------------------------------

class FusedCrossEntropy : public ::testing::TestWithParam<DType> {
 protected:
  CpuBackend be{2};
  DType dt = GetParam();
  DType stats = dt == DType::F64 ? DType::F64 : DType::F32;
  // Relative to the reference's largest magnitude, as in cpu_kernels_test.cpp and
  // cpu_bf16_test.cpp: fp32 2e-5, fp64 1e-11; bf16 gradients are rounded once (4e-3).
  double loss_tolerance() const { return dt == DType::F64 ? 1e-11 : 2e-5; }
  double grad_tolerance() const {
    return dt == DType::F64 ? 1e-11 : dt == DType::BF16 ? 4e-3 : 2e-5;
  }
};

TEST_P(FusedCrossEntropy, OneReadOfTheLogitsMatchesTheReferenceAndTheSeparateCalls) {
  // More rows than threads, and rows longer than a vector register's many multiples.
  const int64_t N = 13, V = 1003;
  Vec logits = random_normal(N * V, 51, 4.0);
  if (dt == DType::BF16)  // what the kernel sees, so that the tolerance is the kernel's own
    logits = to_host(be, make_tensor(be, logits, {N, V}, DType::BF16));
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 389) % V);
  targets[0] = 0;
  targets[1] = static_cast<int32_t>(V - 1);
  const double dloss = 1.0 / 7.0;
  Vec losses, dlogits;
  reference::crossentropy(losses, dlogits, logits, targets, dloss, N, V);

  const Tensor tt = make_tokens(be, targets);
  Tensor fused = make_tensor(be, logits, {N, V}, dt);
  Tensor flosses = be.empty({N}, stats, MemoryCategory::Workspace);
  KernelProfile profile;
  be.set_profile(&profile);
  be.crossentropy_loss_and_backward(fused, flosses, fused, tt, dloss);  // in place
  be.set_profile(nullptr);
  EXPECT_LT(max_relative_error(to_host(be, flosses), losses), loss_tolerance());
  EXPECT_LT(max_relative_error(to_host(be, fused), dlogits), grad_tolerance());
  EXPECT_EQ(calls(profile, "crossentropy_loss_and_backward"), 1);
  EXPECT_EQ(calls(profile, "crossentropy_stats"), 0) << "one fused pass, not the four calls";

  // The four calls the tensor-parallel head makes, on the same logits: the same formulas.
  Tensor apart = make_tensor(be, logits, {N, V}, dt);
  Tensor mx = be.empty({N}, stats, MemoryCategory::Workspace), se = be.empty({N}, stats, MemoryCategory::Workspace),
         tl = be.empty({N}, stats, MemoryCategory::Workspace), al = be.empty({N}, stats, MemoryCategory::Workspace);
  be.crossentropy_stats(mx, se, apart);
  be.crossentropy_target_logit(tl, apart, tt, 0);
  be.crossentropy_losses(al, mx, se, tl);
  be.crossentropy_backward(apart, apart, mx, se, tt, 0, dloss);
  EXPECT_LT(max_relative_error(to_host(be, flosses), to_host(be, al)), loss_tolerance());
  EXPECT_LT(max_relative_error(to_host(be, fused), to_host(be, apart)), grad_tolerance());
}

INSTANTIATE_TEST_SUITE_P(Precisions, FusedCrossEntropy,
                         ::testing::Values(DType::F32, DType::F64, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace meshtrain
