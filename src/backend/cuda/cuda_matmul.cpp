// Linear layers through cuBLASLt. Row-major tensors are column-major transposes, so with
// inp (N, C), weight (OC, C), out (N, OC) — all row-major — the products are, column-major:
//   forward  out^T  (OC x N) = W (as C x OC, transposed) * inp^T (C x N)      + bias (epilogue)
//   dinp^T (C x N)  = W^T (C x OC) * dout^T (OC x N)                          (assigned)
//   dW^T   (C x OC) = inp^T (C x N) * dout (N x OC, from dout^T transposed)  (beta = 1: +=)
// dW accumulates in fp32 straight from bf16 inputs (cuBLASLt's bf16 x bf16 -> fp32 variant);
// dbias is a deterministic column-sum kernel, not the BGRAD epilogue, which would overwrite
// rather than accumulate.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backend_util.h"
#include "cuda_check.h"
#include "meshtrain/tensor/bf16.h"

namespace meshtrain {

using cuda::cols_of;
using cuda::rows_of;

namespace {

// "matmul_forward 65536x768x2304": the profile keeps each GEMM shape apart.
std::string gemm_name(const char* op, int64_t N, int64_t C, int64_t OC) {
  return std::string(op) + " " + std::to_string(N) + "x" + std::to_string(C) + "x" +
         std::to_string(OC);
}

// The forward product's call: out^T (OC x N) = W^T-as-stored * inp^T [+ bias].
cuda::GemmCall forward_call(const char* op, Tensor& out, const Tensor& inp, const Tensor& weight,
                            const Tensor* bias) {
  const int64_t N = rows_of(inp), C = cols_of(inp), OC = rows_of(weight);
  cuda::GemmCall g;
  g.op = op;
  g.m = OC;
  g.n = N;
  g.k = C;
  g.a = {weight.raw(), C, 0, true};
  g.b = {inp.raw(), C, 0, false};
  g.d = out.raw();
  g.ldd = OC;
  g.input = g.output = inp.dtype();
  g.bias = bias ? bias->raw() : nullptr;
  return g;
}

// The input gradient's call: dinp^T (C x N) = W (C x OC, as stored) * dout^T.
cuda::GemmCall input_gradient_call(const char* op, Tensor& dinp, const Tensor& dout,
                                   const Tensor& weight) {
  const int64_t N = rows_of(dout), OC = cols_of(dout), C = cols_of(dinp);
  cuda::GemmCall g;
  g.op = op;
  g.m = C;
  g.n = N;
  g.k = OC;
  g.a = {weight.raw(), C, 0, false};
  g.b = {dout.raw(), OC, 0, false};
  g.d = dinp.raw();
  g.ldd = C;
  g.input = g.output = dout.dtype();
  return g;
}

// cuBLASLt's GELU epilogues want their auxiliary matrix 16-byte aligned with a leading
// dimension of whole 16-byte packs; other views take the unfused path.
bool gelu_epilogue_fits(const Tensor& pre) {
  const int64_t width = cols_of(pre) * static_cast<int64_t>(dtype_size(pre.dtype()));
  return reinterpret_cast<uintptr_t>(pre.raw()) % 16 == 0 && width % 16 == 0;
}

// Runs `g` with `epilogue` (GELU, or its gradient) reading or writing `pre`; false, having done
// nothing, where cuBLASLt offers no algorithm for it.
bool run_with_gelu(cuda::LtGemm& gemm, cudaStream_t stream, cuda::GemmCall g,
                   cuda::GemmCall::Epilogue epilogue, const Tensor& pre) {
  g.epilogue = epilogue;
  g.aux = pre.raw();
  g.ldaux = cols_of(pre);
  return gemm.run_if_supported(g, stream);
}

}  // namespace

// The residual, if any, as C of the GEMM (beta 1) where cuBLASLt takes it, else the plain
// product and then add_inplace.
void CudaBackend::do_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                                    const Tensor* bias, const Tensor* residual) {
  const int64_t N = rows_of(inp), C = cols_of(inp), OC = rows_of(weight);
  const double flops = 2.0 * double(N) * double(C) * double(OC);
  if (residual && options_.fused_epilogues) {
    const char* op = "matmul_forward_add";
    cuda::TimedOp timed(profile_, stream_, profile_ ? gemm_name(op, N, C, OC) : "", flops);
    cuda::GemmCall g = forward_call(op, out, inp, weight, bias);
    g.c = residual->raw();
    g.beta = 1.f;
    if (lib_->gemm->run_if_supported(g, stream_)) {
      ++residual_epilogues_.fused;
      return;
    }
  }
  {
    cuda::TimedOp timed(profile_, stream_, profile_ ? gemm_name("matmul_forward", N, C, OC) : "",
                        flops);
    lib_->gemm->run(forward_call("matmul_forward", out, inp, weight, bias), stream_);
  }
  if (residual) {
    ++residual_epilogues_.unfused;
    add_inplace(out, *residual);
  }
}

void CudaBackend::do_matmul_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp,
                                         const Tensor& weight, const Tensor& bias) {
  const char* op = "matmul_gelu_forward";
  if (options_.fused_epilogues && gelu_epilogue_fits(pre)) {
    const int64_t N = rows_of(inp), C = cols_of(inp), OC = rows_of(weight);
    cuda::TimedOp timed(profile_, stream_, profile_ ? gemm_name(op, N, C, OC) : "",
                        2.0 * double(N) * double(C) * double(OC));
    if (run_with_gelu(*lib_->gemm, stream_, forward_call(op, out, inp, weight, &bias),
                      cuda::GemmCall::Epilogue::GeluAux, pre)) {
      ++gelu_epilogues_.fused;
      return;
    }
  }
  ++gelu_epilogues_.unfused;
  Backend::do_matmul_gelu_forward(out, pre, inp, weight, bias);
}

void CudaBackend::do_matmul_backward(Tensor* dinp, Tensor* dweight, Tensor* dbias,
                                     const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                     GradWrite dweight_write) {
  const char* op = "matmul_backward";
  // OC from dout: a weight-gradient-only call (zero-bubble schedules) may run after ZeRO-3 has
  // released the weight, which only the input gradient reads.
  const int64_t N = rows_of(inp), C = cols_of(inp), OC = cols_of(dout);
  cuda::TimedOp timed(
      profile_, stream_, profile_ ? gemm_name("matmul_backward", N, C, OC) : "",
      ((dinp ? 2.0 : 0.0) + (dweight ? 2.0 : 0.0)) * double(N) * double(C) * double(OC));
  if (dinp) lib_->gemm->run(input_gradient_call(op, *dinp, dout, weight), stream_);
  if (dweight) {
    cuda::GemmCall g;
    g.op = op;
    g.m = C;
    g.n = OC;
    g.k = N;
    g.a = {inp.raw(), C, 0, false};
    g.b = {dout.raw(), OC, 0, true};
    g.d = dweight->raw();
    g.ldd = C;
    g.input = inp.dtype();
    g.output = DType::F32;
    g.beta = dweight_write == GradWrite::Assign ? 0.f : 1.f;
    lib_->gemm->run(g, stream_);
  }
  if (dbias) bias_backward(*dbias, dout);
}

void CudaBackend::do_matmul_gelu_backward(Tensor& dpre, const Tensor& dout, const Tensor& weight,
                                          const Tensor& pre) {
  const char* op = "matmul_gelu_backward";
  if (options_.fused_epilogues && gelu_epilogue_fits(pre)) {
    const int64_t N = rows_of(dout), OC = cols_of(dout), C = cols_of(pre);
    cuda::TimedOp timed(profile_, stream_, profile_ ? gemm_name(op, N, C, OC) : "",
                        2.0 * double(N) * double(C) * double(OC));
    if (run_with_gelu(*lib_->gemm, stream_, input_gradient_call(op, dpre, dout, weight),
                      cuda::GemmCall::Epilogue::DGelu, pre)) {
      ++gelu_epilogues_.fused;
      return;
    }
  }
  ++gelu_epilogues_.unfused;
  Backend::do_matmul_gelu_backward(dpre, dout, weight, pre);
}

double CudaBackend::measure_bf16_gemm_peak_tflops(int64_t m, int64_t n, int64_t k,
                                                  int iterations) {
  const char* op = "measure_bf16_gemm_peak_tflops";
  Tensor a = empty({m, k}, DType::BF16, MemoryCategory::Workspace);  // a "weight" (m, k)
  Tensor b = empty({n, k}, DType::BF16, MemoryCategory::Workspace);  // "inp" (n, k)
  Tensor d = empty({n, m}, DType::BF16, MemoryCategory::Workspace);  // "out" (n, m)
  // Random operands: a GEMM over constant data (or zeros) runs measurably faster on the same
  // silicon, which would raise the ceiling falsely and flatter every MFU computed from it.
  std::vector<uint16_t> host(static_cast<size_t>(std::max(m, n) * k));
  uint32_t x = 0x9e3779b9u;
  for (uint16_t& v : host) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = float_to_bf16_bits(static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f);
  }
  copy_from_host(a, host.data());
  copy_from_host(b, host.data());
  cuda::GemmCall g;
  g.op = op;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = {a.raw(), k, 0, true};  // the layout of matmul_forward: A transposed, B not
  g.b = {b.raw(), k, 0, false};
  g.d = d.raw();
  g.ldd = m;
  g.input = g.output = DType::BF16;
  for (int i = 0; i < 3; ++i) lib_->gemm->run(g, stream_);  // warm-up (and algorithm choice)
  cudaEvent_t start, stop;
  MESHTRAIN_CUDA_CHECK(op, cudaEventCreate(&start));
  MESHTRAIN_CUDA_CHECK(op, cudaEventCreate(&stop));
  float best_ms = 1e30f;
  for (int i = 0; i < std::max(1, iterations); ++i) {
    MESHTRAIN_CUDA_CHECK(op, cudaEventRecord(start, stream_));
    lib_->gemm->run(g, stream_);
    MESHTRAIN_CUDA_CHECK(op, cudaEventRecord(stop, stream_));
    MESHTRAIN_CUDA_CHECK(op, cudaEventSynchronize(stop));
    float ms = 0;
    MESHTRAIN_CUDA_CHECK(op, cudaEventElapsedTime(&ms, start, stop));
    best_ms = std::min(best_ms, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * double(m) * double(n) * double(k) / (double(best_ms) * 1e-3) / 1e12;
}

}  // namespace meshtrain
