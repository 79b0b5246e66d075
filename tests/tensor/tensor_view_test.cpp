// adjacent_view: separate tensors that lie back to back in one buffer seen as one, which lets
// layers with separate parameters (q, k and v; SwiGLU's gate and up) run one matrix product
// (model/stacked_columns.h); anything else is refused by an undefined tensor, never a view that
// would reach past a part or into another buffer.

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"

namespace meshtrain {
namespace {

TEST(AdjacentView, JoinsPartsThatFollowEachOtherInOneBuffer) {
  CpuBackend be(1);
  Tensor flat = be.empty({40}, DType::F32, MemoryCategory::Parameters);
  float* base = flat.data<float>();
  for (int i = 0; i < 40; ++i) base[i] = static_cast<float>(i);
  const Tensor q = flat.view(0, {4, 2}), k = flat.view(8, {2, 2}), v = flat.view(12, {2, 2});
  const Tensor qkv = adjacent_view({q, k, v}, {8, 2});
  ASSERT_TRUE(qkv.defined());
  EXPECT_EQ(qkv.shape(), (Shape{8, 2}));
  EXPECT_EQ(qkv.data<float>(), base);
  EXPECT_EQ(qkv.data<float>()[15], 15.0f);
  // A single part is itself.
  EXPECT_EQ(adjacent_view({k}, {4}).data<float>(), base + 8);
}

TEST(AdjacentView, RefusesGapsOrderOtherBuffersAndDtypes) {
  CpuBackend be(1);
  Tensor flat = be.empty({40}, DType::F32, MemoryCategory::Parameters);
  Tensor other = be.empty({40}, DType::F32, MemoryCategory::Parameters);
  const Tensor a = flat.view(0, {4}), b = flat.view(4, {4});
  EXPECT_FALSE(adjacent_view({a, flat.view(5, {4})}, {8}).defined()) << "a gap";
  EXPECT_FALSE(adjacent_view({b, a}, {8}).defined()) << "out of order";
  EXPECT_FALSE(adjacent_view({a, other.view(4, {4})}, {8}).defined()) << "another buffer";
  EXPECT_FALSE(adjacent_view({a, Tensor{}}, {8}).defined()) << "an undefined part";
  EXPECT_FALSE(adjacent_view({}, {0}).defined());
  Tensor mixed = be.empty({8}, DType::BF16, MemoryCategory::Parameters);
  EXPECT_FALSE(adjacent_view({mixed.view(0, {4}), flat.view(2, {4})}, {8}).defined());
  EXPECT_THROW(adjacent_view({a, b}, {9}), std::logic_error) << "a shape of another size";
}

}  // namespace
}  // namespace meshtrain
