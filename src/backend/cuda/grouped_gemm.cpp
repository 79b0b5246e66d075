#include "grouped_gemm.h"

#include <cublas_v2.h>

#include <string>

#include "cuda_check.h"

namespace meshtrain::cuda {

GroupedGemm::GroupedGemm(void* workspace, size_t workspace_bytes, bool allow_tf32)
    : allow_tf32_(allow_tf32) {
  check_lt(cublasCreate(&handle_), "init", "cublasCreate");
  // Without a workspace of its own, cuBLAS would allocate one per stream behind the allocator.
  check_lt(cublasSetWorkspace(handle_, workspace, workspace_bytes), "init", "cublasSetWorkspace");
}

GroupedGemm::~GroupedGemm() {
  if (handle_) cublasDestroy(handle_);
}

void GroupedGemm::pointer_table(const std::vector<GroupedProblem>& problems, void** table) {
  const size_t P = problems.size();
  for (size_t i = 0; i < P; ++i) {
    table[i] = const_cast<void*>(problems[i].a.ptr);
    table[P + i] = const_cast<void*>(problems[i].b.ptr);
    table[2 * P + i] = problems[i].c;
  }
}

bool GroupedGemm::aligned(const std::vector<GroupedProblem>& problems, DType input) const {
  // cuBLAS asks 16-byte addresses of 16-bit inputs and of its FAST (TF32) compute types (or, per
  // operand, rules on k that these row views need not meet); strict fp32 asks nothing.
  if (input == DType::F32 && !allow_tf32_) return true;
  const auto ok = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  for (const GroupedProblem& p : problems)
    if (!ok(p.a.ptr) || !ok(p.b.ptr) || !ok(p.c)) return false;
  return true;
}

cublasStatus_t GroupedGemm::run(const char* op, const std::vector<GroupedProblem>& problems,
                                void* const* device_table, DType input, DType output,
                                float beta, cudaStream_t stream) {
  const size_t P = problems.size();
  if (P == 0) return CUBLAS_STATUS_SUCCESS;
  check_lt(cublasSetStream(handle_, stream), op, "cublasSetStream");
  // One group per product (the experts' row counts differ); sizes, scalars and transposes are
  // read on the host during the call, the addresses on the device from the table.
  std::vector<cublasOperation_t> ta(P), tb(P);
  std::vector<int64_t> m(P), n(P), k(P), lda(P), ldb(P), ldc(P), group_size(P, 1);
  std::vector<float> alpha(P, 1.f), betas(P, beta);
  for (size_t i = 0; i < P; ++i) {
    const GroupedProblem& p = problems[i];
    ta[i] = p.a.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
    tb[i] = p.b.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
    m[i] = p.m;
    n[i] = p.n;
    k[i] = p.k;
    lda[i] = p.a.ld;
    ldb[i] = p.b.ld;
    ldc[i] = p.ldc;
  }
  const cublasComputeType_t compute = input == DType::F32 && allow_tf32_
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  const cudaDataType_t in_type = cuda_type(input, op), out_type = cuda_type(output, op);
  const cublasStatus_t status = cublasGemmGroupedBatchedEx_64(
      handle_, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(), device_table,
      in_type, lda.data(), device_table + P, in_type, ldb.data(), betas.data(),
      device_table + 2 * P,
      out_type, ldc.data(), static_cast<int64_t>(P), group_size.data(), compute);
  if (status != CUBLAS_STATUS_NOT_SUPPORTED) check_lt(status, op, "cublasGemmGroupedBatchedEx");
  return status;
}

}  // namespace meshtrain::cuda
