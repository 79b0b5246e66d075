#include "meshtrain/backend/host_doubles.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "meshtrain/tensor/bf16.h"

namespace meshtrain {

// The elements of `t` (contiguous) as doubles, through the device's own copy to the host.
std::vector<double> to_host_doubles(Backend& be, const Tensor& t, const std::string& op) {
  const int64_t n = t.numel();
  std::vector<double> out(static_cast<size_t>(n));
  switch (t.dtype()) {
    case DType::F64:
      be.copy_to_host(out.data(), t);
      break;
    case DType::F32: {
      std::vector<float> f(static_cast<size_t>(n));
      be.copy_to_host(f.data(), t);
      std::copy(f.begin(), f.end(), out.begin());
      break;
    }
    case DType::BF16: {
      std::vector<uint16_t> b(static_cast<size_t>(n));
      be.copy_to_host(b.data(), t);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_float(b[i]);
      break;
    }
    default:
      throw std::invalid_argument("backend '" + be.name() + "' does not support " + op +
                                  " for dtype " + std::string(dtype_name(t.dtype())) +
                                  " (fp32, fp64 or bf16)");
  }
  return out;
}

void from_host_doubles(Backend& be, Tensor& t, const std::vector<double>& v, const std::string& op) {
  switch (t.dtype()) {
    case DType::F64:
      be.copy_from_host(t, v.data());
      break;
    case DType::F32: {
      std::vector<float> f(v.begin(), v.end());
      be.copy_from_host(t, f.data());
      break;
    }
    case DType::BF16: {
      std::vector<uint16_t> b(v.size());
      for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16_bits(static_cast<float>(v[i]));
      be.copy_from_host(t, b.data());
      break;
    }
    default:
      throw std::invalid_argument("backend '" + be.name() + "' does not support " + op +
                                  " for dtype " + std::string(dtype_name(t.dtype())) +
                                  " (fp32, fp64 or bf16)");
  }
}

}  // namespace meshtrain
