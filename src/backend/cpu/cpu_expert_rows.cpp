// CpuBackend: the mixture-of-experts row operations (gather_rows, gathered_row_dots), the dtype
// dispatch onto expert_rows.cpp for calls the Backend front has checked (expert_rows_front.cpp).
// The index is host memory here, so an entry outside [-1, M) is refused before any row is read
// (a GPU cannot check without waiting and skips such a term; backend.h).

#include <stdexcept>
#include <string>

#include "cpu_checks.h"
#include "kernels.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"

namespace meshtrain {

using cpu::Acc;
using cpu::dispatch;
using cpu::ptr;

namespace {

// Refuses the first index entry outside [-1, M) for `rows` (the tensor the index picks rows of).
void check_index_values(const char* op, const Tensor& index, const char* rows, int64_t M) {
  const int32_t* idx = ptr<int32_t>(index);
  const int64_t K = index.dim(1);
  if (const int64_t i = cpu::gather_index_outside(idx, index.numel(), M); i >= 0)
    throw std::invalid_argument(
        std::string("backend 'cpu': ") + op + ": index " + std::to_string(idx[i]) + " of row " +
        std::to_string(i / K) + " (term " + std::to_string(i % K) + ") is outside [-1, " +
        std::to_string(M) + "): each entry is one of the " + std::to_string(M) + " rows of " +
        rows + ", or -1 for a term left out (a token an expert dropped)");
}

}  // namespace

void CpuBackend::do_gather_rows(Tensor& out, const Tensor& src, const Tensor& index,
                                const Tensor* weights) {
  const char* op = "gather_rows";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, src.dtype(), [&](auto tag) {
    using T = decltype(tag);
    check_index_values(op, index, "src", src.dim(0));
    cpu::gather_rows<T>(ptr<T>(out), ptr<T>(src), ptr<int32_t>(index),
                        weights == nullptr ? nullptr : ptr<Acc<T>>(*weights), out.dim(0),
                        out.dim(1), index.dim(1));
  });
}

void CpuBackend::do_gathered_row_dots(Tensor& out, const Tensor& a, const Tensor& b,
                                      const Tensor& index) {
  const char* op = "gathered_row_dots";
  KernelProfile::Scope timed(profile_, op);
  dispatch(planning_, op, a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    check_index_values(op, index, "b", b.dim(0));
    cpu::gathered_row_dots<T>(ptr<Acc<T>>(out), ptr<T>(a), ptr<T>(b), ptr<int32_t>(index),
                              a.dim(0), a.dim(1), index.dim(1));
  });
}

}  // namespace meshtrain
