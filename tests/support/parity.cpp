#include "support/parity.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/config_dump.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain::testing {

namespace {
std::vector<double> host_values(Backend& be, const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::F64) {
    be.copy_to_host(out.data(), t);
  } else {
    std::vector<float> f(out.size());
    be.copy_to_host(f.data(), t);
    out.assign(f.begin(), f.end());
  }
  return out;
}

// Scales the elements of `t` (a slice of `p` from local flat index `local_begin`) whose global
// row is `first_row` or later.
void scale_rows_of(Backend& be, const Parameter& p, Tensor t, int64_t local_begin,
                   int64_t first_row, double factor) {
  std::vector<double> v = host_values(be, t);
  const int64_t row_size = p.spec.global_shape.numel() / p.spec.global_shape[0];
  for (size_t i = 0; i < v.size(); ++i)
    if (p.global_index(local_begin + static_cast<int64_t>(i)) / row_size >= first_row) v[i] *= factor;
  if (t.dtype() == DType::F64) {
    be.copy_from_host(t, v.data());
  } else {
    const std::vector<float> f(v.begin(), v.end());
    be.copy_from_host(t, f.data());
  }
}

}  // namespace

void scale_rows_from(Trainer& trainer, Backend& be, const std::string& suffix, int64_t first_row,
                     double factor) {
  auto named = [&](const Parameter& p) {
    const std::string& n = p.spec.name;
    return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  bool sharded = false;
  for (Parameter* p : trainer.model().params().params()) {
    if (!named(*p) || p->tied_copy) continue;
    if (!p->value.defined()) {
      sharded = true;  // ZeRO-3: the shards below are the only copy
      continue;
    }
    scale_rows_of(be, *p, p->value, 0, first_row, factor);
  }
  if (!sharded) return;
  for (const OwnedPiece& piece : trainer.state().owned_pieces())
    if (named(*piece.param)) scale_rows_of(be, *piece.param, piece.value, piece.local_begin, first_row, factor);
}

Config tiny_config(const std::string& run_dir) {
  Config c;
  c.deck_path = "<test>";
  c.run.name = "parity";
  c.run.dir = run_dir;
  c.run.seed = 7;
  c.run.comm_timeout = 120;
  // The tests compare fp32 CPU numbers (tests/support/check_test_devices.py keeps it so): never
  // let "auto" pick a GPU and bf16 where one exists.
  c.run.device = DeviceChoice::Cpu;
  c.train.precision = DType::F32;
  c.model = gpt2_spec(8, 32, 4, 16, 256);
  c.data.synthetic_bytes = 1 << 16;
  c.data.val = "none";
  c.train.steps = 5;
  c.train.global_batch = 16;
  c.train.micro_batch = 16;
  c.train.lr = 6e-4;
  c.train.min_lr = 6e-5;
  c.train.warmup_steps = 1;
  c.train.grad_clip = 1.0;
  c.parallel.dp = 1;
  c.parallel.schedule = ScheduleKind::GPipe;
  return c;
}

ModelSpec tiny_rms_swiglu(ModelSpec m) {
  m.norm.kind = NormKind::Rms;
  m.norm.eps = 1e-6;
  m.activation = ActivationKind::SwiGlu;
  m.linear_bias = false;
  m.tie_embeddings = false;
  m.ffn_hidden_set = 88;
  return m;
}

ModelSpec tiny_moe(ModelSpec m) {
  m = tiny_rms_swiglu(m);
  m.feed_forward = FeedForwardKind::Moe;
  m.moe.experts = 4;
  m.moe.top_k = 2;
  m.moe.ffn_hidden_set = 24;
  m.moe.shared_ffn_hidden = 16;
  m.moe.aux_loss = 0.05;
  m.moe.z_loss = 0.01;
  m.moe.first_dense_layers = 1;
  return m;
}

Reference run_reference(Config c, int steps, const InitialChange& change) {
  c.parallel = ParallelOptions{};
  c.parallel.dp = 1;
  c.train.micro_batch = c.train.global_batch;
  c.checkpoint.resume = "none";  // from step 0, whatever the run directory holds
  check_layout(c, 1);
  // Each reference is computed once per process. The parity tests ask for the same single-rank
  // run again and again (each precision's check takes the next finer or coarser run as the
  // yardstick of its rounding, the bitwise checks the fp32 run once more), and every rank
  // computes it. The key is the whole effective configuration but the directories it writes to:
  // they change where the run writes, not what it computes. A run with an initial change is
  // not the deck's alone and is computed each time (a function has no key).
  static std::map<std::string, Reference> computed;
  Config key_config = c;
  key_config.run.dir.clear();
  key_config.checkpoint.dir.clear();
  const std::string key = dump_config(key_config) + "\nsteps = " + std::to_string(steps);
  if (!change)
    if (const auto found = computed.find(key); found != computed.end()) return found->second;
  CpuBackend backend(1);
  ProcessGrid grid(MPI_COMM_SELF, c.grid_shape(), c.run.comm_timeout);
  Trainer trainer(c, grid, backend);
  if (change) change(trainer, backend);
  Reference ref;
  for (int s = 0; s < steps; ++s) ref.losses.push_back(trainer.train_step(s).loss);
  for (const OwnedPiece& piece : trainer.state().owned_pieces()) {
    std::vector<double>& global = ref.params[piece.param->spec.name];
    global.resize(static_cast<size_t>(piece.param->spec.global_shape.numel()));
    const std::vector<double> host = host_values(backend, piece.value);
    for (int64_t i = 0; i < piece.count; ++i)
      global[static_cast<size_t>(piece.param->global_index(piece.local_begin + i))] = host[i];
  }
  if (!change) computed.emplace(key, ref);
  return ref;
}

ParityResult run_parallel(Config c, int steps, const Reference& ref, const InitialChange& change) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  check_layout(c, world);
  CpuBackend backend(1);
  ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), c.run.comm_timeout);
  Trainer trainer(c, grid, backend);
  if (change) change(trainer, backend);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) losses.push_back(trainer.train_step(s).loss);
  return compare_with_reference(trainer, backend, MPI_COMM_WORLD, losses, 0, ref);
}

ParityResult compare_with_reference(Trainer& trainer, Backend& backend, MPI_Comm comm,
                                    const std::vector<double>& losses, int first_step,
                                    const Reference& ref) {
  ParityResult r;
  r.losses = losses;
  for (size_t s = 0; s < losses.size(); ++s) {
    const double want = ref.losses[static_cast<size_t>(first_step) + s];
    r.max_loss_error = std::max(r.max_loss_error, std::abs(losses[s] - want) / std::abs(want));
  }
  // Per parameter: sums of squared differences and of squared reference values over the
  // primary pieces (each element once in the grid), reduced over the world below.
  std::map<std::string, std::pair<double, double>> sums;
  for (const auto& [name, values] : ref.params) sums[name] = {0.0, 0.0};
  for (const OwnedPiece& piece : trainer.state().owned_pieces()) {
    const std::string& name = piece.param->spec.name;
    const std::vector<double>& global = ref.params.at(name);
    double scale = 1e-300;
    for (double v : global) scale = std::max(scale, std::abs(v));
    const std::vector<double> host = host_values(backend, piece.value);
    r.owned_values.insert(r.owned_values.end(), host.begin(), host.end());
    auto& [diff2, ref2] = sums[name];
    for (int64_t i = 0; i < piece.count; ++i) {
      const double want = global[static_cast<size_t>(piece.param->global_index(piece.local_begin + i))];
      const double diff = host[i] - want;
      if (piece.primary) {
        diff2 += diff * diff;
        ref2 += want * want;
      }
      if (std::abs(diff) / scale > r.max_param_error) {  // every copy, replicas too
        r.max_param_error = std::abs(diff) / scale;
        r.worst_param = name;
      }
    }
  }
  std::vector<double> flat;
  for (const auto& [name, d] : sums) {
    flat.push_back(d.first);
    flat.push_back(d.second);
  }
  MPI_Allreduce(MPI_IN_PLACE, flat.data(), static_cast<int>(flat.size()), MPI_DOUBLE, MPI_SUM, comm);
  double total_diff = 0, total_ref = 0;
  size_t i = 0;
  for (const auto& [name, d] : sums) {
    total_diff += flat[i];
    total_ref += flat[i + 1];
    const double rel = std::sqrt(flat[i] / std::max(flat[i + 1], 1e-300));
    if (rel > r.max_param_l2_error) {
      r.max_param_l2_error = rel;
      r.worst_l2_param = name;
    }
    i += 2;
  }
  r.params_l2_error = std::sqrt(total_diff / total_ref);
  MPI_Allreduce(MPI_IN_PLACE, &r.max_param_error, 1, MPI_DOUBLE, MPI_MAX, comm);
  return r;
}

}  // namespace meshtrain::testing
