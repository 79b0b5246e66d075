#pragma once
// Moving host vectors of doubles in and out of backend tensors of any floating dtype (bf16
// rounds to nearest even on the way in and widens exactly on the way out).

#include <cstdint>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/tensor/bf16.h"

namespace meshtrain::testing {

inline Tensor make_tensor(Backend& be, const std::vector<double>& values, Shape shape, DType dtype,
                          MemoryCategory c = MemoryCategory::Workspace) {
  Tensor t = be.empty(shape, dtype, c);
  if (dtype == DType::F32) {
    std::vector<float> f(values.begin(), values.end());
    be.copy_from_host(t, f.data());
  } else if (dtype == DType::BF16) {
    std::vector<uint16_t> b(values.size());
    for (size_t i = 0; i < values.size(); ++i) b[i] = float_to_bf16_bits(static_cast<float>(values[i]));
    be.copy_from_host(t, b.data());
  } else {
    be.copy_from_host(t, values.data());
  }
  return t;
}

// The stash attention_forward fills and attention_backward reads, as the backend wants it.
inline Tensor attention_stash(Backend& be, int64_t B, int64_t T, int64_t NH, DType activations) {
  const Backend::AttentionStash s = be.attention_stash(B, T, NH, activations);
  return be.empty(s.shape, s.dtype, MemoryCategory::Workspace);
}

// The values a tensor of dtype `t` holds for `v` (fp32 and bf16 round to nearest even): a
// reference computing in double on them sees the kernel's inputs exactly.
inline std::vector<double> representable(std::vector<double> v, DType t) {
  for (double& x : v) {
    if (t == DType::F32) x = static_cast<float>(x);
    if (t == DType::BF16) x = bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(x)));
  }
  return v;
}

// An int32 tensor of `shape` (row indices, e.g. gather_rows' (R, K) index).
inline Tensor make_int32(Backend& be, const std::vector<int32_t>& values, Shape shape) {
  Tensor t = be.empty(shape, DType::I32, MemoryCategory::Workspace);
  be.copy_from_host(t, values.data());
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
  } else if (t.dtype() == DType::BF16) {
    std::vector<uint16_t> b(out.size());
    be.copy_to_host(b.data(), t);
    for (size_t i = 0; i < b.size(); ++i) out[i] = bf16_bits_to_float(b[i]);
  } else {
    be.copy_to_host(out.data(), t);
  }
  return out;
}

}  // namespace meshtrain::testing
