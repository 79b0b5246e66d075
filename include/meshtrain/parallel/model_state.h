#pragma once
// ModelState owns this rank's training state — parameters, gradients, optimizer moments — laid
// out in buckets (bucket_plan.h) and sharded over the data-parallel group by ZeRO stage
// (Rajbhandari et al., arXiv 1910.02054):
//
// Mixed precision: with bf16 parameters (the layers' values), gradients are fp32 and the
// optimizer keeps fp32 master weights of its shard beside the moments; after each update the
// master weights are cast to bf16 into the parameters (and gathered). With offload, master
// weights and moments live in pinned host memory and the update runs on the CPU, bucket by
// bucket, overlapping the copies of one bucket with the update of the previous.
//
//   zero  parameters         gradients                     optimizer (AdamW m, v)
//   0     full               full, all-reduced             full
//   1     full, all-gathered  full, reduce-scattered        shard
//   2     full, all-gathered  shard (per-bucket staging)    shard
//   3     shard, gathered     shard (per-bucket staging)    shard
//         per unit on use
//
// It is the model's UnitHooks: it gathers a unit's parameters before the unit runs (ZeRO-3,
// with the next unit prefetched), and launches a bucket's gradient reduction as soon as every
// unit writing into it has finished its backward (its weight-gradient part, when a zero-bubble
// schedule splits it) — on the last micro-batch for stages 0 and 1
// (no communication before), on every micro-batch for stages 2 and 3 (which keep no full
// gradients). A bucket is ready when all units writing it have completed the same number of
// backward passes, which also handles the tied embedding's two users.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/progress_thread.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/bucket_plan.h"

namespace meshtrain {

struct StateGroups {
  Communicator* dp = nullptr;  // the data group (x context parallel): ReplicaGroup::Data
  Communicator* tp = nullptr;
  Communicator* pp = nullptr;
  Communicator* embedding = nullptr;  // first + last stage (tied embeddings), else size 1
  // ReplicaGroup::ExpertData's replicas; null where no parameter carries that group.
  Communicator* expert_data = nullptr;
  // The expert group (parallel.ep): its ranks hold different experts, whose gradients the norm
  // adds up over it; null without expert parallelism.
  Communicator* expert = nullptr;

  // The communicator a parameter of `group` is reduced and sharded over.
  Communicator& replicas_of(ReplicaGroup group) const;
};

struct ModelStateOptions {
  int zero = 0;
  double bucket_mb = 25.0;
  AdamWHyper adamw;
  int microbatches = 1;  // backward passes per unit per step
  // Where the optimizer's state lives: null, with the parameters; or this host backend (pinned
  // memory): master weights and moments are updated on the CPU (parallel.offload = "optimizer").
  Backend* offload = nullptr;
  // False under asynchronous data parallelism: the gradient stays this replica's (ZeRO 0), for
  // the parameter servers to sum.
  bool reduce_over_dp = true;
};

// One field of this rank's state as one flat range (the buckets one after another, in the
// optimizer's dtype): what parameter servers hold of it (parallel/parameter_server.h).
enum class FlatField { Values, Gradients, ExpAvg, ExpAvgSq };

// A piece of one parameter that this rank owns: `count` elements from local flat index
// `local_begin` of the parameter's slice, with views of its value and optimizer moments. The
// value is the optimizer's (the fp32 master weights under bf16 mixed precision), on `backend`
// (the device, or the host when the optimizer is offloaded).
struct OwnedPiece {
  Parameter* param = nullptr;
  int64_t local_begin = 0, count = 0;
  Tensor value, exp_avg, exp_avg_sq;
  Backend* backend = nullptr;
  // The one copy of these elements in the whole grid that a checkpoint writes: data-parallel
  // replicas (ZeRO 0) defer to dp rank 0, tensor-parallel replicas to tp rank 0, and the tied
  // embedding's copy on the last stage to the first stage's.
  bool primary = false;
};

// Which copies of this rank's state exist elsewhere in the grid, i.e. which other ranks must
// hold the same bits (the replica check, train/replica_check.h):
//   Replicas   the data-parallel (x context-parallel) group: every parameter's values under
//              ZeRO 0-2 (after the update's all-gather), and under ZeRO 0 the optimizer's
//              master weights and moments too. ZeRO 3 leaves nothing replicated here.
//   Tensor     the tensor group: parameters not split over it (layer norms, row-parallel
//              biases): their values and the optimizer's pieces of them, under every stage.
//   Embedding  the first and last pipeline stage with tied embeddings: wte's values (ZeRO 0-2)
//              and, under ZeRO 0, its optimizer state (other stages shard it differently).
//   Experts    the expert-data group (parallel.ep): the expert weights, which the Replicas
//              scope leaves out, as Replicas holds the others (values under ZeRO 0-2, and under
//              ZeRO 0 the optimizer's state).
enum class ReplicaScope { Replicas, Tensor, Embedding, Experts };

// One replicated piece of state and a hash of its bits; `what` names it the same way on every
// rank that holds a copy ("h.0.ln1.weight[0] values", "... state @0+64").
struct ReplicaRecord {
  std::string what;
  uint64_t hash = 0;
};

class ModelState final : public UnitHooks {
 public:
  ModelState(PipelineStage& stage, const StateGroups& groups, const ModelStateOptions& options);
  ~ModelState() override;

  // Initial parameter values from (seed, name, global index).
  void initialize(uint64_t seed);

  // Starts a step's gradients: none is filled with zeros; each one's first writer assigns it
  // (Parameter::grad_unwritten), and a bucket zeroes what no unit wrote before its reduction.
  void begin_step();
  // Zeroes every gradient that nothing has written since begin_step (a benchmark that reduces
  // without running the model's backward).
  void zero_unwritten_gradients();
  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;
  void after_input_backward(int unit) override;
  void before_weight_backward(int unit) override;
  void after_weight_backward(int unit) override;
  // Completes every reduction; sums tied-embedding and sequence-parallel gradients.
  void finish_backward();
  // Global L2 norm of the gradient (each element counted once over the whole grid).
  double grad_norm();
  void optimizer_step(double lr, double grad_scale);
  // Drops gathered parameters (ZeRO-3) outside a step, e.g. after an evaluation pass.
  void release_gathered();

  // Seconds spent waiting for reductions in the last step (at the end of backward, and for
  // ZeRO 2/3 at each unit): the part of the data-parallel communication backward did not hide.
  double exposed_comm_seconds() const { return exposed_comm_seconds_; }
  // steady_clock seconds at which this rank's last backward ended (finish_backward entered) and
  // its reductions were complete: exposed communication of a step is the latest completion
  // minus the latest backward end over the ranks (a rank waiting for a slower one is skew,
  // not communication).
  double backward_end_time() const { return backward_end_time_; }
  double reductions_done_time() const { return reductions_done_time_; }

  int64_t steps_taken() const;
  void set_steps_taken(int64_t steps);
  int zero() const { return options_.zero; }
  // Backward passes per unit per step from the next step on (uneven data-parallel shares,
  // train/work_balance.h; ZeRO 0 and 1 only, which reduce once per step).
  void set_microbatches(int microbatches) { options_.microbatches = microbatches; }
  // The optimizer's element type: fp32 master weights under bf16, else the parameters' own.
  DType state_dtype() const { return state_dtype_; }
  const BucketPlan& plan() const { return plan_; }
  // The pieces of parameters whose value and moments this rank holds authoritatively (its
  // shard under ZeRO >= 1, everything under ZeRO 0), for checkpoints.
  std::vector<OwnedPiece> owned_pieces();
  // After values of owned pieces were overwritten (a checkpoint load): refresh replicas.
  void sync_after_load();
  // A reader of the owned pieces on another thread (an asynchronous checkpoint copying them
  // while the next step's forward and backward run) sets a fence: the first call that writes
  // them (optimizer_step, initialize, sync_after_load, write_flat) runs it, once, before
  // writing. Null clears it.
  void set_update_fence(std::function<void()> fence) { update_fence_ = std::move(fence); }
  bool update_fenced() const { return static_cast<bool>(update_fence_); }

  // This rank's copies of state replicated over `scope`, in an order every holder shares
  // (parameter order, then owned pieces). Copies to the host: a check every so many steps.
  std::vector<ReplicaRecord> replica_records(ReplicaScope scope);
  // A hash of this rank's owned gradients after finish_backward (a step's re-run compares it).
  uint64_t gradient_hash();
  // This rank's gradient of bucket b after finish_backward, summed over the bucket's replica
  // group: its shard under ZeRO >= 1 (at owned offset replicas rank x shard_size), else whole.
  Tensor owned_gradients(int b) { return owned_grads(b); }
  // Fault injection (config/fault_injection.h): flips bit `bit` of element `index` of this
  // rank's slice of parameter `name` ("" the first) in every copy this rank holds: the layers'
  // values and, where separate, the optimizer's. False when this rank holds no such element.
  bool flip_parameter_bit(const std::string& name, int64_t index, int bit);
  // Flips bit `bit` of element `index` (modulo their count) of this rank's owned gradients
  // among those its share of the gradient norm counts.
  void flip_gradient_bit(int64_t index, int bit);

  // The flat view (ZeRO 0, optimizer not offloaded): its length, its AdamW segments (where
  // weight decay applies) and its norm segments (each element of the grid counted once), and
  // host copies in and out. Writing Values sets the optimizer's values; sync_after_load() then
  // brings them into the parameters.
  int64_t flat_size() const { return plan_.total_size(); }
  std::vector<OptimizerSegment> flat_segments() const;
  std::vector<OptimizerSegment> flat_norm_segments() const;
  void read_flat(FlatField field, void* host);
  void write_flat(FlatField field, const void* host);

  // What the parameters belong to (checkpoint/ saves and restores its buffers by name).
  PipelineStage& stage() { return *stage_; }
 private:
  void pass_update_fence();
  std::function<void()> update_fence_;
  struct BucketState;
  struct Pending;

  BucketState& bucket(int b) { return *buckets_[b]; }
  // The group bucket b is reduced and sharded over (its parameters' ReplicaGroup).
  Communicator& replicas(int b) const { return groups_.replicas_of(plan_.buckets[b].group); }
  bool shards_params() const { return options_.zero >= 3; }
  bool shards_grads() const { return options_.zero >= 2; }
  int64_t owned_begin(int b) const;
  int64_t owned_size(int b) const;
  Tensor owned_values(int b);
  Tensor owned_grads(int b);
  // What the optimizer updates: the master weights, or the parameters' owned range itself.
  Tensor optimizer_values(int b);
  // Copies (casting) the optimizer's values of bucket b into the parameters' owned range.
  void upload_master(int b);
  void gather_parameters();
  bool has_master() const { return state_be_ != be_ || state_dtype_ != stage_->dtype(); }
  void point_values(int b, const Tensor& full);
  void point_grads(int b, const Tensor& full);
  void start_gather(int b);
  void ensure_gathered(int b);
  void release(int b);
  void acquire_staging(int b);
  // Marks bucket b's gradients unwritten; zeroes those of them still unwritten.
  void mark_unwritten(int b);
  void zero_unwritten(int b);
  void maybe_reduce(int b);
  // A unit's gradients for one more micro-batch are complete: reduce what is ready.
  void gradients_final(int unit);
  // Drops the pins before_backward took on a unit's parameters (ZeRO-3).
  void unpin(int unit);
  void launch_reduction(int b);
  void progress();
  void retire_older_than(int generation);
  void complete(Pending& p);
  void all_reduce_segments(Communicator& comm, std::vector<Tensor>& pieces);

  PipelineStage* stage_;  // what the parameters belong to: any model family
  Backend* be_;
  Backend* state_be_;   // where master weights and moments live (be_, or the offload host)
  DType state_dtype_;   // fp32 under bf16 parameters, else the parameters' dtype
  StateGroups groups_;
  ModelStateOptions options_;
  BucketPlan plan_;
  std::vector<std::unique_ptr<BucketState>> buckets_;
  std::vector<Pending> pending_;
  std::vector<int> completed_;  // backward passes finished this step, per unit
  Tensor flat_values_, flat_grads_;
  double exposed_comm_seconds_ = 0;
  double backward_end_time_ = 0, reductions_done_time_ = 0;
  int generation_ = 0;  // after_backward calls so far
  ProgressThread progress_thread_;
  bool progress_active_ = false;
};

}  // namespace meshtrain
