// The `gpu` suite (one rank, one GPU): GPT-2 124M (12 layers, d_model 768, 12 heads, T 1024,
// vocabulary 50257 padded to 50304, tied embeddings) trained in bf16 mixed precision at the
// largest micro-batch that fits, against the machine's ceiling measured in the same run: a large
// bf16 cuBLASLt GEMM. Prints tokens/s and MFU (PaLM FLOPs, ModelSpec::flops_per_token, over that
// peak). Its steps alternate between GELU in cuBLASLt's epilogues and the unfused kernels, one
// row each. bench/gpu/run.sh runs it next to the same model in PyTorch and prints the ratio. A
// header line says which attention ran, and why not cuDNN's when it did not; where cuDNN must
// work (backend/attention_support.h) a fallback counts as a wrong result.

#include <algorithm>
#include <cmath>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/app/run_setup.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/train/trainer.h"

#if MESHTRAIN_HAVE_CUDA
#include "meshtrain/backend/cuda/cuda_backend.h"
#endif

namespace meshtrain {

void bench_gpu(const BenchArgs& args, BenchReport& report) {
#if !MESHTRAIN_HAVE_CUDA
  (void)args;
  (void)report;
  throw AgreedError("bench --suite gpu needs a CUDA build of meshtrain (nvcc at build time)");
#else
  std::string why;
  if (cuda_device_count(&why) == 0) throw AgreedError("bench --suite gpu: no GPU: " + why);
  CudaBackend backend;
  report.columns({"micro_batch", "tokens", "step_ms", "tokens/s", "TFLOP/s", "MFU"});
  const double peak = backend.measure_bf16_gemm_peak_tflops();
  report.header("suite gpu: " + backend.describe() + "; ceiling: bf16 cuBLASLt GEMM 8192^3, " +
                std::to_string(peak) + " TFLOP/s");
  int wrong = 0;
  for (int64_t b : {64, 32, 16, 8, 4}) {
    Config c = bench_deck("gpu", gpt2_spec(12, 768, 12, 1024, 50304));
    c.run.device = DeviceChoice::Cuda;
    c.data.synthetic_bytes = 1 << 22;
    c.train.precision = DType::BF16;
    c.train.micro_batch = static_cast<int>(b);
    c.train.global_batch = static_cast<int>(b);
    c.parallel.communicator = CommChoice::Nccl;
    check_layout(c, 1);
    try {
      std::unique_ptr<ProcessGrid> grid = make_grid(c, backend);
      Trainer trainer(c, *grid, backend);
      // Which attention the numbers below measure. A cuDNN fallback where cuDNN must work
      // (sm_80/sm_90, cuDNN 9) is a wrong result: the row would pass off the own kernels' speed.
      std::string why;
      const int64_t heads = c.model.heads, hs = c.model.head_dim();
      if (backend.attention_impl_for(DType::BF16, b, 1024, heads, hs, &why) == AttentionImpl::Cudnn) {
        report.header("attention: cuDNN fused (" + describe(backend.cudnn_platform()) + ")");
      } else {
        const RejectedAttention r = judge_rejected_attention(backend.cudnn_platform(), DType::BF16,
                                                             b, 1024, heads, hs, why);
        report.header("attention: own kernels: " + r.message);
        if (r.is_error) wrong = 1;
      }
      // Steps alternate between GELU and the residual adds in cuBLASLt's epilogues and the
      // unfused kernels, so that the two are measured side by side on the same card, state and
      // data.
      std::vector<double> seconds[2];  // [0]: fused, [1]: unfused
      double first_loss = 0;
      const int measured = 2 * std::max(args.steps, 5);
      for (int s = 0; s <= measured; ++s) {
        backend.set_fused_epilogues(s % 2 == 0);
        const CudaBackend::EpilogueCounts gelu = backend.gelu_epilogues(),
                                          residual = backend.residual_epilogues();
        const StepResult r = trainer.train_step(s);
        if (s == 0) first_loss = r.loss;
        else seconds[s % 2].push_back(r.seconds);
        if (s == 0 && backend.gelu_epilogues().fused == gelu.fused)
          report.header("GELU epilogue: cuBLASLt offered none for these shapes; both rows run "
                        "the unfused kernels");
        if (s == 0 && backend.residual_epilogues().fused == residual.fused)
          report.header("residual epilogue: cuBLASLt offered none for these shapes; both rows "
                        "add the residual separately");
      }
      backend.set_fused_epilogues(true);
      if (std::abs(first_loss - std::log(50304.0)) > 0.5) wrong = 1;  // logits start near zero
      const double tokens = static_cast<double>(b) * 1024.0;
      for (int fused = 0; fused < 2; ++fused) {
        std::vector<double>& v = seconds[fused];
        std::sort(v.begin(), v.end());
        const double t = v[v.size() / 2];
        const double tflops = c.model.flops_per_token() * tokens / t / 1e12;
        report.row(fused == 0 ? "gpt2-124M bf16 T1024" : "gpt2-124M bf16 T1024, epilogues unfused",
                   {static_cast<double>(b), tokens, t * 1e3, tokens / t, tflops, tflops / peak},
                   wrong);
      }
      // Where the time goes: a few more steps with every operation timed on its own (the
      // stream drained around each, so these steps run slower than the measured ones).
      KernelProfile profile;
      backend.set_profile(&profile);
      const int profiled = 3;
      double profiled_seconds = 0;
      for (int s = 0; s < profiled; ++s)
        profiled_seconds += trainer.train_step(measured + 1 + s).seconds;
      backend.set_profile(nullptr);
      report_breakdown(report, profile, profiled, profiled_seconds / profiled);
      return;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      if (what.find("out of memory") == std::string::npos) throw;
      report.header("micro-batch " + std::to_string(b) + " does not fit: " + what);
      backend.allocator().release_cached();
    }
  }
  throw std::runtime_error("bench --suite gpu: not even micro-batch 4 fits");
#endif
}

}  // namespace meshtrain
