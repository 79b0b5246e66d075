// The device communicators — NCCL, and MPI staged through pinned host memory — on device tensors
// of a CudaBackend, with expectations computed from rank and size (the sum of rank + 1 over n
// ranks is n(n+1)/2). NCCL needs a GPU per rank (no two ranks of a node on the same GPU UUID,
// however CUDA_VISIBLE_DEVICES numbers them: gpu_sharing in config/device_check.h); the staged
// communicator needs one GPU, which ranks may share. Every rank computes
// whether it can run and all ranks agree (MPI min) before skipping, so no rank is left waiting
// in a collective the others skipped.

#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "meshtrain/app/run_setup.h"
#include "meshtrain/backend/cuda/cuda_backend.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/comm/nccl_communicator.h"
#include "meshtrain/comm/staged_mpi_communicator.h"
#include "meshtrain/config/device_check.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

using testing::make_tensor;
using testing::to_host;
using Vec = std::vector<double>;

bool on_every_rank(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

std::unique_ptr<MpiCommunicator> world_copy(const std::string& name) {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  return std::make_unique<MpiCommunicator>(comm, name);
}

CudaBackend& backend(int device) {
  static std::unique_ptr<CudaBackend> be;
  if (!be) {
    CudaBackendOptions options;
    options.device = device;
    be = std::make_unique<CudaBackend>(options);
  }
  return *be;
}

enum class Kind { Nccl, Staged };

class DeviceComm : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    std::string why;
    const int devices = cuda_device_count(&why);
    if (!on_every_rank(devices > 0)) {
      if (devices == 0) GTEST_SKIP() << "no CUDA device: " << why;
      GTEST_SKIP() << "no CUDA device on some rank";
    }
    const int device = local_rank() % devices;
    const GpuSharing sharing = gpu_sharing(gather_over_node(cuda_device_uuid(device)));
    if (GetParam() == Kind::Nccl && !on_every_rank(sharing.own_gpu))
      GTEST_SKIP() << "NCCL needs a GPU per rank: " << (sharing.own_gpu ? "on another node, " : "")
                   << sharing.why_not;
    be_ = &backend(device);
    static std::unique_ptr<Communicator> nccl, staged;
    auto& comm = GetParam() == Kind::Nccl ? nccl : staged;
    if (!comm) {
      if (GetParam() == Kind::Nccl)
        comm = std::make_unique<NcclCommunicator>(world_copy("world"), *be_);
      else
        comm = std::make_unique<StagedMpiCommunicator>(world_copy("world"), *be_);
    }
    comm_ = comm.get();
    rank_ = comm_->rank();
    n_ = comm_->size();
  }

  Tensor filled(int64_t count, DType dtype, double value) {
    Tensor t = be_->empty({count}, dtype, MemoryCategory::CommBuffers);
    if (dtype == DType::F64) {
      const Vec v(count, value);
      be_->copy_from_host(t, v.data());
    } else if (dtype == DType::I32) {
      const std::vector<int32_t> v(count, static_cast<int32_t>(value));
      be_->copy_from_host(t, v.data());
    } else {
      be_->fill(t, value);
    }
    return t;
  }
  Vec host(const Tensor& t) {
    if (t.dtype() != DType::I32) return to_host(*be_, t);
    std::vector<int32_t> v(t.numel());
    be_->copy_to_host(v.data(), t);
    return Vec(v.begin(), v.end());
  }

  CudaBackend* be_ = nullptr;
  Communicator* comm_ = nullptr;
  int rank_ = 0, n_ = 1;
};

TEST_P(DeviceComm, AllReduceSumsRankPlusOneInEveryDtype) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F64, DType::I32}) {
    Tensor t = filled(1000, dtype, rank_ + 1);
    comm_->all_reduce(t, ReduceOp::Sum).wait();
    EXPECT_EQ(host(t), Vec(1000, n_ * (n_ + 1) / 2.0)) << dtype_name(dtype);
  }
}

TEST_P(DeviceComm, AllReduceMaxAndMin) {
  Tensor hi = filled(64, DType::F32, rank_ + 1), lo = filled(64, DType::BF16, rank_ + 1);
  comm_->all_reduce(hi, ReduceOp::Max).wait();
  comm_->all_reduce(lo, ReduceOp::Min).wait();
  EXPECT_EQ(host(hi), Vec(64, n_));
  EXPECT_EQ(host(lo), Vec(64, 1.0));
}

TEST_P(DeviceComm, ReduceScatterGivesEachRankItsChunk) {
  const int64_t k = 300;
  Vec in(k * n_);
  for (int c = 0; c < n_; ++c)
    for (int64_t j = 0; j < k; ++j) in[c * k + j] = (rank_ + 1) * (c + 1);
  for (DType dtype : {DType::F32, DType::BF16}) {
    Tensor tin = make_tensor(*be_, in, {k * n_}, dtype);
    Tensor tout = be_->empty({k}, dtype, MemoryCategory::CommBuffers);
    comm_->reduce_scatter(tout, tin, ReduceOp::Sum).wait();
    EXPECT_EQ(host(tout), Vec(k, (rank_ + 1) * n_ * (n_ + 1) / 2.0)) << dtype_name(dtype);
  }
}

TEST_P(DeviceComm, AllGatherConcatenatesInRankOrder) {
  const int64_t k = 257;
  Tensor in = filled(k, DType::BF16, rank_ + 1);
  Tensor out = be_->empty({k * n_}, DType::BF16, MemoryCategory::CommBuffers);
  comm_->all_gather(out, in).wait();
  Vec want;
  for (int r = 0; r < n_; ++r) want.insert(want.end(), k, r + 1);
  EXPECT_EQ(host(out), want);
}

TEST_P(DeviceComm, BroadcastFromTheLastRank) {
  const int root = n_ - 1;
  Tensor t = filled(100, DType::F32, rank_ == root ? 42.0 : -1.0);
  comm_->broadcast(t, root).wait();
  EXPECT_EQ(host(t), Vec(100, 42.0));
}

TEST_P(DeviceComm, SendRecvAroundARing) {
  const int next = (rank_ + 1) % n_, prev = (rank_ + n_ - 1) % n_;
  Tensor out = filled(4096, DType::F32, rank_ + 1);
  Tensor in = filled(4096, DType::F32, 0.0);
  // Even ranks send first, odd ranks receive first: no pair waits on each other.
  if (rank_ % 2 == 0) {
    comm_->send(out, next, 7).wait();
    comm_->recv(in, prev, 7).wait();
  } else {
    comm_->recv(in, prev, 7).wait();
    comm_->send(out, next, 7).wait();
  }
  EXPECT_EQ(host(in), Vec(4096, prev + 1));
}

// Uneven blocks (0 to 2 rows, some empty) of rows whose values encode source, destination, row
// and column below 256 (exact in bf16), then back with the counts swapped.
TEST_P(DeviceComm, AllToAllMovesUnevenBlocksAndBack) {
  const int64_t width = 5;
  const auto rows = [](int64_t src, int64_t dst) { return (src + 2 * dst + 1) % 3; };
  const auto code = [&](int64_t src, int64_t dst, int64_t row, int64_t col) {
    return static_cast<double>(((src * 4 + dst) * 3 + row) * width + col);
  };
  std::vector<int64_t> send, recv;
  for (int p = 0; p < n_; ++p) {
    send.push_back(rows(rank_, p));
    recv.push_back(rows(p, rank_));
  }
  ASSERT_EQ(comm_->all_to_all_counts(send), recv);
  Vec in, want;
  for (int p = 0; p < n_; ++p)
    for (int64_t r = 0; r < send[p]; ++r)
      for (int64_t c = 0; c < width; ++c) in.push_back(code(rank_, p, r, c));
  for (int p = 0; p < n_; ++p)
    for (int64_t r = 0; r < recv[p]; ++r)
      for (int64_t c = 0; c < width; ++c) want.push_back(code(p, rank_, r, c));
  const auto rows_in = [&](const Vec& v) { return static_cast<int64_t>(v.size()) / width; };
  for (DType dtype : {DType::F32, DType::BF16, DType::F64}) {
    Tensor tin = make_tensor(*be_, in, {rows_in(in), width}, dtype);
    Tensor tout = be_->empty({rows_in(want), width}, dtype, MemoryCategory::CommBuffers);
    comm_->all_to_all(tout, tin, send, recv).wait();
    EXPECT_EQ(host(tout), want) << dtype_name(dtype);
    Tensor back = be_->empty({rows_in(in), width}, dtype, MemoryCategory::CommBuffers);
    comm_->all_to_all(back, tout, recv, send).wait();
    EXPECT_EQ(host(back), in) << dtype_name(dtype);
  }
}

TEST_P(DeviceComm, BarrierAndHostHelpers) {
  comm_->barrier();
  EXPECT_EQ(comm_->all_reduce_scalar(rank_ + 1, ReduceOp::Sum), n_ * (n_ + 1) / 2.0);
  const auto all = comm_->all_gather_bytes(std::to_string(rank_));
  ASSERT_EQ(static_cast<int>(all.size()), n_);
  for (int r = 0; r < n_; ++r) EXPECT_EQ(all[r], std::to_string(r));
}

INSTANTIATE_TEST_SUITE_P(Comm, DeviceComm, ::testing::Values(Kind::Nccl, Kind::Staged),
                         [](const auto& info) {
                           return std::string(info.param == Kind::Nccl ? "nccl" : "staged");
                         });

}  // namespace
}  // namespace meshtrain
