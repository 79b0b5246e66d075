// The Backend's grouped matrix products over expert-sorted rows (backend.h, "mixture of
// experts"): grouped_matmul_forward and grouped_matmul_backward, each checking its call's
// contract once for every device before the device's do_* hook runs, and the default hooks: the
// per-group loop of matmul_forward's and matmul_backward's kernels, which the CPU backend keeps.
// The group counts are host integers, so unlike gather_rows' index they are checked here.

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "op_contract.h"

namespace meshtrain {

using contract::OpContract;
using contract::shapes;
using contract::str;

namespace {

using Named = std::initializer_list<std::pair<const char*, const Tensor*>>;

// The counts: one per group of `groups`, none negative, summing to the R rows of `inp`. An
// index and its value name the first bad count; the shapes show what it had to fit.
void check_rows(const OpContract& c, const std::vector<int64_t>& rows, int64_t groups, int64_t R,
                Named named) {
  if (static_cast<int64_t>(rows.size()) != groups)
    c.fail(str(static_cast<int64_t>(rows.size())) + " group row counts for " + str(groups) +
           " groups (the first dimension of weights (G, N, K)): " + shapes(named));
  int64_t sum = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    if (rows[g] < 0)
      c.fail("group " + str(static_cast<int64_t>(g)) + " has " + str(rows[g]) +
             " rows; a count is 0 or more: " + shapes(named));
    sum += rows[g];
  }
  if (sum != R)
    c.fail("the group row counts sum to " + str(sum) + ", not to the " + str(R) +
           " rows of inp (R, K): " + shapes(named));
}

void check_ranks(const OpContract& c, Named matrices, const Tensor* weights, Named named) {
  for (auto [name, t] : matrices)
    if (t != nullptr && t->shape().rank() != 2)
      c.fail(std::string(name) + " must be a matrix (2-D): " + shapes(named));
  if (weights != nullptr && weights->shape().rank() != 3)
    c.fail("weights must be (G, N, K), one (N, K) matrix per group: " + shapes(named));
}

// Group g's (N, K) matrix of a (G, N, K) tensor.
Tensor group_matrix(const Tensor& stacked, int64_t g) {
  const int64_t N = stacked.dim(1), K = stacked.dim(2);
  return stacked.view(g * N * K, {N, K});
}

}  // namespace

void Backend::grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weights,
                                     const std::vector<int64_t>& rows) {
  const OpContract c(*this, "grouped_matmul_forward");
  const Named named{{"inp", &inp}, {"weights", &weights}, {"out", &out}};
  check_ranks(c, {{"inp", &inp}, {"out", &out}}, &weights, named);
  const int64_t R = inp.dim(0), K = inp.dim(1), N = weights.dim(1);
  if (weights.dim(2) != K || out.dim(0) != R || out.dim(1) != N)
    c.fail("inp (R, K) @ each weights[g] (N, K)^T is out (R, N): " + shapes(named));
  check_rows(c, rows, weights.dim(0), R, named);
  const DType a = inp.dtype();
  c.same_dtype(a, "weights", weights);
  c.same_dtype(a, "out", out);
  c.on_device({&out, &inp, &weights});
  c.computes_in(a);
  if (R == 0) return;  // no rows reached this rank's experts
  do_grouped_matmul_forward(out, inp, weights, rows);
}

void Backend::grouped_matmul_backward(Tensor* dinp, Tensor* dweights, const Tensor& dout,
                                      const Tensor& inp, const Tensor& weights,
                                      const std::vector<int64_t>& rows) {
  const OpContract c(*this, "grouped_matmul_backward");
  const Tensor* w = dinp != nullptr ? &weights : nullptr;  // read only for the input gradient
  const Named named{{"inp", &inp}, {"weights", w}, {"dout", &dout}, {"dinp", dinp},
                    {"dweights", dweights}};
  check_ranks(c, {{"inp", &inp}, {"dout", &dout}, {"dinp", dinp}}, w, named);
  if (dweights != nullptr && dweights->shape().rank() != 3)
    c.fail("dweights must be (G, N, K), one (N, K) matrix per group: " + shapes(named));
  const int64_t R = inp.dim(0), K = inp.dim(1), N = dout.dim(1);
  if (dout.dim(0) != R || (dinp && (dinp->dim(0) != R || dinp->dim(1) != K)) ||
      (w && (w->dim(1) != N || w->dim(2) != K)) ||
      (dweights && (dweights->dim(1) != N || dweights->dim(2) != K)) ||
      (w && dweights && w->dim(0) != dweights->dim(0)))
    c.fail("dout (R, N), inp and dinp (R, K), weights and dweights (G, N, K): " + shapes(named));
  if (w != nullptr || dweights != nullptr)
    check_rows(c, rows, (w ? w : dweights)->dim(0), R, named);
  const DType a = inp.dtype();
  c.same_dtype(a, "dout", dout);
  c.on_device("dout", dout);
  c.on_device("inp", inp);
  if (dinp) {
    c.same_dtype(a, "weights", weights);
    c.same_dtype(a, "dinp", *dinp);
    c.on_device("weights", weights);
    c.on_device("dinp", *dinp);
  }
  if (dweights) {
    c.wide_grad(a, "dweights", *dweights);
    c.on_device("dweights", *dweights);
  }
  c.computes_in(a);
  if (R == 0 || (dinp == nullptr && dweights == nullptr)) return;
  do_grouped_matmul_backward(dinp, dweights, dout, inp, weights, rows);
}

void Backend::do_grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weights,
                                        const std::vector<int64_t>& rows) {
  int64_t begin = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    const int64_t end = begin + rows[g];
    if (end > begin) {
      Tensor o = out.rows(begin, end);
      do_matmul_forward(o, inp.rows(begin, end), group_matrix(weights, static_cast<int64_t>(g)),
                        nullptr, nullptr);
    }
    begin = end;
  }
}

void Backend::do_grouped_matmul_backward(Tensor* dinp, Tensor* dweights, const Tensor& dout,
                                         const Tensor& inp, const Tensor& weights,
                                         const std::vector<int64_t>& rows) {
  int64_t begin = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    const int64_t end = begin + rows[g], group = static_cast<int64_t>(g);
    if (end > begin) {
      Tensor di, dw;
      if (dinp) di = dinp->rows(begin, end);
      if (dweights) dw = group_matrix(*dweights, group);
      do_matmul_backward(dinp ? &di : nullptr, dweights ? &dw : nullptr, nullptr,
                         dout.rows(begin, end), inp.rows(begin, end),
                         dinp ? group_matrix(weights, group) : Tensor{}, GradWrite::Add);
    }
    begin = end;
  }
}

}  // namespace meshtrain
