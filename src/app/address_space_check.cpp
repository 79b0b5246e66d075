#include "meshtrain/app/address_space_check.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>


namespace meshtrain {

namespace {

// `name`'s value in `env` (null-terminated "NAME=value" strings), or null. Not getenv: libc's
// own copy of the environment is set up only after the preinit_array has run.
const char* lookup(char** env, const char* name) {
  const size_t length = std::strlen(name);
  for (char** e = env; e && *e; ++e)
    if (std::strncmp(*e, name, length) == 0 && (*e)[length] == '=') return *e + length + 1;
  return nullptr;
}

// A positive thread count from an environment variable ("4", or OpenMP's list "4,2": its first).
int threads_from(char** env, const char* name) {
  const char* v = lookup(env, name);
  if (!v || !*v) return 0;
  const long n = std::strtol(v, nullptr, 10);
  return n > 0 && n < (1 << 20) ? static_cast<int>(n) : 0;
}

// The process's address space now (/proc/self/statm's first field), in bytes; 0 if unknown.
size_t address_space_in_use() {
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[128] = {};
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return 0;
  return static_cast<size_t>(std::strtoull(text, nullptr, 10)) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

int openblas_startup_threads(char** env) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  int n = threads_from(env, "OPENBLAS_NUM_THREADS");
  if (n == 0) n = threads_from(env, "GOTO_NUM_THREADS");
  if (n == 0) n = threads_from(env, "OMP_NUM_THREADS");
  if (n == 0 || n > cpus) n = cpus;
  return n > 0 ? n : 1;
}

void refuse_small_address_space(char** env) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  const size_t in_use = address_space_in_use();
  const size_t cap = static_cast<size_t>(limit.rlim_cur);
  const int threads = openblas_startup_threads(env);
  const size_t needed = static_cast<size_t>(threads) * kOpenBlasBufferBytes + kStartupReserveBytes;
  const size_t headroom = cap > in_use ? cap - in_use : 0;
  if (headroom >= needed) return;
  int rank = 0;
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = lookup(env, name); v && *v) {
      rank = std::atoi(v);
      break;
    }
  const auto mib = [](size_t bytes) { return static_cast<unsigned long long>(bytes >> 20); };
  std::fprintf(stderr,
               "meshtrain: rank %d: error: out of memory: the address-space limit (ulimit -v %llu) "
               "leaves %llu MiB beside the %llu MiB the program and its libraries take, less than "
               "the %llu MiB start-up needs (OpenBLAS's GEMM buffers, %d thread(s) x %llu MiB, and "
               "%llu MiB for MPI's start-up and the first allocations); raise the limit to at least "
               "%llu KiB, or start fewer threads per rank (OMP_NUM_THREADS)\n"
               "meshtrain: more in docs/memory-and-planning.md\n",
               rank, static_cast<unsigned long long>(cap >> 10), mib(headroom),
               mib(in_use), mib(needed), threads, mib(kOpenBlasBufferBytes), mib(kStartupReserveBytes),
               static_cast<unsigned long long>((in_use + needed) >> 10) + 1);
  std::fflush(stderr);
  ::_exit(1);  // kExitInput; nothing is initialised that would need an orderly exit
}

}  // namespace meshtrain
