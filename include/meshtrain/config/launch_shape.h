#pragma once
// The launch a time prediction assumes: how a node's ranks share its cores. A machine profile
// measured by calibrate records the launch it was measured under (machine_profile.h), because
// the rates depend on it: 8 ranks on 2 cores that spin while waiting in MPI leave no core to the
// busy ones, and ranks bound to one core each cannot use a core their neighbours leave. When a
// run's launch differs, the predictions are those of the calibrated launch; the comparison says
// so in one line.

#include <string>

namespace meshtrain {

struct LaunchShape {
  int ranks_per_node = 0;    // 0: not known (a profile written before launches were recorded)
  int threads_per_rank = 0;
  int cores_per_node = 0;
  int cores_per_rank = 0;    // the cores a rank may run on (its cpuset: the launcher's binding)
  std::string idle_ranks;    // "yield" (they sleep in MPI), "spin" (they poll), "" not known

  // ranks x threads / cores: above 1, ranks share cores.
  double oversubscription() const;
};

// "" when `now` matches `calibrated` in everything both know; else one line naming each thing
// that differs, both ways, and what the predictions then assume, e.g. "this launch differs from
// the one machine profile P was calibrated under: each rank bound to 2 cores (calibrated: 1),
// waiting ranks spin (calibrated: yield); predicted times assume the calibrated launch".
std::string launch_difference(const std::string& profile_name, const LaunchShape& calibrated,
                              const LaunchShape& now);

// "4 ranks x 1 thread on 2 cores, each bound to 1 core, waiting ranks spin" (what is known).
std::string describe_launch(const LaunchShape& launch);

}  // namespace meshtrain
