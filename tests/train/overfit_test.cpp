// A small model must memorise a tiny corpus: the built-in corpus cut to 512 bytes (15 windows
// of 32 tokens), a 2-layer GPT, every sample in every batch. From log(256) = 5.55 at start, the
// training loss must fall below 0.5 nats/token within 150 steps — far below what any model of
// the language could reach (the corpus' own entropy is above 1 nat/byte), so only memorisation
// gets there. A broken gradient, optimizer or data path stalls well above the bound.

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/train/trainer.h"
#include "support/parity.h"
#include "support/sanitized.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

TEST(Overfit, TinyModelMemorisesTinyCorpus) {
  // A number to reach, not code to look at: its 150 steps repeat one step's code, which the
  // sanitizers see in the layout tests.
  if (testing::kSanitized)
    GTEST_SKIP() << "under the sanitizers the 150-step memorisation is left to the Release run";
  testing::TempDir dir;
  Config c = testing::tiny_config(dir.path());
  c.model = gpt2_spec(2, 64, 4, 32, 256);
  c.data.synthetic_bytes = 512;
  c.train.steps = 150;
  c.train.global_batch = 15;
  c.train.micro_batch = 15;
  c.train.lr = 3e-3;
  c.train.min_lr = 3e-4;
  c.train.warmup_steps = 10;
  c.train.weight_decay = 0.0;
  check_layout(c, 1);
  CpuBackend backend(2);
  ProcessGrid grid(MPI_COMM_SELF, c.grid_shape(), 60.0);
  Trainer trainer(c, grid, backend);
  double first = 0, last = 0;
  for (int s = 0; s < c.train.steps; ++s) {
    last = trainer.train_step(s).loss;
    if (s == 0) first = last;
  }
  std::printf("  loss %.3f at step 1, %.3f at step %d\n", first, last, c.train.steps);
  EXPECT_NEAR(first, std::log(256.0), 0.3);
  EXPECT_LT(last, 0.5);
}

}  // namespace
}  // namespace meshtrain
