#pragma once
// Measurements the benchmark suites share: random inputs, and the median of a collective piece
// of work timed on its slowest rank.

#include <cstdint>
#include <functional>

#include "meshtrain/backend/backend.h"
#include "meshtrain/comm/communicator.h"

namespace meshtrain {

// An fp32 workspace tensor of standard normal values drawn from `seed`.
Tensor random_normal_tensor(Backend& be, Shape shape, uint32_t seed);

// Median over `runs` of the slowest rank's time of `work` (seconds), after one untimed run that
// warms caches and buffers; collective over `comm`.
double median_slowest_seconds(Communicator& comm, int runs, const std::function<void()>& work);
// Median seconds of `runs` calls of `work` on this rank alone, after one untimed call
// (primitives, caches).
double median_seconds(int runs, const std::function<void()>& work);

}  // namespace meshtrain
