#include "meshtrain/parallel/slowdown.h"

#include <time.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace meshtrain {

namespace {

// Process-wide by design (slowdown.h): emulated hardware, like the device itself, belongs to
// the process, not to one object. Atomic: the executor may read it from any thread.
std::atomic<double> g_factor{1.0};
std::atomic<bool> g_cpu_basis{false};
std::atomic<double> g_fixed_seconds{0.0};
std::atomic<long> g_fixed_overruns{0};

[[noreturn]] void bad(const std::string& spec, const std::string& why) {
  throw std::invalid_argument(
      "MESHTRAIN_SLOWDOWN=\"" + spec + "\": " + why +
      " (expected RANK:FACTOR[,RANK:FACTOR...], RANK a world rank >= 0 or \"*\" for every rank "
      "not named, FACTOR a number >= 1; e.g. \"2:3\" makes rank 2 three times slower)");
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace

void set_compute_slowdown(double factor, PaddingBasis basis) {
  if (!(factor >= 1.0) || !std::isfinite(factor))
    throw std::invalid_argument("compute slowdown factor " + std::to_string(factor) +
                                " (expected a finite number >= 1)");
  g_factor.store(factor);
  g_cpu_basis.store(basis == PaddingBasis::CpuTime);
}

void set_fixed_compute_time(double seconds) {
  if (!(seconds >= 0.0) || !std::isfinite(seconds))
    throw std::invalid_argument("fixed compute time " + std::to_string(seconds) +
                                " s (expected a finite number >= 0; 0 turns it off)");
  g_fixed_seconds.store(seconds);
}

double fixed_compute_time() { return g_fixed_seconds.load(); }

long fixed_compute_overruns() { return g_fixed_overruns.load(); }

double compute_slowdown() { return g_factor.load(); }

double slowdown_for_rank(const std::string& spec, int world_rank) {
  if (trim(spec).empty()) return 1.0;
  double named = -1, others = -1;
  bool seen_star = false;
  std::stringstream list(spec);
  std::string item;
  std::vector<int> ranks;
  while (std::getline(list, item, ',')) {
    item = trim(item);
    const size_t colon = item.find(':');
    if (item.empty()) bad(spec, "an empty entry");
    if (colon == std::string::npos) bad(spec, "\"" + item + "\" has no ':'");
    const std::string rank_text = trim(item.substr(0, colon));
    const std::string factor_text = trim(item.substr(colon + 1));
    size_t used = 0;
    double factor = 0;
    try {
      factor = std::stod(factor_text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (factor_text.empty() || used != factor_text.size() || !std::isfinite(factor))
      bad(spec, "factor \"" + factor_text + "\" of \"" + item + "\" is not a number");
    if (factor < 1.0) bad(spec, "factor " + factor_text + " of \"" + item + "\" is below 1");
    if (rank_text == "*") {
      if (seen_star) bad(spec, "\"*\" is given twice");
      seen_star = true;
      others = factor;
      continue;
    }
    const bool digits = !rank_text.empty() && rank_text.size() <= 9 &&
                        rank_text.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) bad(spec, "rank \"" + rank_text + "\" of \"" + item + "\" is not a world rank or \"*\"");
    const int rank = std::stoi(rank_text);
    for (int r : ranks)
      if (r == rank) bad(spec, "rank " + rank_text + " is given twice");
    ranks.push_back(rank);
    if (rank == world_rank) named = factor;
  }
  if (named >= 1) return named;
  return others >= 1 ? others : 1.0;
}

double pad_compute(double seconds) {
  const double factor = compute_slowdown();
  if (factor <= 1.0 || seconds <= 0) return seconds;
  // The time actually slept (a sleep may overrun): the rank really spent it.
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>((factor - 1.0) * seconds));
  return seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

namespace {

double wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double thread_cpu_now() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

PaddedCompute::PaddedCompute()
    : factor_(compute_slowdown()),
      fixed_(g_fixed_seconds.load()),
      cpu_basis_(g_cpu_basis.load()),
      wall_start_(wall_now()),
      cpu_start_(factor_ > 1.0 && cpu_basis_ ? thread_cpu_now() : 0.0) {}

double PaddedCompute::finish() {
  const double wall = wall_now() - wall_start_;
  double target = 0;  // the elapsed time the action is padded to
  if (fixed_ > 0) {
    target = fixed_;
    if (wall > fixed_) ++g_fixed_overruns;
  } else if (factor_ > 1.0 && cpu_basis_) {
    target = factor_ * (thread_cpu_now() - cpu_start_);
  } else {
    return pad_compute(wall);
  }
  if (target > wall) std::this_thread::sleep_for(std::chrono::duration<double>(target - wall));
  return wall_now() - wall_start_;  // a sleep may overrun: the rank really spent it
}

}  // namespace meshtrain
