#include "meshtrain/io/prepare_outputs.h"

#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "meshtrain/io/data_error.h"
#include "meshtrain/io/regular_file.h"

namespace meshtrain {

namespace {

std::string temporary_of(const std::string& output) { return output + ".tmp"; }

struct FileIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileIdentity& o) const { return dev == o.dev && ino == o.ino; }
};

// The file `path` names, links followed; false when there is none.
bool identity_of(const std::string& path, FileIdentity& id) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  id = {st.st_dev, st.st_ino};
  return true;
}

// The read file that `path` is (itself, or through a link), or "".
std::string read_file_at(const std::string& path, const std::vector<std::string>& read_files) {
  FileIdentity out;
  if (!identity_of(path, out)) return "";
  for (const std::string& in : read_files) {
    FileIdentity id;
    if (identity_of(in, id) && id == out) return in;
  }
  return "";
}

void check_one(const std::string& path, bool temporary, const std::vector<std::string>& read_files,
               ExistingOutputs existing) {
  if (const std::string in = read_file_at(path, read_files); !in.empty())
    throw DataError(path, std::string("is ") + (in == path ? "" : "the same file as ") +
                              (in == path ? "" : in + ", ") + "an input of this prepare, which " +
                              (temporary ? "writing its temporary" : "its output") +
                              " would destroy (give --out a prefix of its own, e.g. --out "
                              "data/new; --force never replaces an input)");
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::symlink_status(path, ec);
  if (!std::filesystem::exists(st)) return;
  const bool file_or_link =
      std::filesystem::is_regular_file(st) || std::filesystem::is_symlink(st);
  if (!file_or_link)
    throw DataError(path, "is " + file_kind_name(st) + " where prepare would write " +
                              (temporary ? "a temporary shard" : "an output") +
                              " (remove it, or give --out another prefix)");
  if (existing == ExistingOutputs::Refuse)
    throw DataError(path, temporary
                              ? "exists: the temporary of a prepare that was killed (or is "
                                "running now); remove it, or give --force to replace it"
                              : "exists; prepare never replaces an output unless told to (give "
                                "--force to replace it, or --out another prefix)");
  if (temporary && ::unlink(path.c_str()) != 0)
    throw DataError(path, std::string("cannot remove the stale temporary: ") + std::strerror(errno));
}

// The handlers' view of the temporaries: fixed storage, written before the handlers are
// installed and not after, because a signal handler may only read what needs no allocation.
constexpr size_t kMaxOutputs = 8, kMaxPathBytes = 4096;
char temporaries[kMaxOutputs][kMaxPathBytes];
std::atomic<size_t> temporary_count{0};
static_assert(std::atomic<size_t>::is_always_lock_free, "read in a signal handler");

void say(const char* text) {
  // write(2), async-signal-safe; a failed write leaves nothing better to do.
  const ssize_t ignored = ::write(2, text, std::strlen(text));
  (void)ignored;
}

extern "C" void on_prepare_signal(int sig) {
  const size_t n = temporary_count.load();
  for (size_t i = 0; i < n; ++i) ::unlink(temporaries[i]);
  say(sig == SIGINT ? "\nmeshtrain: prepare stopped by SIGINT" : "meshtrain: prepare stopped by SIGTERM");
  say("; its unfinished outputs were removed, no output was written\n");
  // Ended by the same signal, as a shell expects of a program it interrupted (status 128 + sig).
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  ::sigaction(sig, &fallback, nullptr);
  ::raise(sig);
}

}  // namespace

StopSignalsHeld::StopSignalsHeld() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  ::pthread_sigmask(SIG_BLOCK, &set, &before_);
}

StopSignalsHeld::~StopSignalsHeld() { ::pthread_sigmask(SIG_SETMASK, &before_, nullptr); }

void check_prepare_outputs(const std::vector<std::string>& outputs,
                           const std::vector<std::string>& read_files, ExistingOutputs existing) {
  for (const std::string& out : outputs) check_one(out, false, read_files, existing);
  for (const std::string& out : outputs) check_one(temporary_of(out), true, read_files, existing);
}

PrepareOutputs::PrepareOutputs(std::vector<std::string> outputs) : outputs_(std::move(outputs)) {
  if (outputs_.size() > kMaxOutputs || temporary_count.load() != 0)
    throw std::logic_error("PrepareOutputs: more than 8 outputs, or two at a time");
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const std::string tmp = temporary_of(outputs_[i]);
    if (tmp.size() >= kMaxPathBytes) throw DataError(tmp, "the path is too long");
    std::memcpy(temporaries[i], tmp.c_str(), tmp.size() + 1);
  }
  temporary_count.store(outputs_.size());
  struct sigaction action {};
  action.sa_handler = on_prepare_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, &int_before_);
  ::sigaction(SIGTERM, &action, &term_before_);
}

PrepareOutputs::~PrepareOutputs() {
  ::sigaction(SIGINT, &int_before_, nullptr);
  ::sigaction(SIGTERM, &term_before_, nullptr);
  temporary_count.store(0);
}

void PrepareOutputs::publish() {
  // A signal that arrives now is delivered once every output is in place (or none is): it then
  // ends a prepare that has finished, and its handler finds no temporary left to remove.
  const StopSignalsHeld held;
  for (size_t i = 0; i < outputs_.size(); ++i) {
    const std::string tmp = temporary_of(outputs_[i]);
    if (std::rename(tmp.c_str(), outputs_[i].c_str()) == 0) continue;
    const std::string why = std::strerror(errno);
    for (size_t j = 0; j < outputs_.size(); ++j)
      std::remove((j < i ? outputs_[j] : temporary_of(outputs_[j])).c_str());
    throw DataError(outputs_[i], "cannot rename " + tmp + " to the final name: " + why +
                                     " (no output of this prepare is left)");
  }
  temporary_count.store(0);
}

}  // namespace meshtrain
