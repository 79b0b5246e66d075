#include "meshtrain/train/fault_injection.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace meshtrain {

namespace {

struct Fault {
  std::string kind;
  int rank = -1, step = -1;
};

std::vector<Fault> parse(const char* text) {
  std::vector<Fault> out;
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ',')) {
    if (item.rfind("checkpoint_kill:", 0) == 0) continue;  // the checkpointer's (checkpointer.h)
    Fault f;
    std::stringstream parts(item);
    std::string part;
    std::getline(parts, f.kind, ':');
    while (std::getline(parts, part, ':')) {
      if (part.rfind("rank=", 0) == 0) f.rank = std::atoi(part.c_str() + 5);
      else if (part.rfind("step=", 0) == 0) f.step = std::atoi(part.c_str() + 5);
    }
    if ((f.kind != "stall" && f.kind != "exit") || f.rank < 0 || f.step < 1)
      throw std::invalid_argument("MESHTRAIN_FAULT: cannot parse \"" + item +
                                  "\" (expected stall|exit:rank=<r>:step=<s>)");
    out.push_back(f);
  }
  return out;
}

}  // namespace

void inject_faults(int world_rank, int step) {
  static const std::vector<Fault> faults = [] {
    const char* env = std::getenv("MESHTRAIN_FAULT");
    return env ? parse(env) : std::vector<Fault>{};
  }();
  for (const Fault& f : faults) {
    if (f.rank != world_rank || f.step != step) continue;
    std::fprintf(stderr, "meshtrain: rank %d: injected fault '%s' at step %d\n", world_rank,
                 f.kind.c_str(), step);
    std::fflush(stderr);
    if (f.kind == "exit") {
      std::this_thread::sleep_for(std::chrono::seconds(1));  // see fault_injection.h
      std::_Exit(9);
    }
    for (;;) pause();  // stall: no progress, no communication, until killed
  }
}

}  // namespace meshtrain
