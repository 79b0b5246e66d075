#pragma once
// Moving host vectors of doubles in and out of backend tensors of any floating dtype.

#include <cstdint>
#include <vector>

#include "meshtrain/backend/backend.h"

namespace meshtrain::testing {

inline Tensor make_tensor(Backend& be, const std::vector<double>& values, Shape shape, DType dtype,
                          MemoryCategory c = MemoryCategory::Workspace) {
  Tensor t = be.empty(shape, dtype, c);
  if (dtype == DType::F32) {
    std::vector<float> f(values.begin(), values.end());
    be.copy_from_host(t, f.data());
  } else {
    be.copy_from_host(t, values.data());
  }
  return t;
}

inline Tensor make_tokens(Backend& be, const std::vector<int32_t>& values) {
  Tensor t = be.empty({static_cast<int64_t>(values.size())}, DType::I32, MemoryCategory::Workspace);
  be.copy_from_host(t, values.data());
  return t;
}

inline std::vector<double> to_host(Backend& be, const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::F32) {
    std::vector<float> f(out.size());
    be.copy_to_host(f.data(), t);
    out.assign(f.begin(), f.end());
  } else {
    be.copy_to_host(out.data(), t);
  }
  return out;
}

}  // namespace meshtrain::testing
