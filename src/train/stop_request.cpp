#include "meshtrain/train/stop_request.h"

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "meshtrain/comm/agreement.h"

namespace meshtrain {

namespace {
volatile std::sig_atomic_t received = 0;
extern "C" void on_stop_signal(int sig) { received = sig; }

std::string watched_file;  // empty: no file watched on this rank
bool file_seen = false;
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
  });
  if (world.rank() == 0) watched_file = path;
}

int stop_request() {
  if (received != 0) return received;
  if (watched_file.empty()) return 0;
  std::error_code ec;
  if (!file_seen) file_seen = std::filesystem::exists(watched_file, ec);
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
