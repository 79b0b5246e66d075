// The Backend's public RMSNorm operations (backend.h), each checking its call's contract once for
// every device before the device's do_* hook runs (as layer_front.cpp does for LayerNorm).

#include <string>

#include "meshtrain/backend/backend.h"
#include "op_contract.h"

namespace meshtrain {

using contract::cols_of;
using contract::OpContract;
using contract::rows_of;
using contract::shapes;

void Backend::rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                              double eps) {
  const OpContract c(*this, "rmsnorm_forward");
  const int64_t N = rows_of(inp), C = cols_of(inp);
  if (out.numel() != N * C || rstd.numel() != N || weight.numel() != C)
    c.fail("shape mismatch for inp " + inp.shape().to_string() + ": " +
           shapes({{"out", &out}, {"rstd", &rstd}, {"weight", &weight}}));
  // eps keeps an all-zero row (padding) finite; a negative one could make the root imaginary.
  if (!(eps > 0)) c.fail("eps " + std::to_string(eps) + " must be > 0 (Llama 3: 1e-5)");
  const DType a = inp.dtype();
  c.same_dtype(a, "out", out);
  c.same_dtype(a, "weight", weight);
  c.wide_stat(a, "rstd", rstd);
  c.on_device({&out, &rstd, &inp, &weight});
  c.computes_in(a);
  do_rmsnorm_forward(out, rstd, inp, weight, eps);
}

namespace {
// rmsnorm_backward's checks; `residual` (rmsnorm_backward_add) may be null.
void check_rmsnorm_backward(const OpContract& c, const Tensor& dinp, const Tensor& dweight,
                            const Tensor& dout, const Tensor& inp, const Tensor& weight,
                            const Tensor& rstd, const Tensor* residual) {
  const int64_t N = rows_of(inp), C = cols_of(inp);
  if (dinp.numel() != N * C || dout.numel() != N * C || dweight.numel() != C ||
      weight.numel() != C || rstd.numel() != N ||
      (residual != nullptr && residual->numel() != N * C))
    c.fail("shape mismatch for inp " + inp.shape().to_string() + ": " +
           shapes({{"dinp", &dinp},
                   {"dweight", &dweight},
                   {"dout", &dout},
                   {"weight", &weight},
                   {"rstd", &rstd},
                   {"residual", residual}}));
  const DType a = inp.dtype();
  c.same_dtype(a, "dinp", dinp);
  c.same_dtype(a, "dout", dout);
  c.same_dtype(a, "weight", weight);
  if (residual != nullptr) c.same_dtype(a, "residual", *residual);
  c.wide_grad(a, "dweight", dweight);
  c.wide_stat(a, "rstd", rstd);
  c.on_device({&dinp, &dweight, &dout, &inp, &weight, &rstd});
  if (residual != nullptr) c.on_device("residual", *residual);
  c.computes_in(a);
}
}  // namespace

void Backend::rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                               const Tensor& inp, const Tensor& weight, const Tensor& rstd) {
  check_rmsnorm_backward(OpContract(*this, "rmsnorm_backward"), dinp, dweight, dout, inp, weight,
                         rstd, nullptr);
  do_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, nullptr);
}

void Backend::rmsnorm_backward_add(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                   const Tensor& inp, const Tensor& weight, const Tensor& rstd,
                                   const Tensor& residual) {
  check_rmsnorm_backward(OpContract(*this, "rmsnorm_backward_add"), dinp, dweight, dout, inp,
                         weight, rstd, &residual);
  do_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, &residual);
}

}  // namespace meshtrain
