// A training step waits for the device a fixed, small number of times. On a GPU every host read
// (a loss, a norm, a synchronous copy) drains the stream; reading the loss per micro-batch, the
// gradient norm per parameter segment and copying tokens per micro-batch made the number of
// drains grow with the micro-batch count and the model. Counted here on the CPU through a
// backend that tallies the calls that would wait (tests/support/counting_backend.h).

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>

#include "meshtrain/config/layout_check.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/train/trainer.h"
#include "support/counting_backend.h"
#include "support/parity.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

// One step's gradient norm (one read of all segments) and loss (one read of all micro-batches).
constexpr int64_t kMaxRoundTripsPerStep = 2;

struct StepCounts {
  testing::CountingBackend::Counts step, eval;
  double loss = 0;
};

StepCounts count(int layers, int micro_batch, int zero) {
  testing::TempDir dir;
  Config c = testing::tiny_config(dir.path());
  c.model.layers = layers;
  c.train.global_batch = 16;
  c.train.micro_batch = micro_batch;
  c.train.eval_batches = 3;
  c.data.val = "synthetic";
  c.parallel.zero = zero;
  check_layout(c, 1);
  testing::CountingBackend backend;
  ProcessGrid grid(MPI_COMM_SELF, c.grid_shape(), 60.0);
  Trainer trainer(c, grid, backend);
  trainer.train_step(0);
  StepCounts out;
  backend.reset_counts();
  out.loss = trainer.train_step(1).loss;
  out.step = backend.counts();
  backend.reset_counts();
  trainer.evaluate();
  out.eval = backend.counts();
  return out;
}

std::string label(int layers, int micro_batch, int zero) {
  return std::to_string(layers) + " layer(s), " + std::to_string(16 / micro_batch) +
         " micro-batch(es), zero " + std::to_string(zero);
}

TEST(HostSync, StepWaitsAFixedNumberOfTimes) {
  const StepCounts base = count(1, 16, 0);
  EXPECT_LE(base.step.round_trips, kMaxRoundTripsPerStep);
  for (int layers : {1, 8})
    for (int micro_batch : {16, 4, 1})
      for (int zero : {0, 2}) {
        const StepCounts n = count(layers, micro_batch, zero);
        const std::string what = label(layers, micro_batch, zero);
        EXPECT_LE(n.step.round_trips, kMaxRoundTripsPerStep) << what;
        EXPECT_EQ(n.step.round_trips, base.step.round_trips) << what;
        // The tokens and targets of all micro-batches: one asynchronous upload per step.
        EXPECT_EQ(n.step.async_uploads, 1) << what;
        EXPECT_TRUE(std::isfinite(n.loss)) << what;
      }
}

TEST(HostSync, EvaluationReadsItsLossOnce) {
  for (int micro_batch : {16, 1}) {
    const StepCounts n = count(2, micro_batch, 0);
    const std::string what = label(2, micro_batch, 0);
    EXPECT_LE(n.eval.round_trips, 1) << what;
    EXPECT_EQ(n.eval.async_uploads, 3) << what << " (one per evaluation batch)";
  }
}

}  // namespace
}  // namespace meshtrain
