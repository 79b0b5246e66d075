// The Backend's public rotary position embedding operations (backend.h). Forward and backward
// share one hook, a rotation by the angle or by minus it; each checks its call's contract once
// for every device before that hook runs.

#include <string>

#include "meshtrain/backend/backend.h"
#include "op_contract.h"

namespace meshtrain {

using contract::cols_of;
using contract::OpContract;
using contract::shapes;
using contract::str;

namespace {
// N = positions.numel() rows of x, each W = x.numel() / N wide, holding `heads` heads of
// head_dim channels from `column`, head_stride() apart; cos and sin (P, head_dim / 2) in wide(A).
void check_rotary(const OpContract& c, const Tensor& x, const Tensor& positions, const Tensor& cos,
                  const Tensor& sin, const Backend::RotaryHeads& where) {
  const int64_t N = positions.numel();
  const int64_t W = N > 0 ? x.numel() / N : 0;
  const auto geometry = [&] {
    return " (column " + str(where.column) + ", heads " + str(where.heads) + ", head_dim " +
           str(where.head_dim) + ", stride " + str(where.stride) + "): " +
           shapes({{"x", &x}, {"positions", &positions}, {"cos", &cos}, {"sin", &sin}});
  };
  if (where.head_dim <= 0 || where.head_dim % 2 != 0 || where.heads <= 0 || where.column < 0)
    c.fail("head_dim must be even and > 0, heads > 0, column >= 0" + geometry());
  if (where.stride != 0 && where.stride < where.head_dim)
    c.fail("stride must be 0 (head_dim) or at least head_dim: rotated heads may not overlap" +
           geometry());
  const int64_t span = (where.heads - 1) * where.head_stride() + where.head_dim;
  if (N == 0 ? x.numel() != 0 : W * N != x.numel() || where.column + span > W)
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
