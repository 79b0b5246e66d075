#pragma once
// Element types of tensors. F32 is the training type on the CPU; F64 exists for verification
// (gradient checks run the whole model in double); BF16/F16 are the GPU mixed-precision types.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace meshtrain {

enum class DType : uint8_t { F32, F64, BF16, F16, I32 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F64: return "fp64";
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::I32: return "int32";
  }
  return "?";
}

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }

enum class Device : uint8_t { Cpu, Cuda };

constexpr std::string_view device_name(Device d) { return d == Device::Cpu ? "cpu" : "cuda"; }

}  // namespace meshtrain
