#pragma once
// Refusing to start under an address-space limit (ulimit -v, RLIMIT_AS) too small to get through
// start-up, before a library's constructor can get stuck in it. OpenBLAS maps a 128 MiB GEMM
// buffer per thread in its constructor, before main, and when the mapping fails it retries for
// ever (blas_memory_alloc): the process spun at 100% CPU with nothing printed. A limit a little
// higher failed inside MPI_Init with Open MPI's own messages. So the executable checks the limit
// from its preinit_array (main.cpp), which runs before every shared library's constructor, and
// exits with status 1 and an out-of-memory message when the headroom is smaller than OpenBLAS's
// buffers plus what MPI's start-up and the first allocations take. Above that, memory that runs
// out later fails an allocation or a thread's creation, which run_reporting_errors reports as
// out of memory.

#include <cstddef>

namespace meshtrain {

// OpenBLAS's buffer per thread (BUFFER_SIZE of its x86-64 build, 32 << 22 bytes; measured: the
// process's size grows by 128 MiB per thread in gotoblas_init).
inline constexpr size_t kOpenBlasBufferBytes = size_t{128} << 20;
// What MPI_Init (Open MPI's shared-memory segments, PMIx, its progress thread) and start-up's
// first allocations take beyond OpenBLAS's buffers (measured on the catalogue's deck: MPI_Init
// fails below about 200 MiB more).
inline constexpr size_t kStartupReserveBytes = size_t{256} << 20;

// The threads OpenBLAS's constructor takes, as it counts them: OPENBLAS_NUM_THREADS,
// GOTO_NUM_THREADS or OMP_NUM_THREADS, else every CPU this process may run on, at most those CPUs.
// `env`: the process's environment (the preinit_array's third argument).
int openblas_startup_threads(char** env);

// Exits the process with status 1 after printing why, when RLIMIT_AS leaves less than
// start-up needs. Plain C calls and no exceptions: it runs from the preinit_array, before
// libstdc++'s constructors.
void refuse_small_address_space(char** env);

}  // namespace meshtrain
