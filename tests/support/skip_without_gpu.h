#pragma once
// SKIP_WITHOUT_GPU(): skips the calling GoogleTest case, with the reason, where no CUDA device
// is usable (CTest's SKIP_REGULAR_EXPRESSION "no CUDA device" then reports the test as skipped).

#include <gtest/gtest.h>

#include <string>

#include "meshtrain/backend/cuda/cuda_backend.h"

#define SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                       \
    std::string why;                                                                         \
    if (::meshtrain::cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)
