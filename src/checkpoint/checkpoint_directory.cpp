#include "checkpoint_directory.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <stdexcept>

#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/node.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/tensor/philox.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/io/regular_file.h"

namespace meshtrain {

namespace fs = std::filesystem;

std::string new_lineage_id() {
  // random_device is the OS's entropy on Linux; the clock and the process id are mixed in so
  // that two runs differ even where it is a deterministic generator.
  std::random_device rd;
  const uint64_t salt = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) ^
                        (static_cast<uint64_t>(::getpid()) << 32);
  const uint64_t hi = mix64((uint64_t{rd()} << 32 | rd()) ^ salt);
  const uint64_t lo = mix64((uint64_t{rd()} << 32 | rd()) + salt);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

StoredCheckpoint read_lineage(int64_t step, const std::string& path) {
  StoredCheckpoint s;
  s.step = step;
  s.path = path;
  try {
    CheckpointFile file(path, MPI_COMM_SELF, CheckpointFile::Access::Read);
    const CheckpointInfo info = file.read_info();
    file.close();
    s.lineage = info.lineage;
    if (s.lineage.empty())
      s.problem = "none recorded: format_version " + std::to_string(info.format_version) +
                  ", meshtrain " + info.meshtrain_version;
  } catch (const std::exception& e) {
    s.problem = std::string("unreadable: ") + e.what();
  }
  return s;
}

std::vector<StoredCheckpoint> scan_checkpoints(const std::string& dir) {
  std::vector<StoredCheckpoint> out;
  for (const auto& [step, path] : Checkpointer::complete_checkpoints(dir)) out.push_back(read_lineage(step, path));
  return out;
}

void refuse_other_lineages(const Config& config, const std::vector<StoredCheckpoint>& stored,
                           const std::string& lineage, const std::string& this_run,
                           const std::string& hint) {
  std::map<std::string, std::string> others;  // "lineage <id>" -> "step_2.h5, step_4.h5"
  for (const StoredCheckpoint& s : stored) {
    if (!lineage.empty() && s.lineage == lineage) continue;
    const std::string who = s.lineage.empty() ? "lineage unknown (" + s.problem + ")" : "lineage " + s.lineage;
    std::string& files = others[who];
    files += (files.empty() ? "" : ", ") + fs::path(s.path).filename().string();
  }
  if (others.empty()) return;
  std::string listed;
  for (const auto& [who, files] : others) listed += (listed.empty() ? "" : "; ") + who + ": " + files;
  throw std::runtime_error(config.deck_path + ": checkpoint.dir = \"" + config.checkpoint.dir +
                           "\" holds checkpoints of another run (" + listed + "), but this run " +
                           this_run + ". A run never overwrites or deletes checkpoints it did not "
                           "write: " + hint);
}

namespace {
// Whether `name` is one the checkpoints of some run are written under: step_<digits>.h5 and its
// .tmp.
bool checkpoint_name(const std::string& name) {
  static const std::regex pattern("step_[0-9]+\\.h5(\\.tmp)?");
  return std::regex_match(name, pattern);
}

}  // namespace

void refuse_occupied_name(const std::string& path, const std::string& context) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(path, ec);
  const bool tmp = path.size() > 4 && path.compare(path.size() - 4, 4, ".tmp") == 0;
  // A link at a checkpoint's name is left to the readers' own check (they never follow one
  // elsewhere), and the rename replaces it; at a .tmp's name the write would go where it points.
  if (!fs::exists(st) || fs::is_regular_file(st) || (fs::is_symlink(st) && !tmp)) return;
  if (fs::is_symlink(st))
    throw std::runtime_error(context + path + " is a symbolic link named like a checkpoint's .tmp: "
                             "writing that checkpoint would write where it points; remove it, or set "
                             "checkpoint.dir to another directory");
  throw std::runtime_error(context + path + " is " + file_kind_name(st) + " named like a checkpoint: a checkpoint "
                           "of that step could not be written there (the rename would fail and leave "
                           "its .tmp); remove or rename it, or set checkpoint.dir to another directory");
}

void refuse_occupied_names(const Config& config) {
  const std::string& dir = config.checkpoint.dir;
  std::error_code ec;
  std::vector<std::string> found;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (checkpoint_name(it->path().filename().string())) found.push_back(it->path().string());
  std::sort(found.begin(), found.end());
  for (const std::string& path : found)
    refuse_occupied_name(path, config.deck_path + ": checkpoint.dir = \"" + dir + "\": ");
}

void check_directory_writable(const Config& config, Communicator& world) {
  const std::string& dir = config.checkpoint.dir;
  const std::string key = config.deck_path + ": checkpoint.dir = \"" + dir + "\": ";
  const std::string hint = " (set checkpoint.dir to a directory every rank can write)";
  agree(world, [&] {
    if (world.rank() != 0) return;
    std::error_code ec;
    if (!fs::create_directories(dir, ec) && ec)
      throw std::runtime_error(key + "cannot create the directory: " + ec.message() + hint);
  });
  // Every rank, after the directory exists: on a file system some nodes do not share, or
  // mount read-only, the ranks there fail (and the agreement names the first of them).
  agree(world, [&] {
    const std::string probe = dir + "/.meshtrain_write_probe." + node_name() + "." + std::to_string(::getpid()) +
                              "." + std::to_string(world.rank());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) throw std::runtime_error(key + "cannot create a file there: " + std::strerror(errno) + hint);
    ::close(fd);
    ::unlink(probe.c_str());
  });
}

}  // namespace meshtrain
