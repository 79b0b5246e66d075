// CpuBackend: set-up, data movement, elementwise ops, reductions and embeddings — the dtype
// dispatch (cpu_checks.h) onto the kernels of kernels.h, on calls the Backend front has checked.
// The layers, attention, cross-entropy and the optimizer are in cpu_layers.cpp.

#include "meshtrain/backend/cpu/cpu_backend.h"

#include <omp.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "cpu_checks.h"
#include "kernels.h"
#include "meshtrain/backend/kernel_profile.h"

namespace meshtrain {

using cpu::cols_of;
using cpu::dispatch;
using cpu::ptr;
using cpu::rows_of;

namespace {
std::unique_ptr<Allocator> make_allocator(Execution e) {
  if (e == Execution::Plan) return std::make_unique<MetaAllocator>(Device::Cpu);
  return std::make_unique<HostAllocator>();
}
}  // namespace

CpuBackend::CpuBackend(int threads, Execution execution)
    : Backend(make_allocator(execution)),
      planning_(execution == Execution::Plan),
      threads_(threads > 0 ? threads : omp_get_max_threads()),
      gemm_(std::make_unique<cpu::Gemm>()) {
  if (!planning_ && threads > 0) omp_set_num_threads(threads);
}

CpuBackend::CpuBackend(int threads, std::unique_ptr<Allocator> allocator)
    : Backend(std::move(allocator)),
      planning_(false),
      threads_(threads > 0 ? threads : omp_get_max_threads()),
      gemm_(std::make_unique<cpu::Gemm>()) {
  if (threads > 0) omp_set_num_threads(threads);
}

bool CpuBackend::computes_in(DType activation) const {
  return activation == DType::F32 || activation == DType::F64 || activation == DType::BF16;
}

int CpuBackend::threads() const { return planning_ ? threads_ : omp_get_max_threads(); }

std::string CpuBackend::describe() const {
  return "cpu (" + cpu::Gemm::onednn_version() + " + OpenBLAS, OpenMP), " +
         std::to_string(threads()) + " thread(s) per rank";
}

void CpuBackend::do_fill(Tensor& t, double value) {
  KernelProfile::Scope timed(profile_, "fill");
  if (planning_) return;
  if (t.dtype() == DType::I32) {
    int32_t* p = t.data<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<int32_t>(value);
    return;
  }
  dispatch(planning_, "fill", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::fill<T>(ptr<T>(t), cpu::narrow<T>(static_cast<cpu::Acc<T>>(value)), t.numel());
  });
}

void CpuBackend::do_copy(Tensor& dst, const Tensor& src) {
  KernelProfile::Scope timed(profile_, "copy");
  if (!planning_) std::memcpy(dst.raw(), src.raw(), src.nbytes());
}

void CpuBackend::do_cast(Tensor& dst, const Tensor& src) {
  KernelProfile::Scope timed(profile_, "cast");
  const DType to = dst.dtype(), from = src.dtype();
  const int64_t n = src.numel();
  const bool supported = to == from || (to == DType::F64 && from == DType::F32) ||
                         (to == DType::F32 && (from == DType::F64 || from == DType::BF16)) ||
                         (to == DType::BF16 && from == DType::F32);
  if (!supported)
    throw std::invalid_argument("backend 'cpu' does not support cast for dtype " +
                                std::string(dtype_name(from)) + " -> " +
                                std::string(dtype_name(to)) +
                                " (supported: fp32 <-> fp64, fp32 <-> bf16)");
  if (planning_) return;
  if (to == from) {
    std::memcpy(dst.raw(), src.raw(), src.nbytes());
  } else if (to == DType::F64) {
    cpu::convert(ptr<double>(dst), ptr<float>(src), n);
  } else if (from == DType::F64) {
    cpu::convert(ptr<float>(dst), ptr<double>(src), n);
  } else if (to == DType::BF16) {
    cpu::float_to_bf16(ptr<uint16_t>(dst), ptr<float>(src), n);
  } else {
    cpu::bf16_to_float(ptr<float>(dst), ptr<uint16_t>(src), n);
  }
}

void CpuBackend::do_copy_from_host(Tensor& dst, const void* src) {
  KernelProfile::Scope timed(profile_, "copy_from_host");
  if (!planning_) std::memcpy(dst.raw(), src, dst.nbytes());
}

// In planning mode `dst` may itself be planned (a fake address): nothing is written.
void CpuBackend::do_copy_to_host(void* dst, const Tensor& src) {
  KernelProfile::Scope timed(profile_, "copy_to_host");
  if (!planning_) std::memcpy(dst, src.raw(), src.nbytes());
}

void CpuBackend::do_add_inplace(Tensor& dst, const Tensor& src) {
  const char* op = "add_inplace";
  KernelProfile::Scope timed(profile_, op);
  if (dst.dtype() != src.dtype()) {  // bf16 into an fp32 accumulator, the one mixed case
    if (!planning_) cpu::add_inplace(ptr<float>(dst), ptr<cpu::bf16>(src), dst.numel());
    return;
  }
  dispatch(planning_, op, dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::add_inplace<T, T>(ptr<T>(dst), ptr<T>(src), dst.numel());
  });
}

void CpuBackend::do_scale_inplace(Tensor& t, double factor) {
  KernelProfile::Scope timed(profile_, "scale_inplace");
  dispatch(planning_, "scale_inplace", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::scale_inplace<T>(ptr<T>(t), static_cast<cpu::Acc<T>>(factor), t.numel());
  });
}

void CpuBackend::do_residual_forward(Tensor& out, const Tensor& a, const Tensor& b) {
  const char* op = "residual_forward";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::residual_forward<T>(ptr<T>(out), ptr<T>(a), ptr<T>(b), out.numel());
  });
}

double CpuBackend::do_sum_squares(const Tensor& t) {
  KernelProfile::Scope timed(profile_, "sum_squares");
  double r = 0;
  dispatch(planning_, "sum_squares", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    r = cpu::sum_squares<T>(ptr<T>(t), t.numel());
  });
  return r;
}

double CpuBackend::do_sum(const Tensor& t) {
  KernelProfile::Scope timed(profile_, "sum");
  double r = 0;
  dispatch(planning_, "sum", t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    r = cpu::sum<T>(ptr<T>(t), t.numel());
  });
  return r;
}

void CpuBackend::do_reduce_into(Tensor& out, int64_t slot, const Tensor& t, Reduction what) {
  KernelProfile::Scope timed(profile_, "reduce_into");
  const double r = what == Reduction::Sum ? sum(t) : sum_squares(t);
  if (!planning_) out.data<double>()[slot] = r;
}

void CpuBackend::do_embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table,
                                      int64_t vocab_begin) {
  const char* op = "embedding_forward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = tokens.numel(), C = cols_of(table);
  dispatch(planning_, op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_forward<T>(ptr<T>(out), ptr<int32_t>(tokens), ptr<T>(table), vocab_begin,
                              rows_of(table), N, C);
  });
}

void CpuBackend::do_embedding_backward(Tensor& dtable, const Tensor& dout, const Tensor& tokens,
                                       int64_t vocab_begin) {
  const char* op = "embedding_backward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = tokens.numel(), C = cols_of(dtable);
  dispatch(planning_, op, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::embedding_backward<T>(ptr<cpu::Acc<T>>(dtable), ptr<T>(dout), ptr<int32_t>(tokens),
                               vocab_begin, rows_of(dtable), N, C);
  });
}

void CpuBackend::do_position_forward(Tensor& out, const Tensor& table, int64_t token_begin) {
  const char* op = "position_forward";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::position_forward<T>(ptr<T>(out), ptr<T>(table), token_begin, rows_of(table), rows_of(out),
                             cols_of(out));
  });
}

void CpuBackend::do_position_backward(Tensor& dtable, const Tensor& dout, int64_t token_begin) {
  const char* op = "position_backward";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    cpu::position_backward<T>(ptr<cpu::Acc<T>>(dtable), ptr<T>(dout), token_begin, rows_of(dtable),
                              rows_of(dout), cols_of(dout));
  });
}

}  // namespace meshtrain
