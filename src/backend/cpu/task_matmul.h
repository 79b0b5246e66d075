#pragma once
// GEMMs that one thread of an OpenMP team runs alone, from every thread of the team at once:
// the flash-attention tasks (flash_attention.cpp) each own a block of queries and multiply
// small blocks, where a GEMM threaded over the team would spend more on forking than on the
// product. oneDNN matmul primitives, created once per (geometry, types, alpha, accumulate) and
// kept: the set of block shapes is small, and creating a primitive costs about a millisecond.
//
// Single-threaded by construction, so that a task's bits cannot depend on the team size: the
// caller lowers its thread's OpenMP thread count to 1 (omp_set_num_threads inside the team;
// run() refuses otherwise), and oneDNN, which sizes its work split by omp_get_max_threads both
// when it creates a primitive and when it runs one, then never splits a reduction.
// One primitive runs on many threads at once. oneDNN allows that only with the user scratchpad
// mode: its own scratchpad is one buffer for all (the blocked kernels pack a block of B there),
// which two threads would both write. So each thread has its own stream, memory objects and
// scratchpad (bound once per primitive, their addresses set per call).

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <map>
#include <mutex>

#include "onednn_matmul.h"

namespace meshtrain::cpu {

class TaskMatmuls {
 public:
  TaskMatmuls();

  // C (fp32) = alpha * A @ B [+ C] for g (2-D: batch 1, 1); A and B of type `in` (bf16 as its
  // uint16_t bits).
  void run(const MatmulGeometry& g, MatmulType in, const void* A, const void* B, float* C,
           float alpha, Accumulate accumulate);
  size_t cached() const;

 private:
  struct Key {
    MatmulGeometry g;
    MatmulType in;
    float alpha;
    Accumulate accumulate;
    auto operator<=>(const Key&) const = default;
  };
  struct Entry {
    dnnl::matmul::primitive_desc pd;  // its operands' descriptors, bound once per thread
    dnnl::matmul primitive;
    size_t scratchpad_bytes;
    size_t index;  // its order of creation: where a thread keeps its bindings (task_matmul.cpp)
  };
  const Entry& find_or_create(const Key& k);

  dnnl::engine engine_;
  const uint64_t serial_;  // unique in the process: whose bindings a thread holds
  mutable std::mutex mutex_;  // guards cache_ (std::map: entries never move once inserted)
  std::map<Key, Entry> cache_;
};

}  // namespace meshtrain::cpu
