#include "meshtrain/backend/backend.h"

namespace meshtrain {

Backend::~Backend() = default;

std::unique_ptr<Allocator> Backend::make_host_allocator() const {
  return std::make_unique<HostAllocator>();
}

Tensor Backend::empty(Shape shape, DType dtype, MemoryCategory category) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  return Tensor(allocator_->allocate(bytes, category), 0, shape, dtype);
}

Tensor Backend::zeros(Shape shape, DType dtype, MemoryCategory category) {
  Tensor t = empty(shape, dtype, category);
  fill(t, 0.0);
  return t;
}

}  // namespace meshtrain
