#include "meshtrain/train/work_balance.h"

#include <fnmatch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "meshtrain/model/model_costs.h"
#include "meshtrain/parallel/schedule.h"
#include "meshtrain/parallel/slowdown.h"

namespace meshtrain {

std::vector<int> proportional_shares(int total, const std::vector<double>& speeds, int granule) {
  const int n = static_cast<int>(speeds.size());
  if (n < 1 || granule < 1 || total % granule != 0 || total < n * granule)
    throw std::invalid_argument("proportional_shares: " + std::to_string(total) +
                                " micro-batches cannot be shared among " + std::to_string(n) +
                                " replicas in multiples of " + std::to_string(granule));
  std::vector<int> shares(n, granule);
  for (int left = total - n * granule; left > 0; left -= granule) {
    int best = 0;
    double best_finish = std::numeric_limits<double>::infinity();
    for (int d = 0; d < n; ++d) {
      const double finish = (shares[d] + granule) / speeds[d];
      if (finish < best_finish) {
        best_finish = finish;
        best = d;
      }
    }
    shares[best] += granule;
  }
  return shares;
}

double slowest_replica(const std::vector<int>& shares, const std::vector<double>& seconds_per_microbatch) {
  double worst = 0;
  for (size_t d = 0; d < shares.size(); ++d) worst = std::max(worst, shares[d] * seconds_per_microbatch[d]);
  return worst;
}

std::vector<double> declared_rank_speeds(const ParallelOptions& p,
                                         const std::vector<std::string>& node_names) {
  if (!p.rank_speeds.empty()) return p.rank_speeds;
  std::vector<double> out(node_names.size(), 1.0);
  for (size_t r = 0; r < node_names.size(); ++r)
    for (const auto& [pattern, speed] : p.node_speeds)
      if (fnmatch(pattern.c_str(), node_names[r].c_str(), 0) == 0) {
        out[r] = speed;
        break;
      }
  return out;
}

double probe_block_seconds(Backend& be, const Config& c) {
  const double tp = static_cast<double>(c.parallel.tp);
  const int64_t N = static_cast<int64_t>(c.train.micro_batch) * c.model.seq_len;
  const DType dt = c.train.precision;
  const DType grad_dt = dt == DType::BF16 ? DType::F32 : dt;
  // The GEMMs of the model's first block on one tensor-parallel shard, as its cost sheet gives
  // them: the block's work the ranks of a job differ in speed at.
  struct Gemm {
    Tensor inp, weight, out, dout, dinp, dweight;
  };
  std::vector<Gemm> gemms;
  for (const LinearCost& l : model_cost_sheet(c.model).blocks.front().linears) {
    const int64_t out = static_cast<int64_t>(l.local_out(tp)), in = static_cast<int64_t>(l.local_in(tp));
    // An expert linear multiplies each token's top_k rows (rows_per_token; 1 for a dense one).
    const int64_t rows = static_cast<int64_t>(static_cast<double>(N) * l.rows_per_token);
    Gemm g;
    g.inp = be.empty({rows, in}, dt, MemoryCategory::Workspace);
    g.weight = be.empty({out, in}, dt, MemoryCategory::Workspace);
    g.out = be.empty({rows, out}, dt, MemoryCategory::Workspace);
    g.dout = be.empty({rows, out}, dt, MemoryCategory::Workspace);
    g.dinp = be.empty({rows, in}, dt, MemoryCategory::Workspace);
    g.dweight = be.zeros({out, in}, grad_dt, MemoryCategory::Workspace);
    for (Tensor* t : {&g.inp, &g.weight, &g.dout}) be.fill(*t, 0.01);
    gemms.push_back(std::move(g));
  }
  // The best of 8 after a warm-up: a rank's speed is what it does undisturbed, and on a node
  // whose ranks share cores the others' work only ever slows a probe (a median took a rank
  // descheduled in half its repetitions for a slow one).
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 9; ++rep) {
    be.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (Gemm& g : gemms) be.matmul_forward(g.out, g.inp, g.weight, nullptr);
    for (Gemm& g : gemms) be.matmul_backward(&g.dinp, &g.dweight, nullptr, g.dout, g.inp, g.weight);
    be.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The probe is compute like a chunk's: a test's MESHTRAIN_SLOWDOWN slows it alike.
    if (rep > 0) best = std::min(best, pad_compute(s));
  }
  return best;
}

std::vector<double> axis_speeds(const GridShape& shape, const std::vector<double>& rank_speeds, Axis a) {
  std::vector<double> out(shape.size(a), std::numeric_limits<double>::infinity());
  for (int r = 0; r < shape.world_size(); ++r) {
    const int i = shape.coordinates(r)[axis_index(a)];
    out[i] = std::min(out[i], rank_speeds[r]);
  }
  return out;
}

namespace {

// Relative to the fastest, rounded to 1/20: a probe's noise of a few percent between identical
// ranks must not turn into uneven shares or a different partition from run to run.
std::vector<double> normalised(std::vector<double> speeds) {
  const double top = *std::max_element(speeds.begin(), speeds.end());
  for (double& s : speeds) s = std::max(0.05, std::round(s / top * 20.0) / 20.0);
  return speeds;
}

}  // namespace

WorkPlan plan_work(const Config& c, ProcessGrid& grid, Backend& backend) {
  const ParallelOptions& p = c.parallel;
  const GridShape& shape = grid.shape();
  WorkPlan plan;
  plan.granule = p.share_granule();
  plan.source = "even";
  const bool planned = backend.planning();
  if (p.balance == Balance::Declared && (!p.rank_speeds.empty() || !planned)) {
    std::vector<std::string> names;
    if (p.rank_speeds.empty()) names = grid.world().all_gather_bytes(grid.node_name());
    plan.rank_speeds = normalised(declared_rank_speeds(p, names));
    plan.source = "declared";
  } else if (p.balance == Balance::Measured && !planned) {
    const double mine = probe_block_seconds(backend, c);
    std::string bytes(sizeof mine, '\0');
    std::memcpy(bytes.data(), &mine, sizeof mine);
    std::vector<double> speeds;
    for (const std::string& b : grid.world().all_gather_bytes(bytes)) {
      double s;
      std::memcpy(&s, b.data(), sizeof s);
      speeds.push_back(1.0 / s);
    }
    plan.rank_speeds = normalised(speeds);
    plan.source = "measured";
  }
  const std::vector<double> even(shape.world_size(), 1.0);
  const std::vector<double>& speeds = plan.rank_speeds.empty() ? even : plan.rank_speeds;
  plan.shares = proportional_shares(c.total_microbatches(), axis_speeds(shape, speeds, Axis::Data),
                                    plan.granule);
  if (!p.partition.empty())
    plan.partition = explicit_partition(p.partition);
  else if (plan.rank_speeds.empty() || p.pp == 1)
    plan.partition = default_partition(c);
  else {
    // One speed per chunk: its stage's, where the schedule places it (zb-v: a V).
    const std::vector<double> stage_speed = axis_speeds(shape, speeds, Axis::Pipeline);
    std::vector<double> chunk_speed;
    for (int stage : chunk_owners(p.pp, p.virtual_stages, schedule_placement(p.schedule)))
      chunk_speed.push_back(stage_speed[static_cast<size_t>(stage)]);
    plan.partition = default_partition(c, chunk_speed);
  }
  return plan;
}

std::vector<ChunkRange> default_partition(const Config& c, const std::vector<double>& chunk_speeds) {
  const ParallelOptions& p = c.parallel;
  const bool v_shape = schedule_placement(p.schedule) == ChunkPlacement::V && p.pp > 1;
  const auto search = [&] {
    return v_shape ? v_balanced_partition(c.model, p.pp, chunk_speeds)
                   : balanced_partition(c.model, p.pp * p.virtual_stages, chunk_speeds);
  };
  if (!chunk_speeds.empty()) return search();
  // Even speeds: the partition depends on the model and the chunks alone, yet the advisor asks
  // for it for each of thousands of layouts and the planner for each stage, and the search costs
  // chunks x layers^2 chunk costs (Megatron's 1T model in 128 chunks: two million). Remembered;
  // guarded for the advisor's threads.
  const ModelSpec& m = c.model;
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, bool, bool, int, int>;
  static std::mutex mutex;
  static std::map<Key, std::vector<ChunkRange>> remembered;
  const Key key{m.layers, m.d_model, m.heads, m.seq_len, m.vocab_size, m.tie_embeddings, v_shape, p.pp,
                p.virtual_stages};
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = remembered.find(key); it != remembered.end()) return it->second;
  }
  std::vector<ChunkRange> partition = search();
  std::lock_guard<std::mutex> lock(mutex);
  if (remembered.size() >= 256) remembered.clear();
  remembered.emplace(key, partition);
  return partition;
}

std::vector<double> replica_pace(const std::vector<int>& shares, const std::vector<double>& rank_compute,
                                 const GridShape& shape) {
  std::vector<double> pace(shares.size(), 0.0);
  for (int r = 0; r < shape.world_size(); ++r) {
    const int d = shape.coordinates(r)[axis_index(Axis::Data)];
    pace[d] = std::max(pace[d], rank_compute[r] / shares[d]);
  }
  return pace;
}

std::vector<int> rebalanced_shares(const std::vector<int>& shares, const std::vector<double>& pace,
                                   int granule, double min_gain) {
  for (double t : pace)
    if (!(t > 0) || !std::isfinite(t)) return shares;  // nothing measured yet
  std::vector<double> speeds;
  for (double t : pace) speeds.push_back(1.0 / t);
  int total = 0;
  for (int s : shares) total += s;
  const std::vector<int> next = proportional_shares(total, speeds, granule);
  const double now = slowest_replica(shares, pace), then = slowest_replica(next, pace);
  return then < (1.0 - min_gain) * now ? next : shares;
}

std::string describe_shares(const std::vector<int>& shares) {
  std::string s;
  for (size_t i = 0; i < shares.size(); ++i) s += (i ? " " : "") + std::to_string(shares[i]);
  return s;
}

}  // namespace meshtrain
