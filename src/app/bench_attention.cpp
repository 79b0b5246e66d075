// The `attention` suite (one rank): the CPU's flash-style causal attention (one layer of GPT-2's
// shape, 12 heads of 64; the same 12 heads of 128, and of 192 with values of 128 as multi-head
// latent attention has them) forward and backward at T 1024 and 2048, fp32 and bf16, in GFLOP/s
// on the causal FLOPs, against the oneDNN GEMM ceiling of the same precision measured in the same
// run on the same threads. Causal FLOPs per (batch, head), query/key heads of HS and value heads
// of HV: forward two products of T^2 / 2 multiply-adds by HS (S = Q K^T) and by HV (O = P V),
// T^2 (HS + HV); backward five (S again, dK, dQ by HS; dP, dV by HV), T^2 (3 HS + 2 HV). The work
// the kernel adds (the diagonal blocks' upper halves, the softmax) is not counted: ratio is what
// the products' FLOPs would run at, against the ceiling.

#include <omp.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "bench_measure.h"
#include "meshtrain/app/bench_suites.h"
#include "meshtrain/backend/cpu/cpu_backend.h"

namespace meshtrain {

void bench_attention(const BenchArgs& args, BenchReport& report) {
  const bool tiny = args.model == "tiny";
  const int64_t NH = tiny ? 2 : 12, base = tiny ? 16 : 64, B = tiny ? 1 : 2;
  // (HS, HV): GPT-2's heads, twice as wide, and latent attention's 3:2 (192/128).
  const std::vector<std::pair<int64_t, int64_t>> heads{
      {base, base}, {2 * base, 2 * base}, {3 * base, 2 * base}};
  const std::vector<int64_t> lengths = tiny ? std::vector<int64_t>{128} : std::vector<int64_t>{1024, 2048};
  CpuBackend be(args.threads);
  omp_set_num_threads(args.threads);  // the ceilings run on the caller's OpenMP team
  int wrong = 0;
  const int n = tiny ? 256 : 2048;
  const double ceiling_f32 = measure_gemm_ceiling(GemmCeiling::OneDnnF32, n, 3, wrong);
  const bool bf16 = cpu_runs_bf16();
  const double ceiling_bf16 = bf16 ? measure_gemm_ceiling(GemmCeiling::OneDnnBf16, n, 3, wrong) : 0;
  report.columns({"T", "HS", "HV", "forward_ms", "forward_gflops", "backward_ms",
                  "backward_gflops", "ceiling_gflops", "forward_ratio", "backward_ratio"});
  report.header("causal attention of one layer, B " + std::to_string(B) + ", " + std::to_string(NH) +
                " heads, query/key heads of HS, value heads of HV, " +
                std::to_string(args.threads) + " thread(s), " + cpu::Gemm::onednn_version() +
                "; GFLOP/s on the causal FLOPs (forward B NH T^2 (HS + HV), backward B NH T^2 "
                "(3 HS + 2 HV)); ratio = GFLOP/s over the oneDNN matmul ceiling of the same "
                "precision (" + std::to_string(n) + "^3, same run); median of " +
                std::to_string(args.steps) + " runs");
  for (const DType dt : {DType::F32, DType::BF16}) {
    if (dt == DType::BF16 && !bf16) {
      report.header("bf16 rows skipped: oneDNN runs no bf16 GEMM under this ISA");
      continue;
    }
    const double ceiling = dt == DType::F32 ? ceiling_f32 : ceiling_bf16;
    for (const int64_t T : lengths)
      for (const auto& [HS, HV] : heads) {
        const AttentionDims dims{NH, NH, HS, HV};
        const int64_t N = B * T, W = NH * (2 * HS + HV), C = NH * HV;
        Tensor qkv = be.empty({N, W}, dt, MemoryCategory::Workspace);
        Tensor dout = be.empty({N, C}, dt, MemoryCategory::Workspace);
        be.cast(qkv, random_normal_tensor(be, {N, W}, 5u));
        be.cast(dout, random_normal_tensor(be, {N, C}, 6u));
        Tensor out = be.empty({N, C}, dt, MemoryCategory::Workspace);
        Tensor dqkv = be.empty({N, W}, dt, MemoryCategory::Workspace);
        const Backend::AttentionStash s = be.attention_stash(B, T, dims, dt);
        Tensor stash = be.empty(s.shape, s.dtype, MemoryCategory::Workspace);
        const double fwd = median_seconds(args.steps, [&] {
          be.attention_forward(out, stash, qkv, B, T, dims);
        });
        const double bwd = median_seconds(args.steps, [&] {
          be.attention_backward(dqkv, dout, qkv, out, stash, B, T, dims);
        });
        const double pairs = static_cast<double>(B * NH) * static_cast<double>(T) * T;
        const double f = pairs * double(HS + HV) / fwd / 1e9,
                     b = pairs * double(3 * HS + 2 * HV) / bwd / 1e9;
        report.row(std::string(dtype_name(dt)),
                   {static_cast<double>(T), double(HS), double(HV), fwd * 1e3, f, bwd * 1e3, b,
                    ceiling, f / ceiling, b / ceiling},
                   wrong);  // the ceiling's probes
      }
  }
}

}  // namespace meshtrain
