// CpuBackend: the cross-entropy over the whole vocabulary in one call, the dtype dispatch onto
// cross_entropy.cpp's fused kernel. (The vocabulary-parallel steps, which all-reduce between
// them, are dispatched in cpu_layers.cpp.)

#include "cpu_checks.h"
#include "kernels.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"

namespace meshtrain {

using cpu::Acc;
using cpu::cols_of;
using cpu::dispatch;
using cpu::ptr;
using cpu::rows_of;

void CpuBackend::do_crossentropy_loss_and_backward(Tensor& dlogits, Tensor& losses,
                                                   const Tensor& logits, const Tensor& targets,
                                                   double dloss) {
  const char* op = "crossentropy_loss_and_backward";
  KernelProfile::Scope timed(profile_, op);
  const int64_t N = rows_of(logits), V = cols_of(logits);
  const DType a = logits.dtype();
  // One row of exponentials per thread, kept in cache between the sum and the gradient.
  Tensor scratch = empty({int64_t{threads()} * V}, cpu::wide(a), MemoryCategory::Workspace);
  dispatch(planning_, op, a, [&](auto tag) {
    using T = decltype(tag);
    cpu::crossentropy_loss_and_backward<T>(ptr<T>(dlogits), ptr<Acc<T>>(losses), ptr<T>(logits),
                                           ptr<int32_t>(targets), static_cast<Acc<T>>(dloss), N,
                                           V, ptr<Acc<T>>(scratch));
  });
}

}  // namespace meshtrain
