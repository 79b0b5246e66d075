// The `comm` suite (run under mpiexec with 2 or more ranks): data-parallel gradient
// synchronisation.
//
//   raw      one MPI_Allreduce of all gradient bytes — the ceiling of this machine and MPI
//   sync     meshtrain's bucketed reduction (ModelState, the production code path) of the same
//            bytes with nothing else running
//   hidden   in real training steps, the fraction of `sync` that overlapped backward:
//            1 - (reduction time left after the last rank's backward ended) / (sync time)
// Bus bandwidth follows nccl-tests: algbw = bytes / time; busbw = algbw x 2 (n - 1) / n.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

Config comm_config(const BenchArgs& args, int ranks, double bucket_mb) {
  Config c = bench_deck("comm", bench_gpt2(args, 8, 512, 8, 128, 256));
  c.train.micro_batch = 2;
  c.train.global_batch = 2 * ranks * 2;  // two micro-batches per rank
  c.parallel.dp = ranks;
  c.parallel.bucket_mb = bucket_mb;
  check_layout(c, ranks);
  return c;
}

}  // namespace

void bench_comm(const BenchArgs& args, BenchReport& report) {
  int ranks = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (ranks < 2) throw std::runtime_error("bench --suite comm needs 2 or more ranks (mpiexec -n 2)");
  const int repeats = std::max(5, args.steps);
  CpuBackend backend(1);
  const double factor = 2.0 * (ranks - 1) / ranks;
  report.columns({"bytes", "time_ms", "busbw_GB/s", "hidden", "ratio"});

  for (double bucket_mb : {25.0, 1e6}) {
    const Config c = comm_config(args, ranks, bucket_mb);
    ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), 600.0);
    Trainer trainer(c, grid, backend);
    ModelState& state = trainer.state();
    const int64_t elements = state.layout().plan().total_size();
    const double bytes = static_cast<double>(elements) * 4.0;

    // Ceiling: one MPI_Allreduce of the same bytes, in the same run.
    std::vector<float> buffer(static_cast<size_t>(elements), 1.0f);
    std::vector<double> raw;
    for (int r = 0; r <= repeats; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = now();
      MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(elements), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      if (r > 0) raw.push_back(now() - t0);
    }
    int wrong = std::abs(buffer[elements / 2] - std::pow(static_cast<float>(ranks), repeats + 1)) >
                        1e-3f * std::pow(static_cast<float>(ranks), repeats + 1) ? 1 : 0;

    // meshtrain's bucketed reduction alone: every unit reports its backward finished, in
    // backward order, as often as there are micro-batches; then wait.
    const int units = trainer.model().params().units();
    std::vector<double> sync;
    for (int r = 0; r <= repeats; ++r) {
      state.begin_step();
      state.reducer().zero_unwritten_gradients();  // as the model's backward would have written them
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = now();
      for (int m = 0; m < c.microbatches(); ++m)
        for (int u = units - 1; u >= 0; --u) {
          state.before_backward(u);
          state.after_backward(u);
        }
      state.finish_backward();
      if (r > 0) sync.push_back(now() - t0);
    }
    // Real steps: the communication still running after the last rank's backward ended
    // (one node: one monotonic clock for all ranks).
    std::vector<double> exposed, step_seconds;
    Communicator& world = grid.world();
    for (int s = 0; s <= args.steps; ++s) {
      const StepResult res = trainer.train_step(s);
      const double backward_end = world.all_reduce_scalar(state.reducer().backward_end_time(), ReduceOp::Max);
      const double done = world.all_reduce_scalar(state.reducer().reductions_done_time(), ReduceOp::Max);
      if (s > 0) {
        exposed.push_back(std::max(0.0, done - backward_end));
        step_seconds.push_back(res.seconds);
      }
    }
    const double t_raw = median(raw), t_sync = median(sync), t_exposed = median(exposed);
    const double hidden = std::max(0.0, 1.0 - t_exposed / t_sync);
    const std::string buckets = std::to_string(state.layout().plan().buckets.size()) + " bucket(s)";
    if (rank == 0) {
      char line[240];
      std::snprintf(line, sizeof line,
                    "comm: %d ranks, %.1f MB of gradients in %s (bucket_mb %g); raw MPI_Allreduce "
                    "%.2f ms (busbw %.2f GB/s); step %.0f ms, reduction after the last backward %.2f ms",
                    ranks, bytes / 1e6, buckets.c_str(), bucket_mb, t_raw * 1e3,
                    bytes * factor / t_raw / 1e9, median(step_seconds) * 1e3, t_exposed * 1e3);
      report.header(line);
    }
    report.row("dp sync, " + buckets, {bytes, t_sync * 1e3, bytes * factor / t_sync / 1e9, hidden,
                                       t_raw / t_sync},
               wrong);
  }
}

}  // namespace meshtrain
