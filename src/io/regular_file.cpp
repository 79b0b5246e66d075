// Refusing FIFOs, devices and directories before a reader blocks in them (io/regular_file.h).

#include "meshtrain/io/regular_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

// open(2) without blocking on a FIFO, then the type judged on the descriptor itself (fstat), so
// that nothing can be swapped in between: fd >= 0, or -1 with errno set (mode_out: the type).
int open_nonblocking(const std::string& path, mode_t& mode_out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  mode_out = st.st_mode;
  return fd;
}

// regular_file_problem's wording, for an open descriptor's type.
std::string short_problem(mode_t mode) {
  const std::string kind = kind_of(mode);
  if (kind.empty()) return "";
  if (S_ISDIR(mode)) return "is a directory";
  return "is " + kind + ", not a regular file";
}

// Opens `path` as a regular file: fd >= 0, or -1 and `why` said as regular_file_problem says it.
int open_regular(const std::string& path, std::string& why) {
  mode_t mode = 0;
  const int fd = open_nonblocking(path, mode);
  if (fd < 0) {
    why = std::string("cannot open: ") + std::strerror(errno);
    return -1;
  }
  why = short_problem(mode);
  if (!why.empty()) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

std::string file_kind_name(const std::filesystem::file_status& status) {
  namespace fs = std::filesystem;
  switch (status.type()) {
    case fs::file_type::regular: return "";
    case fs::file_type::directory: return "a directory";
    case fs::file_type::fifo: return "a FIFO (named pipe)";
    case fs::file_type::character: return "a character device";
    case fs::file_type::block: return "a block device";
    case fs::file_type::socket: return "a socket";
    default: return "not a regular file";
  }
}

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
  mode_t mode = 0;
  const int fd = open_nonblocking(path, mode);
  if (fd < 0) return -1;
  const std::string why = problem(path, mode, what, expected);
  if (!why.empty()) {
    ::close(fd);
    throw DataError(path, why.substr(path.size() + 2));
  }
  // Reads of a regular file never block; blocking mode is restored for the reader's sake.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string regular_file_problem(const std::string& path) {
  std::string why;
  const int fd = open_regular(path, why);
  if (fd >= 0) ::close(fd);
  return why;
}

std::string read_regular_file(const std::string& path, std::string& out) {
  std::string why;
  const int fd = open_regular(path, why);
  if (fd < 0) return why;
  out.clear();
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      why = std::string("cannot be read: ") + std::strerror(errno);
      break;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return why;
}

int rename_without_replacing(const std::string& from, const std::string& to) {
  int error = ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0 ? 0 : errno;
  if (error == EINVAL || error == ENOSYS) {
    // A file system without RENAME_NOREPLACE: a hard link fails where a file exists, as a
    // rename would not.
    error = ::link(from.c_str(), to.c_str()) == 0 ? 0 : errno;
    if (error == 0) ::unlink(from.c_str());
  }
  return error;
}

}  // namespace meshtrain
