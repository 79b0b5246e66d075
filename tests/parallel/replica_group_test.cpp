// Buckets per replica group (parallel/bucket_plan.h, ModelState): a parameter's gradient is summed,
// and under ZeRO sharded, over the group it carries (ParamSpec::group), never over another. A
// stage of its own (a PipelineStage with a few parameters, no layers) tags some parameters
// ReplicaGroup::ExpertData and gives that group a communicator that is a split of the data group
// (world ranks of equal parity): their gradients must come out summed over that split only, the
// other parameters' over the whole world, in every ZeRO stage.

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/model/pipeline_stage.h"
#include "meshtrain/parallel/model_state.h"
#include "support/mpi_world.h"

namespace meshtrain {
namespace {

using testing::world_rank;
using testing::world_size;

// Two units: a dense parameter; then two expert parameters between two dense ones, so that the
// groups alternate in backward order and a bucket would mix them if the plan ignored the tag.
class GroupedStage final : public PipelineStage {
 public:
  GroupedStage() : backend_(1) {
    store_.begin_unit("dense");
    add("dense.a", 40, ReplicaGroup::Data);
    store_.begin_unit("mixed");
    add("dense.b", 8, ReplicaGroup::Data);
    add("expert.w", 24, ReplicaGroup::ExpertData);
    add("expert.b", 6, ReplicaGroup::ExpertData);
    add("dense.c", 12, ReplicaGroup::Data);
  }
  int chunks() const override { return 1; }
  Backend& backend() override { return backend_; }
  DType dtype() const override { return DType::F32; }
  ParameterStore& params() override { return store_; }
  LossAccumulator& loss() override { return loss_; }
  bool ties_embeddings() const override { return false; }
  Shape boundary_shape(const TokenShape& tokens) const override { return {tokens.N(), 1}; }
  // The test drives the training state's hooks itself; nothing runs a chunk.
  std::unique_ptr<ChunkActivations> new_activations(int) override { return nullptr; }
  Tensor forward(int, const MicroBatchData&, const Tensor&, ChunkActivations&, Pass, Recompute,
                 double, double*, UnitHooks&) override {
    throw std::logic_error("GroupedStage runs no chunk");
  }
  Tensor backward(int, const MicroBatchData&, const Tensor&, ChunkActivations&, Recompute,
                  UnitHooks&, DeferredWeightGradients*) override {
    throw std::logic_error("GroupedStage runs no chunk");
  }
  void backward_weights(int, DeferredWeightGradients&, UnitHooks&) override {
    throw std::logic_error("GroupedStage runs no chunk");
  }

 private:
  void add(const std::string& name, int64_t n, ReplicaGroup group) {
    ParamSpec spec;
    spec.name = name;
    spec.global_shape = {n};
    spec.group = group;
    store_.add(spec, 0, 1);
  }
  CpuBackend backend_;
  LossAccumulator loss_{backend_};
  ParameterStore store_;
};

MpiCommunicator split_by_parity() {
  MPI_Comm comm;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() % 2, world_rank(), &comm);
  return MpiCommunicator(comm, "expert-data", std::chrono::seconds(60));
}

// What each rank puts into every gradient element: distinct per rank, so that every sum tells
// which ranks it covered.
double contribution(int rank) { return rank + 1.0; }

double sum_over(const Communicator& group) {
  // The group's world ranks: those of this rank's parity when it is the split, else all.
  double s = 0;
  for (int r = 0; r < world_size(); ++r)
    if (group.size() == world_size() || r % 2 == world_rank() % 2) s += contribution(r);
  return s;
}

struct Groups {
  MpiCommunicator world{MPI_COMM_WORLD, "data", std::chrono::seconds(60)};
  MpiCommunicator self_tp{MPI_COMM_SELF, "tensor", std::chrono::seconds(60)};
  MpiCommunicator self_pp{MPI_COMM_SELF, "pipeline", std::chrono::seconds(60)};
  MpiCommunicator self_embedding{MPI_COMM_SELF, "embedding", std::chrono::seconds(60)};
  MpiCommunicator experts = split_by_parity();
  StateGroups state() { return {&world, &self_tp, &self_pp, &self_embedding, &experts}; }
};

TEST(ReplicaGroups, BucketsHoldOneGroupEachShardedOverItsRanks) {
  if (world_size() < 2) GTEST_SKIP() << "the expert-data split needs 2 ranks or more";
  Groups g;
  for (int zero : {0, 1, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    GroupedStage stage;
    ModelStateOptions o;
    o.zero = zero;
    o.bucket_mb = 64;
    ModelState state(stage, g.state(), o);
    int expert_buckets = 0;
    for (const Bucket& b : state.layout().plan().buckets) {
      for (const Parameter* p : b.params) EXPECT_EQ(p->spec.group, b.group) << p->spec.name;
      const int shards = zero == 0 ? 1 : b.group == ReplicaGroup::ExpertData ? g.experts.size() : world_size();
      EXPECT_EQ(b.size, b.shard_size * shards);
      if (b.group == ReplicaGroup::ExpertData) ++expert_buckets;
    }
    // Both expert parameters are adjacent in backward order: one bucket, or one per unit (ZeRO 3).
    EXPECT_EQ(expert_buckets, 1);
  }
}

TEST(ReplicaGroups, EachBucketIsReducedOverItsGroupsCommunicator) {
  if (world_size() < 2) GTEST_SKIP() << "the expert-data split needs 2 ranks or more";
  Groups g;
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    GroupedStage stage;
    ModelStateOptions o;
    o.zero = zero;
    o.bucket_mb = 64;
    ModelState state(stage, g.state(), o);
    state.initialize(1);
    state.begin_step();
    Backend& be = stage.backend();
    ParameterStore& store = stage.params();
    for (int u = store.units() - 1; u >= 0; --u) {
      state.before_backward(u);
      for (Parameter* p : store.unit_params(u)) {
        be.fill(p->grad, contribution(world_rank()));
        p->grad_unwritten = false;  // written (as a layer's backward would)
      }
      state.after_backward(u);
    }
    state.finish_backward();

    const BucketPlan& plan = state.layout().plan();
    int checked = 0;
    for (size_t b = 0; b < plan.buckets.size(); ++b) {
      const Bucket& bk = plan.buckets[b];
      const Communicator& comm = bk.group == ReplicaGroup::ExpertData
                                     ? static_cast<const Communicator&>(g.experts)
                                     : static_cast<const Communicator&>(g.world);
      const Tensor grads = state.layout().owned_grads(static_cast<int>(b));
      std::vector<float> host(static_cast<size_t>(grads.numel()));
      be.copy_to_host(host.data(), grads);
      const int64_t lo = zero >= 1 ? comm.rank() * bk.shard_size : 0;
      const double want = sum_over(comm);
      for (size_t i = 0; i < bk.params.size(); ++i)
        for (int64_t e = bk.offsets[i]; e < bk.offsets[i] + bk.params[i]->numel(); ++e) {
          if (e < lo || e >= lo + grads.numel()) continue;
          ASSERT_EQ(host[static_cast<size_t>(e - lo)], want)
              << bk.params[i]->spec.name << " element " << e - bk.offsets[i];
          ++checked;
        }
    }
    // Every rank owns some element of every parameter group between them; here at least one.
    EXPECT_GT(checked, 0);
  }
}

TEST(ReplicaGroups, AGroupWithoutCommunicatorIsRefusedWithAHint) {
  Groups g;
  StateGroups groups = g.state();
  groups.expert_data = nullptr;
  GroupedStage stage;
  for (int zero : {0, 1}) {  // ZeRO 0 too, where the plan itself needs no group's size
    SCOPED_TRACE("zero " + std::to_string(zero));
    ModelStateOptions o;
    o.zero = zero;
    try {
      ModelState state(stage, groups, o);
      ADD_FAILURE() << "built a state for expert parameters with no expert-data group";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("StateGroups::expert_data"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace meshtrain
