#include "meshtrain/train/planner.h"

#include <algorithm>
#include <exception>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

MemoryCategory StagePlan::dominant() const {
  size_t best = 0;
  for (size_t c = 1; c < kMemoryCategories; ++c)
    if (at_peak[c] > at_peak[best]) best = c;
  return static_cast<MemoryCategory>(best);
}

size_t LayoutPlan::peak() const { return stages[static_cast<size_t>(peak_stage())].peak_total; }

int LayoutPlan::peak_stage() const {
  int best = 0;
  for (size_t s = 1; s < stages.size(); ++s)
    if (stages[s].peak_total > stages[static_cast<size_t>(best)].peak_total) best = static_cast<int>(s);
  return best;
}

std::string LayoutPlan::layout() const { return layout_name(config); }

std::string layout_name(const Config& config) {
  const ParallelOptions& p = config.parallel;
  const char* rc[] = {"none", "selective", "full"};
  std::string s = "dp " + std::to_string(p.dp) + " tp " + std::to_string(p.tp) + " pp " +
                  std::to_string(p.pp) + (p.cp > 1 ? " cp " + std::to_string(p.cp) : std::string()) +
                  (p.ep > 1 ? " ep " + std::to_string(p.ep) : std::string()) + " " +
                  std::string(schedule_name(p.schedule));
  if (p.virtual_stages > 1) s += " v" + std::to_string(p.virtual_stages);
  s += " m" + std::to_string(config.microbatches()) + "x" + std::to_string(config.train.micro_batch) +
       " zero " + std::to_string(p.zero) + " rc " + rc[static_cast<int>(p.recompute)];
  if (p.sequence_parallel && p.tp > 1) s += " sp";
  return s;
}

namespace {

// One stage's dry run: the peaks of two steps of its Trainer.
StagePlan plan_stage(const Config& config, ProcessGrid& grid, CpuBackend& backend, int stage) {
  {
    Trainer trainer(config, grid, backend, DataMode::ShapesOnly);
    if (config.parallel.uneven_shares()) {
      // The replica with the most micro-batches bounds the memory (GPipe keeps all of them): the
      // largest declared share, or, where speeds are only known at run time (measured,
      // rebalanced), the largest share there can be. This rank is replica 0: it takes that share.
      std::vector<int> shares = trainer.work().shares;
      const int granule = trainer.work().granule;
      if (config.parallel.balance != Balance::Declared || config.parallel.rebalance) {
        std::fill(shares.begin(), shares.end(), granule);
        shares[0] = config.total_microbatches() - (config.parallel.dp - 1) * granule;
      } else {
        std::iter_swap(shares.begin(), std::max_element(shares.begin(), shares.end()));
      }
      trainer.set_shares(shares);
    }
    trainer.reset_memory_peaks();
    // An asynchronous checkpoint's snapshot is held while the next steps run (whenever writing
    // takes longer than a step, through a whole step's peak): count it through both.
    const bool snapshots = config.checkpoint.async && config.checkpoint.every > 0;
    const size_t snapshot = snapshots ? Checkpointer::snapshot_bytes(trainer.state()) : 0;
    backend.memory().on_allocate(MemoryCategory::CheckpointSnapshot, snapshot);
    // Two steps: the second shows the steady state (buffers the first step leaves cached or
    // allocated for the next, e.g. ZeRO-1's reduced gradient shards).
    trainer.train_step(0);
    trainer.train_step(1);
    const MemoryTracker& m = backend.memory();
    StagePlan s;
    s.pp_rank = stage;
    for (size_t c = 0; c < kMemoryCategories; ++c) {
      s.peak[c] = m.peak(static_cast<MemoryCategory>(c));
      s.at_peak[c] = m.at_peak(static_cast<MemoryCategory>(c));
    }
    s.peak_total = m.peak_total();
    backend.memory().on_release(MemoryCategory::CheckpointSnapshot, snapshot);
    return s;
  }
}

}  // namespace

LayoutPlan plan_layout(Config config, int world_size, int threads, size_t stop_above) {
  check_layout(config, world_size);
  config.run.trace = false;
  LayoutPlan plan;
  plan.config = config;
  const GridShape shape = config.grid_shape();
  // The first and last stages first (they also hold the embedding and the head): a plan that
  // stops over the limit stops soonest.
  std::vector<int> order = {0};
  for (int s = config.parallel.pp - 1; s > 0; --s) order.push_back(s);
  for (int stage : order) {
    GridCoords coords{};
    coords[axis_index(Axis::Pipeline)] = stage;
    ProcessGrid grid = ProcessGrid::planned(shape, shape.world_rank(coords));
    CpuBackend backend(threads, Execution::Plan);
    if (config.run.device == DeviceChoice::Cuda) backend.plan_attention_of(Device::Cuda);
    backend.memory().set_limit(stop_above);
    try {
      plan.stages.push_back(plan_stage(config, grid, backend, stage));
    } catch (const MemoryLimitExceeded&) {
      plan.stopped_over = stop_above;
      plan.stages.clear();
      return plan;
    }
  }
  std::sort(plan.stages.begin(), plan.stages.end(),
            [](const StagePlan& a, const StagePlan& b) { return a.pp_rank < b.pp_rank; });
  return plan;
}

std::vector<LayoutPlan> plan_layouts(const std::vector<Config>& configs, int world_size, int threads,
                                     size_t stop_above) {
  std::vector<LayoutPlan> plans(configs.size());
  std::vector<std::exception_ptr> errors(configs.size());
  // Dynamic: a layout's dry run costs from microseconds to seconds (micro-batches x stages).
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < configs.size(); ++i) {
    try {
      plans[i] = plan_layout(configs[i], world_size, threads, stop_above);
    } catch (...) {
      errors[i] = std::current_exception();  // an exception cannot leave an OpenMP loop
    }
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  return plans;
}

namespace {

// A mixture of experts may split its experts over any divisor of the replicas (dp x cp) that
// also divides the experts; a dense model keeps the deck's ep (1: check_layout refuses others).
std::vector<int> expert_parallel_choices(const Config& base, int replicas) {
  if (base.model.feed_forward != FeedForwardKind::Moe) return {base.parallel.ep};
  std::vector<int> out;
  for (int ep = 1; ep <= replicas; ++ep)
    if (replicas % ep == 0 && base.model.moe.experts % ep == 0) out.push_back(ep);
  return out;
}

}  // namespace

std::vector<Config> enumerate_layouts(const Config& base, int world_size) {
  return enumerate_layouts(base, world_size, nullptr, nullptr);
}

std::vector<Config> enumerate_layouts(const Config& base, int world_size,
                                      const std::function<bool(const Config&)>& keep,
                                      std::vector<std::string>* refused) {
  std::vector<Config> out;
  const int cp = base.parallel.cp;  // the deck's: the advisor chooses tp and pp around it
  for (int tp = 1; tp <= world_size; ++tp) {
    if (world_size % tp) continue;
    for (int pp = 1; pp <= world_size / tp; ++pp) {
      if ((world_size / tp) % pp || (world_size / (tp * pp)) % cp) continue;
      const int dp = world_size / (tp * pp * cp);
      // One pass (the deck's ep) for a dense model.
      for (int ep : expert_parallel_choices(base, dp * cp))
      for (int mb = 1; mb <= base.train.global_batch; mb *= 2) {
        for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved,
                                  ScheduleKind::ZeroBubbleH1, ScheduleKind::ZeroBubbleV}) {
          if (pp == 1 && kind != ScheduleKind::OneFOneB) continue;  // one stage: no schedule to choose
          for (int zero = 0; zero <= 3; ++zero)
            for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
              Config c = base;
              c.parallel.dp = dp;
              c.parallel.tp = tp;
              c.parallel.pp = pp;
              c.parallel.ep = ep;
              c.parallel.schedule = kind;
              c.parallel.virtual_stages =
                  kind == ScheduleKind::Interleaved || kind == ScheduleKind::ZeroBubbleV ? 2 : 1;
              c.parallel.zero = zero;
              c.parallel.recompute = rc;
              c.parallel.sequence_parallel = tp > 1;
              c.parallel.partition.clear();
              c.train.micro_batch = mb;
              if (keep && !keep(c)) continue;
              try {
                check_layout(c, world_size);
              } catch (const DeckError& e) {
                if (refused && std::find(refused->begin(), refused->end(), e.what()) == refused->end())
                  refused->push_back(e.what());
                continue;
              }
              out.push_back(c);
            }
        }
      }
    }
  }
  return out;
}

}  // namespace meshtrain
