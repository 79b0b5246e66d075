#include "meshtrain/backend/backend.h"

#include <stdexcept>
#include <string>

namespace meshtrain {

Backend::~Backend() = default;

std::unique_ptr<Allocator> Backend::make_host_allocator() const {
  return std::make_unique<HostAllocator>();
}

Tensor Backend::empty(Shape shape, DType dtype, MemoryCategory category) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  return Tensor(allocator_->allocate(bytes, category), 0, shape, dtype);
}

Tensor Backend::empty_host(Shape shape, DType dtype, MemoryCategory category) {
  if (!host_allocator_) host_allocator_ = make_host_allocator();
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  return Tensor(host_allocator_->allocate(bytes, category), 0, shape, dtype);
}

void Backend::copy_from_host_async(Tensor& dst, Tensor src) {
  if (src.nbytes() != dst.nbytes() || src.device() != Device::Cpu)
    throw std::invalid_argument("backend '" + name() + "': copy_from_host_async: source " +
                                src.shape().to_string() + " " + std::string(dtype_name(src.dtype())) +
                                " must be a host tensor of the destination's size " +
                                dst.shape().to_string() + " " + std::string(dtype_name(dst.dtype())));
  copy_from_host(dst, src.raw());
}

void Backend::matmul_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp,
                                  const Tensor& weight, const Tensor& bias) {
  matmul_forward(pre, inp, weight, &bias);
  gelu_forward(out, pre);
}

void Backend::matmul_gelu_backward(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                                   const Tensor& pre) {
  Tensor product = empty(pre.shape(), pre.dtype(), MemoryCategory::Workspace);
  matmul_backward(&product, nullptr, nullptr, dout, pre, weight);  // `pre`: only its shape
  gelu_backward(dpre, pre, product);
}

void Backend::snapshot_to_host(Tensor& dst, const Tensor& src) {
  if (dst.nbytes() != src.nbytes() || dst.device() != Device::Cpu)
    throw std::invalid_argument("backend '" + name() + "': snapshot_to_host: destination " +
                                dst.shape().to_string() + " must be a host tensor of the source's size " +
                                src.shape().to_string());
  copy_to_host(dst.raw(), src);
}

Tensor Backend::zeros(Shape shape, DType dtype, MemoryCategory category) {
  Tensor t = empty(shape, dtype, category);
  fill(t, 0.0);
  return t;
}

}  // namespace meshtrain
