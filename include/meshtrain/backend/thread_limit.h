#pragma once
// The most threads one meshtrain process runs for its kernels, BLAS or tokenizing, whoever asks
// (run.threads, OMP_NUM_THREADS, --threads). Threads beyond a node's hardware threads only take
// turns on them, while each reserves a stack: 100000 of them exhausted memory or the kernel's
// thread limit part-way (a segfault inside the OpenMP runtime; prepare aborted with its .tmp
// shards left behind). 1024 is above the hardware threads of today's largest nodes (two sockets
// of 192 cores with two threads each make 768), so no real layout is refused, and a typo is
// refused before anything starts. One number for every path, so that a value run.threads refuses
// is refused in OMP_NUM_THREADS too.

namespace meshtrain {

inline constexpr int kMaxThreads = 1024;

}  // namespace meshtrain
