#pragma once
// Communicator for device tensors over MPI, staging through pinned host buffers: each operation
// copies its inputs to the host (synchronously, on the backend's stream), runs the ordinary
// non-blocking MPI operation, and when it completes copies the results back on the backend's
// stream (test() then waits for that copy's event). For machines where NCCL cannot be used —
// several ranks sharing one GPU, or no NCCL network — at the cost of two PCIe copies and MPI's
// host bandwidth. bf16 reductions are carried out in fp32 on the host (converted there and
// rounded back to nearest even); data movement of any dtype is bytewise. Host tensors passed in
// are handed to the MPI communicator unchanged.

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "meshtrain/backend/cuda/cuda_allocator.h"
#include "meshtrain/backend/cuda/cuda_backend.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/mpi_communicator.h"

namespace meshtrain {

class StagedMpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `mpi`; `backend` must outlive this.
  StagedMpiCommunicator(std::unique_ptr<MpiCommunicator> mpi, CudaBackend& backend,
                        std::chrono::duration<double> timeout = std::chrono::seconds(600));
  ~StagedMpiCommunicator() override;

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  std::string name() const override { return mpi_->name(); }
  std::string backend() const override { return "mpi-staged"; }

  void check_supported(const std::string& op, const Tensor& t, Use use) const override;

 protected:
  Work do_all_reduce(Tensor& t, ReduceOp op) override;
  Work do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override;
  Work do_all_gather(Tensor& out, const Tensor& in) override;
  Work do_broadcast(Tensor& t, int root) override;
  Work do_send(const Tensor& t, int dst, int tag) override;
  Work do_recv(Tensor& t, int src, int tag) override;
  Work do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                     const std::vector<int64_t>& recv_rows) override;
  std::vector<int64_t> do_all_to_all_counts(const std::vector<int64_t>& send) override {
    return mpi_->all_to_all_counts(send);
  }
  void do_barrier() override { mpi_->barrier(); }
  void do_broadcast_bytes(std::string& bytes, int root) override {
    mpi_->broadcast_bytes(bytes, root);
  }
  std::vector<std::string> do_all_gather_bytes(const std::string& mine) override {
    return mpi_->all_gather_bytes(mine);
  }
  double do_all_reduce_scalar(double value, ReduceOp op) override {
    return mpi_->all_reduce_scalar(value, op);
  }
  void copy_local(Tensor& out, const Tensor& in) override;

 private:
  // A host tensor of `t`'s shape in `dtype` (pinned, from the cache).
  Tensor host_like(const Tensor& t, DType dtype);
  // Device -> host (synchronous); bf16 widened to fp32 when `widen`.
  Tensor stage_out(const Tensor& t, bool widen);
  // Host -> device on the backend's stream (bf16 narrowed from an fp32 host tensor if needed).
  void stage_in(Tensor& device, const Tensor& host);
  // The Work of a staged operation: `inner` (MPI), then `copy_back` (host -> device), keeping
  // the host buffers in `keep` alive until both are done.
  Work after(Work inner, std::function<void()> copy_back, std::vector<Tensor> keep,
             std::string what);

  std::unique_ptr<MpiCommunicator> mpi_;
  CudaBackend& backend_;
  std::chrono::duration<double> timeout_;
  std::unique_ptr<PinnedHostAllocator> pinned_;
};

}  // namespace meshtrain
