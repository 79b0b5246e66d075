// The CUDA backend's calls that avoid host round trips (see backend.h):
//  - reduce_into writes what sum/sum_squares would return into a device slot, bit for bit,
//    without waiting; many slots are read with one copy;
//  - copy_from_host_async from pinned memory (empty_host) returns before the copy is done and
//    keeps its source alive until it is: the data lands, and a source dropped at once by the
//    caller is not reused by the pinned allocator while the DMA still reads it.
// Without a GPU every test skips with the reason.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/backend/cuda/cuda_backend.h"
#include "support/random.h"
#include "support/skip_without_gpu.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

CudaBackend& gpu() {
  static CudaBackend be;
  return be;
}

TEST(CudaHostTransfer, ReduceIntoMatchesSumBitForBit) {
  SKIP_WITHOUT_GPU();
  CudaBackend& be = gpu();
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor t = testing::make_tensor(be, testing::random_normal(100003, 7), {100003}, dt);
    Tensor slots = be.zeros({4}, DType::F64, MemoryCategory::Workspace);
    be.reduce_into(slots, 3, t, Reduction::Sum);
    be.reduce_into(slots, 1, t, Reduction::SumSquares);
    std::vector<double> host(4);
    be.copy_to_host(host.data(), slots);
    EXPECT_EQ(host[1], be.sum_squares(t)) << dtype_name(dt);
    EXPECT_EQ(host[3], be.sum(t)) << dtype_name(dt);
    EXPECT_EQ(host[0], 0.0);
    EXPECT_EQ(host[2], 0.0);
  }
}

TEST(CudaHostTransfer, AsyncUploadLandsAndOutlivesItsCaller) {
  SKIP_WITHOUT_GPU();
  CudaBackend& be = gpu();
  const int64_t n = int64_t{1} << 22;  // 16 MiB: long enough for the DMA to be in flight
  std::vector<Tensor> dst;
  for (int round = 0; round < 4; ++round) {
    Tensor host = be.empty_host({n}, DType::I32, MemoryCategory::Activations);
    ASSERT_EQ(host.device(), Device::Cpu);
    for (int64_t i = 0; i < n; ++i) host.data<int32_t>()[i] = static_cast<int32_t>(i * 7 + round);
    dst.push_back(be.empty({n}, DType::I32, MemoryCategory::Activations));
    be.copy_from_host_async(dst.back(), std::move(host));
    // `host` is gone here: the next round's empty_host must not get its block back (and
    // overwrite it) before this copy is done.
  }
  for (int round = 0; round < 4; ++round) {
    std::vector<int32_t> back(static_cast<size_t>(n));
    be.copy_to_host(back.data(), dst[round]);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i) wrong += back[i] != static_cast<int32_t>(i * 7 + round);
    EXPECT_EQ(wrong, 0) << "round " << round;
  }
}

}  // namespace
}  // namespace meshtrain
