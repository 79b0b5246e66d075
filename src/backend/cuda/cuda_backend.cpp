// CudaBackend: set-up, data movement, elementwise ops, reductions and the layer kernels'
// dispatch onto the launchers of kernels.h, for calls the Backend front has checked. GEMMs live
// in cuda_matmul.cpp, attention in cuda_attention.cpp, the optimizer in cuda_optimizer.cpp,
// cross-entropy in cuda_cross_entropy.cpp.

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "backend_util.h"
#include "cuda_check.h"
#include "meshtrain/backend/cuda/cuda_allocator.h"

namespace meshtrain {

using cuda::bf16;
using cuda::cols_of;
using cuda::ptr;
using cuda::rows_of;

bool CudaBackend::computes_in(DType activation) const {
  return activation == DType::F32 || activation == DType::BF16;
}

namespace cuda {

void unsupported(const char* op, DType t) {
  throw std::invalid_argument(std::string("backend 'cuda' does not support ") + op +
                              " for dtype " + std::string(dtype_name(t)));
}

}  // namespace cuda

namespace {

int launcher_local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK",
                          "SLURM_LOCALID", "PMIX_LOCAL_RANK"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return 0;
}

std::unique_ptr<Allocator> make_allocator(const CudaBackendOptions& options) {
  std::string why;
  const int count = cuda_device_count(&why);
  if (count == 0)
    throw std::runtime_error("backend 'cuda': no CUDA device (" + why +
                             "); hint: run on a GPU node, or use the cpu backend");
  const int device = options.device >= 0 ? options.device : launcher_local_rank() % count;
  if (device >= count)
    throw std::invalid_argument("backend 'cuda': device " + std::to_string(device) +
                                " requested but only " + std::to_string(count) + " visible");
  MESHTRAIN_CUDA_CHECK("init", cudaSetDevice(device));
  return std::make_unique<CudaAllocator>(device);
}

}  // namespace

std::string_view attention_impl_name(AttentionImpl a) {
  switch (a) {
    case AttentionImpl::Auto: return "auto";
    case AttentionImpl::Cudnn: return "cudnn";
    case AttentionImpl::Own: return "own";
  }
  return "?";
}

AttentionImpl parse_attention_impl(std::string_view s) {
  if (s == "auto") return AttentionImpl::Auto;
  if (s == "cudnn") return AttentionImpl::Cudnn;
  if (s == "own") return AttentionImpl::Own;
  throw std::invalid_argument("attention implementation '" + std::string(s) +
                              "' is not one of auto, cudnn, own");
}

int cuda_device_count(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
    return 0;
  }
  if (count == 0 && why) *why = "cudaGetDeviceCount found no device";
  return count;
}

std::string cuda_device_uuid(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  char text[48];
  std::snprintf(text, sizeof text,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

CudaBackend::CudaBackend(CudaBackendOptions options)
    : Backend(make_allocator(options)),
      options_(options),
      device_(static_cast<CudaAllocator&>(allocator()).device_index()),
      lib_(std::make_unique<Libraries>()) {
  MESHTRAIN_CUDA_CHECK("init", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const size_t ws_floats = (options_.gemm_workspace_bytes + 3) / 4;
  lib_->gemm_workspace = empty({static_cast<int64_t>(ws_floats)}, DType::F32, MemoryCategory::Workspace);
  lib_->gemm = std::make_unique<cuda::LtGemm>(lib_->gemm_workspace.raw(),
                                              options_.gemm_workspace_bytes,
                                              options_.tf32 == Tf32::On);
  int major = 0, minor = 0;
  MESHTRAIN_CUDA_CHECK("init", cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_));
  MESHTRAIN_CUDA_CHECK("init", cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_));
  lib_->platform = {major, minor, static_cast<int64_t>(cudnnGetVersion())};
  if (options_.attention != AttentionImpl::Own) {
    try {
      lib_->cudnn = std::make_unique<cuda::CudnnAttention>();
    } catch (const std::exception& e) {
      lib_->cudnn_error = e.what();
      if (options_.attention == AttentionImpl::Cudnn) throw;
    }
  }
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (lib_) {
    for (auto& [event, host] : lib_->host_copies) cudaEventDestroy(event);
    if (lib_->snapshot_stream) {
      cudaStreamSynchronize(lib_->snapshot_stream);
      cudaStreamDestroy(lib_->snapshot_stream);
      cudaEventDestroy(lib_->snapshot_start);
      cudaEventDestroy(lib_->snapshot_done);
    }
  }
  lib_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

const CudnnPlatform& CudaBackend::cudnn_platform() const { return lib_->platform; }
const std::string& CudaBackend::attention_fallback() const { return lib_->attention_fallback; }

void CudaBackend::synchronize() {
  MESHTRAIN_CUDA_CHECK("synchronize", cudaStreamSynchronize(stream_));
  retire_host_copies();
}

void CudaBackend::retire_host_copies() {
  auto& copies = lib_->host_copies;
  size_t done = 0;
  // In stream order: the first copy still running means every later one is too.
  while (done < copies.size() && cudaEventQuery(copies[done].first) == cudaSuccess) {
    cudaEventDestroy(copies[done].first);
    ++done;
  }
  cudaGetLastError();  // cudaErrorNotReady is an answer, not an error
  copies.erase(copies.begin(), copies.begin() + static_cast<std::ptrdiff_t>(done));
}

// ---- data movement and elementwise -------------------------------------------------------

void CudaBackend::do_fill(Tensor& t, double value) {
  cuda::TimedOp timed(profile_, stream_, "fill");
  switch (t.dtype()) {
    // F64: the device-side slots of loss and gradient-norm sums (reduce_into).
    case DType::F64: cuda::fill(ptr<double>("fill", t), value, t.numel(), stream_); return;
    case DType::F32: cuda::fill(ptr<float>("fill", t), value, t.numel(), stream_); return;
    case DType::BF16: cuda::fill(ptr<bf16>("fill", t), value, t.numel(), stream_); return;
    case DType::I32: cuda::fill(ptr<int32_t>("fill", t), value, t.numel(), stream_); return;
    default: cuda::unsupported("fill", t.dtype());
  }
}

void CudaBackend::do_copy(Tensor& dst, const Tensor& src) {
  cuda::TimedOp timed(profile_, stream_, "copy");
  if (dst.raw() == src.raw() || src.nbytes() == 0) return;
  MESHTRAIN_CUDA_CHECK("copy", cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(),
                                               cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::do_cast(Tensor& dst, const Tensor& src) {
  cuda::TimedOp timed(profile_, stream_, "cast");
  const DType to = dst.dtype(), from = src.dtype();
  if (to == from) return copy(dst, src);
  if (to == DType::BF16 && from == DType::F32)
    return cuda::convert(ptr<bf16>("cast", dst), ptr<float>("cast", src), src.numel(), stream_);
  if (to == DType::F32 && from == DType::BF16)
    return cuda::convert(ptr<float>("cast", dst), ptr<bf16>("cast", src), src.numel(), stream_);
  throw std::invalid_argument("backend 'cuda' does not support cast for dtype " +
                              std::string(dtype_name(from)) + " -> " +
                              std::string(dtype_name(to)) + " (supported: fp32 <-> bf16)");
}

void CudaBackend::do_copy_from_host(Tensor& dst, const void* src) {
  if (dst.nbytes() == 0) return;
  MESHTRAIN_CUDA_CHECK("copy_from_host", cudaMemcpyAsync(dst.raw(), src, dst.nbytes(),
                                                         cudaMemcpyHostToDevice, stream_));
  // The caller may reuse `src` on return (pageable memory is staged, but pinned is not).
  MESHTRAIN_CUDA_CHECK("copy_from_host", cudaStreamSynchronize(stream_));
  retire_host_copies();
}

// From pinned memory (empty_host) cudaMemcpyAsync returns at once and the DMA reads `src` later,
// so `src` must stay untouched and allocated until the copy is done: the backend keeps it (and
// its pinned block, which the allocator would otherwise hand out again) until the event recorded
// after the copy completes. No stream synchronisation: the kernels that read `dst` are queued
// behind the copy on the same stream.
void CudaBackend::do_copy_from_host_async(Tensor& dst, Tensor src) {
  const char* op = "copy_from_host_async";
  if (dst.nbytes() == 0) return;
  retire_host_copies();
  MESHTRAIN_CUDA_CHECK(op, cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(),
                                           cudaMemcpyHostToDevice, stream_));
  cudaEvent_t done = nullptr;
  MESHTRAIN_CUDA_CHECK(op, cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(done, stream_);
  if (recorded != cudaSuccess) {
    cudaEventDestroy(done);
    MESHTRAIN_CUDA_CHECK(op, recorded);
  }
  lib_->host_copies.emplace_back(done, std::move(src));
}

void CudaBackend::do_copy_to_host(void* dst, const Tensor& src) {
  if (src.nbytes() == 0) return;
  MESHTRAIN_CUDA_CHECK("copy_to_host", cudaMemcpyAsync(dst, src.raw(), src.nbytes(),
                                                       cudaMemcpyDeviceToHost, stream_));
  MESHTRAIN_CUDA_CHECK("copy_to_host", cudaStreamSynchronize(stream_));
  retire_host_copies();
}

void CudaBackend::do_snapshot_to_host(Tensor& dst, const Tensor& src) {
  const char* op = "snapshot_to_host";
  if (src.nbytes() == 0) return;
  Libraries& l = *lib_;
  if (!l.snapshot_stream) {
    MESHTRAIN_CUDA_CHECK(op, cudaStreamCreateWithFlags(&l.snapshot_stream, cudaStreamNonBlocking));
    MESHTRAIN_CUDA_CHECK(op, cudaEventCreateWithFlags(&l.snapshot_start, cudaEventDisableTiming));
    MESHTRAIN_CUDA_CHECK(op, cudaEventCreateWithFlags(&l.snapshot_done, cudaEventDisableTiming));
  }
  // Every kernel queued so far (the step that produced this state) comes before the copy.
  MESHTRAIN_CUDA_CHECK(op, cudaEventRecord(l.snapshot_start, stream_));
  MESHTRAIN_CUDA_CHECK(op, cudaStreamWaitEvent(l.snapshot_stream, l.snapshot_start, 0));
  MESHTRAIN_CUDA_CHECK(op, cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(),
                                           cudaMemcpyDeviceToHost, l.snapshot_stream));
  MESHTRAIN_CUDA_CHECK(op, cudaEventRecord(l.snapshot_done, l.snapshot_stream));
}

void CudaBackend::order_after_snapshot() {
  if (lib_->snapshot_done)
    MESHTRAIN_CUDA_CHECK("order_after_snapshot", cudaStreamWaitEvent(stream_, lib_->snapshot_done, 0));
}

// Called from the checkpoint's own thread: the device is made current there first (a
// thread's current device is its own).
void CudaBackend::wait_for_snapshot() {
  if (!lib_->snapshot_done) return;
  MESHTRAIN_CUDA_CHECK("wait_for_snapshot", cudaSetDevice(device_));
  MESHTRAIN_CUDA_CHECK("wait_for_snapshot", cudaEventSynchronize(lib_->snapshot_done));
}

void CudaBackend::do_add_inplace(Tensor& dst, const Tensor& src) {
  cuda::TimedOp timed(profile_, stream_, "add_inplace");
  const char* op = "add_inplace";
  if (dst.dtype() == DType::F32 && src.dtype() == DType::F32)
    return cuda::add_inplace(ptr<float>(op, dst), ptr<float>(op, src), dst.numel(), stream_);
  if (dst.dtype() == DType::BF16 && src.dtype() == DType::BF16)
    return cuda::add_inplace(ptr<bf16>(op, dst), ptr<bf16>(op, src), dst.numel(), stream_);
  // bf16 into an fp32 accumulator, the one mixed case the front lets through.
  cuda::add_inplace(ptr<float>(op, dst), ptr<bf16>(op, src), dst.numel(), stream_);
}

void CudaBackend::do_scale_inplace(Tensor& t, double factor) {
  cuda::TimedOp timed(profile_, stream_, "scale_inplace");
  cuda::dispatch("scale_inplace", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::scale_inplace(ptr<T>("scale_inplace", t), static_cast<float>(factor), t.numel(), stream_);
  });
}

void CudaBackend::do_residual_forward(Tensor& out, const Tensor& a, const Tensor& b) {
  cuda::TimedOp timed(profile_, stream_, "residual_forward");
  const char* op = "residual_forward";
  cuda::dispatch(op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::residual_forward(ptr<T>(op, out), ptr<T>(op, a), ptr<T>(op, b), out.numel(), stream_);
  });
}

void CudaBackend::do_reduce_into(Tensor& out, int64_t slot, const Tensor& t, Reduction what) {
  cuda::TimedOp timed(profile_, stream_, "reduce_into");
  const bool squares = what == Reduction::SumSquares;
  const char* op = squares ? "sum_squares" : "sum";
  double* result = ptr<double>(op, out) + slot;
  // Freed on return while the kernels may still run: the next user of the block is queued
  // behind them on the same stream (see cuda_allocator.h).
  Tensor scratch = empty({cuda::sum_scratch(t.numel())}, DType::F64, MemoryCategory::Workspace);
  cuda::dispatch(op, t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::sum(result, ptr<T>(op, t), t.numel(), squares, ptr<double>(op, scratch), stream_);
  });
}

void CudaBackend::do_reduce_pieces_into(Tensor& out, int64_t first_slot, const Tensor& t,
                                        const std::vector<FlatPiece>& pieces, Reduction what) {
  cuda::TimedOp timed(profile_, stream_, "reduce_into");
  const bool squares = what == Reduction::SumSquares;
  const char* op = squares ? "sum_squares" : "sum";
  const auto count = static_cast<int64_t>(pieces.size());
  if (count == 0) return;
  std::vector<int64_t> offsets, counts;
  for (const FlatPiece& piece : pieces) {
    offsets.push_back(piece.offset);
    counts.push_back(piece.count);
  }
  Tensor scratch = empty({cuda::sum_pieces_scratch(counts.data(), count)}, DType::F64,
                         MemoryCategory::Workspace);
  cuda::dispatch(op, t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::sum_pieces(ptr<double>(op, out) + first_slot, ptr<T>(op, t), offsets.data(),
                     counts.data(), count, squares, ptr<double>(op, scratch), stream_);
  });
}

namespace {
double reduce(CudaBackend& be, const Tensor& t, Reduction what) {
  Tensor result = be.empty({1}, DType::F64, MemoryCategory::Workspace);
  be.reduce_into(result, 0, t, what);
  double host = 0;
  be.copy_to_host(&host, result);
  return host;
}
}  // namespace

double CudaBackend::do_sum_squares(const Tensor& t) {
  return reduce(*this, t, Reduction::SumSquares);
}
double CudaBackend::do_sum(const Tensor& t) { return reduce(*this, t, Reduction::Sum); }

// ---- embeddings ---------------------------------------------------------------------------

void CudaBackend::do_embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table,
                                       int64_t vocab_begin) {
  cuda::TimedOp timed(profile_, stream_, "embedding_forward");
  const char* op = "embedding_forward";
  const int64_t N = tokens.numel(), C = cols_of(table);
  cuda::dispatch(op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::embedding_forward(ptr<T>(op, out), ptr<int32_t>(op, tokens), ptr<T>(op, table),
                            vocab_begin, rows_of(table), N, C, stream_);
  });
}

void CudaBackend::do_embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens,
                                        int64_t vocab_begin) {
  cuda::TimedOp timed(profile_, stream_, "embedding_backward");
  const char* op = "embedding_backward";
  const int64_t N = tokens.numel(), C = cols_of(dtable);
  const size_t bytes = cuda::embedding_backward_workspace(N, C);
  Tensor ws = empty({static_cast<int64_t>((bytes + 3) / 4)}, DType::F32, MemoryCategory::Workspace);
  cuda::dispatch(op, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::embedding_backward(ptr<float>(op, dtable), ptr<T>(op, dout), ptr<int32_t>(op, tokens),
                             vocab_begin, rows_of(dtable), N, C, ws.raw(), bytes, stream_);
  });
}

void CudaBackend::do_position_forward(Tensor& out, const Tensor& table, int64_t token_begin) {
  cuda::TimedOp timed(profile_, stream_, "position_forward");
  const char* op = "position_forward";
  cuda::dispatch(op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::position_forward(ptr<T>(op, out), ptr<T>(op, table), token_begin, rows_of(table),
                           rows_of(out), cols_of(out), stream_);
  });
}

void CudaBackend::do_position_backward(Tensor& dtable, const Tensor& dout, int64_t token_begin) {
  cuda::TimedOp timed(profile_, stream_, "position_backward");
  const char* op = "position_backward";
  cuda::dispatch(op, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::position_backward(ptr<float>(op, dtable), ptr<T>(op, dout), token_begin, rows_of(dtable),
                            rows_of(dout), cols_of(dout), stream_);
  });
}

// ---- layers -------------------------------------------------------------------------------

void CudaBackend::do_layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                       const Tensor& weight, const Tensor& bias) {
  cuda::TimedOp timed(profile_, stream_, "layernorm_forward");
  const char* op = "layernorm_forward";
  const int64_t N = rows_of(inp), C = cols_of(inp);
  const DType a = inp.dtype();
  cuda::dispatch(op, a, [&](auto tag) {
    using T = decltype(tag);
    cuda::layernorm_forward(ptr<T>(op, out), ptr<float>(op, mean), ptr<float>(op, rstd),
                            ptr<T>(op, inp), ptr<T>(op, weight), ptr<T>(op, bias), N, C, stream_);
  });
}

void CudaBackend::do_layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias,
                                        const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                        const Tensor& mean, const Tensor& rstd,
                                        const Tensor* residual) {
  cuda::TimedOp timed(profile_, stream_, "layernorm_backward");
  const char* op = "layernorm_backward";
  const int64_t N = rows_of(inp), C = cols_of(inp);
  const DType a = inp.dtype();
  Tensor scratch = empty({cuda::layernorm_backward_scratch(N, C)}, DType::F32, MemoryCategory::Workspace);
  cuda::dispatch(op, a, [&](auto tag) {
    using T = decltype(tag);
    cuda::layernorm_backward(ptr<T>(op, dinp), ptr<float>(op, dweight), ptr<float>(op, dbias),
                             ptr<T>(op, dout), ptr<T>(op, inp), ptr<T>(op, weight),
                             residual == nullptr ? nullptr : ptr<T>(op, *residual),
                             ptr<float>(op, mean), ptr<float>(op, rstd), N, C,
                             ptr<float>(op, scratch), stream_);
  });
}

void CudaBackend::do_bias_forward(Tensor& out, const Tensor& bias) {
  cuda::TimedOp timed(profile_, stream_, "bias_forward");
  const char* op = "bias_forward";
  cuda::dispatch(op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::bias_forward(ptr<T>(op, out), ptr<T>(op, bias), rows_of(out), cols_of(out), stream_);
  });
}

void CudaBackend::do_bias_backward(Tensor& dbias, const Tensor& dout) {
  cuda::TimedOp timed(profile_, stream_, "bias_backward");
  const char* op = "bias_backward";
  const int64_t N = rows_of(dout), C = cols_of(dout);
  Tensor scratch = empty({cuda::column_sums_scratch(N, C)}, DType::F32, MemoryCategory::Workspace);
  cuda::dispatch(op, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::column_sums(ptr<float>(op, dbias), ptr<T>(op, dout), N, C, ptr<float>(op, scratch),
                      stream_);
  });
}

void CudaBackend::do_gelu_forward(Tensor& out, const Tensor& inp) {
  cuda::TimedOp timed(profile_, stream_, "gelu_forward");
  const char* op = "gelu_forward";
  cuda::dispatch(op, inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::gelu_forward(ptr<T>(op, out), ptr<T>(op, inp), inp.numel(), stream_);
  });
}

void CudaBackend::do_gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  cuda::TimedOp timed(profile_, stream_, "gelu_backward");
  const char* op = "gelu_backward";
  cuda::dispatch(op, inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cuda::gelu_backward(ptr<T>(op, dinp), ptr<T>(op, inp), ptr<T>(op, dout), inp.numel(), stream_);
  });
}

std::unique_ptr<Allocator> CudaBackend::make_host_allocator() const {
  return std::make_unique<PinnedHostAllocator>();
}

}  // namespace meshtrain
