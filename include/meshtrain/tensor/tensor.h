#pragma once
// Tensor: a shape, an element type and a view into a Buffer on some device. Tensors are cheap
// handles (copying one shares the buffer). Views into one buffer are how parameters live inside
// a flat parameter buffer, and how a micro-batch's slice of a larger activation is addressed.
// Tensors do no arithmetic: kernels live behind the Backend interface.

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/tensor/allocator.h"
#include "meshtrain/tensor/dtype.h"

namespace meshtrain {

class Shape {
 public:
  static constexpr int kMaxRank = 4;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t numel() const;
  bool operator==(const Shape& other) const;
  bool operator!=(const Shape& other) const { return !(*this == other); }
  std::string to_string() const;  // "(768, 2304)"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Buffer> buffer, size_t byte_offset, Shape shape, DType dtype);

  bool defined() const { return buffer_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return buffer_->device(); }
  MemoryCategory category() const { return buffer_->category(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const {
    if (!buffer_) undefined_access();
    return static_cast<char*>(buffer_->data()) + offset_;
  }
  // Typed pointer; throws if T does not match dtype().
  template <class T> T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(raw());
  }

  // A view of `shape` starting `element_offset` elements into this tensor.
  Tensor view(int64_t element_offset, Shape shape) const;
  // The same elements with another shape of equal size.
  Tensor reshape(Shape shape) const { return view(0, shape); }
  // Rows [begin, end) of the first dimension.
  Tensor rows(int64_t begin, int64_t end) const;

  // `parts`, when they lie back to back in one buffer (each starting where the one before
  // ends) and share a dtype, as one view of `shape` (as many elements as they hold together);
  // an undefined tensor otherwise. Layers that keep separate parameters (Hugging Face's q, k
  // and v projections) run them as one matrix product where their storage allows it.
  friend Tensor adjacent_view(const std::vector<Tensor>& parts, Shape shape);

 private:
  void check_dtype(DType expected) const;
  [[noreturn]] static void undefined_access();

  std::shared_ptr<Buffer> buffer_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
};

Tensor adjacent_view(const std::vector<Tensor>& parts, Shape shape);

}  // namespace meshtrain
