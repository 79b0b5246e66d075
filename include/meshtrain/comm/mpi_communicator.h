#pragma once
// Communicator over an MPI communicator, for host buffers. Non-blocking MPI (MPI_Iallreduce,
// MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast, MPI_Isend/Irecv, MPI_Ialltoallv) behind
// Work handles, so gradient buckets, pipeline transfers and expert dispatch overlap computation.
// All-to-all counts rows of a derived datatype (one row of W elements), so that its int counts
// and offsets stay far from their limit however wide the rows. bf16 reductions (activations
// of bf16 mixed precision on the CPU: tensor-parallel sums) run in fp32 and are rounded to
// nearest even once at the end, as the GPU's staged communicator does: each rank's bf16 values
// widen exactly into an fp32 buffer that MPI reduces, and the result is narrowed when the Work
// completes.

#include <mpi.h>

#include <chrono>
#include <functional>

#include "meshtrain/comm/communicator.h"

namespace meshtrain {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed on destruction) unless it is MPI_COMM_WORLD or MPI_COMM_SELF.
  MpiCommunicator(MPI_Comm comm, std::string name,
                  std::chrono::duration<double> timeout = std::chrono::seconds(600));
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  std::string backend() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }
  void set_timeout(std::chrono::duration<double> t) { timeout_ = t; }
  // Waits on this communicator sleep between polls (Work::Impl::patient): for a background
  // thread's own communicator.
  void set_patient(bool on) { patient_ = on; }

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
  std::vector<int64_t> do_all_to_all_counts(const std::vector<int64_t>& send) override;
  void do_barrier() override;
  void do_broadcast_bytes(std::string& bytes, int root) override;
  std::vector<std::string> do_all_gather_bytes(const std::string& mine) override;
  double do_all_reduce_scalar(double value, ReduceOp op) override;

 private:
  // `finish` runs once, when the request has completed (before test() first returns true).
  Work make_work(MPI_Request request, std::string what, std::function<void()> finish = nullptr);
  std::string describe(const char* op, const Tensor& t) const;

  MPI_Comm comm_;
  std::string name_;
  std::chrono::duration<double> timeout_;
  bool patient_ = false;
  int rank_ = 0, size_ = 1;
  bool owned_ = false;
};

}  // namespace meshtrain
