// Refusing FIFOs, devices and directories before a reader blocks in them (io/regular_file.h).

#include "meshtrain/io/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "meshtrain/io/data_error.h"

namespace meshtrain {

namespace {

// "" for a regular file, else what the mode is, as a message names it.
std::string kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string problem(const std::string& path, mode_t mode, const std::string& what,
                    const std::string& expected) {
  const std::string kind = kind_of(mode);
  if (kind.empty()) return "";
  return path + ": is " + kind + ", not " + what + " (expected " + expected + ")";
}

}  // namespace

std::string non_regular_file_problem(const std::string& path, const std::string& what,
                                     const std::string& expected) {
  // stat(2) follows a symbolic link to what it names and, unlike open(2), never blocks.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return problem(path, st.st_mode, what, expected);
}

void require_regular_file(const std::string& path, const std::string& what,
                          const std::string& expected) {
  const std::string why = non_regular_file_problem(path, what, expected);
  // DataError prefixes "<path>: "; the message already starts with it.
  if (!why.empty()) throw DataError(path, why.substr(path.size() + 2));
}

int open_regular_file(const std::string& path, const std::string& what,
                      const std::string& expected) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  const std::string why = problem(path, st.st_mode, what, expected);
  if (!why.empty()) {
    ::close(fd);
    throw DataError(path, why.substr(path.size() + 2));
  }
  // Reads of a regular file never block; blocking mode is restored for the reader's sake.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace meshtrain
