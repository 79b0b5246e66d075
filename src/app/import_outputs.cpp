#include "meshtrain/app/import_outputs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>

#include "meshtrain/checkpoint/checkpoint_import.h"
#include "meshtrain/io/regular_file.h"

namespace meshtrain {

namespace fs = std::filesystem;

namespace {

// Where `path` leads, whatever its spelling: the real path of its directory (links, "." and ".."
// resolved as far as it exists) and its name. The name itself is not followed: an output that
// is a link is refused on its own (not a regular file).
fs::path identity(const std::string& path) {
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  const fs::path dir = fs::weakly_canonical(abs.parent_path(), ec);
  return (ec ? abs.parent_path() : dir) / abs.filename();
}

// Whether two existing paths are one file (device and inode: hard links and links included).
bool same_file(const std::string& a, const std::string& b) {
  struct stat x {}, y {};
  return ::stat(a.c_str(), &x) == 0 && ::stat(b.c_str(), &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

// The checks of a --deck-out path on its own, as check_import_destination's of OUT.h5.
void check_deck_destination(const std::string& deck, bool force) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(deck, ec);
  if (fs::is_directory(status))
    throw std::runtime_error(deck + ": is a directory; --deck-out writes a deck file (e.g. " +
                             (fs::path(deck) / "model.toml").string() + ")");
  if (fs::exists(status) && !force)
    throw std::runtime_error(deck + ": already exists; --deck-out writes a new deck and never over "
                             "another (give a path that does not exist, or --force to replace it)");
  if (fs::exists(status) && !fs::is_regular_file(status))
    throw std::runtime_error(deck + ": exists and is " + file_kind_name(status) +
                             "; --force replaces only a regular file");
  if (fs::exists(fs::symlink_status(deck + ".tmp", ec)))
    throw std::runtime_error(deck + ".tmp: already exists, and --deck-out writes " + deck +
                             " under that name first (left by an interrupted import?): delete it if nothing "
                             "is writing it");
}

// Refuses two outputs (or their temporaries) that are one file.
void check_distinct_outputs(const ImportArgs& args) {
  if (args.deck_out.empty()) return;
  const struct {
    std::string path, role;
  } checkpoint[] = {{args.out, "the checkpoint"}, {args.out + ".tmp", "the name the checkpoint is written under"}},
    deck[] = {{args.deck_out, "--deck-out"}, {args.deck_out + ".tmp", "the name --deck-out is written under"}};
  for (const auto& c : checkpoint)
    for (const auto& d : deck)
      if (identity(c.path) == identity(d.path) || same_file(c.path, d.path))
        throw std::runtime_error(d.path + " (" + d.role + ") is the same file as " + c.path + " (" + c.role +
                                 "): one would be written over the other; give --deck-out a file of its own "
                                 "(e.g. " + fs::path(args.out).replace_extension(".toml").string() + ")");
}

// Refuses an existing output that is a file the import reads.
void check_not_an_input(const std::string& output, const std::string& role, const ImportArgs& args,
                        const std::vector<std::string>& inputs) {
  std::error_code ec;
  if (output.empty() || !fs::exists(fs::symlink_status(output, ec))) return;  // not a file yet: no input
  auto refuse = [&](const std::string& input) {
    throw std::runtime_error(output + " (" + role + ") is the same file as " + input +
                             ", which the import reads: --force replaces an output, never an input; "
                             "write to another path");
  };
  for (const std::string& input : inputs)
    if (!input.empty() && same_file(output, input)) refuse(input);
  // Every file of the Hugging Face directory: the weights, the shards its index names, the
  // tokenizer.
  for (auto it = fs::recursive_directory_iterator(args.dir, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (same_file(output, it->path().string())) refuse(it->path().string());
}

}  // namespace

ImportOutputs::ImportOutputs(const ImportArgs& args, const std::vector<std::string>& inputs) : args_(args) {
  // "dir/" (or "dir/.."): a directory's name, under which <path>.tmp would be "dir/.tmp".
  for (const std::string& output : {args.out, args.deck_out}) {
    const fs::path name = fs::path(output).filename();
    if (!output.empty() && (name.empty() || name == "." || name == ".."))
      throw std::runtime_error(output + ": names a directory; " +
                               (output == args.out ? "meshtrain import writes a checkpoint file (e.g. OUT.h5)"
                                                   : "--deck-out writes a deck file (e.g. NEW.toml)"));
  }
  check_distinct_outputs(args);
  check_not_an_input(args.out, "the checkpoint", args, inputs);
  if (!args.deck_out.empty()) {
    check_not_an_input(args.deck_out, "--deck-out", args, inputs);
    check_deck_destination(args.deck_out, args.force);
  }
  const fs::path parent = fs::path(args.out).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  std::error_code ec;
  if (fs::is_directory(dir, ec)) lock_directory(dir);
  // Under the lock: no run can start writing checkpoints there between this scan and the write.
  check_import_destination(args.out, args.force);
}

ImportOutputs::~ImportOutputs() {
  if (!staged_.empty()) ::unlink(staged_.c_str());
}

void ImportOutputs::lock_directory(const std::string& dir) {
  std::string warning;
  lock_ = DirectoryLock::take(dir, kDirectoryLockName, args_.out + ": its directory " + dir + " ", warning);
  if (!warning.empty()) std::fprintf(stderr, "meshtrain: warning: %s\n", warning.c_str());
}

void ImportOutputs::stage_deck(const std::string& text) {
  const std::string tmp = args_.deck_out + ".tmp";
  if (const fs::path parent = fs::path(args_.deck_out).parent_path(); !parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
  }
  // O_EXCL: a file that appeared there since the check is someone else's, and stays as it is.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(tmp + ": cannot create the deck: " + std::strerror(errno));
  staged_ = tmp;
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const int err = done == text.size() ? (::fsync(fd) == 0 ? 0 : errno) : (errno ? errno : ENOSPC);
  ::close(fd);
  if (err != 0) throw std::runtime_error(tmp + ": cannot write the deck: " + std::strerror(err));
}

void ImportOutputs::publish_deck() {
  const std::string& deck = args_.deck_out;
  int err = 0;
  if (args_.force) {
    std::error_code ec;
    fs::rename(staged_, deck, ec);
    err = ec.value();
  } else {
    err = rename_without_replacing(staged_, deck);
  }
  if (err == EEXIST)
    throw std::runtime_error(deck + ": already exists (it appeared while the import was written); --deck-out "
                             "never writes over another file (--force replaces it); the checkpoint " +
                             args_.out + " is written, and its deck is not");
  if (err != 0)
    throw std::runtime_error(deck + ": cannot rename " + staged_ + " to it: " + std::strerror(err) +
                             "; the checkpoint " + args_.out + " is written, and its deck is not");
  staged_.clear();
}

void ImportOutputs::write(const std::string& deck_text, const std::function<void()>& write_checkpoint) {
  if (!args_.deck_out.empty()) stage_deck(deck_text);
  // Often <checkpoint.dir>/step_00000000.h5 of a run not started yet (README): make its directory.
  if (const fs::path parent = fs::path(args_.out).parent_path(); !parent.empty() && !lock_) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (fs::is_directory(parent, ec)) lock_directory(parent.string());
  }
  write_checkpoint();
  if (!args_.deck_out.empty()) publish_deck();
}

}  // namespace meshtrain
