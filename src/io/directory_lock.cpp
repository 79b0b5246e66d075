#include "meshtrain/io/directory_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "meshtrain/comm/node.h"
#include "meshtrain/io/checkpoint_file.h"

namespace meshtrain {

namespace {

// The holder's line, as written by take(): "node N, pid P, since T".
std::string holder_of(int fd) {
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  if (text.empty()) return "a process that has not yet written its name (it is starting)";
  for (char& c : text)  // the file comes from another process: print only plain text
    if (c < 0x20 || c == 0x7f) c = ' ';
  return text;
}

bool unsupported(int err) { return err == ENOLCK || err == ENOSYS || err == EOPNOTSUPP || err == EINVAL; }

}  // namespace

std::unique_ptr<DirectoryLock> DirectoryLock::take(const std::string& dir, const std::string& file_name,
                                                   const std::string& context, std::string& warning) {
  const std::string path = dir + "/" + file_name;
  // A holder removes the file as it releases the lock: a lock taken on a file that is no longer
  // at `path` protects nothing, so the next try opens the new one.
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
      throw std::runtime_error(context + "cannot create the lock file " + path + ": " + std::strerror(errno) +
                               " (the directory must be writable, and the name free for meshtrain's lock)");
    struct flock request {};
    request.l_type = F_WRLCK;
    request.l_whence = SEEK_SET;
    if (::fcntl(fd, F_OFD_SETLK, &request) != 0) {
      const int err = errno;
      if (err == EAGAIN || err == EACCES) {
        const std::string holder = holder_of(fd);
        ::close(fd);
        throw std::runtime_error(context + "is in use by another run (" + path + " is locked by " + holder +
                                 "): two jobs must not write into one directory; wait for that job to "
                                 "end (or cancel it), or give this run a directory of its own");
      }
      if (!unsupported(err)) {
        ::close(fd);
        throw std::runtime_error(context + "cannot lock " + path + ": " + std::strerror(err));
      }
      warning = context + "the file system cannot lock " + path + " (" + std::strerror(err) +
                "): nothing stops a second job from writing into the same directory";
      return std::unique_ptr<DirectoryLock>(new DirectoryLock(path, fd));
    }
    struct stat held {}, named {};
    if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino) {
      std::unique_ptr<DirectoryLock> lock(new DirectoryLock(path, fd));
      lock->locked_ = true;
      const std::string me = "node " + node_name() + ", pid " + std::to_string(::getpid()) + ", since " +
                             utc_timestamp() + "\n";
      if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
        warning = context + "could not write the holder into " + path + ": " + std::strerror(errno);
      return lock;
    }
    ::close(fd);
    if (attempt >= 100)
      throw std::runtime_error(context + "cannot lock " + path + ": it is replaced as fast as it is "
                               "locked (another job starting and ending there in a loop?)");
  }
}

DirectoryLock::~DirectoryLock() {
  // Removed while still held: a process that opened it meanwhile finds, once it gets the lock,
  // that the path no longer names what it locked, and tries again (take()).
  if (locked_) ::unlink(path_.c_str());
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace meshtrain
