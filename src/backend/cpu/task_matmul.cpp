#include "task_matmul.h"

#include <omp.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <unordered_map>

namespace meshtrain::cpu {

namespace {

// This thread's scratchpad, grown to the largest any primitive asked for and kept: a call
// uses it only while it runs, on the thread that owns it.
void* thread_scratchpad(size_t bytes) {
  constexpr size_t kAlign = 64;  // a cache line, as oneDNN's own buffers
  struct Buffer {
    std::unique_ptr<std::byte[]> data;
    size_t size = 0;
  };
  thread_local Buffer buffer;
  if (buffer.size < bytes) {
    buffer.data = std::make_unique<std::byte[]>(bytes + kAlign);
    buffer.size = bytes;
  }
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data.get());
  return buffer.data.get() + (kAlign - address % kAlign) % kAlign;
}

}  // namespace

TaskMatmuls::TaskMatmuls() : engine_(dnnl::engine::kind::cpu, 0) {}

size_t TaskMatmuls::cached() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return cache_.size();
}

const TaskMatmuls::Entry& TaskMatmuls::find_or_create(const Key& k) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = cache_.find(k); it != cache_.end()) return it->second;
  const auto pd = matmul_primitive_desc(engine_, k.g, k.in, MatmulType::F32, false, k.alpha,
                                        k.accumulate, Epilogue::None, false,
                                        dnnl::scratchpad_mode::user);
  return cache_.emplace(k, Entry{pd, dnnl::matmul(pd), pd.scratchpad_desc().get_size()})
      .first->second;
}

void TaskMatmuls::run(const MatmulGeometry& g, MatmulType in, const void* A, const void* B,
                      float* C, float alpha, Accumulate accumulate) {
  if (omp_get_max_threads() != 1)
    throw std::logic_error("backend 'cpu': TaskMatmuls::run needs its thread's OpenMP thread "
                           "count at 1 (call omp_set_num_threads(1) inside the team first), or "
                           "oneDNN would split the product over threads and its bits would "
                           "follow the team size");
  try {
    const Entry& e = find_or_create({g, in, alpha, accumulate});
    dnnl::stream stream(engine_);
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(e.pd.src_desc(), engine_, const_cast<void*>(A))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(e.pd.weights_desc(), engine_, const_cast<void*>(B))},
        {DNNL_ARG_DST, dnnl::memory(e.pd.dst_desc(), engine_, C)}};
    if (e.scratchpad_bytes > 0)
      args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(e.pd.scratchpad_desc(), engine_,
                                                     thread_scratchpad(e.scratchpad_bytes)));
    e.primitive.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& err) {
    throw std::runtime_error(matmul_failure(g, in, MatmulType::F32, err));
  }
}

}  // namespace meshtrain::cpu
