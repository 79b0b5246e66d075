// Context extension (issue 55): a rotary model's checkpoint resumes at another model.seq_len and
// with another rotary scaling. A tiny Llama trains 3 steps at seq_len 64 and saves; a run at 256
// with YaRN (factor 4, original 64) resumes that checkpoint and trains 3 more. Its continuation
// must equal, to round-off in fp64, a single run that starts at 256 with YaRN from the same
// weights, AdamW moments and step (set in memory, not through a checkpoint): nothing of the
// 64-token run (data windows, the rotary table, the scaling) may survive the resume. The same
// checkpoint continued at 64 trains otherwise, so the comparison sees the new length.
//
// One rank, launched by CTest under mpiexec.

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/families/registry.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/train/trainer.h"
#include "support/mpi_world.h"
#include "support/parity.h"
#include "support/shared_temp_dir.h"
#include "support/tensors.h"

namespace meshtrain {
namespace {

constexpr int kSavedAt = 3, kSteps = 6;

// This rank's parameters and both AdamW moments, every owned piece in order (fp64 run).
std::vector<double> owned_state(Trainer& trainer, Backend& be) {
  std::vector<double> out;
  for (const OwnedPiece& p : trainer.state().owned_pieces())
    for (const Tensor* t : {&p.value, &p.exp_avg, &p.exp_avg_sq}) {
      const std::vector<double> host = testing::to_host(be, *t);
      out.insert(out.end(), host.begin(), host.end());
    }
  return out;
}

// The inverse of owned_state: the state another trainer reached, as if it had trained here.
void set_owned_state(Trainer& trainer, Backend& be, const std::vector<double>& state, int64_t steps) {
  size_t at = 0;
  for (OwnedPiece& p : trainer.state().owned_pieces())
    for (Tensor* t : {&p.value, &p.exp_avg, &p.exp_avg_sq}) {
      const size_t n = static_cast<size_t>(t->numel());
      ASSERT_LE(at + n, state.size());
      be.copy_from_host(*t, state.data() + at);
      at += n;
    }
  ASSERT_EQ(at, state.size());
  trainer.state().set_steps_taken(steps);
  trainer.state().sync_after_load();
}

Config llama_at_64(const std::string& dir) {
  Config c = testing::tiny_config(dir);
  c.model = family_defaults("llama", gpt2_spec(2, 32, 4, 64, 256));
  c.model.kv_heads_set = 2;
  c.model.ffn_hidden_set = 64;
  c.train.precision = DType::F64;
  c.train.steps = kSteps;
  c.train.global_batch = 4;
  c.train.micro_batch = 2;
  c.checkpoint.dir = dir + "/ckpt";
  return c;
}

Config yarn_at_256(Config c) {
  c.model.seq_len = 256;
  c.model.rope.scaling = RopeScalingKind::Yarn;
  c.model.rope.factor = 4.0;
  c.model.rope.original_max_positions = 64;
  return c;
}

double max_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale > 0 ? worst / scale : worst;
}

struct Continuation {
  std::vector<double> losses, state;
};

Continuation continue_to_end(Trainer& t, Backend& be) {
  Continuation out;
  for (int s = t.step(); s < kSteps; ++s) out.losses.push_back(t.train_step(s).loss);
  out.state = owned_state(t, be);
  return out;
}

TEST(ContextExtension, YarnResumeAt256EqualsARunStartedThereFromTheSameState) {
  if (testing::world_size() != 1) GTEST_SKIP() << "a one-rank test";
  testing::SharedTempDir dir;
  Config short_deck = llama_at_64(dir.path()), long_deck = yarn_at_256(short_deck);
  check_layout(short_deck, 1);
  check_layout(long_deck, 1);
  CpuBackend be(1);
  ProcessGrid grid(MPI_COMM_WORLD, short_deck.grid_shape(), short_deck.run.comm_timeout);

  std::string path;
  std::vector<double> saved_state;
  {
    Trainer t(short_deck, grid, be);
    for (int s = 0; s < kSavedAt; ++s) t.train_step(s);
    path = Checkpointer(short_deck, grid).save(t.state(), t.step()).path;
    saved_state = owned_state(t, be);
  }
  Continuation extended;
  {
    Trainer t(long_deck, grid, be);
    const CheckpointStats loaded = Checkpointer(long_deck, grid).load(t.state(), path);
    EXPECT_EQ(loaded.context_extension,
              "model.seq_len 64 -> 256, model.rope_scaling \"none\" -> \"yarn\", model.rope_factor 8.0 -> 4.0, "
              "model.rope_original_max_positions 8192 -> 64");
    t.set_step(static_cast<int>(loaded.step));
    ASSERT_EQ(t.step(), kSavedAt);
    extended = continue_to_end(t, be);
  }
  Continuation single;
  {
    Trainer t(long_deck, grid, be);
    set_owned_state(t, be, saved_state, kSavedAt);
    t.set_step(kSavedAt);
    single = continue_to_end(t, be);
  }
  Continuation unextended;
  {
    Trainer t(short_deck, grid, be);
    t.set_step(static_cast<int>(Checkpointer(short_deck, grid).load(t.state(), path).step));
    unextended = continue_to_end(t, be);
  }
  ASSERT_EQ(extended.losses.size(), single.losses.size());
  EXPECT_LE(max_relative_difference(extended.losses, single.losses), 1e-12);
  ASSERT_EQ(extended.state.size(), single.state.size());
  EXPECT_LE(max_relative_difference(extended.state, single.state), 1e-12);
  // The new length and scaling took effect: the 64-token continuation is another trajectory.
  EXPECT_GT(max_relative_difference(unextended.losses, single.losses), 1e-6);
}

}  // namespace
}  // namespace meshtrain
