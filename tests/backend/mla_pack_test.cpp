// Multi-head latent attention's packed row (backend.h, mla_pack / mla_unpack), on the CPU
// backend's one-pass kernel and on the default every device inherits (through copy_columns,
// cast and add_inplace; the counting test backend keeps it), in fp64, fp32 and bf16:
//  - pack puts every element where the layout says (exact copies);
//  - unpack is its transpose: dq and dkv exact copies, dk_rope the heads' rope-key gradients
//    summed in head order in wide(A) (fp32 under bf16) and rounded once, the bits of the sum
//    written out here; both implementations give the same bits;
//  - the round trip: unpack of a packed row gives q and kv back and heads x k_rope.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "support/counting_backend.h"
#include "support/random.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using Vec = std::vector<double>;
using testing::make_tensor, testing::random_normal, testing::representable, testing::to_host;

constexpr int64_t N = 5;
const MlaHeads kHeads{3, 4, 2, 5};  // Dq = 6, a kv head 9, qkv 2 * 3 * 6 + 3 * 5 = 51

int64_t Dq() { return kHeads.nope + kHeads.rope; }
int64_t Dkv() { return kHeads.nope + kHeads.value; }
int64_t width() { return 2 * kHeads.heads * Dq() + kHeads.heads * kHeads.value; }

// The packed row, written from the layout (backend.h).
Vec packed(const Vec& q, const Vec& kv, const Vec& pe) {
  const int64_t H = kHeads.heads;
  Vec out(N * width());
  for (int64_t n = 0; n < N; ++n) {
    double* row = &out[n * width()];
    for (int64_t c = 0; c < H * Dq(); ++c) row[c] = q[n * H * Dq() + c];
    for (int64_t h = 0; h < H; ++h) {
      const double* src = &kv[n * H * Dkv() + h * Dkv()];
      double* k = row + H * Dq() + h * Dq();
      double* v = row + 2 * H * Dq() + h * kHeads.value;
      for (int64_t d = 0; d < kHeads.nope; ++d) k[d] = src[d];
      for (int64_t d = 0; d < kHeads.rope; ++d) k[kHeads.nope + d] = pe[n * kHeads.rope + d];
      for (int64_t d = 0; d < kHeads.value; ++d) v[d] = src[kHeads.nope + d];
    }
  }
  return out;
}

// dk_rope: each row's heads summed in head order in wide(A), rounded once to A.
Vec rope_key_gradient(const Vec& dqkv, DType dt) {
  const int64_t H = kHeads.heads;
  Vec out(N * kHeads.rope);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < kHeads.rope; ++d) {
      auto at = [&](int64_t h) { return dqkv[n * width() + H * Dq() + h * Dq() + kHeads.nope + d]; };
      double sum = at(0);
      float sum32 = static_cast<float>(at(0));
      for (int64_t h = 1; h < H; ++h) sum += at(h), sum32 += static_cast<float>(at(h));
      out[n * kHeads.rope + d] = dt == DType::F64 ? sum : sum32;
    }
  return representable(out, dt);
}

struct Unpacked {
  Vec dq, dkv, dk_rope;
};

template <class Be> Vec pack(Be& be, DType dt, const Vec& q, const Vec& kv, const Vec& pe) {
  const int64_t H = kHeads.heads;
  Tensor qkv = be.empty({N, width()}, dt, MemoryCategory::Workspace);
  be.fill(qkv, 7.0);  // every column must be assigned
  be.mla_pack(qkv, make_tensor(be, q, {N, H * Dq()}, dt), make_tensor(be, kv, {N, H * Dkv()}, dt),
              make_tensor(be, pe, {N, kHeads.rope}, dt), kHeads);
  return to_host(be, qkv);
}

template <class Be> Unpacked unpack(Be& be, DType dt, const Vec& dqkv) {
  const int64_t H = kHeads.heads;
  Tensor dq = be.empty({N, H * Dq()}, dt, MemoryCategory::Workspace);
  Tensor dkv = be.empty({N, H * Dkv()}, dt, MemoryCategory::Workspace);
  Tensor dpe = be.empty({N, kHeads.rope}, dt, MemoryCategory::Workspace);
  be.mla_unpack(dq, dkv, dpe, make_tensor(be, dqkv, {N, width()}, dt), kHeads);
  return {to_host(be, dq), to_host(be, dkv), to_host(be, dpe)};
}

class MlaPack : public ::testing::TestWithParam<DType> {
 protected:
  DType dt = GetParam();
  CpuBackend cpu{2};
  testing::CountingBackend fallback{2};  // Backend's default mla_pack / mla_unpack
  Vec q = representable(random_normal(N * kHeads.heads * Dq(), 81), dt);
  Vec kv = representable(random_normal(N * kHeads.heads * Dkv(), 82), dt);
  Vec pe = representable(random_normal(N * kHeads.rope, 83), dt);
};

TEST_P(MlaPack, PackPutsEveryElementWhereTheLayoutSays) {
  const Vec want = packed(q, kv, pe);
  EXPECT_EQ(pack(cpu, dt, q, kv, pe), want);
  EXPECT_EQ(pack(fallback, dt, q, kv, pe), want);
}

TEST_P(MlaPack, UnpackCopiesAndSumsTheRopeKeyInHeadOrder) {
  const int64_t H = kHeads.heads;
  const Vec dqkv = representable(random_normal(N * width(), 84), dt);
  const Vec want_rope = rope_key_gradient(dqkv, dt);
  for (const bool default_path : {false, true}) {
    SCOPED_TRACE(default_path ? "Backend's default" : "CPU kernel");
    const Unpacked got = default_path ? unpack(fallback, dt, dqkv) : unpack(cpu, dt, dqkv);
    // dq and dkv: the transposes of pack's copies, column by column.
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < H * Dq(); ++c)
        ASSERT_EQ(got.dq[n * H * Dq() + c], dqkv[n * width() + c]);
      for (int64_t h = 0; h < H; ++h) {
        const double* k = &dqkv[n * width() + H * Dq() + h * Dq()];
        const double* v = &dqkv[n * width() + 2 * H * Dq() + h * kHeads.value];
        const double* d = &got.dkv[n * H * Dkv() + h * Dkv()];
        for (int64_t e = 0; e < kHeads.nope; ++e) ASSERT_EQ(d[e], k[e]) << "row " << n;
        for (int64_t e = 0; e < kHeads.value; ++e) ASSERT_EQ(d[kHeads.nope + e], v[e]);
      }
    }
    EXPECT_EQ(got.dk_rope, want_rope);
  }
}

// Packing, then unpacking the packed row as a gradient: q and kv come back exactly, and the rope
// key H times (small integers: every sum exact in every dtype).
TEST_P(MlaPack, RoundTrip) {
  Vec small_pe(pe.size());
  for (size_t i = 0; i < pe.size(); ++i) small_pe[i] = static_cast<double>(int64_t(i % 7) - 3);
  const Unpacked got = unpack(cpu, dt, pack(cpu, dt, q, kv, small_pe));
  EXPECT_EQ(got.dq, q);
  EXPECT_EQ(got.dkv, kv);
  Vec want(small_pe);
  for (double& x : want) x *= static_cast<double>(kHeads.heads);
  EXPECT_EQ(got.dk_rope, want);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MlaPack, ::testing::Values(DType::F64, DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace meshtrain
