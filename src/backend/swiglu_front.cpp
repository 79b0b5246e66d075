// The Backend's public SwiGLU operations (backend.h): on separate gate and up tensors, or on the
// packed (N, 2F) product of both, each checking its call's contract once for every device before
// the device's do_* hook runs.

#include <string>

#include "meshtrain/backend/backend.h"
#include "op_contract.h"

namespace meshtrain {

using contract::OpContract;
using contract::shapes;

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

}  // namespace meshtrain
