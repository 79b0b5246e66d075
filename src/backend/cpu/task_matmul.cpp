#include "task_matmul.h"

#include <omp.h>

#include <stdexcept>
#include <utility>

namespace meshtrain::cpu {

TaskMatmuls::TaskMatmuls() : engine_(dnnl::engine::kind::cpu, 0) {}

size_t TaskMatmuls::cached() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return cache_.size();
}

std::pair<const TaskMatmuls::Entry*, TaskMatmuls::PerThread*> TaskMatmuls::find_or_create(
    const Key& k) {
  const std::lock_guard<std::mutex> lock(mutex_);
  auto it = cache_.find(k);
  if (it == cache_.end()) {
    const auto pd = matmul_primitive_desc(engine_, k.g, k.in, MatmulType::F32, false, k.alpha,
                                          k.accumulate, Epilogue::None);
    it = cache_.emplace(k, Entry{pd, dnnl::matmul(pd)}).first;
  }
  auto t = threads_.find(std::this_thread::get_id());
  if (t == threads_.end())
    t = threads_.emplace(std::this_thread::get_id(), PerThread{dnnl::stream(engine_), {}}).first;
  return {&it->second, &t->second};
}

void TaskMatmuls::run(const MatmulGeometry& g, MatmulType in, const void* A, const void* B,
                      float* C, float alpha, Accumulate accumulate) {
  if (omp_get_max_threads() != 1)
    throw std::logic_error("backend 'cpu': TaskMatmuls::run needs its thread's OpenMP thread "
                           "count at 1 (call omp_set_num_threads(1) inside the team first), or "
                           "oneDNN would split the product over threads and its bits would "
                           "follow the team size");
  try {
    const auto [e, mine] = find_or_create({g, in, alpha, accumulate});
    // Only this thread reaches its PerThread (keyed by its id), so no lock from here on.
    auto b = mine->bound.find(e);
    if (b == mine->bound.end()) {
      Bound fresh{dnnl::memory(e->pd.src_desc(), engine_, DNNL_MEMORY_NONE),
                  dnnl::memory(e->pd.weights_desc(), engine_, DNNL_MEMORY_NONE),
                  dnnl::memory(e->pd.dst_desc(), engine_, DNNL_MEMORY_NONE), {}};
      // Handles: the map's copies are the same memory objects as the three above.
      fresh.args = {{DNNL_ARG_SRC, fresh.src}, {DNNL_ARG_WEIGHTS, fresh.weights},
                    {DNNL_ARG_DST, fresh.dst}};
      b = mine->bound.emplace(e, std::move(fresh)).first;
    }
    Bound& bound = b->second;
    bound.src.set_data_handle(const_cast<void*>(A));
    bound.weights.set_data_handle(const_cast<void*>(B));
    bound.dst.set_data_handle(C);
    e->primitive.execute(mine->stream, bound.args);
    mine->stream.wait();
  } catch (const dnnl::error& err) {
    throw std::runtime_error(matmul_failure(g, in, MatmulType::F32, err));
  }
}

}  // namespace meshtrain::cpu
