#pragma once
// ShardedOptimizer: AdamW over this rank's owned range of each bucket (its shard under ZeRO >= 1,
// everything under ZeRO 0), the parameters' initial values and the global gradient norm. Under
// train.optimizer = "muon" (any ZeRO stage, any tp), Muon steps the hidden matrices
// (parallel/muon_matrices.h) and AdamW the rest; a Muon matrix's momentum lives in AdamW's
// exp_avg at the matrix's place (its exp_avg_sq stays zero), so that checkpoints hold it by the
// parameter's name, sharded and resharded like AdamW's moments.
//
// Mixed precision: with bf16 parameters (the layers' values), gradients are fp32 and the
// optimizer keeps fp32 master weights of its shard beside the moments; after each update the
// master weights are cast to bf16 into the parameters (and gathered, ZeroGather). With offload,
// master weights and moments live in pinned host memory and the update runs on the CPU, bucket
// by bucket, overlapping the copies of one bucket with the update of the previous.
// Part of ModelState (model_state.h), over its StateLayout.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/muon_matrices.h"
#include "meshtrain/parallel/state_layout.h"
#include "meshtrain/parallel/zero_gather.h"

namespace meshtrain {

class ShardedOptimizer {
 public:
  ShardedOptimizer(StateLayout& layout, ZeroGather& gather);

  // Initial parameter values from (seed, name, global index).
  void initialize(uint64_t seed);
  // Global L2 norm of the gradient (each element counted once over the whole grid).
  double grad_norm();
  void step(double lr, double grad_scale);
  // After the optimizer's values were overwritten (a checkpoint load): refresh the parameters.
  void sync_after_load();

  int64_t steps_taken() const;
  void set_steps_taken(int64_t steps);
  // What the optimizer updates in bucket b: the master weights, or the parameters' owned range.
  Tensor values(int b);
  AdamW& adamw(int b) { return *adamw_[static_cast<size_t>(b)]; }
  // Muon's matrices and their owners (empty under AdamW alone).
  const std::vector<MuonMatrix>& muon_matrices() const { return muon_; }

  // A reader of the optimizer's values on another thread (an asynchronous checkpoint copying
  // them while the next step's forward and backward run) sets a fence: the first call that
  // writes them runs it, once, before writing. Null clears it.
  void set_update_fence(std::function<void()> fence) { update_fence_ = std::move(fence); }
  bool update_fenced() const { return static_cast<bool>(update_fence_); }
  // Runs and clears the fence: every writer of the optimizer's values calls it first.
  void pass_update_fence();

 private:
  void upload_master(int b);
  void initialize_bucket(int b, uint64_t seed);
  void step_offloaded(double lr, double grad_scale);
  void step_muon(double lr, double grad_scale);
  Tensor muon_momenta(int b, size_t first, size_t end, double grad_scale);
  void orthogonalise(int b, size_t first, size_t end, Tensor& updates);
  Tensor share_updates(int b, Tensor& updates);

  StateLayout* layout_;
  ZeroGather* gather_;
  std::vector<std::unique_ptr<AdamW>> adamw_;  // per bucket, on the state backend
  std::vector<Tensor> master_;      // per bucket: the optimizer's values, where not the parameters'
  std::vector<Tensor> host_grads_;  // per bucket, offload: the owned gradients copied to the host
  std::function<void()> update_fence_;
  std::vector<MuonMatrix> muon_;
};

}  // namespace meshtrain
