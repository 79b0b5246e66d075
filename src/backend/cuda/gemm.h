#pragma once
// cuBLASLt matrix products for the CUDA backend. One call describes a (possibly strided-batched)
// column-major product
//   D (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C   [+ bias (m) on every column]
// with C = D unless the call names another C of D's layout.
// where row-major tensors enter as their column-major transposes (see matmul.cpp for the
// mapping). bf16 inputs accumulate in fp32 (CUBLAS_COMPUTE_32F) and may write fp32 or bf16;
// fp32 inputs use strict fp32 unless TF32 was allowed. The algorithm for each distinct
// (shapes, types, strides, pointer alignments) is chosen once by cuBLASLt's heuristic and cached.

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>

#include "meshtrain/tensor/dtype.h"

namespace meshtrain::cuda {

// Fails, naming `op` and `call` and cuBLAS's words for `status`, unless it is a success (the
// status of cuBLAS and cuBLASLt calls alike).
void check_lt(cublasStatus_t status, const char* op, const char* call);
// The cuBLAS type of a GEMM operand's dtype (fp32, bf16, fp16); fails naming `op` otherwise.
cudaDataType_t cuda_type(DType t, const char* op);

struct GemmOperand {
  const void* ptr = nullptr;
  int64_t ld = 0;            // leading dimension (elements) of the stored column-major matrix
  int64_t batch_stride = 0;  // elements between consecutive batch entries
  bool transpose = false;    // op(X) = X^T
};

struct GemmCall {
  const char* op = "gemm";   // the backend operation, for error messages
  int64_t m = 0, n = 0, k = 0;
  GemmOperand a, b;
  void* d = nullptr;
  int64_t ldd = 0, stride_d = 0;
  // C, read where beta != 0, laid out as D: D itself unless given (D = product + C, C kept).
  const void* c = nullptr;
  int64_t batch = 1;
  DType input = DType::F32;   // type of A and B
  DType output = DType::F32;  // type of D and C
  float alpha = 1.f, beta = 0.f;
  const void* bias = nullptr;  // epilogue bias of length m, in the output type
  // GELU in the epilogue (tanh approximation), with its input in `aux` (m x n, leading dimension
  // ldaux, the output type): GeluAux writes D = gelu(product [+ bias]) and aux = product [+ bias];
  // DGelu writes D = product * gelu'(aux), reading aux.
  enum class Epilogue { Plain, GeluAux, DGelu };
  Epilogue epilogue = Epilogue::Plain;
  void* aux = nullptr;
  int64_t ldaux = 0;
};

class LtGemm {
 public:
  LtGemm(void* workspace, size_t workspace_bytes, bool allow_tf32);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Fails, naming the operation, where cuBLASLt has no algorithm for the call.
  void run(const GemmCall& call, cudaStream_t stream);
  // Runs the call where cuBLASLt has an algorithm for it, else returns false having done
  // nothing (remembered per call shape): for fused epilogues that have an unfused fallback.
  bool run_if_supported(const GemmCall& call, cudaStream_t stream);

 private:
  struct Plan;
  using Key = std::array<int64_t, 24>;
  Plan& plan_for(const GemmCall& call);
  cublasStatus_t launch(Plan& plan, const GemmCall& call, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  bool allow_tf32_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace meshtrain::cuda
