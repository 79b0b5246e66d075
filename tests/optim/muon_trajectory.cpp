// Writes a single-rank fp64 Muon run's trajectory for the independent NumPy reference
// (tests/reference/muon_reference_test.py runs this binary, then holds meshtrain's steps to the
// reference's): every parameter's value before each step and the gradient that step used, the
// step's learning rate, and the values after the last step. Not a CTest of its own: without
// MESHTRAIN_MUON_TRAJECTORY (the output directory) the test skips.
//
// MESHTRAIN_MUON_MODEL: "gpt2" (the parity tests' tiny GPT-2: fused qkv, tied embeddings,
// biases), "llama" (rotary, RMSNorm, SwiGLU, grouped-query attention, untied) or "moe" (Llama's
// block with a mixture of experts: expert tensors (E, rows, cols) and routers).
// Files: manifest.json, and <step>/<name>.value, <step>/<name>.grad, final/<name>.value, each the
// parameter's float64 values, little-endian, row-major in its global shape.

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/train/trainer.h"
#include "support/parity.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

constexpr int kSteps = 20;

ModelSpec model_named(const std::string& name, ModelSpec m) {
  if (name == "gpt2") return m;
  m = testing::tiny_rms_swiglu(m);
  m.positions = PositionKind::Rotary;
  m.kv_heads_set = 2;
  if (name == "moe") m = testing::tiny_moe(m);
  else if (name != "llama") ADD_FAILURE() << "MESHTRAIN_MUON_MODEL: gpt2, llama or moe, not " << name;
  return m;
}

void write_doubles(const std::filesystem::path& path, Backend& be, const Tensor& t) {
  std::vector<double> host(static_cast<size_t>(t.numel()));
  be.copy_to_host(host.data(), t);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(host.size() * sizeof(double)));
  ASSERT_TRUE(out.good()) << path;
}

void write_values(const std::filesystem::path& dir, Trainer& trainer, Backend& be) {
  std::filesystem::create_directories(dir);
  for (Parameter* p : trainer.model().params().params())
    write_doubles(dir / (p->spec.name + ".value"), be, p->value);
}

TEST(MuonTrajectory, Write) {
  const char* out = std::getenv("MESHTRAIN_MUON_TRAJECTORY");
  if (!out) GTEST_SKIP() << "MESHTRAIN_MUON_TRAJECTORY (the output directory) is not set";
  const char* model = std::getenv("MESHTRAIN_MUON_MODEL");
  const std::filesystem::path dir(out);
  testing::TempDir run;
  Config c = testing::tiny_config(run.path());
  c.model = model_named(model ? model : "gpt2", c.model);
  c.train.precision = DType::F64;
  c.train.optimizer = OptimizerKind::Muon;
  c.train.grad_clip = 0;  // the gradient as computed is the one the step uses
  c.train.steps = kSteps;
  c.train.warmup_steps = 3;
  check_layout(c, 1);
  CpuBackend backend(1);
  ProcessGrid grid(MPI_COMM_SELF, c.grid_shape(), c.run.comm_timeout);
  Trainer trainer(c, grid, backend);
  std::ofstream manifest(dir / "manifest.json");
  manifest.precision(17);
  manifest << "{\"steps\": " << kSteps << ", \"weight_decay\": " << c.train.weight_decay
           << ", \"beta1\": " << c.train.beta1 << ", \"beta2\": " << c.train.beta2
           << ", \"eps\": " << c.train.eps << ", \"params\": [";
  bool first = true;
  for (Parameter* p : trainer.model().params().params()) {
    ASSERT_EQ(p->shape, p->spec.global_shape) << p->spec.name << ": one rank holds it whole";
    manifest << (first ? "" : ", ") << "{\"name\": \"" << p->spec.name << "\", \"shape\": [";
    for (int d = 0; d < p->shape.rank(); ++d) manifest << (d ? ", " : "") << p->shape[d];
    manifest << "]}";
    first = false;
  }
  manifest << "], \"lr\": [";
  for (int s = 0; s < kSteps; ++s) {
    const std::filesystem::path step_dir = dir / std::to_string(s);
    write_values(step_dir, trainer, backend);
    const StepResult r = trainer.train_step(s);
    for (Parameter* p : trainer.model().params().params()) write_doubles(step_dir / (p->spec.name + ".grad"), backend, p->grad);
    manifest << (s ? ", " : "") << r.lr;
  }
  manifest << "]}\n";
  write_values(dir / "final", trainer, backend);
  ASSERT_TRUE(manifest.good());
}

}  // namespace
}  // namespace meshtrain
