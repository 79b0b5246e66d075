// CpuBackend: AdamW, the dtype dispatch onto adamw.cpp. Master weights, gradients and moments are
// all fp32 or all fp64 (the front's check); a bf16 model's optimizer updates its fp32 masters and
// writes the bf16 parameters from them in the same pass (ModelState).

#include <vector>

#include "cpu_checks.h"
#include "kernels.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/kernel_profile.h"

namespace meshtrain {

using cpu::Acc;
using cpu::dispatch;
using cpu::ptr;

// Every piece in one parallel pass; `rounded`: null, or the bf16 copy to write in that pass.
void CpuBackend::do_adamw_update(Tensor& param, const Tensor& grad, Tensor& exp_avg,
                                 Tensor& exp_avg_sq, const std::vector<FlatPiece>& pieces,
                                 const std::vector<double>& decays, const AdamWStep& s,
                                 Tensor* rounded) {
  const char* op = "adamw_update";
  KernelProfile::Scope timed(profile_, op);
  std::vector<cpu::AdamWPiece> work;
  work.reserve(pieces.size());
  for (size_t k = 0; k < pieces.size(); ++k)
    if (pieces[k].count > 0) work.push_back({pieces[k].offset, pieces[k].count, decays[k]});
  dispatch(planning_, op, param.dtype(), [&](auto tag) {
    using T = Acc<decltype(tag)>;
    cpu::adamw_update_pieces<T>(ptr<T>(param), ptr<T>(grad), ptr<T>(exp_avg), ptr<T>(exp_avg_sq),
                                rounded ? ptr<uint16_t>(*rounded) : nullptr, work.data(),
                                static_cast<int64_t>(work.size()), s.lr, s.beta1, s.beta2, s.eps,
                                s.step, s.grad_scale);
  });
}

}  // namespace meshtrain
