#include "meshtrain/model/parameter.h"

#include <stdexcept>

#include "meshtrain/backend/backend.h"

namespace meshtrain {

Shape split_shape(const Shape& global, int dim, int parts) {
  if (dim < 0) return global;
  int64_t d[Shape::kMaxRank] = {};
  for (int i = 0; i < global.rank(); ++i) d[i] = global[i];
  if (d[dim] % parts != 0)
    throw std::invalid_argument("dimension " + std::to_string(dim) + " of " + global.to_string() +
                                " does not split into " + std::to_string(parts));
  d[dim] /= parts;
  switch (global.rank()) {
    case 1: return Shape{d[0]};
    case 2: return Shape{d[0], d[1]};
    case 3: return Shape{d[0], d[1], d[2]};
    default: return Shape{d[0], d[1], d[2], d[3]};
  }
}

int64_t Parameter::global_index(int64_t local) const {
  if (split_dim() < 0) return local;
  const Shape& g = spec.global_shape;
  int64_t idx[Shape::kMaxRank] = {};
  for (int i = shape.rank() - 1; i >= 0; --i) {
    idx[i] = local % shape[i];
    local /= shape[i];
  }
  idx[split_dim()] += split_begin;
  int64_t out = 0;
  for (int i = 0; i < g.rank(); ++i) out = out * g[i] + idx[i];
  return out;
}

GradWrite Parameter::take_grad_write() {
  if (!grad_unwritten) return GradWrite::Add;
  grad_unwritten = false;
  return GradWrite::Assign;
}

void Parameter::zero_grad_if_unwritten(Backend& be) {
  if (!grad_unwritten) return;
  be.fill(grad, 0.0);
  grad_unwritten = false;
}

}  // namespace meshtrain
