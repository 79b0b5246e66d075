#include "meshtrain/train/time_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#include "meshtrain/config/deck_error.h"
#include "meshtrain/model/model_costs.h"
#include "meshtrain/model/partition.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/parallel/schedule.h"
#include "meshtrain/parallel/schedule_cache.h"
#include "meshtrain/parallel/schedule_simulator.h"
#include "meshtrain/train/planner.h"
#include "meshtrain/train/work_balance.h"

#include "chunk_pricer.h"

namespace meshtrain {

namespace {

// Whether every group along `axis` lies inside one node: consecutive blocks of ranks_per_node
// ranks share a node, and a group's ranks are `stride` apart (the product of the faster axes'
// sizes in parallel.order).
LinkClass link_of(const GridShape& shape, Axis axis, int ranks_per_node) {
  int stride = 1;
  for (Axis a : shape.order) {
    if (a == axis) break;
    stride *= shape.size(a);
  }
  const int span = stride * shape.size(axis);
  return span <= ranks_per_node && ranks_per_node % span == 0 ? LinkClass::IntraNode : LinkClass::InterNode;
}

// Whether every group (world ranks, e.g. GridShape::expert_groups) lies inside one node, for
// groups that are not one axis: expert parallelism's are folded over the dp x cp replicas.
LinkClass link_of_groups(const std::vector<std::vector<int>>& groups, int ranks_per_node) {
  for (const std::vector<int>& g : groups)
    for (int r : g)
      if (r / ranks_per_node != g.front() / ranks_per_node) return LinkClass::InterNode;
  return LinkClass::IntraNode;
}

// Layouts that differ only where the pipeline cannot see it (the ZeRO stage, dp itself) run
// the same schedule with the same costs: ranking thousands of layouts simulates each pipeline
// once. Guarded for the advisor's threads; bounded, as a planning process is short-lived.
SimulationResult simulate_cached(ScheduleKind kind, int pp, int v, int m, const SimulationCosts& costs,
                                 CommModel comm) {
  static std::mutex mutex;
  static std::map<std::vector<double>, SimulationResult> cache;
  std::vector<double> key = {static_cast<double>(kind), static_cast<double>(pp), static_cast<double>(v),
                             static_cast<double>(m), costs.send, static_cast<double>(comm)};
  key.insert(key.end(), costs.chunk_forward.begin(), costs.chunk_forward.end());
  key.insert(key.end(), costs.chunk_backward.begin(), costs.chunk_backward.end());
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  SimulationResult result = simulate(pipeline_schedules(kind, pp, m, v)->train, pp, v, m, costs, comm,
                                     Passes::ForwardAndBackward, schedule_placement(kind));
  std::lock_guard<std::mutex> lock(mutex);
  if (cache.size() > 4096) cache.clear();
  cache.emplace(std::move(key), result);
  return result;
}

std::string percent(double part, double whole) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.0f%%", whole > 0 ? 100 * part / whole : 0.0);
  return buf;
}

}  // namespace

namespace {

// The links of a layout's groups, and expert parallelism's: the expert group exchanges rows
// (all_to_all) and the expert-data group reduces the experts' gradients; both fold over the
// replicas, so neither is one axis.
struct Links {
  LinkClass tp, dp, pp, expert_data;
  const AlphaBeta* expert_exchange = nullptr;  // null without expert parallelism
};

// What the prediction cannot see or prices approximately, said once.
void add_layout_caveats(const Config& c, const MachineProfile& profile, const GridShape& shape,
                        std::vector<std::string>& caveats) {
  const ParallelOptions& par = c.parallel;
  const bool crosses_nodes = shape.world_size() > std::max(1, profile.ranks_per_node);
  if (crosses_nodes && !profile.has_inter_node())
    caveats.push_back("the machine profile " + profile.path + " has no inter-node measurement (a single-node calibration): "
                      "links across nodes are priced as inside one");
  if (profile.threads_per_rank != std::max(1, c.run.threads) && profile.device == "cpu")
    caveats.push_back("the profile was measured with " + std::to_string(profile.threads_per_rank) +
                      " thread(s) per rank, the run uses " + std::to_string(std::max(1, c.run.threads)));
  if (par.offload != Offload::None) caveats.push_back("optimizer offload is priced as if on the device");
  if (c.train.optimizer == OptimizerKind::Muon)
    caveats.push_back("Muon: each block linear's Newton-Schulz is priced as one matrix (a fused "
                      "projection steps as its slices, a little less), its owners as sharing the "
                      "work evenly, and the moves of its matrices (tp's sums into whole matrices, "
                      "ZeRO's gather and reduce-scatter, ZeRO 0's all-reduce) as after the step");
  if (par.cp > 1)
    caveats.push_back("context parallelism: ring attention's transfers are priced as hidden "
                      "behind attention (bench --suite context: the ring at 0.985 of compute "
                      "alone on one node), and its gradient reduction over dp x cp on dp's links");
  if (par.uneven_shares())
    caveats.push_back("ranks are priced as identical: parallel.balance and rebalance (uneven "
                      "shares for ranks of different speeds) are not modelled");
  if (c.model.feed_forward == FeedForwardKind::Moe)
    caveats.push_back("mixture of experts: routing is priced as balanced (every expert gets "
                      "top_k / experts of the tokens; a rank's experts run as one grouped "
                      "GEMM of groups that size)");
}

Links links_of(const Config& c, const MachineProfile& profile, const GridShape& shape,
               std::vector<std::string>& caveats) {
  const int R = std::max(1, profile.ranks_per_node);
  Links links;
  links.tp = link_of(shape, Axis::Tensor, R);
  links.dp = link_of(shape, Axis::Data, R);
  links.pp = link_of(shape, Axis::Pipeline, R);
  links.expert_data = links.dp;
  if (c.model.feed_forward != FeedForwardKind::Moe || c.parallel.ep <= 1) return links;
  const LinkClass ep_link = link_of_groups(shape.expert_groups(), R);
  links.expert_data = link_of_groups(shape.expert_data_groups(), R);
  CollectiveKind kind = CollectiveKind::AllToAll;
  if (!profile.has_link(ep_link, kind)) {
    kind = CollectiveKind::AllGather;
    caveats.push_back("the machine profile " + profile.path + " has no all_to_all measurement (a "
                      "datasheet, or written before calibrate measured it): expert parallelism's "
                      "exchange is priced with all_gather's model; `meshtrain bench --suite "
                      "calibrate` measures it");
  }
  links.expert_exchange = &profile.link(ep_link, kind);
  return links;
}

// Each layer's passes, priced once per distinct sheet (today's blocks are all alike).
struct LayerPrice {
  PassTime forward, backward, recompute;
  double parameters = 0, expert_parameters = 0;
  ChunkPricer::MatrixWork muon;  // Newton-Schulz under train.optimizer = "muon", else none
};

std::vector<LayerPrice> price_layers(const ChunkPricer& pricer, const ModelCostSheet& sheets,
                                     const ParallelOptions& par, const TrainOptions& train) {
  const double tp = static_cast<double>(par.tp);
  std::vector<LayerPrice> layer_prices(sheets.blocks.size());
  for (size_t l = 0; l < sheets.blocks.size(); ++l) {
    if (l > 0 && sheets.blocks[l] == sheets.blocks[l - 1]) {
      layer_prices[l] = layer_prices[l - 1];
      continue;
    }
    LayerPrice& p = layer_prices[l];
    p.forward = pricer.block_forward(sheets.blocks[l]);
    p.backward = pricer.block_backward(sheets.blocks[l]);
    if (par.recompute == Recompute::Full) p.recompute = p.forward;
    if (par.recompute == Recompute::Selective) p.recompute = pricer.block_forward(sheets.blocks[l], true);
    p.parameters = sheets.blocks[l].local_parameters(tp);
    if (train.optimizer == OptimizerKind::Muon) p.muon = pricer.newton_schulz(sheets.blocks[l], train.muon.ns_steps);
    if (par.ep > 1) {
      double experts = 0;
      for (const ParameterCost& q : sheets.blocks[l].parameters)
        if (q.expert_parallel) experts += q.local_numel(tp);
      p.parameters -= experts;
      p.expert_parameters = experts / par.ep;
    }
  }
  return layer_prices;
}

// One micro-batch's passes through each model chunk, and the parameters each chunk holds:
// experts' parameters a rank holds under ep > 1 (its experts only) apart, as they are reduced
// over the expert-data group rather than over all replicas; under ep 1 they count among
// `parameters`.
struct ChunkPrices {
  std::vector<PassTime> forward, backward;
  std::vector<double> parameters, expert_parameters;
  std::vector<ChunkPricer::MatrixWork> muon;
};

ChunkPrices price_chunks(const Config& c, const ChunkPricer& pricer) {
  const ParallelOptions& par = c.parallel;
  const auto chunks = static_cast<size_t>(par.pp * par.virtual_stages);
  const std::vector<ChunkRange> ranges =
      par.partition.empty() ? default_partition(c) : explicit_partition(par.partition);
  const ModelCostSheet& sheets = model_cost_sheet(c.model);
  const double tp = static_cast<double>(par.tp);
  const std::vector<LayerPrice> layer_prices = price_layers(pricer, sheets, par, c.train);
  ChunkPrices out{std::vector<PassTime>(chunks), std::vector<PassTime>(chunks),
                  std::vector<double>(chunks, 0.0), std::vector<double>(chunks, 0.0),
                  std::vector<ChunkPricer::MatrixWork>(chunks)};
  for (size_t k = 0; k < chunks; ++k) {
    const ChunkRange& r = ranges[k];
    PassTime& f = out.forward[k];
    PassTime& b = out.backward[k];
    double& held = out.parameters[k];
    for (int l = r.first_layer; l < r.end_layer; ++l) {
      const LayerPrice& p = layer_prices[static_cast<size_t>(l)];
      f += p.forward;
      b += p.backward;
      b += p.recompute;
      held += p.parameters;
      out.expert_parameters[k] += p.expert_parameters;
      ChunkPricer::MatrixWork& muon = out.muon[k];
      muon.dense_s += p.muon.dense_s;
      muon.expert_s += p.muon.expert_s;
      muon.dense_elements += p.muon.dense_elements;
      muon.expert_elements += p.muon.expert_elements;
    }
    if (r.has_embedding) {
      f += pricer.embedding_forward(sheets.embedding);
      b += pricer.embedding_backward(sheets.embedding);
      held += sheets.embedding.local_parameters(tp);
    }
    if (r.has_head) {
      f += pricer.head_forward(sheets.head);
      b += pricer.head_backward(sheets.head);
      // Tied embeddings: the last stage keeps its own copy of the token embedding (summed over
      // the embedding group), as much state as an untied head; a chunk with both holds it once.
      held += sheets.head.local_parameters(tp, /*include_shared=*/!r.has_embedding);
    }
  }
  return out;
}

// The schedule simulator's costs: each chunk's passes and one activation's transfer.
SimulationCosts simulation_costs(const Config& c, const MachineProfile& profile, const Links& links,
                                 const ChunkPrices& chunks) {
  const ParallelOptions& par = c.parallel;
  SimulationCosts costs;
  for (size_t k = 0; k < chunks.forward.size(); ++k) {
    costs.chunk_forward.push_back(chunks.forward[k].total());
    costs.chunk_backward.push_back(chunks.backward[k].total());
  }
  const double act_bytes = static_cast<double>(dtype_size(c.train.precision));
  const double sent = static_cast<double>(c.train.micro_batch) * static_cast<double>(c.model.seq_len) *
                      static_cast<double>(c.model.d_model) * act_bytes /
                      (par.sequence_parallel && par.tp > 1 ? par.tp : 1) / par.cp;
  if (par.pp > 1)
    costs.send = profile.link(links.pp, CollectiveKind::PointToPoint).seconds(CollectiveKind::PointToPoint, sent, 2) +
                 profile.sync_seconds;
  return costs;
}

// How much faster a rank runs while others of its node idle: at most the node's oversubscription,
// and only as far as ranks waiting in MPI leave their cores (they spin under the MPI libraries'
// default polling: the profile measured it under the calibrating launch).
struct CoreSharing {
  double oversubscribed = 1, sharing = 1;
};

CoreSharing core_sharing(const MachineProfile& profile) {
  CoreSharing s;
  s.oversubscribed = profile.device == "cpu"
                         ? std::max(1.0, static_cast<double>(profile.ranks_per_node) *
                                             std::max(1, profile.threads_per_rank) /
                                             std::max(1, profile.cores_per_node))
                         : 1.0;
  s.sharing = 1 + std::clamp(profile.waiting_ranks_lend, 0.0, 1.0) * (s.oversubscribed - 1);
  return s;
}

// CPU ranks sharing cores (more ranks x threads than a node has cores): the profile's rates
// are each rank's share while all of them compute, but a rank idle in a pipeline bubble
// leaves its share to the others. The pipeline then takes the longer of its critical path at
// an unshared core's speed and the node's whole work at the shared rates.
std::vector<double> pipeline_ends(const SimulationResult& sim, const MachineProfile& profile,
                                  const CoreSharing& cores, std::vector<std::string>& caveats) {
  std::vector<double> pipeline_end = sim.finish;
  if (profile.device != "cpu") return pipeline_end;
  if (cores.oversubscribed > 1 && cores.sharing <= 1)
    caveats.push_back("ranks share cores, but ranks waiting in MPI kept theirs under the calibrating "
                      "launch (they spin): pipeline bubbles are priced as lending none; a launch "
                      "whose waiting ranks sleep (Open MPI: OMPI_MCA_mpi_yield_when_idle=1) runs "
                      "bubbly layouts faster, and wants a profile calibrated under it");
  if (cores.sharing > 1 && sim.makespan > 0) {
    double mean_busy = 0;
    for (double b : sim.busy) mean_busy += b / static_cast<double>(sim.busy.size());
    const double pipeline = std::max(sim.makespan / cores.sharing, mean_busy);
    for (double& t : pipeline_end) t *= pipeline / sim.makespan;
    char buf[320];
    std::snprintf(buf, sizeof buf, "%d ranks x %d thread(s) share %d cores per node: pipeline bubbles "
                  "lend %.0f%% of their cores to busy ranks (as measured under the calibrating launch: "
                  "a launch whose waiting ranks spin or sleep otherwise predicts otherwise)",
                  profile.ranks_per_node, profile.threads_per_rank, profile.cores_per_node,
                  100 * std::clamp(profile.waiting_ranks_lend, 0.0, 1.0));
    caveats.push_back(buf);
  }
  return pipeline_end;
}

// What one pipeline stage holds and runs per step, summed over its chunks.
struct StageWork {
  double params = 0, experts = 0, forward_mb = 0, backward_mb = 0;
  ChunkPricer::MatrixWork muon;
};

StageWork stage_work(const ParallelOptions& par, int stage, int m, const ChunkPrices& chunks, StageTime& st) {
  StageWork w;
  for (int k : rank_chunks(stage, par.pp, par.virtual_stages, schedule_placement(par.schedule))) {
    const auto i = static_cast<size_t>(k);
    w.params += chunks.parameters[i];
    w.experts += chunks.expert_parameters[i];
    w.muon.dense_s += chunks.muon[i].dense_s;
    w.muon.expert_s += chunks.muon[i].expert_s;
    w.muon.dense_elements += chunks.muon[i].dense_elements;
    w.muon.expert_elements += chunks.muon[i].expert_elements;
    w.forward_mb += chunks.forward[i].total();
    w.backward_mb += chunks.backward[i].total();
    st.compute_s += m * (chunks.forward[i].compute + chunks.backward[i].compute);
    st.tp_comm_s += m * (chunks.forward[i].tp_comm + chunks.backward[i].tp_comm);
    st.ep_comm_s += m * (chunks.forward[i].ep_comm + chunks.backward[i].ep_comm);
  }
  return w;
}

// One group's gradient reduction of `held` parameters and, under ZeRO, its parameters'
// all-gather, each bucket's collective waiting for its peers.
struct Reduction {
  double reduce = 0, regather = 0, buckets = 0;
};

Reduction reduction_over(const Config& c, const MachineProfile& profile, double held, int ranks,
                         LinkClass link) {
  const ParallelOptions& par = c.parallel;
  const double grad_bytes = c.train.precision == DType::F64 ? 8 : 4;
  const double param_bytes = static_cast<double>(dtype_size(c.train.precision));
  const double bucket_bytes = std::max(1.0, par.bucket_mb * 1024 * 1024);
  const AlphaBeta& allreduce = profile.link(link, CollectiveKind::AllReduce);
  const AlphaBeta& scatter = profile.link(link, CollectiveKind::ReduceScatter);
  const AlphaBeta& gather = profile.link(link, CollectiveKind::AllGather);
  const double grads = held * grad_bytes, params = held * param_bytes;
  Reduction r;
  r.buckets = std::max(1.0, std::ceil(grads / bucket_bytes));
  const double waits = r.buckets * profile.sync_seconds;  // one per bucket's collective
  r.reduce = waits + (par.zero == 0 ? allreduce.seconds(CollectiveKind::AllReduce, grads, ranks)
                                    : scatter.seconds(CollectiveKind::ReduceScatter, grads, ranks));
  r.regather = par.zero >= 1 ? waits + gather.seconds(CollectiveKind::AllGather, params, ranks) : 0;
  return r;
}

// Data-parallel communication of one stage (over dp x cp replicas, > 1): its time, and what of
// it the passes do not hide.
void price_data_parallel(const Config& c, const MachineProfile& profile, const Links& links, int m,
                         const StageWork& w, StageTime& st) {
  const ParallelOptions& par = c.parallel;
  const int dp = par.dp * par.cp;
  Reduction all = reduction_over(c, profile, w.params, dp, links.dp);
  // Expert parallelism: the experts' gradients are reduced over their expert-data group only
  // (none where ep spans every replica), after or before the dense ones on the same path.
  if (w.experts > 0 && dp / par.ep > 1) {
    const Reduction experts = reduction_over(c, profile, w.experts, dp / par.ep, links.expert_data);
    all.reduce += experts.reduce;
    all.regather += experts.regather;
    all.buckets += experts.buckets;
  }
  const double reduce = all.reduce, regather = all.regather, buckets = all.buckets;
  // A reduction overlapping a pass: the buckets that pass finishes early hide behind the
  // rest of it; the last bucket, finished at its very end, never does.
  const auto hidden_behind = [&](double comm, double pass) { return std::max(comm / buckets, comm - pass); };
  if (par.zero <= 1) {
    st.dp_comm_s = reduce + regather;
    st.dp_exposed_s = hidden_behind(reduce, w.backward_mb) + regather;
  } else if (par.zero == 2) {
    st.dp_comm_s = m * reduce + regather;
    st.dp_exposed_s = m * hidden_behind(reduce, w.backward_mb) + regather;
  } else {  // ZeRO-3: parameters gathered for every forward and backward
    st.dp_comm_s = m * (2 * regather + reduce);
    st.dp_exposed_s = m * (hidden_behind(regather, w.forward_mb) + hidden_behind(regather + reduce, w.backward_mb));
  }
}

// AdamW reads parameter, gradient and both moments and writes three of them (fp32), plus the
// cast back to the compute dtype; gradient clipping reads the gradients once more.
double optimizer_seconds(const Config& c, const ChunkPricer& pricer, const StageWork& w) {
  const ParallelOptions& par = c.parallel;
  const int dp = par.dp * par.cp;
  const double grad_bytes = c.train.precision == DType::F64 ? 8 : 4;
  const double param_bytes = static_cast<double>(dtype_size(c.train.precision));
  double owned = par.zero >= 1 ? w.params / dp : w.params, read = w.params;
  if (w.experts > 0) {  // ZeRO shards the experts over their expert-data group
    owned += par.zero >= 1 ? w.experts / (dp / par.ep) : w.experts;
    read += w.experts;
  }
  return pricer.memory(owned * (7 * 4 + param_bytes) + read * grad_bytes);
}

// Moving Muon's matrices over a replica group of `ranks` (parallel/muon_matrices.h): under ZeRO 0
// every replica holds every momentum, and one all-reduce sums the owners' updates; under ZeRO the
// owned pieces are all-gathered before Newton-Schulz and the updates reduce-scattered after it.
double muon_replica_seconds(const ParallelOptions& par, const MachineProfile& profile, LinkClass link,
                            double bytes, int ranks) {
  if (ranks <= 1) return 0;
  const auto collective = [&](CollectiveKind kind) {
    return profile.sync_seconds + profile.link(link, kind).seconds(kind, bytes, ranks);
  };
  if (par.zero == 0) return collective(CollectiveKind::AllReduce);
  return collective(CollectiveKind::AllGather) + collective(CollectiveKind::ReduceScatter);
}

// Muon's share of the step on one rank (parallel/muon_matrices.h): its owners' Newton-Schulz, the
// whole matrices divided evenly over the replicas times the tensor ranks (dp x cp x tp; an
// expert's over its expert-data group x tp), the replica group's sums of this tensor rank's
// pieces, and with tp > 1 the two all-reduces that sum the pieces into whole matrices and the
// owners' updates back.
double muon_seconds(const Config& c, const MachineProfile& profile, const Links& links, const StageWork& w) {
  const ParallelOptions& par = c.parallel;
  const int dp = par.dp * par.cp, expert_dp = std::max(1, dp / par.ep), tp = std::max(1, par.tp);
  const double bytes = c.train.precision == DType::F64 ? 8 : 4;
  double seconds = w.muon.dense_s / (dp * tp) + w.muon.expert_s / (expert_dp * tp);
  // The dense matrices are split over tp (the cost sheet's are whole); the experts are whole on
  // every tensor rank.
  seconds += muon_replica_seconds(par, profile, links.dp, w.muon.dense_elements / tp * bytes, dp);
  if (w.muon.expert_elements > 0)
    seconds += muon_replica_seconds(par, profile, links.expert_data, w.muon.expert_elements * bytes, expert_dp);
  if (tp > 1) {
    const double whole = (w.muon.dense_elements + w.muon.expert_elements) * bytes;
    seconds += 2 * (profile.sync_seconds + profile.link(links.tp, CollectiveKind::AllReduce)
                                               .seconds(CollectiveKind::AllReduce, whole, tp));
  }
  return seconds;
}

// The step is the slowest stage's: its parts become the prediction's.
void take_critical_stage(const Config& c, const MachineProfile& profile, const GridShape& shape,
                         StepTimePrediction& out) {
  const auto critical = std::max_element(out.stages.begin(), out.stages.end(),
                                         [](const StageTime& a, const StageTime& b) { return a.end_s < b.end_s; });
  out.critical_stage = critical->pp_rank;
  out.step_s = critical->end_s;
  out.compute_s = critical->compute_s;
  out.tp_comm_s = critical->tp_comm_s;
  out.ep_comm_s = critical->ep_comm_s;
  out.bubble_s =
      std::max(0.0, critical->pipeline_end_s - critical->compute_s - critical->tp_comm_s - critical->ep_comm_s);
  out.dp_exposed_s = critical->dp_exposed_s;
  out.optimizer_s = critical->optimizer_s;
  out.model_flops = c.model.flops_per_token() * static_cast<double>(c.train.global_batch) *
                    static_cast<double>(c.model.seq_len);
  const double peak = profile.gemm(c.train.precision).peak;
  out.mfu = out.step_s > 0 ? out.model_flops / (shape.world_size() * peak * out.step_s) : 0;
}

// The prediction, or (bound_only) its lower bound without simulating the pipeline: a stage's last
// compute ends no earlier than its first input can arrive plus its own work, which cores lent by
// idle ranks (pipeline_ends) speed up by at most `sharing`; the rest of the step (dp, optimizer)
// is priced alike.
StepTimePrediction predict(const Config& c, const MachineProfile& profile, bool bound_only) {
  const ParallelOptions& par = c.parallel;
  const GridShape shape = c.grid_shape();
  StepTimePrediction out;
  add_layout_caveats(c, profile, shape, out.caveats);
  const Links links = links_of(c, profile, shape, out.caveats);
  const ChunkPricer pricer(c, profile, links.tp, links.expert_exchange);
  const ChunkPrices chunks = price_chunks(c, pricer);
  const SimulationCosts costs = simulation_costs(c, profile, links, chunks);
  const int m = c.microbatches();
  const CommModel comm = c.run.device == DeviceChoice::Cuda ? CommModel::Nccl : CommModel::Mpi;
  const CoreSharing cores = core_sharing(profile);
  SimulationResult sim;
  if (!bound_only) {
    sim = simulate_cached(par.schedule, par.pp, par.virtual_stages, m, costs, comm);
    if (!sim.ok) throw DeckError("the time model could not run the schedule: " + sim.error);
  }
  const std::vector<double> pipeline_end = pipeline_ends(sim, profile, cores, out.caveats);

  for (int stage = 0; stage < par.pp; ++stage) {
    StageTime st;
    st.pp_rank = stage;
    const StageWork w = stage_work(par, stage, m, chunks, st);
    if (bound_only) {
      // Stage s computes nothing before the first micro-batch's forward has passed chunks 0 to
      // s - 1 (on ranks 0 to s - 1 under either placement) and reached it, and then at most its
      // own work back to back.
      double first_input = 0;
      for (int k = 0; k < stage; ++k) first_input += chunks.forward[static_cast<size_t>(k)].total() + costs.send;
      st.pipeline_end_s = (first_input + st.compute_s + st.tp_comm_s + st.ep_comm_s) / cores.sharing;
    } else {
      st.pipeline_end_s = pipeline_end[static_cast<size_t>(stage)];
    }
    if (par.dp * par.cp > 1) price_data_parallel(c, profile, links, m, w, st);
    st.optimizer_s = optimizer_seconds(c, pricer, w);
    if (c.train.optimizer == OptimizerKind::Muon) st.optimizer_s += muon_seconds(c, profile, links, w);
    st.end_s = st.pipeline_end_s + st.dp_exposed_s + st.optimizer_s;
    out.stages.push_back(st);
  }
  take_critical_stage(c, profile, shape, out);
  return out;
}

}  // namespace

StepTimePrediction predict_step_time(const Config& c, const MachineProfile& profile) {
  return predict(c, profile, false);
}

double step_time_lower_bound(const Config& c, const MachineProfile& profile) {
  return predict(c, profile, true).step_s;
}

std::string describe_prediction(const StepTimePrediction& p) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f ms", p.step_s * 1e3);
  std::string s = buf;
  // Only a layout that exchanges rows names ep: a dense model's line stays as it was.
  const std::string ep = p.ep_comm_s > 0 ? ", ep " + percent(p.ep_comm_s, p.step_s) : "";
  s += " (compute " + percent(p.compute_s, p.step_s) + ", tp " + percent(p.tp_comm_s, p.step_s) + ", bubble " +
       percent(p.bubble_s, p.step_s) + ep + ", dp " + percent(p.dp_exposed_s, p.step_s) + ", optimizer " +
       percent(p.optimizer_s, p.step_s) + ")";
  std::snprintf(buf, sizeof buf, ", MFU %.1f%%", 100 * p.mfu);
  return s + buf;
}

}  // namespace meshtrain
