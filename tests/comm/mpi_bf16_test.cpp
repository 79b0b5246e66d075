// bf16 over the MPI communicator (host tensors: the CPU backend's bf16 activations). Reductions
// widen every rank's values exactly to fp32, reduce in fp32 and round to nearest even once, as
// the GPU's staged communicator does; data movement is bytewise. Expectations are computed from
// rank and size: values are multiples of 2^-8 below 4, so every fp32 sum over a few ranks is
// exact and the only rounding is the final one. Under mpiexec with 2 and 3 ranks.

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/tensor/allocator.h"
#include "meshtrain/tensor/bf16.h"
#include "support/mpi_world.h"

namespace meshtrain {
namespace {

constexpr int64_t kCount = 6;

Tensor bf16_tensor(HostAllocator& alloc, const std::vector<float>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor t(alloc.allocate(static_cast<size_t>(n) * 2, MemoryCategory::Activations), 0, {n},
           DType::BF16);
  auto* bits = static_cast<uint16_t*>(t.raw());
  for (int64_t i = 0; i < n; ++i) bits[i] = float_to_bf16_bits(values[static_cast<size_t>(i)]);
  return t;
}

std::vector<float> values_of(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  const auto* bits = static_cast<const uint16_t*>(t.raw());
  for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = bf16_bits_to_float(bits[i]);
  return out;
}

// Rank r's element i: exact in bf16.
float value(int r, int64_t i) { return 1.0f + std::ldexp(static_cast<float>((r * 5 + i * 3) % 17), -4); }

float round_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

MpiCommunicator world() {
  return MpiCommunicator(MPI_COMM_WORLD, "world", std::chrono::duration<double>(60));
}

TEST(MpiBf16, AllReduceSumsInFp32AndRoundsOnce) {
  MpiCommunicator comm = world();
  HostAllocator alloc;
  const int n = comm.size(), r = comm.rank();
  std::vector<float> mine(kCount);
  for (int64_t i = 0; i < kCount; ++i) mine[static_cast<size_t>(i)] = value(r, i);
  // Element kCount - 1: rank 0 holds 1, every other rank 2^-8. In fp32 the sum is
  // 1 + (n - 1) 2^-8; rounding after each addition instead would keep 1 (1 + 2^-8 is a tie that
  // goes to the even 1). With 3 ranks the two differ.
  mine.back() = r == 0 ? 1.0f : std::ldexp(1.0f, -8);
  Tensor t = bf16_tensor(alloc, mine);
  comm.all_reduce(t, ReduceOp::Sum).wait();
  const std::vector<float> got = values_of(t);
  for (int64_t i = 0; i + 1 < kCount; ++i) {
    float sum = 0;
    for (int k = 0; k < n; ++k) sum += value(k, i);
    EXPECT_EQ(got[static_cast<size_t>(i)], round_bf16(sum)) << "element " << i;
  }
  EXPECT_EQ(got.back(), round_bf16(1.0f + static_cast<float>(n - 1) * std::ldexp(1.0f, -8)));

  Tensor m = bf16_tensor(alloc, {static_cast<float>(r), -static_cast<float>(r)});
  comm.all_reduce(m, ReduceOp::Max).wait();
  EXPECT_EQ(values_of(m), (std::vector<float>{static_cast<float>(n - 1), 0.0f}));
}

TEST(MpiBf16, ReduceScatterSumsInFp32AndRoundsOnce) {
  MpiCommunicator comm = world();
  HostAllocator alloc;
  const int n = comm.size(), r = comm.rank();
  std::vector<float> in(static_cast<size_t>(kCount * n));
  for (int64_t i = 0; i < kCount * n; ++i) in[static_cast<size_t>(i)] = value(r, i);
  Tensor tin = bf16_tensor(alloc, in);
  Tensor tout = bf16_tensor(alloc, std::vector<float>(kCount, 0.0f));
  comm.reduce_scatter(tout, tin, ReduceOp::Sum).wait();
  const std::vector<float> got = values_of(tout);
  for (int64_t i = 0; i < kCount; ++i) {
    float sum = 0;
    for (int k = 0; k < n; ++k) sum += value(k, r * kCount + i);
    EXPECT_EQ(got[static_cast<size_t>(i)], round_bf16(sum)) << "element " << i;
  }
}

TEST(MpiBf16, AllGatherMovesTheBits) {
  MpiCommunicator comm = world();
  HostAllocator alloc;
  const int n = comm.size(), r = comm.rank();
  std::vector<float> mine(kCount);
  for (int64_t i = 0; i < kCount; ++i) mine[static_cast<size_t>(i)] = value(r, i);
  Tensor in = bf16_tensor(alloc, mine);
  Tensor out = bf16_tensor(alloc, std::vector<float>(static_cast<size_t>(kCount * n), 0.0f));
  comm.all_gather(out, in).wait();
  const std::vector<float> got = values_of(out);
  for (int k = 0; k < n; ++k)
    for (int64_t i = 0; i < kCount; ++i)
      EXPECT_EQ(got[static_cast<size_t>(k * kCount + i)], value(k, i));
}

}  // namespace
}  // namespace meshtrain
