#include <algorithm>
#include <cmath>
#include <cstdio>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/app/cpu_binding.h"
#include "meshtrain/app/mpi_session.h"
#include "meshtrain/comm/node.h"

namespace meshtrain {

DeviceEmulation device_emulation() {
  DeviceEmulation e;
  e.ranks_per_node = node_membership(MPI_COMM_WORLD).local_size;
  MPI_Comm node = split_by_node(MPI_COMM_WORLD);
  e.cores = node_usable_cores(node);
  MPI_Comm_free(&node);
  e.factor = e.ranks_per_node > e.cores ? std::ceil(2.0 * e.ranks_per_node / e.cores) : 1.0;
  return e;
}

Config bench_deck(const std::string& suite, const ModelSpec& model) {
  Config c;
  c.deck_path = "<bench>";
  c.run.name = "bench-" + suite;
  c.run.dir = "runs/bench-" + suite;
  c.model = model;
  c.data.synthetic_bytes = 1 << 20;
  c.data.val = "none";
  c.train.steps = 1000;
  c.train.warmup_steps = 0;
  // A step whose gradient norm spikes is run again (train/step_rerun.h), and its time counts
  // both runs: on generated text at full learning rate from the first step that happens within
  // a measurement (the hetero suite's step 7), doubling one timed step and its work. What the
  // suites time is a step; the re-run is tested where it is the subject (sdc_test).
  c.run.rerun_spike_factor = 0;
  return c;
}

ModelSpec bench_gpt2(const BenchArgs& args, int layers, int64_t d_model, int64_t heads,
                     int64_t seq_len, int64_t vocab_size) {
  if (args.model == "tiny")
    return gpt2_spec(layers, 64, 2, std::min<int64_t>(seq_len, 32), std::min<int64_t>(vocab_size, 256));
  return gpt2_spec(layers, d_model, heads, seq_len, vocab_size);
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
    if (args.suite == "context") bench_context(args, report);
    if (args.suite == "async") bench_async(args, report);
    if (args.suite == "moe") bench_moe(args, report);
    if (args.suite == "attention") bench_attention(args, report);
    if (args.suite == "window") bench_window(args, report);
    if (!args.json.empty() && mpi.rank() == 0) report.write_json(args.json);
    if (report.wrong() > 0) {
      std::fprintf(stderr, "meshtrain bench: %d result check(s) failed\n", report.wrong());
      return kExitInternal;
    }
    return kExitOk;
  });
}

}  // namespace meshtrain
