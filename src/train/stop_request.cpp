#include "meshtrain/train/stop_request.h"

#include <csignal>

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

}  // namespace meshtrain
