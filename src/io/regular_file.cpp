#include "meshtrain/io/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace meshtrain {

namespace {

std::string kind_problem(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe), not a regular file";
  if (S_ISSOCK(mode)) return "is a socket, not a regular file";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "is a device, not a regular file";
  return "is not a regular file";
}

// Opens `path` for reading as a regular file: fd >= 0, or -1 and `problem` said. The type is
// judged on the descriptor opened (fstat), not on the name beforehand, so that nothing can be
// swapped in between; O_NONBLOCK keeps a FIFO from blocking the open.
int open_regular(const std::string& path, std::string& problem) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    problem = std::string("cannot open: ") + std::strerror(errno);
    return -1;
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    problem = std::string("cannot be examined: ") + std::strerror(errno);
  } else {
    problem = kind_problem(st.st_mode);
  }
  if (!problem.empty()) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::string regular_file_problem(const std::string& path) {
  std::string problem;
  const int fd = open_regular(path, problem);
  if (fd >= 0) ::close(fd);
  return problem;
}

std::string read_regular_file(const std::string& path, std::string& out) {
  std::string problem;
  const int fd = open_regular(path, problem);
  if (fd < 0) return problem;
  out.clear();
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      problem = std::string("cannot be read: ") + std::strerror(errno);
      break;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return problem;
}

}  // namespace meshtrain
