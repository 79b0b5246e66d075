#include "meshtrain/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>


namespace meshtrain {

// The event recorded after one operation (or one group) on the communication stream, shared by
// the Works of every transfer of a group.
struct NcclDoneEvent {
  cudaEvent_t event = nullptr;
  ~NcclDoneEvent() {
    if (event) cudaEventDestroy(event);
  }
};

namespace {

[[noreturn]] void unsupported(const std::string& op, DType t) {
  throw std::invalid_argument("communicator 'nccl' does not support " + op + " for dtype " +
                              std::string(dtype_name(t)));
}

void check_nccl(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  std::string detail = ncclGetErrorString(r);
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) detail += std::string(": ") + last;
  }
  throw std::runtime_error("communicator 'nccl': " + what + " failed: " + detail);
}

// Not cuda::check (src/backend/cuda/cuda_check.h): errors here name the communicator, which
// is what a user of a communication failure needs, rather than a backend op.
void check_cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  throw std::runtime_error("communicator 'nccl': " + what + " failed: " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(const std::string& op, DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
  }
  unsupported(op, t);
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

void require_device(const std::string& op, const Tensor& t) {
  if (t.device() != Device::Cuda)
    throw std::invalid_argument("communicator 'nccl' does not support " + op +
                                " on host buffers (use the MPI communicator)");
}

// Completion of one operation on the communication stream. Polling only queries the event; the
// compute stream is made to wait for it only by Work::wait (order_consumers), so a reducer that
// polls right after launching keeps the collective overlapped with the backward pass.
class NcclWork final : public Work::Impl {
 public:
  NcclWork(std::shared_ptr<NcclDoneEvent> done, cudaStream_t compute, ncclComm_t comm, std::string what,
           std::vector<Tensor> keep)
      : done_(std::move(done)), compute_(compute), comm_(comm), what_(std::move(what)),
        keep_(std::move(keep)) {}

  bool test() override {
    const cudaError_t e = cudaEventQuery(done_->event);
    if (e == cudaSuccess) {
      keep_.clear();
      return true;
    }
    if (e != cudaErrorNotReady) check_cuda(e, what_ + ": cudaEventQuery");
    ncclResult_t async = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &async), comm_, what_ + ": ncclCommGetAsyncError");
    check_nccl(async, comm_, what_);
    return false;
  }
  void order_consumers() override {
    check_cuda(cudaStreamWaitEvent(compute_, done_->event, 0), what_ + ": cudaStreamWaitEvent");
  }
  std::string describe() const override { return what_; }

 private:
  std::shared_ptr<NcclDoneEvent> done_;
  cudaStream_t compute_;
  ncclComm_t comm_;
  std::string what_;
  std::vector<Tensor> keep_;  // buffers stay allocated until the collective is done
};

}  // namespace

NcclCommunicator::NcclCommunicator(std::unique_ptr<MpiCommunicator> mpi, CudaBackend& backend,
                                   std::chrono::duration<double> timeout)
    : mpi_(std::move(mpi)), backend_(backend), timeout_(timeout) {
  check_cuda(cudaSetDevice(backend_.device_index()), "cudaSetDevice");
  // Rank 0 creates the id; every rank learns whether that worked before initialising.
  struct {
    int ok;
    ncclUniqueId id;
  } message{};
  std::string error;
  if (mpi_->rank() == 0) {
    const ncclResult_t r = ncclGetUniqueId(&message.id);
    message.ok = r == ncclSuccess;
    if (!message.ok) error = ncclGetErrorString(r);
  }
  MPI_Bcast(&message, sizeof message, MPI_BYTE, 0, mpi_->comm());
  if (!message.ok)
    throw std::runtime_error("communicator 'nccl': ncclGetUniqueId failed on rank 0 of group '" +
                             mpi_->name() + "'" + (error.empty() ? "" : ": " + error));
  check_nccl(ncclCommInitRank(&comm_, mpi_->size(), message.id, mpi_->rank()), nullptr,
             "ncclCommInitRank for group '" + mpi_->name() + "' (rank " +
                 std::to_string(mpi_->rank()) + " of " + std::to_string(mpi_->size()) +
                 "; NCCL needs a distinct GPU per rank: ranks sharing a GPU must use the staged "
                 "MPI communicator)");
  int least = 0, greatest = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  check_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest),
             "cudaStreamCreateWithPriority");
  check_cuda(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming), "cudaEventCreate");
  barrier_buffer_ = backend_.zeros({1}, DType::F32, MemoryCategory::CommBuffers);
  // On a communication failure anywhere in the process, this communicator is aborted before
  // MPI_Abort: a kernel waiting for a dead peer never finishes otherwise (comm/job_abort.h).
  abort_on_failure_ = ScopedAbortHook([comm = comm_] { ncclCommAbort(comm); });
}

NcclCommunicator::~NcclCommunicator() {
  abort_on_failure_ = ScopedAbortHook();
  if (stream_) cudaStreamSynchronize(stream_);
  if (comm_) ncclCommDestroy(comm_);
  if (compute_ready_) cudaEventDestroy(compute_ready_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::string NcclCommunicator::describe(const char* op, const Tensor& t) const {
  return std::string(op) + " of " + std::to_string(t.numel()) + " " +
         std::string(dtype_name(t.dtype())) + " on group '" + name() + "' (rank " +
         std::to_string(rank()) + " of " + std::to_string(size()) + ", nccl)";
}

void NcclCommunicator::order_after_compute() {
  check_cuda(cudaEventRecord(compute_ready_, backend_.stream()), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(stream_, compute_ready_, 0), "cudaStreamWaitEvent");
}

std::shared_ptr<NcclDoneEvent> NcclCommunicator::record_done(const std::string& what) {
  auto done = std::make_shared<NcclDoneEvent>();
  check_cuda(cudaEventCreateWithFlags(&done->event, cudaEventDisableTiming), what + ": cudaEventCreate");
  check_cuda(cudaEventRecord(done->event, stream_), what + ": cudaEventRecord");
  return done;
}

Work NcclCommunicator::finish(std::string what, std::vector<Tensor> keep) {
  std::shared_ptr<NcclDoneEvent> done = record_done(what);
  return Work(std::make_unique<NcclWork>(std::move(done), backend_.stream(), comm_, std::move(what),
                                         std::move(keep)),
              timeout_);
}

void NcclCommunicator::check_supported(const std::string& op, const Tensor& t, Use) const {
  require_device(op, t);
  nccl_type(op, t.dtype());
}

void NcclCommunicator::copy_local(Tensor& out, const Tensor& in) { backend_.copy(out, in); }

Work NcclCommunicator::do_all_reduce(Tensor& t, ReduceOp op) {
  if (t.numel() == 0) return {};
  const std::string name = "all_reduce(" + std::string(reduce_op_name(op)) + ")";
  const ncclDataType_t type = nccl_type(name, t.dtype());
  order_after_compute();
  const std::string what = describe(name.c_str(), t);
  check_nccl(ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()), type, nccl_op(op),
                           comm_, stream_),
             comm_, what);
  return finish(what, {t});
}

Work NcclCommunicator::do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  const std::string name = "reduce_scatter(" + std::string(reduce_op_name(op)) + ")";
  const ncclDataType_t type = nccl_type(name, in.dtype());
  order_after_compute();
  const std::string what = describe(name.c_str(), in);
  check_nccl(ncclReduceScatter(in.raw(), out.raw(), static_cast<size_t>(out.numel()), type,
                               nccl_op(op), comm_, stream_),
             comm_, what);
  return finish(what, {in, out});
}

Work NcclCommunicator::do_all_gather(Tensor& out, const Tensor& in) {
  const ncclDataType_t type = nccl_type("all_gather", in.dtype());
  order_after_compute();
  const std::string what = describe("all_gather", out);
  // In place when `in` is this rank's slot of `out` (NCCL detects that case itself).
  check_nccl(ncclAllGather(in.raw(), out.raw(), static_cast<size_t>(in.numel()), type, comm_,
                           stream_),
             comm_, what);
  return finish(what, {in, out});
}

Work NcclCommunicator::do_broadcast(Tensor& t, int root) {
  if (t.numel() == 0) return {};
  const ncclDataType_t type = nccl_type("broadcast", t.dtype());
  order_after_compute();
  const std::string what = describe("broadcast", t) + " from rank " + std::to_string(root);
  check_nccl(ncclBroadcast(t.raw(), t.raw(), static_cast<size_t>(t.numel()), type, root, comm_,
                           stream_),
             comm_, what);
  return finish(what, {t});
}

// A lone transfer is a step of one: NCCL's transfers are issued in groups (do_exchange).
Work NcclCommunicator::do_send(const Tensor& t, int dst, int tag) {
  return std::move(do_exchange({{Transfer::Kind::Send, t, dst, tag}}).front());
}

Work NcclCommunicator::do_recv(Tensor& t, int src, int tag) {
  return std::move(do_exchange({{Transfer::Kind::Recv, t, src, tag}}).front());
}

// NCCL point-to-point calls block the stream until the peer's matching call runs, and carry no
// tags. Issued as one group, the transfers of a step progress together (a send and a receive
// between the same two ranks cannot wait for each other), and the group as a whole is one
// operation on the stream; the schedule guarantees matching groups are issued in the same order
// on both peers (parallel/schedule.h).
std::vector<Work> NcclCommunicator::do_exchange(const std::vector<Transfer>& step) {
  std::vector<std::string> what;
  for (const Transfer& t : step) {
    const bool send = t.kind == Transfer::Kind::Send;
    what.push_back(describe(send ? "send" : "recv", t.tensor) + (send ? " to rank " : " from rank ") +
                   std::to_string(t.peer) + " tag " + std::to_string(t.tag));
  }
  std::vector<Work> works;
  order_after_compute();
  std::string group = what.front() + (step.size() > 1 ? " (in a group of " + std::to_string(step.size()) + ")" : "");
  check_nccl(ncclGroupStart(), comm_, group);
  for (const Transfer& t : step) {
    const ncclDataType_t type = nccl_type("send", t.tensor.dtype());
    const auto count = static_cast<size_t>(t.tensor.numel());
    if (t.kind == Transfer::Kind::Send)
      check_nccl(ncclSend(t.tensor.raw(), count, type, t.peer, comm_, stream_), comm_, group);
    else
      check_nccl(ncclRecv(t.tensor.raw(), count, type, t.peer, comm_, stream_), comm_, group);
  }
  check_nccl(ncclGroupEnd(), comm_, group);
  const std::shared_ptr<NcclDoneEvent> done = record_done(group);
  for (size_t i = 0; i < step.size(); ++i)
    works.emplace_back(std::make_unique<NcclWork>(done, backend_.stream(), comm_, std::move(what[i]),
                                                  std::vector<Tensor>{step[i].tensor}),
                       timeout_);
  return works;
}

// One group of a send and a receive per peer with rows to move, as PyTorch's all_to_all_single
// does over NCCL for uneven splits (the call Megatron-Core's token dispatcher makes): inside a
// group the transfers progress together, so no order of peers can deadlock. The block a rank
// keeps is copied on the communication stream, so that the Work's event covers it too.
Work NcclCommunicator::do_all_to_all(Tensor& out, const Tensor& in,
                                     const std::vector<int64_t>& send_rows,
                                     const std::vector<int64_t>& recv_rows) {
  const ncclDataType_t type = nccl_type("all_to_all", in.dtype());
  const auto width = static_cast<size_t>(in.dim(1));
  const std::string what = "all_to_all of rows of " + std::to_string(width) + " " +
                           std::string(dtype_name(in.dtype())) + " on group '" + name() +
                           "' (rank " + std::to_string(rank()) + " of " + std::to_string(size()) +
                           ", nccl), send_rows " + row_counts_text(send_rows) + ", recv_rows " +
                           row_counts_text(recv_rows);
  order_after_compute();
  const auto me = static_cast<size_t>(rank());
  const std::vector<int64_t> send_start = row_block_starts(send_rows);
  const std::vector<int64_t> recv_start = row_block_starts(recv_rows);
  if (send_rows[me] > 0)
    check_cuda(cudaMemcpyAsync(out.rows(recv_start[me], recv_start[me] + recv_rows[me]).raw(),
                               in.rows(send_start[me], send_start[me] + send_rows[me]).raw(),
                               static_cast<size_t>(send_rows[me]) * width * dtype_size(in.dtype()),
                               cudaMemcpyDeviceToDevice, stream_),
               what + ": the block this rank keeps");
  check_nccl(ncclGroupStart(), comm_, what);
  for (size_t p = 0; p < send_rows.size(); ++p) {
    const int peer = static_cast<int>(p);
    if (p != me && send_rows[p] > 0)
      check_nccl(ncclSend(in.rows(send_start[p], send_start[p] + send_rows[p]).raw(),
                          static_cast<size_t>(send_rows[p]) * width, type, peer, comm_, stream_),
                 comm_, what);
    if (p != me && recv_rows[p] > 0)
      check_nccl(ncclRecv(out.rows(recv_start[p], recv_start[p] + recv_rows[p]).raw(),
                          static_cast<size_t>(recv_rows[p]) * width, type, peer, comm_, stream_),
                 comm_, what);
  }
  check_nccl(ncclGroupEnd(), comm_, what);
  return finish(what, {in, out});
}

std::vector<int64_t> NcclCommunicator::do_all_to_all_counts(const std::vector<int64_t>& send) {
  return mpi_->all_to_all_counts(send);
}

void NcclCommunicator::do_barrier() { do_all_reduce(barrier_buffer_, ReduceOp::Sum).wait(); }

void NcclCommunicator::do_broadcast_bytes(std::string& bytes, int root) {
  mpi_->broadcast_bytes(bytes, root);
}

std::vector<std::string> NcclCommunicator::do_all_gather_bytes(const std::string& mine) {
  return mpi_->all_gather_bytes(mine);
}

double NcclCommunicator::do_all_reduce_scalar(double value, ReduceOp op) {
  return mpi_->all_reduce_scalar(value, op);
}

}  // namespace meshtrain
