// The `zero` suite (mpiexec -n 2 or more, data-parallel): step time and memory of each ZeRO
// stage and recompute mode, relative to zero 0 / recompute none, measured in the same run.
// The ceiling here is the plain data-parallel step: ratio = its time / this time (1: free).

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

void bench_zero(const BenchArgs& args, BenchReport& report) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  CpuBackend backend(1);
  report.columns({"zero", "recompute", "step_ms", "peak_MiB", "state_MiB", "ratio"});
  const ModelSpec model = bench_gpt2(args, 6, 384, 6, 128, 256);
  report.header("zero: dp " + std::to_string(ranks) + ", GPT " + std::to_string(model.layers) +
                " layers d_model " + std::to_string(model.d_model) + " T " +
                std::to_string(model.seq_len) + ", 2 micro-batches of 4 per rank; "
                "ratio = step time of zero 0 / recompute none over this one");
  double baseline = 0;
  for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    for (int zero = 0; zero <= 3; ++zero) {
      if (rc != Recompute::None && zero != 0) continue;
      Config c = bench_deck("zero", model);
      c.train.micro_batch = 4;
      c.train.global_batch = 8 * ranks;
      c.parallel.dp = ranks;
      c.parallel.zero = zero;
      c.parallel.recompute = rc;
      check_layout(c, ranks);
      ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), 600.0);
      Trainer trainer(c, grid, backend);
      trainer.reset_memory_peaks();
      std::vector<double> ms;
      int wrong = 0;
      for (int s = 0; s <= args.steps; ++s) {
        const StepResult r = trainer.train_step(s);
        if (!std::isfinite(r.loss)) wrong = 1;
        if (s > 0) ms.push_back(r.seconds * 1e3);
      }
      std::sort(ms.begin(), ms.end());
      const double t = ms[ms.size() / 2];
      if (baseline == 0) baseline = t;
      const std::vector<MemoryPeaks> peaks = trainer.memory_peaks();
      const MemoryPeaks& p = peaks[0];
      const double state = static_cast<double>(p.peak[0] + p.peak[1] + p.peak[2]) / (1 << 20);
      const char* names[] = {"none", "selective", "full"};
      report.row(std::string("zero ") + std::to_string(zero) + ", recompute " + names[static_cast<int>(rc)],
                 {static_cast<double>(zero), static_cast<double>(rc), t,
                  static_cast<double>(p.peak_total) / (1 << 20), state, baseline / t},
                 wrong);
    }
  }
}

}  // namespace meshtrain
