#include "bench_measure.h"

#include <chrono>
#include <random>
#include <vector>

#include "meshtrain/train/straggler_report.h"  // median_of

namespace meshtrain {

Tensor random_normal_tensor(Backend& be, Shape shape, uint32_t seed) {
  Tensor t = be.empty(shape, DType::F32, MemoryCategory::Workspace);
  std::vector<float> host(static_cast<size_t>(shape.numel()));
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : host) x = normal(gen);
  be.copy_from_host(t, host.data());
  return t;
}

double median_seconds(int runs, const std::function<void()>& work) {
  work();
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    work();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median_of(t);
}

double median_slowest_seconds(Communicator& comm, int runs, const std::function<void()>& work) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> times;
  for (int r = 0; r <= runs; ++r) {
    comm.barrier();
    const auto t0 = Clock::now();
    work();
    const double mine = std::chrono::duration<double>(Clock::now() - t0).count();
    const double slowest = comm.all_reduce_scalar(mine, ReduceOp::Max);
    if (r > 0) times.push_back(slowest);
  }
  return median_of(times);
}

}  // namespace meshtrain
