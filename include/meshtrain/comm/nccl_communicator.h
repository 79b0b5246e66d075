#pragma once
// Communicator over NCCL for device tensors of a CudaBackend. Built collectively per group from
// an MPI communicator (rank 0 of the group creates the NCCL unique id and broadcasts it over
// MPI). Collectives run on the communicator's own stream, ordered after all work already queued
// on the backend's compute stream (an event recorded there); the Work each returns holds an
// event recorded after the collective: test() only queries it (and NCCL's asynchronous error),
// and wait() makes the compute stream wait for it, so kernels queued afterwards see the result.
// The Work keeps the tensors it uses alive until it completes. Waits time out like MPI's.
//
// dtypes: fp32, bf16, fp16, fp64 and int32 (NCCL reduces bf16 natively). Point-to-point: NCCL
// has no tags; messages between a pair of ranks match in the order they were posted (the tag
// only names the transfer in errors), and a send or receive blocks the stream until its peer's
// runs: exchange() issues a transfer step as one group, and all_to_all one group of a send and
// a receive per peer (NCCL has no all-to-all of uneven sizes). Byte and scalar helpers, and
// all_to_all's counts (host values), run over the MPI communicator.
// Needs one GPU per rank of the group: ranks that share a GPU use StagedMpiCommunicator.

#include <chrono>
#include <memory>

#include "meshtrain/backend/cuda/cuda_backend.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/job_abort.h"
#include "meshtrain/comm/mpi_communicator.h"

struct ncclComm;

namespace meshtrain {

struct NcclDoneEvent;

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `mpi`'s group. Takes ownership of `mpi`. `backend` must outlive this.
  NcclCommunicator(std::unique_ptr<MpiCommunicator> mpi, CudaBackend& backend,
                   std::chrono::duration<double> timeout = std::chrono::seconds(600));
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  std::string name() const override { return mpi_->name(); }
  std::string backend() const override { return "nccl"; }
  cudaStream_t stream() const { return stream_; }

  void check_supported(const std::string& op, const Tensor& t, Use use) const override;

 protected:
  Work do_all_reduce(Tensor& t, ReduceOp op) override;
  Work do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override;
  Work do_all_gather(Tensor& out, const Tensor& in) override;
  Work do_broadcast(Tensor& t, int root) override;
  Work do_send(const Tensor& t, int dst, int tag) override;
  Work do_recv(Tensor& t, int src, int tag) override;
  std::vector<Work> do_exchange(const std::vector<Transfer>& step) override;
  Work do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                     const std::vector<int64_t>& recv_rows) override;
  std::vector<int64_t> do_all_to_all_counts(const std::vector<int64_t>& send) override;
  void do_barrier() override;
  void do_broadcast_bytes(std::string& bytes, int root) override;
  std::vector<std::string> do_all_gather_bytes(const std::string& mine) override;
  double do_all_reduce_scalar(double value, ReduceOp op) override;
  void copy_local(Tensor& out, const Tensor& in) override;

 private:
  void order_after_compute();
  std::shared_ptr<NcclDoneEvent> record_done(const std::string& what);
  Work finish(std::string what, std::vector<Tensor> keep);
  std::string describe(const char* op, const Tensor& t) const;

  std::unique_ptr<MpiCommunicator> mpi_;
  CudaBackend& backend_;
  std::chrono::duration<double> timeout_;
  ncclComm* comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr;
  Tensor barrier_buffer_;
  ScopedAbortHook abort_on_failure_;  // ncclCommAbort before MPI_Abort (comm/job_abort.h)
};

}  // namespace meshtrain
