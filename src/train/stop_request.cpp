#include "meshtrain/train/stop_request.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/flight_recorder.h"
#include "meshtrain/io/regular_file.h"

namespace meshtrain {

namespace {
volatile std::sig_atomic_t received = 0;
extern "C" void on_stop_signal(int sig) {
  received = sig;
  // A launcher ending the job after one rank died sends this to the others: the flight record
  // then tells them from the one that died (comm/flight_report.cpp).
  note_signal_in_flight_record(sig);
}

std::string watched_file;  // empty: no file watched on this rank
bool file_seen = false;

// What a run can take as a stop request and remove afterwards: a file, or a link (removing the
// link, not what it names). A directory (or a fifo, a socket, a device) is not a request.
bool removable_stop_file(const std::filesystem::file_status& st) {
  return std::filesystem::is_regular_file(st) || std::filesystem::is_symlink(st);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a signal must not turn an MPI or file call into an error
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

void watch_stop_file(Communicator& world) {
  const char* value = std::getenv(kStopFileVariable);
  const std::string path = value ? value : "";
  agree(world, [&] {
    if (path.empty()) return;
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (dir.empty()) dir = ".";
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
      throw AgreedError(std::string(kStopFileVariable) + "=" + path + ": the directory " + dir.string() +
                        " does not exist on this rank's node, so the stop file could never appear; "
                        "name a file in an existing directory on a file system every node mounts, "
                        "or unset the variable");
    // Something there that the run cannot remove once it stopped on it (a directory, most
    // often the run directory itself) would stop every restart at once: a chain job requeues
    // on exit 75 forever. Refused here, with status 1, which ends the chain.
    const std::filesystem::file_status st = std::filesystem::symlink_status(path, ec);
    if (std::filesystem::exists(st) && !removable_stop_file(st))
      throw AgreedError(std::string(kStopFileVariable) + "=" + path + ": is " + file_kind_name(st) +
                        ", not a stop file: a run stops when a file appears there and removes it; "
                        "name a path where nothing is (e.g. " + (dir / "STOP").string() +
                        "), or unset the variable");
    // The run removes the file it stopped on; where it cannot, every restart would stop again.
    if (::access(dir.c_str(), W_OK) != 0)
      throw AgreedError(std::string(kStopFileVariable) + "=" + path + ": the directory " + dir.string() +
                        " is not writable here (" + std::strerror(errno) + "), so a run could not "
                        "remove the stop file it stopped on and every restart would stop again; "
                        "name a file in a directory the job can write, or unset the variable");
  });
  if (world.rank() == 0) watched_file = path;
}

int stop_request() {
  if (received != 0) return received;
  if (watched_file.empty()) return 0;
  std::error_code ec;
  // Only what consume_stop_file can remove: a directory created there later must not stop
  // this run and every restart after it.
  if (!file_seen) file_seen = removable_stop_file(std::filesystem::symlink_status(watched_file, ec));
  return file_seen ? kStopFileRequest : 0;
}

void consume_stop_file() {
  std::error_code ec;
  if (file_seen) std::filesystem::remove(watched_file, ec);
}

std::string stop_reason(int request) {
  switch (request) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
    case kStopFileRequest: {
      const char* value = std::getenv(kStopFileVariable);
      return std::string("the stop file ") + (value ? value : "");
    }
    default: return "signal " + std::to_string(request);
  }
}

void check_stop_during_startup(Communicator& world, const char* after) {
  const int request = static_cast<int>(world.all_reduce_scalar(stop_request(), ReduceOp::Max));
  if (request == 0) return;
  consume_stop_file();
  throw StopDuringStartup("stopping during start-up on " + stop_reason(request) + " (after " + after +
                          "): no step taken, nothing to save; run again (requeue) to resume");
}

}  // namespace meshtrain
