#pragma once
// An exclusive lock on a directory a run writes into (run.dir, checkpoint.dir), so that two jobs
// never write into one: the second is refused at start-up, before it writes anything there,
// with the holder's node and process id. The lock is a POSIX open-file-description lock
// (fcntl F_OFD_SETLK) on a file in the directory, which names its holder. The OS releases it
// when the holder's process ends, however it ends (killed, crashed): a lock file left behind by
// a dead job does not block the next.
//
// Why fcntl locks, not flock(2): on NFS, Linux's flock is emulated with fcntl's byte-range locks
// (both reach the server's lock manager), but elsewhere flock may be node-local; fcntl locks are
// the ones NFS and Lustre (mounted with -o flock) enforce across nodes. Why the open-file-
// description kind: a classic fcntl lock belongs to the process and is dropped when it closes
// any descriptor of the file (a library reading it would release it unseen); an OFD lock lives
// exactly as long as this object's descriptor. Where the file system has no locks at all
// (ENOLCK, ENOSYS: NFS without a lock manager, Lustre with -o noflock) the run goes on
// unprotected, with a warning: refusing would make such a file system unusable.

#include <memory>
#include <string>

namespace meshtrain {

// The lock file's name in a run.dir or checkpoint.dir (the trainer's, and import's in the
// directory it writes a checkpoint into).
constexpr const char* kDirectoryLockName = ".meshtrain.lock";

class DirectoryLock {
 public:
  // Locks `dir`/`file_name` (created if missing, never through a symbolic link) and writes this
  // process's node and pid into it. Throws std::runtime_error starting with `context` where
  // another process holds it ("... is in use by another run: node N, pid P, since T ...") or the
  // file cannot be made. `warning` gets the text of a lock the file system could not take.
  static std::unique_ptr<DirectoryLock> take(const std::string& dir, const std::string& file_name,
                                             const std::string& context, std::string& warning);
  // Removes the lock file while still holding the lock, then releases it.
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  DirectoryLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
  bool locked_ = false;
};

}  // namespace meshtrain
