// CudaBackend: the experts' grouped products (backend.h, grouped_matmul_forward/backward) as
// cuBLAS grouped GEMMs (grouped_gemm.h), one group per expert with rows, laid out as
// cuda_matmul.cpp's products of one expert:
//   forward  out_g^T  (N x n_g) = W_g (as K x N, transposed) * inp_g^T (K x n_g)
//   dinp_g^T (K x n_g) = W_g (K x N, as stored) * dout_g^T (N x n_g)                 (assigned)
//   dW_g^T   (K x N)   = inp_g^T (K x n_g) * dout_g (n_g x N, dout_g^T transposed)   (beta 1: +=)
// An expert without rows is left out of the call (nothing to write, its dW_g kept as it was).
// The row counts are host integers already (routing decided them on the host), so the shapes
// cost no wait; the device addresses go up in a pinned table queued ahead of the GEMM on the
// same stream (copy_from_host_async): no synchronisation either. What the grouped call cannot
// take runs as one cuBLASLt product per expert (the Backend's default loop): bf16 weight
// gradients, which accumulate bf16 products into fp32 (a type pair the grouped call lacks),
// addresses off its alignment, and types it reports unsupported.

#include <cstdint>
#include <string>
#include <vector>

#include "backend_util.h"
#include "grouped_gemm.h"

namespace meshtrain {

namespace {

// Group g's (N, K) matrix of a (G, N, K) tensor.
const void* group_matrix(const Tensor& stacked, int64_t g) {
  const int64_t N = stacked.dim(1), K = stacked.dim(2);
  return stacked.view(g * N * K, {N, K}).raw();
}

// One problem per group with rows: make(g, first row, rows) for each.
template <class Make>
std::vector<cuda::GroupedProblem> problems_of(const std::vector<int64_t>& rows, Make&& make) {
  std::vector<cuda::GroupedProblem> out;
  int64_t begin = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    if (rows[g] > 0) out.push_back(make(static_cast<int64_t>(g), begin, rows[g]));
    begin += rows[g];
  }
  return out;
}

}  // namespace

bool CudaBackend::run_grouped(const char* op, const std::vector<cuda::GroupedProblem>& problems,
                              DType input, DType output, float beta, double flops) {
  if (!lib_->grouped) {
    lib_->grouped = std::make_unique<cuda::GroupedGemm>(
        lib_->gemm_workspace.raw(), options_.gemm_workspace_bytes, options_.tf32 == Tf32::On);
  }
  cuda::GroupedGemm& gemm = *lib_->grouped;
  if (!gemm.aligned(problems, input)) return false;
  const int64_t slots = 3 * static_cast<int64_t>(problems.size());
  // 8-byte slots for the addresses; no dtype of its own, fp64 has their width.
  Tensor host = empty_host({slots}, DType::F64, MemoryCategory::Workspace);
  cuda::GroupedGemm::pointer_table(problems, static_cast<void**>(host.raw()));
  Tensor table = empty({slots}, DType::F64, MemoryCategory::Workspace);
  copy_from_host_async(table, std::move(host));
  cuda::TimedOp timed(profile_, stream_, op, flops);
  return gemm.run(op, problems, static_cast<void* const*>(table.raw()), input, output, beta,
                  stream_) == CUBLAS_STATUS_SUCCESS;
}

void CudaBackend::do_grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weights,
                                            const std::vector<int64_t>& rows) {
  const int64_t R = inp.dim(0), K = inp.dim(1), N = weights.dim(1);
  const auto problems = problems_of(rows, [&](int64_t g, int64_t b, int64_t n) {
    cuda::GroupedProblem p;
    p.m = N;
    p.n = n;
    p.k = K;
    p.a = {group_matrix(weights, g), K, 0, true};
    p.b = {inp.rows(b, b + n).raw(), K, 0, false};
    p.c = out.rows(b, b + n).raw();
    p.ldc = N;
    return p;
  });
  const double flops = 2.0 * double(R) * double(N) * double(K);
  if (run_grouped("grouped_matmul_forward", problems, inp.dtype(), inp.dtype(), 0.f, flops)) {
    ++grouped_matmuls_.grouped;
    return;
  }
  ++grouped_matmuls_.per_group;
  Backend::do_grouped_matmul_forward(out, inp, weights, rows);
}

void CudaBackend::do_grouped_matmul_backward(Tensor* dinp, Tensor* dweights, const Tensor& dout,
                                             const Tensor& inp, const Tensor& weights,
                                             const std::vector<int64_t>& rows) {
  const char* op = "grouped_matmul_backward";
  const int64_t R = inp.dim(0), K = inp.dim(1), N = dout.dim(1);
  const double flops = 2.0 * double(R) * double(N) * double(K);
  if (dinp) {
    const auto problems = problems_of(rows, [&](int64_t g, int64_t b, int64_t n) {
      cuda::GroupedProblem p;
      p.m = K;
      p.n = n;
      p.k = N;
      p.a = {group_matrix(weights, g), K, 0, false};
      p.b = {dout.rows(b, b + n).raw(), N, 0, false};
      p.c = dinp->rows(b, b + n).raw();
      p.ldc = K;
      return p;
    });
    if (run_grouped(op, problems, dout.dtype(), dout.dtype(), 0.f, flops)) {
      ++grouped_matmuls_.grouped;
    } else {
      ++grouped_matmuls_.per_group;
      Backend::do_grouped_matmul_backward(dinp, nullptr, dout, inp, weights, rows);
    }
  }
  if (dweights) {
    // bf16 products into fp32 gradients: no grouped kernel (grouped_gemm.h).
    const bool grouped_types = inp.dtype() == DType::F32;
    const auto problems = problems_of(rows, [&](int64_t g, int64_t b, int64_t n) {
      cuda::GroupedProblem p;
      p.m = K;
      p.n = N;
      p.k = n;
      p.a = {inp.rows(b, b + n).raw(), K, 0, false};
      p.b = {dout.rows(b, b + n).raw(), N, 0, true};
      p.c = dweights->view(g * N * K, {N, K}).raw();
      p.ldc = K;
      return p;
    });
    if (grouped_types && run_grouped(op, problems, DType::F32, DType::F32, 1.f, flops)) {
      ++grouped_matmuls_.grouped;
    } else {
      ++grouped_matmuls_.per_group;
      Backend::do_grouped_matmul_backward(nullptr, dweights, dout, inp, weights, rows);
    }
  }
}

}  // namespace meshtrain
