#include "task_matmul.h"

#include <omp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <vector>

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

// What this thread has bound for one TaskMatmuls: a stream, and per primitive the memory
// objects of its arguments, whose data handles each call sets. Creating them per call cost
// about as much as a 64x64x64 product. A thread that turns to another TaskMatmuls starts over,
// so each thread holds one set at most.
struct ThreadBindings {
  uint64_t owner = 0;  // the serial of the TaskMatmuls bound; 0: none
  std::optional<dnnl::stream> stream;
  std::vector<std::unordered_map<int, dnnl::memory>> args;  // by Entry::index; empty: unbound
};
thread_local ThreadBindings bindings;

std::atomic<uint64_t> next_serial{1};

}  // namespace

TaskMatmuls::TaskMatmuls() : engine_(dnnl::engine::kind::cpu, 0), serial_(next_serial++) {}

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
  return cache_
      .emplace(k, Entry{pd, dnnl::matmul(pd), pd.scratchpad_desc().get_size(), cache_.size()})
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
    if (bindings.owner != serial_) bindings = ThreadBindings{serial_, dnnl::stream(engine_), {}};
    if (bindings.args.size() <= e.index) bindings.args.resize(e.index + 1);
    std::unordered_map<int, dnnl::memory>& args = bindings.args[e.index];
    if (args.empty()) {
      args.emplace(DNNL_ARG_SRC, dnnl::memory(e.pd.src_desc(), engine_, nullptr));
      args.emplace(DNNL_ARG_WEIGHTS, dnnl::memory(e.pd.weights_desc(), engine_, nullptr));
      args.emplace(DNNL_ARG_DST, dnnl::memory(e.pd.dst_desc(), engine_, nullptr));
      if (e.scratchpad_bytes > 0)
        args.emplace(DNNL_ARG_SCRATCHPAD,
                     dnnl::memory(e.pd.scratchpad_desc(), engine_, nullptr));
    }
    args.at(DNNL_ARG_SRC).set_data_handle(const_cast<void*>(A));
    args.at(DNNL_ARG_WEIGHTS).set_data_handle(const_cast<void*>(B));
    args.at(DNNL_ARG_DST).set_data_handle(C);
    if (e.scratchpad_bytes > 0)
      args.at(DNNL_ARG_SCRATCHPAD).set_data_handle(thread_scratchpad(e.scratchpad_bytes));
    e.primitive.execute(*bindings.stream, args);
    bindings.stream->wait();
  } catch (const dnnl::error& err) {
    throw std::runtime_error(matmul_failure(g, in, MatmulType::F32, err));
  }
}

}  // namespace meshtrain::cpu
