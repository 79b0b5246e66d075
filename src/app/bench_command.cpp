#include <cstdio>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/app/mpi_session.h"

namespace meshtrain {

int bench_command(const BenchArgs& args) {
  MpiSession mpi;
  return run_reporting_errors([&] {
    BenchReport report({"tokens", "time_ms", "tokens/s", "GFLOP/s", "ratio"}, mpi.rank() == 0);
    if (args.suite == "step" || args.suite == "all") bench_step(args, report);
    if (args.suite == "checkpoint" || args.suite == "all") bench_checkpoint(args, report);
    if (!args.json.empty() && mpi.rank() == 0) report.write_json(args.json);
    if (report.wrong() > 0) {
      std::fprintf(stderr, "meshtrain bench: %d result check(s) failed\n", report.wrong());
      return kExitInternal;
    }
    return kExitOk;
  });
}

}  // namespace meshtrain
