#include <cstdio>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/app/mpi_session.h"

namespace meshtrain {

Config bench_deck(const std::string& suite, const GptConfig& model) {
  Config c;
  c.deck_path = "<bench>";
  c.run.name = "bench-" + suite;
  c.run.dir = "runs/bench-" + suite;
  c.model = model;
  c.data.synthetic_bytes = 1 << 20;
  c.data.val = "none";
  c.train.steps = 1000;
  c.train.warmup_steps = 0;
  return c;
}

int bench_command(const BenchArgs& args) {
  MpiSession mpi;
  return run_reporting_errors([&] {
    BenchReport report;
    int ranks = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    const bool all = args.suite == "all";
    if (args.suite == "step" || (all && ranks == 1)) bench_step(args, report);
    if (args.suite == "comm" || (all && ranks > 1)) bench_comm(args, report);
    if (args.suite == "pipeline" || (all && ranks > 1)) bench_pipeline(args, report);
    if (args.suite == "zero" || (all && ranks > 1)) bench_zero(args, report);
    if (args.suite == "checkpoint" || all) bench_checkpoint(args, report);
    if (args.suite == "gpu") bench_gpu(args, report);
    if (args.suite == "calibrate") bench_calibrate(args, report);
    if (args.suite == "hetero") bench_hetero(args, report);
    if (args.suite == "async") bench_async(args, report);
    if (!args.json.empty() && mpi.rank() == 0) report.write_json(args.json);
    if (report.wrong() > 0) {
      std::fprintf(stderr, "meshtrain bench: %d result check(s) failed\n", report.wrong());
      return kExitInternal;
    }
    return kExitOk;
  });
}

}  // namespace meshtrain
