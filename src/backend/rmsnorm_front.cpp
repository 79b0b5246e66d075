// The Backend's public operations of the Llama-family layers (backend.h): RMSNorm, SwiGLU and
// rotary position embeddings, each checking its call's contract once for every device before
// the device's do_* hook runs (as layer_front.cpp does for GPT-2's layers).

#include <string>

#include "meshtrain/backend/backend.h"
#include "op_contract.h"

namespace meshtrain {

using contract::cols_of;
using contract::OpContract;
using contract::rows_of;
using contract::shapes;
using contract::str;

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
  do_rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd);
}

void Backend::rmsnorm_backward_add(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                   const Tensor& inp, const Tensor& weight, const Tensor& rstd,
                                   const Tensor& residual) {
  check_rmsnorm_backward(OpContract(*this, "rmsnorm_backward_add"), dinp, dweight, dout, inp,
                         weight, rstd, &residual);
  do_rmsnorm_backward_add(dinp, dweight, dout, inp, weight, rstd, residual);
}

void Backend::swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  const OpContract c(*this, "swiglu_forward");
  if (gate.shape() != up.shape() || out.shape() != gate.shape())
    c.fail("gate and up are the two halves' separate (N, F) tensors, out alike: " +
           shapes({{"out", &out}, {"gate", &gate}, {"up", &up}}));
  const DType a = gate.dtype();
  c.same_dtype(a, "up", up);
  c.same_dtype(a, "out", out);
  c.on_device({&out, &gate, &up});
  c.computes_in(a);
  do_swiglu_forward(out, gate, up);
}

void Backend::swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                              const Tensor& up) {
  const OpContract c(*this, "swiglu_backward");
  const Shape& s = gate.shape();
  if (up.shape() != s || dout.shape() != s || dgate.shape() != s || dup.shape() != s)
    c.fail("every tensor has gate's shape: " + shapes({{"dgate", &dgate},
                                                       {"dup", &dup},
                                                       {"dout", &dout},
                                                       {"gate", &gate},
                                                       {"up", &up}}));
  const DType a = gate.dtype();
  c.same_dtype(a, "up", up);
  c.same_dtype(a, "dout", dout);
  c.same_dtype(a, "dgate", dgate);
  c.same_dtype(a, "dup", dup);
  c.on_device({&dgate, &dup, &dout, &gate, &up});
  c.computes_in(a);
  do_swiglu_backward(dgate, dup, dout, gate, up);
}

void Backend::swiglu_forward_packed(Tensor& out, const Tensor& gate_up) {
  const OpContract c(*this, "swiglu_forward_packed");
  if (gate_up.shape().rank() != 2 || gate_up.dim(1) % 2 != 0 || out.shape().rank() != 2 ||
      out.dim(0) != gate_up.dim(0) || 2 * out.dim(1) != gate_up.dim(1))
    c.fail("gate_up is (N, 2F), gate's F columns then up's, and out (N, F): " +
           shapes({{"out", &out}, {"gate_up", &gate_up}}));
  const DType a = gate_up.dtype();
  c.same_dtype(a, "out", out);
  c.on_device({&out, &gate_up});
  c.computes_in(a);
  do_swiglu_forward_packed(out, gate_up);
}

void Backend::swiglu_backward_packed(Tensor& dgate_up, const Tensor& dout, const Tensor& gate_up) {
  const OpContract c(*this, "swiglu_backward_packed");
  if (gate_up.shape().rank() != 2 || gate_up.dim(1) % 2 != 0 || dgate_up.shape() != gate_up.shape() ||
      dout.shape().rank() != 2 || dout.dim(0) != gate_up.dim(0) || 2 * dout.dim(1) != gate_up.dim(1))
    c.fail("gate_up and dgate_up are (N, 2F), gate's F columns then up's, and dout (N, F): " +
           shapes({{"dgate_up", &dgate_up}, {"dout", &dout}, {"gate_up", &gate_up}}));
  const DType a = gate_up.dtype();
  c.same_dtype(a, "dout", dout);
  c.same_dtype(a, "dgate_up", dgate_up);
  c.on_device({&dgate_up, &dout, &gate_up});
  c.computes_in(a);
  do_swiglu_backward_packed(dgate_up, dout, gate_up);
}

namespace {
// N = positions.numel() rows of x, each W = x.numel() / N wide, holding `heads` heads of
// head_dim channels from `column`; cos and sin (P, head_dim / 2) in wide(A).
void check_rotary(const OpContract& c, const Tensor& x, const Tensor& positions, const Tensor& cos,
                  const Tensor& sin, const Backend::RotaryHeads& where) {
  const int64_t N = positions.numel();
  const int64_t W = N > 0 ? x.numel() / N : 0;
  const auto geometry = [&] {
    return " (column " + str(where.column) + ", heads " + str(where.heads) + ", head_dim " +
           str(where.head_dim) + "): " +
           shapes({{"x", &x}, {"positions", &positions}, {"cos", &cos}, {"sin", &sin}});
  };
  if (where.head_dim <= 0 || where.head_dim % 2 != 0 || where.heads <= 0 || where.column < 0)
    c.fail("head_dim must be even and > 0, heads > 0, column >= 0" + geometry());
  if (N == 0 ? x.numel() != 0 : W * N != x.numel() || where.column + where.heads * where.head_dim > W)
    c.fail("x must hold one row per position, each with the heads inside it" + geometry());
  if (cos.shape().rank() != 2 || cos.shape() != sin.shape() || cols_of(cos) != where.head_dim / 2)
    c.fail("cos and sin must both be (positions, head_dim / 2)" + geometry());
  const DType a = x.dtype();
  c.wide_stat(a, "cos", cos);
  c.wide_stat(a, "sin", sin);
  c.expect_dtype(a, "positions", positions, DType::I32, "token positions are int32");
  c.on_device({&x, &positions, &cos, &sin});
  c.computes_in(a);
}
}  // namespace

void Backend::rotary_forward(Tensor& x, const Tensor& positions, const Tensor& cos,
                             const Tensor& sin, const RotaryHeads& where) {
  check_rotary(OpContract(*this, "rotary_forward"), x, positions, cos, sin, where);
  do_rotary(x, positions, cos, sin, where, Rotation::ByAngle);
}

void Backend::rotary_backward(Tensor& dx, const Tensor& positions, const Tensor& cos,
                              const Tensor& sin, const RotaryHeads& where) {
  check_rotary(OpContract(*this, "rotary_backward"), dx, positions, cos, sin, where);
  do_rotary(dx, positions, cos, sin, where, Rotation::ByMinusAngle);
}

}  // namespace meshtrain
