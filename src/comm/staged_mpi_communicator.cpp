#include "meshtrain/comm/staged_mpi_communicator.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/tensor/bf16.h"

namespace meshtrain {

namespace {

// Not cuda::check (src/backend/cuda/cuda_check.h): errors here name the communicator, which
// is what a user of a communication failure needs, rather than a backend op.
void check_cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  throw std::runtime_error("communicator 'mpi-staged': " + what + " failed: " +
                           cudaGetErrorString(e));
}

// Runs the MPI operation, then the copy back to the device, then waits for that copy.
class StagedWork final : public Work::Impl {
 public:
  StagedWork(Work inner, std::function<void()> copy_back, std::vector<Tensor> keep,
             cudaStream_t stream, std::string what)
      : inner_(std::move(inner)), copy_back_(std::move(copy_back)), keep_(std::move(keep)),
        stream_(stream), what_(std::move(what)) {}
  ~StagedWork() override {
    if (copied_) cudaEventDestroy(copied_);
  }

  bool test() override {
    if (!copied_) {
      if (!inner_.test()) return false;
      if (!copy_back_) {
        keep_.clear();
        return true;
      }
      copy_back_();
      check_cuda(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming), what_);
      check_cuda(cudaEventRecord(copied_, stream_), what_);
    }
    const cudaError_t e = cudaEventQuery(copied_);
    if (e == cudaErrorNotReady) return false;
    check_cuda(e, what_ + ": copy back to the device");
    copy_back_ = nullptr;
    keep_.clear();  // the host buffers go back to the pinned cache
    return true;
  }
  std::string describe() const override { return what_ + " (staged through host memory)"; }

 private:
  Work inner_;
  std::function<void()> copy_back_;
  std::vector<Tensor> keep_;  // host buffers MPI or the copy back still use
  cudaStream_t stream_;
  std::string what_;
  cudaEvent_t copied_ = nullptr;
};

bool reduces_in_fp32(DType t) { return t == DType::BF16; }

}  // namespace

StagedMpiCommunicator::StagedMpiCommunicator(std::unique_ptr<MpiCommunicator> mpi,
                                             CudaBackend& backend,
                                             std::chrono::duration<double> timeout)
    : mpi_(std::move(mpi)), backend_(backend), timeout_(timeout),
      pinned_(std::make_unique<PinnedHostAllocator>()) {
  mpi_->set_timeout(timeout);
}

StagedMpiCommunicator::~StagedMpiCommunicator() = default;

Tensor StagedMpiCommunicator::host_like(const Tensor& t, DType dtype) {
  const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(dtype);
  return Tensor(pinned_->allocate(bytes, MemoryCategory::CommBuffers), 0, t.shape(), dtype);
}

Tensor StagedMpiCommunicator::stage_out(const Tensor& t, bool widen) {
  Tensor host = host_like(t, t.dtype());
  backend_.copy_to_host(host.raw(), t);  // synchronous: MPI reads the host buffer next
  if (!widen || t.dtype() != DType::BF16) return host;
  Tensor wide = host_like(t, DType::F32);
  const auto* in = static_cast<const uint16_t*>(host.raw());
  float* out = static_cast<float*>(wide.raw());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = bf16_bits_to_float(in[i]);
  return wide;
}

void StagedMpiCommunicator::stage_in(Tensor& device, const Tensor& host) {
  Tensor source = host;
  if (device.dtype() == DType::BF16 && host.dtype() == DType::F32) {
    source = host_like(device, DType::BF16);
    const float* in = static_cast<const float*>(host.raw());
    auto* out = static_cast<uint16_t*>(source.raw());
    for (int64_t i = 0; i < device.numel(); ++i) out[i] = float_to_bf16_bits(in[i]);
  }
  // Asynchronous on the compute stream; the Work waits for it before the host buffer is reused.
  check_cuda(cudaMemcpyAsync(device.raw(), source.raw(), device.nbytes(), cudaMemcpyHostToDevice,
                             backend_.stream()),
             "copy to the device");
  if (source.raw() != host.raw()) check_cuda(cudaStreamSynchronize(backend_.stream()), "copy");
}

Work StagedMpiCommunicator::after(Work inner, std::function<void()> copy_back,
                                  std::vector<Tensor> keep, std::string what) {
  return Work(std::make_unique<StagedWork>(std::move(inner), std::move(copy_back), std::move(keep),
                                           backend_.stream(), std::move(what)),
              timeout_);
}

// Host tensors go to the MPI communicator unchanged (its checks included); device tensors are
// staged, and MPI then checks the host copies it is given.
void StagedMpiCommunicator::check_supported(const std::string& op, const Tensor& t, Use use) const {
  if (t.device() == Device::Cpu) mpi_->check_supported(op, t, use);
}

void StagedMpiCommunicator::copy_local(Tensor& out, const Tensor& in) {
  if (in.device() == Device::Cpu) Communicator::copy_local(out, in);
  else backend_.copy(out, in);
}

Work StagedMpiCommunicator::do_all_reduce(Tensor& t, ReduceOp op) {
  if (t.device() == Device::Cpu) return mpi_->all_reduce(t, op);
  Tensor host = stage_out(t, reduces_in_fp32(t.dtype()));
  Work inner = mpi_->all_reduce(host, op);
  Tensor device = t;
  return after(std::move(inner), [this, device, host]() mutable { stage_in(device, host); }, {host},
               "all_reduce(" + std::string(reduce_op_name(op)) + ") of " +
                   std::to_string(t.numel()) + " " + std::string(dtype_name(t.dtype())) +
                   " on group '" + name() + "'");
}

Work StagedMpiCommunicator::do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  if (in.device() == Device::Cpu) return mpi_->reduce_scatter(out, in, op);
  Tensor host_in = stage_out(in, reduces_in_fp32(in.dtype()));
  Tensor host_out = host_like(out, host_in.dtype());
  Work inner = mpi_->reduce_scatter(host_out, host_in, op);
  Tensor device = out;
  return after(std::move(inner), [this, device, host_out]() mutable { stage_in(device, host_out); },
               {host_in, host_out},
               "reduce_scatter of " + std::to_string(in.numel()) + " " +
                   std::string(dtype_name(in.dtype())) + " on group '" + name() + "'");
}

Work StagedMpiCommunicator::do_all_gather(Tensor& out, const Tensor& in) {
  if (in.device() == Device::Cpu) return mpi_->all_gather(out, in);
  Tensor host_in = stage_out(in, false);
  Tensor host_out = host_like(out, out.dtype());
  Work inner = mpi_->all_gather(host_out, host_in);
  Tensor device = out;
  return after(std::move(inner), [this, device, host_out]() mutable { stage_in(device, host_out); },
               {host_in, host_out},
               "all_gather of " + std::to_string(out.numel()) + " " +
                   std::string(dtype_name(out.dtype())) + " on group '" + name() + "'");
}

Work StagedMpiCommunicator::do_broadcast(Tensor& t, int root) {
  if (t.device() == Device::Cpu) return mpi_->broadcast(t, root);
  Tensor host = rank() == root ? stage_out(t, false) : host_like(t, t.dtype());
  Work inner = mpi_->broadcast(host, root);
  Tensor device = t;
  std::function<void()> back;
  if (rank() != root) back = [this, device, host]() mutable { stage_in(device, host); };
  return after(std::move(inner), std::move(back), {host},
               "broadcast of " + std::to_string(t.numel()) + " " +
                   std::string(dtype_name(t.dtype())) + " on group '" + name() + "'");
}

Work StagedMpiCommunicator::do_send(const Tensor& t, int dst, int tag) {
  if (t.device() == Device::Cpu) return mpi_->send(t, dst, tag);
  Tensor host = stage_out(t, false);
  Work inner = mpi_->send(host, dst, tag);
  return after(std::move(inner), nullptr, {host},
               "send of " + std::to_string(t.numel()) + " " + std::string(dtype_name(t.dtype())) +
                   " to rank " + std::to_string(dst) + " tag " + std::to_string(tag) +
                   " on group '" + name() + "'");
}

Work StagedMpiCommunicator::do_recv(Tensor& t, int src, int tag) {
  if (t.device() == Device::Cpu) return mpi_->recv(t, src, tag);
  Tensor host = host_like(t, t.dtype());
  Work inner = mpi_->recv(host, src, tag);
  Tensor device = t;
  return after(std::move(inner), [this, device, host]() mutable { stage_in(device, host); }, {host},
               "recv of " + std::to_string(t.numel()) + " " + std::string(dtype_name(t.dtype())) +
                   " from rank " + std::to_string(src) + " tag " + std::to_string(tag) +
                   " on group '" + name() + "'");
}

Work StagedMpiCommunicator::do_all_to_all(Tensor& out, const Tensor& in,
                                          const std::vector<int64_t>& send_rows,
                                          const std::vector<int64_t>& recv_rows) {
  if (in.device() == Device::Cpu) return mpi_->all_to_all(out, in, send_rows, recv_rows);
  Tensor host_in = stage_out(in, false);
  Tensor host_out = host_like(out, out.dtype());
  Work inner = mpi_->all_to_all(host_out, host_in, send_rows, recv_rows);
  Tensor device = out;
  return after(std::move(inner), [this, device, host_out]() mutable { stage_in(device, host_out); },
               {host_in, host_out},
               "all_to_all of rows of " + std::to_string(in.dim(1)) + " " +
                   std::string(dtype_name(in.dtype())) + " on group '" + name() +
                   "', send_rows " + row_counts_text(send_rows) + ", recv_rows " +
                   row_counts_text(recv_rows));
}

}  // namespace meshtrain
