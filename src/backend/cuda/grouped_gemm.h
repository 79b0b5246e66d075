#pragma once
// cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx) for the CUDA backend: products of different
// sizes in one call, each column-major (as gemm.h's)
//   C_i (m_i x n_i) = op(A_i) (m_i x k_i) * op(B_i) (k_i x n_i) + beta * C_i
// Why cuBLAS's call and not cuBLASLt: cuBLASLt (cuBLAS 13.1, CUDA 13.0) batches only products of
// one shape (strided or pointer-array batches, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE); the experts'
// products differ in their row counts, and the grouped call takes a shape per group. Its type
// table has bf16 -> bf16 and fp32 -> fp32, both accumulating in fp32, but no bf16 inputs into an
// fp32 C: bf16 weight gradients stay per-expert cuBLASLt products (cuda_grouped_matmul.cpp).

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "gemm.h"
#include "meshtrain/tensor/dtype.h"

namespace meshtrain::cuda {

// One product; a's and b's ld and transpose as GemmOperand's (batch_stride unused).
struct GroupedProblem {
  int64_t m = 0, n = 0, k = 0;
  GemmOperand a, b;
  void* c = nullptr;
  int64_t ldc = 0;
};

class GroupedGemm {
 public:
  // `workspace` may be the cuBLASLt GEMMs' own: every call of both runs on one stream.
  GroupedGemm(void* workspace, size_t workspace_bytes, bool allow_tf32);
  ~GroupedGemm();
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  // The table `run` reads on the device: every problem's A, then every B, then every C
  // (3 x problems.size() addresses), written into `table` (host memory the caller uploads).
  static void pointer_table(const std::vector<GroupedProblem>& problems, void** table);
  // Whether the call's addresses meet cuBLAS's alignment rule for it (16 bytes for bf16 inputs
  // and TF32; none for strict fp32): where not, the caller runs the products one by one.
  bool aligned(const std::vector<GroupedProblem>& problems, DType input) const;
  // Queues the products on `stream` as one call, one group each, alpha 1 and `beta`, reading the
  // addresses from `device_table` (pointer_table's, uploaded ahead of it in stream order).
  // Returns CUBLAS_STATUS_NOT_SUPPORTED without queuing anything where cuBLAS has no kernel for
  // the types; fails on any other error, naming `op`.
  cublasStatus_t run(const char* op, const std::vector<GroupedProblem>& problems,
                     void* const* device_table, DType input, DType output, float beta,
                     cudaStream_t stream);

 private:
  cublasHandle_t handle_ = nullptr;
  bool allow_tf32_;
};

}  // namespace meshtrain::cuda
