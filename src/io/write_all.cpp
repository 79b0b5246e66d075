#include "meshtrain/io/write_all.h"

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

namespace meshtrain {

int write_all(int fd, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : ENOSPC;
    done += static_cast<size_t>(n);
  }
  return 0;
}

void count_unwritten(const std::string& path, const char* what, const char* records, int error, int64_t step,
                     int64_t& lost) {
  if (lost++ > 0) return;  // once, loudly
  std::fprintf(stderr, "meshtrain: warning: %s: cannot write %s (%s)%s; training goes on, but this file will "
               "lack %s (check the file system of run.dir)\n",
               path.c_str(), what, std::strerror(error),
               step >= 0 ? (" at step " + std::to_string(step)).c_str() : "", records);
  std::fflush(stderr);
}

}  // namespace meshtrain
