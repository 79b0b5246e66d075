// Optimizer offload (parallel.offload = "optimizer"): master weights and AdamW moments on a host
// backend, updated there, bucket by bucket with copies overlapped. Offload changes where the
// arithmetic happens, not what it is: with a CPU "device" and a CPU host the run must be
// bitwise identical to the one without offload, for every ZeRO stage, and the device must hold
// no optimizer state. (On GPUs the host is pinned memory; the same code path runs.)

#include <gtest/gtest.h>
#include <mpi.h>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/train/trainer.h"
#include "support/parity.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

struct Outcome {
  std::vector<double> losses;
  std::vector<float> parameters;  // every parameter element this rank holds, in store order
  size_t device_optimizer_bytes = 0;
};

Outcome train(Config c) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  check_layout(c, world);
  CpuBackend backend(1);
  ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), 120.0);
  Trainer trainer(c, grid, backend);
  Outcome o;
  for (int s = 0; s < 5; ++s) o.losses.push_back(trainer.train_step(s).loss);
  trainer.state().release_gathered();
  for (const OwnedPiece& piece : trainer.state().owned_pieces()) {
    std::vector<float> host(static_cast<size_t>(piece.count));
    piece.backend->copy_to_host(host.data(), piece.value);
    o.parameters.insert(o.parameters.end(), host.begin(), host.end());
  }
  o.device_optimizer_bytes = backend.memory().current(MemoryCategory::OptimizerState);
  return o;
}

TEST(Offload, OptimizerOnTheHostGivesTheSameBits) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  testing::TempDir dir;
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    Config c = testing::tiny_config(dir.path());
    c.parallel.dp = world;
    c.parallel.zero = zero;
    c.parallel.bucket_mb = 0.01;
    c.train.micro_batch = 16 / world / 2;
    const Outcome plain = train(c);
    c.parallel.offload = Offload::Optimizer;
    const Outcome offloaded = train(c);
    EXPECT_EQ(plain.losses, offloaded.losses);
    int same = plain.parameters == offloaded.parameters ? 1 : 0, all_same = 0;
    MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    EXPECT_EQ(all_same, 1) << "parameters differ bitwise";
    EXPECT_GT(plain.device_optimizer_bytes, 0u);
    EXPECT_EQ(offloaded.device_optimizer_bytes, 0u) << "optimizer state left on the device";
  }
}

}  // namespace
}  // namespace meshtrain
