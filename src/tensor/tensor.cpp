#include "meshtrain/tensor/tensor.h"

#include <stdexcept>

namespace meshtrain {

Shape::Shape(std::initializer_list<int64_t> dims) {
  if (dims.size() > kMaxRank) throw std::invalid_argument("Shape: more than 4 dimensions");
  for (int64_t d : dims) {
    if (d < 0) throw std::invalid_argument("Shape: negative dimension");
    dims_[rank_++] = d;
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != other.dims_[i]) return false;
  return true;
}

std::string Shape::to_string() const {
  std::string s = "(";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + ")";
}

Tensor::Tensor(std::shared_ptr<Buffer> buffer, size_t byte_offset, Shape shape, DType dtype)
    : buffer_(std::move(buffer)), offset_(byte_offset), shape_(shape), dtype_(dtype) {
  if (offset_ + nbytes() > buffer_->bytes())
    throw std::out_of_range("Tensor: view " + shape_.to_string() + " exceeds its buffer");
}

Tensor Tensor::view(int64_t element_offset, Shape shape) const {
  if (element_offset < 0 || element_offset + shape.numel() > numel())
    throw std::out_of_range("Tensor::view: " + shape.to_string() + " at offset " +
                            std::to_string(element_offset) + " exceeds " + shape_.to_string());
  return Tensor(buffer_, offset_ + static_cast<size_t>(element_offset) * dtype_size(dtype_), shape,
                dtype_);
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  if (shape_.rank() < 1 || begin < 0 || end > shape_[0] || begin > end)
    throw std::out_of_range("Tensor::rows: [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") of " + shape_.to_string());
  const int64_t row = shape_[0] == 0 ? 0 : numel() / shape_[0];
  Shape s;
  switch (shape_.rank()) {
    case 1: s = Shape{end - begin}; break;
    case 2: s = Shape{end - begin, shape_[1]}; break;
    case 3: s = Shape{end - begin, shape_[1], shape_[2]}; break;
    default: s = Shape{end - begin, shape_[1], shape_[2], shape_[3]}; break;
  }
  return view(begin * row, s);
}

Tensor adjacent_view(const std::vector<Tensor>& parts, Shape shape) {
  if (parts.empty()) return {};
  const Tensor& first = parts.front();
  size_t end = first.offset_;
  int64_t elements = 0;
  for (const Tensor& p : parts) {
    if (!p.defined() || p.buffer_ != first.buffer_ || p.dtype_ != first.dtype_ || p.offset_ != end)
      return {};
    end += p.nbytes();
    elements += p.numel();
  }
  if (elements != shape.numel())
    throw std::logic_error("adjacent_view: " + shape.to_string() + " over parts of " +
                           std::to_string(elements) + " elements");
  return Tensor(first.buffer_, first.offset_, shape, first.dtype_);
}

void Tensor::undefined_access() {
  throw std::logic_error("Tensor: access to an undefined tensor (a parameter not gathered, or "
                         "an activation already freed)");
}

void Tensor::check_dtype(DType expected) const {
  if (expected != dtype_)
    throw std::logic_error("Tensor: accessed " + std::string(dtype_name(dtype_)) + " tensor as " +
                           std::string(dtype_name(expected)));
}

}  // namespace meshtrain
