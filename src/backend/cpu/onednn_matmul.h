#pragma once
// oneDNN matmul primitives for Gemm (gemm.h), created once per (shape, strides, transposes,
// data types, bias, post-ops, threads) and kept: creating one costs about a millisecond, running
// a GPT-2 layer's GEMM a few. Transposes are strides of the memory descriptors, bias is the
// matmul's bias argument, Accumulate::Add a sum post-op and the GELU epilogue an eltwise post-op
// (oneDNN applies them in that order, matching the OpenBLAS path). Internal to the CPU backend.

#include <oneapi/dnnl/dnnl.hpp>

#include <compare>
#include <cstdint>
#include <map>

#include "meshtrain/backend/cpu/gemm.h"

namespace meshtrain::cpu {

enum class MatmulType { F32, BF16 };  // input type; accumulation and output are fp32

class OneDnnMatmul {
 public:
  OneDnnMatmul();

  // C = epilogue(op(A) @ op(B) + bias [+ C]); A, B of type `in`, bias and C fp32.
  void run(const GemmShape& s, MatmulType in, const void* A, const void* B, const float* bias,
           float* C, GemmOptions o);
  size_t cached() const { return cache_.size(); }

 private:
  struct Key {
    Trans ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    MatmulType in;
    bool bias;
    Accumulate accumulate;
    Epilogue epilogue;
    int threads;  // a primitive's blocking is chosen for the team size it was created for
    auto operator<=>(const Key&) const = default;
  };
  struct Entry {
    dnnl::matmul primitive;
    dnnl::memory a, b, bias, c;  // descriptors bound once; data handles set per call
  };
  Entry& find_or_create(const Key& k);

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<Key, Entry> cache_;
};

}  // namespace meshtrain::cpu
