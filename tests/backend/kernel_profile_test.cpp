// KernelProfile: outermost operations only, entries by decreasing time, and the CPU backend
// recording its operations (with GEMM FLOPs) while a profile is set.

#include <gtest/gtest.h>

#include <thread>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"

namespace meshtrain {
namespace {

TEST(KernelProfile, CountsOutermostScopesOnly) {
  KernelProfile p;
  {
    KernelProfile::Scope outer(&p, "outer", 10);
    KernelProfile::Scope inner(&p, "inner", 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  { KernelProfile::Scope quick(&p, "quick"); }
  { KernelProfile::Scope none(nullptr, "ignored"); }
  const auto e = p.entries();
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].op, "outer");  // the slowest first
  EXPECT_EQ(e[0].calls, 1);
  EXPECT_EQ(e[0].flops, 10);
  EXPECT_GE(e[0].seconds, 0.002);
  EXPECT_EQ(e[1].op, "quick");
  EXPECT_DOUBLE_EQ(p.total_seconds(), e[0].seconds + e[1].seconds);
}

TEST(KernelProfile, CpuBackendRecordsItsOperationsWhileSet) {
  CpuBackend be(1);
  KernelProfile p;
  Tensor x = be.zeros({4, 8}, DType::F32, MemoryCategory::Workspace);
  Tensor w = be.zeros({6, 8}, DType::F32, MemoryCategory::Workspace);
  Tensor y = be.empty({4, 6}, DType::F32, MemoryCategory::Workspace);
  be.set_profile(&p);
  be.matmul_forward(y, x, w, nullptr);
  be.matmul_forward(y, x, w, nullptr);
  be.scale_inplace(y, 2.0);
  be.set_profile(nullptr);
  be.scale_inplace(y, 2.0);
  const auto e = p.entries();
  ASSERT_EQ(e.size(), 2u);
  for (const auto& entry : e) {
    if (entry.op == "matmul_forward 4x6x8") {
      EXPECT_EQ(entry.calls, 2);
      EXPECT_EQ(entry.flops, 2 * 2.0 * 4 * 6 * 8);
    } else {
      EXPECT_EQ(entry.op, "scale_inplace");
      EXPECT_EQ(entry.calls, 1);
    }
  }
}

}  // namespace
}  // namespace meshtrain
