#pragma once
// oneDNN matmul primitives for Gemm (gemm.h), created once per (shape, strides, data types,
// bias, scale, post-ops, threads) and kept: creating one costs about a millisecond, running a
// GPT-2 layer's GEMM a few. Transposes are strides of the memory descriptors (2-D, or 4-D for a
// batch), bias is the matmul's bias argument, alpha an output scale, Accumulate::Add a sum
// post-op, an addend a binary-add post-op and the GELU epilogue an eltwise post-op (oneDNN
// applies them in that order, matching the OpenBLAS path). Internal to the CPU backend.

#include <oneapi/dnnl/dnnl.hpp>

#include <compare>
#include <cstdint>
#include <map>
#include <string>

#include "meshtrain/backend/cpu/gemm.h"

namespace meshtrain::cpu {

enum class MatmulType { F32, BF16 };  // element types of inputs and output; accumulation is fp32

// A matmul's geometry: batch sizes (1, 1 for a plain GEMM, which gets 2-D descriptors), sizes
// and element strides (batch0, batch1, row, column) of A (M, K), B (K, N) and C (M, N).
struct MatmulGeometry {
  int64_t batch0 = 1, batch1 = 1, M = 0, N = 0, K = 0;
  BatchedGemmShape::Strides a, b, c;
  auto operator<=>(const MatmulGeometry&) const = default;

  static MatmulGeometry of(const GemmShape& s);
  static MatmulGeometry of(const BatchedGemmShape& s);
};

// The primitive descriptor of C = epilogue(alpha * A @ B + bias [+ C] [+ addend]) for geometry g, created
// for the thread count oneDNN sees at the call (omp_get_max_threads): OneDnnMatmul and
// TaskMatmuls (task_matmul.h) both build theirs here. A primitive that runs on several threads
// at once needs the user scratchpad mode (a scratchpad per call): oneDNN's own is shared.
dnnl::matmul::primitive_desc matmul_primitive_desc(
    const dnnl::engine& engine, const MatmulGeometry& g, MatmulType in, MatmulType out, bool bias,
    float alpha, Accumulate accumulate, Epilogue epilogue, bool addend = false,
    dnnl::scratchpad_mode scratchpad = dnnl::scratchpad_mode::library);
// The memory descriptor of a (rows, cols) operand of g with strides st.
dnnl::memory::desc matmul_operand(const MatmulGeometry& g, int64_t rows, int64_t cols,
                                  const BatchedGemmShape::Strides& st, MatmulType type);
// The message of a failed oneDNN matmul: its shape and types, oneDNN's words, and how to see more.
std::string matmul_failure(const MatmulGeometry& g, MatmulType in, MatmulType out,
                           const dnnl::error& err);

class OneDnnMatmul {
 public:
  OneDnnMatmul();

  // C = epilogue(alpha * A @ B + bias [+ C] [+ addend]); A, B of type `in`, bias fp32, C and
  // the addend (C's strides) of type `out` (bf16 only for bf16 inputs).
  void run(const MatmulGeometry& g, MatmulType in, MatmulType out, const void* A, const void* B,
           const float* bias, void* C, GemmOptions o, float alpha = 1.0f);
  size_t cached() const { return cache_.size(); }
  // oneDNN's name for the kernel of the last run, e.g. "brg:avx512_core" or "gemm:jit".
  const std::string& last_implementation() const { return last_implementation_; }

 private:
  struct Key {
    MatmulGeometry g;
    float alpha;
    MatmulType in, out;
    bool bias, addend;
    Accumulate accumulate;
    Epilogue epilogue;
    int threads;  // a primitive's blocking is chosen for the team size it was created for
    auto operator<=>(const Key&) const = default;
  };
  struct Entry {
    dnnl::matmul primitive;
    dnnl::memory a, b, bias, c, addend;  // descriptors bound once; data handles set per call
    std::string implementation;
  };
  Entry& find_or_create(const Key& k);

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<Key, Entry> cache_;
  std::string last_implementation_;
};

}  // namespace meshtrain::cpu
