#include "gemm.h"

#include <cublas_api.h>

#include <string>

#include "cuda_check.h"

namespace meshtrain::cuda {

void check_lt(cublasStatus_t status, const char* op, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail(op, std::string(call) + " failed: " + cublasGetStatusString(status) + " (" +
               cublasGetStatusName(status) + ")");
}
#define LT_CHECK(op, call) check_lt((call), (op), #call)

cudaDataType_t cuda_type(DType t, const char* op) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: fail(op, "cuBLAS GEMM on dtype " + std::string(dtype_name(t)));
  }
}

namespace {

// Largest power of two (at most 256) dividing the address and the batch stride in bytes:
// cuBLASLt assumes 256-byte aligned operands unless told otherwise, and tensor views
// (parameters inside a flat buffer, per-head slices of qkv) are often less aligned.
int64_t alignment(const void* ptr, int64_t stride_bytes) {
  uint64_t bits = reinterpret_cast<uintptr_t>(ptr) | static_cast<uint64_t>(stride_bytes) | 256u;
  return static_cast<int64_t>(bits & (~bits + 1));
}

struct Layout {
  cublasLtMatrixLayout_t desc = nullptr;
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
         int64_t stride, const char* op) {
    LT_CHECK(op, cublasLtMatrixLayoutCreate(&desc, type, static_cast<uint64_t>(rows),
                                            static_cast<uint64_t>(cols), ld));
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      LT_CHECK(op, cublasLtMatrixLayoutSetAttribute(desc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                    &count, sizeof count));
      LT_CHECK(op, cublasLtMatrixLayoutSetAttribute(
                       desc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
  }
  ~Layout() {
    if (desc) cublasLtMatrixLayoutDestroy(desc);
  }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

}  // namespace

struct LtGemm::Plan {
  cublasLtMatmulDesc_t op_desc = nullptr;
  std::unique_ptr<Layout> a, b, d;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // cuBLASLt had an algorithm (and it ran, where it has run)
  bool has_bias = false, has_aux = false;
  ~Plan() {
    if (op_desc) cublasLtMatmulDescDestroy(op_desc);
  }
};

LtGemm::LtGemm(void* workspace, size_t workspace_bytes, bool allow_tf32)
    : workspace_(workspace), workspace_bytes_(workspace_bytes), allow_tf32_(allow_tf32) {
  LT_CHECK("init", cublasLtCreate(&handle_));
}

LtGemm::~LtGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

LtGemm::Plan& LtGemm::plan_for(const GemmCall& c) {
  const int64_t in_size = static_cast<int64_t>(dtype_size(c.input));
  const int64_t out_size = static_cast<int64_t>(dtype_size(c.output));
  const Key key = {c.m, c.n, c.k, c.a.ld, c.a.batch_stride, c.a.transpose, c.b.ld,
                   c.b.batch_stride, c.b.transpose, c.ldd, c.stride_d, c.batch,
                   static_cast<int64_t>(c.input), static_cast<int64_t>(c.output),
                   c.bias != nullptr, c.beta != 0.f,
                   alignment(c.a.ptr, c.a.batch_stride * in_size),
                   alignment(c.b.ptr, c.b.batch_stride * in_size),
                   alignment(c.d, c.stride_d * out_size),
                   c.bias ? alignment(c.bias, 0) : 0,
                   static_cast<int64_t>(c.epilogue), c.ldaux,
                   c.aux ? alignment(c.aux, 0) : 0,
                   alignment(c.c ? c.c : c.d, c.stride_d * out_size)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;

  auto plan = std::make_unique<Plan>();
  const cudaDataType_t in_type = cuda_type(c.input, c.op), out_type = cuda_type(c.output, c.op);
  const cublasComputeType_t compute = c.input == DType::F32 && allow_tf32_
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  LT_CHECK(c.op, cublasLtMatmulDescCreate(&plan->op_desc, compute, CUDA_R_32F));
  const cublasOperation_t ta = c.a.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = c.b.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CHECK(c.op, cublasLtMatmulDescSetAttribute(plan->op_desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                sizeof ta));
  LT_CHECK(c.op, cublasLtMatmulDescSetAttribute(plan->op_desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                sizeof tb));
  cublasLtEpilogue_t epilogue = c.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (c.epilogue == GemmCall::Epilogue::GeluAux)
    epilogue = c.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (c.epilogue == GemmCall::Epilogue::DGelu) {
    if (c.bias) fail(c.op, "a GELU-gradient epilogue takes no bias");
    epilogue = CUBLASLT_EPILOGUE_DGELU;
  }
  LT_CHECK(c.op, cublasLtMatmulDescSetAttribute(plan->op_desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                &epilogue, sizeof epilogue));
  if (c.epilogue != GemmCall::Epilogue::Plain) {
    LT_CHECK(c.op, cublasLtMatmulDescSetAttribute(
                       plan->op_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &c.ldaux,
                       sizeof c.ldaux));
    plan->has_aux = true;
  }
  if (c.bias) {
    const cudaDataType_t bias_type = out_type;
    LT_CHECK(c.op, cublasLtMatmulDescSetAttribute(
                       plan->op_desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                       sizeof bias_type));
    plan->has_bias = true;
  }
  plan->a = std::make_unique<Layout>(in_type, c.a.transpose ? c.k : c.m,
                                     c.a.transpose ? c.m : c.k, c.a.ld, c.batch,
                                     c.a.batch_stride, c.op);
  plan->b = std::make_unique<Layout>(in_type, c.b.transpose ? c.n : c.k,
                                     c.b.transpose ? c.k : c.n, c.b.ld, c.batch,
                                     c.b.batch_stride, c.op);
  plan->d = std::make_unique<Layout>(out_type, c.m, c.n, c.ldd, c.batch, c.stride_d, c.op);

  cublasLtMatmulPreference_t pref = nullptr;
  LT_CHECK(c.op, cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  const uint32_t align_a = static_cast<uint32_t>(key[16]), align_b = static_cast<uint32_t>(key[17]),
                 align_d = static_cast<uint32_t>(key[18]), align_c = static_cast<uint32_t>(key[23]);
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                              &align_a, sizeof align_a);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                              &align_b, sizeof align_b);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                              &align_c, sizeof align_c);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                              &align_d, sizeof align_d);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->op_desc, plan->a->desc, plan->b->desc,
                                        plan->d->desc, plan->d->desc, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // An epilogue cuBLASLt does not offer for these types is answered as "no algorithm" by some
  // versions and as an error status by others: both mean the same to a caller with a fallback.
  if (c.epilogue == GemmCall::Epilogue::Plain) check_lt(st, c.op, "cublasLtMatmulAlgoGetHeuristic");
  plan->found = st == CUBLAS_STATUS_SUCCESS && found > 0;
  plan->algo = result.algo;
  Plan& ref = *plan;
  plans_.emplace(key, std::move(plan));
  return ref;
}

cublasStatus_t LtGemm::launch(Plan& plan, const GemmCall& c, cudaStream_t stream) {
  if (plan.has_bias)
    LT_CHECK(c.op, cublasLtMatmulDescSetAttribute(plan.op_desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                  &c.bias, sizeof c.bias));
  if (plan.has_aux)
    LT_CHECK(c.op, cublasLtMatmulDescSetAttribute(
                       plan.op_desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c.aux,
                       sizeof c.aux));
  return cublasLtMatmul(handle_, plan.op_desc, &c.alpha, c.a.ptr, plan.a->desc, c.b.ptr,
                        plan.b->desc, &c.beta, c.c ? c.c : c.d, plan.d->desc, c.d, plan.d->desc,
                        &plan.algo,
                        workspace_, workspace_bytes_, stream);
}

void LtGemm::run(const GemmCall& c, cudaStream_t stream) {
  if (c.m == 0 || c.n == 0 || c.batch == 0) return;
  Plan& plan = plan_for(c);
  if (!plan.found)
    fail(c.op, "cuBLASLt has no algorithm for m=" + std::to_string(c.m) + " n=" +
                   std::to_string(c.n) + " k=" + std::to_string(c.k) + " batch=" +
                   std::to_string(c.batch) + " (" + std::string(dtype_name(c.input)) + " -> " +
                   std::string(dtype_name(c.output)) +
                   "); hint: odd leading dimensions or misaligned views rule out tensor-core "
                   "kernels, and some type pairs have none");
  check_lt(launch(plan, c, stream), c.op, "cublasLtMatmul");
}

bool LtGemm::run_if_supported(const GemmCall& c, cudaStream_t stream) {
  if (c.m == 0 || c.n == 0 || c.batch == 0) return true;
  Plan& plan = plan_for(c);
  if (!plan.found) return false;
  const cublasStatus_t st = launch(plan, c, stream);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {
    plan.found = false;
    return false;
  }
  check_lt(st, c.op, "cublasLtMatmul");
  return true;
}

}  // namespace meshtrain::cuda
