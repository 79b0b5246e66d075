// The Backend's public operations that move token rows to their experts and back (backend.h,
// "mixture of experts"): gather_rows and gathered_row_dots, each checking its call's contract
// once for every device before the device's do_* hook runs (as rmsnorm_front.cpp does).
// The index's values are not read here: on a GPU that would wait for the device. The CPU
// backend, whose index is host memory, refuses an entry outside [-1, M) in its hook.

#include <initializer_list>
#include <string>
#include <utility>

#include "meshtrain/backend/backend.h"
#include "op_contract.h"

namespace meshtrain {

using contract::OpContract;
using contract::shapes;
using contract::wide;

namespace {

using Named = std::initializer_list<std::pair<const char*, const Tensor*>>;

// Every named tensor (null ones left out) is a matrix, and index (R, K) has K >= 1 terms a row.
void check_matrices_and_terms(const OpContract& c, Named named, const Tensor& index) {
  for (auto [name, t] : named)
    if (t != nullptr && t->shape().rank() != 2)
      c.fail("every tensor is a matrix (2-D): " + shapes(named));
  if (index.dim(1) < 1) c.fail("index (R, K) needs K >= 1 terms per row: " + shapes(named));
}

}  // namespace

void Backend::gather_rows(Tensor& out, const Tensor& src, const Tensor& index,
                          const Tensor* weights) {
  const OpContract c(*this, "gather_rows");
  const Named named{{"out", &out}, {"src", &src}, {"index", &index}, {"weights", weights}};
  check_matrices_and_terms(c, named, index);
  if (index.dim(0) != out.dim(0) || src.dim(1) != out.dim(1))
    c.fail("index (R, K) holds the terms of each row of out (R, C), rows of src (M, C): " +
           shapes(named));
  if (weights != nullptr && weights->shape() != index.shape())
    c.fail("weights must be (R, K) like index, one per term: " + shapes(named));
  const DType a = src.dtype();
  c.same_dtype(a, "out", out);
  c.expect_dtype(a, "index", index, DType::I32, "row indices are int32");
  // The weights are the router's gates, kept wide as statistics are (fp32 under bf16).
  if (weights != nullptr) c.expect_dtype(a, "weights", *weights, wide(a), "routing weights are");
  c.on_device({&out, &src, &index});
  if (weights != nullptr) c.on_device("weights", *weights);
  c.computes_in(a);
  if (out.dim(0) == 0) return;  // no rows to write (a rank that no token reached)
  do_gather_rows(out, src, index, weights);
}

void Backend::gathered_row_dots(Tensor& out, const Tensor& a, const Tensor& b,
                                const Tensor& index) {
  const OpContract c(*this, "gathered_row_dots");
  const Named named{{"out", &out}, {"a", &a}, {"b", &b}, {"index", &index}};
  check_matrices_and_terms(c, named, index);
  if (index.dim(0) != a.dim(0) || b.dim(1) != a.dim(1))
    c.fail("index (R, K) holds the terms of each row of a (R, C), rows of b (M, C): " +
           shapes(named));
  if (out.shape() != index.shape())
    c.fail("out must be (R, K) like index, one dot per term: " + shapes(named));
  const DType act = a.dtype();
  c.same_dtype(act, "b", b);
  c.expect_dtype(act, "index", index, DType::I32, "row indices are int32");
  c.expect_dtype(act, "out", out, wide(act), "routing weights' gradients are");
  c.on_device({&out, &a, &b, &index});
  c.computes_in(act);
  if (out.dim(0) == 0) return;
  do_gathered_row_dots(out, a, b, index);
}

}  // namespace meshtrain
