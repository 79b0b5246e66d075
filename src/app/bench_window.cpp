// The `window` suite (one rank): sliding-window attention (AttentionDims::window) against full
// causal attention of the same shape on the CPU's flash-style kernel, forward and backward, fp32:
// the kernel skips the key chunks before a block's window, so at T >> W its time should scale
// as T W rather than T^2 (issue 55 asks for W = 1024 at most 0.3x full attention's time at
// T = 16384). Rows per (T, W): the windowed and the full times and their ratio, and the ratio
// the skipped work alone predicts, (W + block) / (T / 2) (a query block sees its window plus
// its own block of keys; full causal attention T / 2 keys on average). Results are checked: the
// windowed output must differ from the full one where the window binds (a kernel that ignored
// the window would run as fast as full attention and is caught by the ratio anyway).

#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "bench_measure.h"
#include "meshtrain/app/bench_suites.h"
#include "meshtrain/backend/cpu/cpu_backend.h"

namespace meshtrain {

namespace {

// Seconds of one forward and one backward call, each the median of `runs` after one untimed.
struct PassSeconds {
  double forward = 0, backward = 0;
};

PassSeconds time_passes(CpuBackend& be, int runs, const Tensor& qkv, const Tensor& dout,
                        Tensor& out, int64_t B, int64_t T, const AttentionDims& dims) {
  Tensor dqkv = be.empty(qkv.shape(), qkv.dtype(), MemoryCategory::Workspace);
  const Backend::AttentionStash s = be.attention_stash(B, T, dims, qkv.dtype());
  Tensor stash = be.empty(s.shape, s.dtype, MemoryCategory::Workspace);
  PassSeconds p;
  p.forward = median_seconds(runs, [&] { be.attention_forward(out, stash, qkv, B, T, dims); });
  p.backward =
      median_seconds(runs, [&] { be.attention_backward(dqkv, dout, qkv, out, stash, B, T, dims); });
  return p;
}

}  // namespace

void bench_window(const BenchArgs& args, BenchReport& report) {
  const bool tiny = args.model == "tiny";
  const int64_t B = 1, NH = tiny ? 2 : 4, HS = tiny ? 16 : 64;
  struct Shape {
    int64_t T, window;
  };
  const std::vector<Shape> shapes = tiny ? std::vector<Shape>{{1024, 128}}
                                         : std::vector<Shape>{{8192, 1024}, {16384, 1024}};
  CpuBackend be(args.threads);
  omp_set_num_threads(args.threads);
  report.columns({"T", "window", "forward_ms", "full_forward_ms", "backward_ms",
                  "full_backward_ms", "ratio", "skipped_work_ratio"});
  report.header("sliding-window against full causal attention of one layer, fp32, B " +
                std::to_string(B) + ", " + std::to_string(NH) + " heads of " + std::to_string(HS) +
                ", " + std::to_string(args.threads) + " thread(s); ratio = windowed (forward + "
                "backward) over full (forward + backward); skipped_work_ratio = (window + 64) / "
                "(T / 2), what the keys left out alone predict; median of " +
                std::to_string(args.steps) + " runs");
  for (const Shape& sh : shapes) {
    const int64_t N = B * sh.T, W = NH * 3 * HS, C = NH * HS;
    const Tensor qkv = random_normal_tensor(be, {N, W}, 7u);
    const Tensor dout = random_normal_tensor(be, {N, C}, 8u);
    Tensor windowed_out = be.empty({N, C}, DType::F32, MemoryCategory::Workspace);
    Tensor full_out = be.empty({N, C}, DType::F32, MemoryCategory::Workspace);
    const AttentionDims full{NH, NH, HS, 0, 0.0, 0}, windowed{NH, NH, HS, 0, 0.0, sh.window};
    const PassSeconds w = time_passes(be, args.steps, qkv, dout, windowed_out, B, sh.T, windowed);
    const PassSeconds f = time_passes(be, args.steps, qkv, dout, full_out, B, sh.T, full);
    // The last query's output differs unless the window was ignored.
    std::vector<float> a(static_cast<size_t>(C)), b(static_cast<size_t>(C));
    be.copy_to_host(a.data(), windowed_out.view((N - 1) * C, {C}));
    be.copy_to_host(b.data(), full_out.view((N - 1) * C, {C}));
    const int wrong = a == b ? 1 : 0;
    const double ratio = (w.forward + w.backward) / (f.forward + f.backward);
    report.row("fp32",
               {static_cast<double>(sh.T), static_cast<double>(sh.window), w.forward * 1e3,
                f.forward * 1e3, w.backward * 1e3, f.backward * 1e3, ratio,
                static_cast<double>(sh.window + 64) / (static_cast<double>(sh.T) / 2)},
               wrong);
  }
}

}  // namespace meshtrain
