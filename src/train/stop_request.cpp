#include "meshtrain/train/stop_request.h"

#include <csignal>
#include <string>

namespace meshtrain {

namespace {
volatile std::sig_atomic_t received = 0;
extern "C" void on_stop_signal(int sig) { received = sig; }
}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a signal must not turn an MPI or file call into an error
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int stop_signal() { return received; }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

void check_stop_during_startup(Communicator& world, const char* after) {
  const int sig = static_cast<int>(world.all_reduce_scalar(stop_signal(), ReduceOp::Max));
  if (sig == 0) return;
  throw StopDuringStartup(std::string("stopping during start-up on ") + signal_name(sig) +
                          " (after " + after + "): no step taken, nothing to save; run again "
                          "(requeue) to resume");
}

}  // namespace meshtrain
