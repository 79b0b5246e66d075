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

namespace meshtrain {

namespace {

// One micro-batch through one model chunk on one rank, split into what the time is spent on.
struct PassTime {
  double compute = 0;  // GEMMs and memory-bound kernels
  double tp_comm = 0;  // tensor-parallel collectives
  double ep_comm = 0;  // expert parallelism's exchanges (on the compute path)
  double total() const { return compute + tp_comm + ep_comm; }
  PassTime& operator+=(const PassTime& o) {
    compute += o.compute;
    tp_comm += o.tp_comm;
    ep_comm += o.ep_comm;
    return *this;
  }
};

// Prices the units of one model chunk on one rank from their cost sheets (model/cost_sheet.h).
class ChunkPricer {
 public:
  // `expert_exchange`: the all_to_all model of the expert group's link (null without ep).
  ChunkPricer(const Config& c, const MachineProfile& profile, LinkClass tp_link, const AlphaBeta* expert_exchange)
      : gemm_(profile.gemm(c.train.precision)), bandwidth_(profile.memory_bytes_per_s),
        tp_(c.parallel.tp), act_bytes_(static_cast<double>(dtype_size(c.train.precision))),
        ep_(c.parallel.ep), expert_exchange_(expert_exchange), sync_(profile.sync_seconds) {
    const double C = static_cast<double>(c.model.d_model);
    // Context parallelism: each rank holds seq_len / cp tokens of every sequence.
    tokens_ = static_cast<double>(c.train.micro_batch) * static_cast<double>(c.model.seq_len) / c.parallel.cp;
    // Sequence parallelism splits the token dimension of the regions outside the GEMMs.
    region_tokens_ = c.parallel.sequence_parallel && tp_ > 1 ? tokens_ / tp_ : tokens_;
    if (tp_ > 1) {
      // Ring all-reduce costs as much as reduce-scatter + all-gather: sequence parallelism
      // changes which collectives run, not their time.
      tp_allreduce_ = profile.link(tp_link, CollectiveKind::AllReduce).seconds(
          CollectiveKind::AllReduce, tokens_ * C * act_bytes_, tp_);
      small_allreduce_ = profile.link(tp_link, CollectiveKind::AllReduce)
                             .seconds(CollectiveKind::AllReduce, tokens_ * 4, tp_);
      // Each collective also waits for busy peers (the profile's synchronization cost).
      tp_allreduce_ += profile.sync_seconds;
      small_allreduce_ += profile.sync_seconds;
    }
    sequences_ = static_cast<double>(c.train.micro_batch);
    keys_ = static_cast<double>(c.model.seq_len);
    // Under cp a rank's S / cp queries meet all S keys (ring attention; the causal halves are
    // balanced over the ranks).
    queries_ = keys_ / c.parallel.cp;
  }

  // Forward of one transformer block; with `core_only`, only the attention core (scores,
  // softmax, weighted sum): what selective recomputation repeats.
  PassTime block_forward(const CostSheet& b, bool core_only = false) const {
    PassTime t;
    for (const AttentionCost& a : b.attention) t.compute += attention_sets(a) * attention_gemm_seconds(a);
    for (const AttentionCost& a : b.attention) t.compute += memory(scores(a) * a.forward_score_accesses * 4);
    if (core_only) return t;
    t.compute += linears_forward(b);
    t.compute += memory(elementwise_bytes(b, Direction::Forward));
    // A row-parallel linear's partial outputs are summed over the group.
    t.tp_comm = b.row_parallel_linears() * tp_allreduce_;
    // The per-expert counts, then the rows out to the experts and back.
    for (const ExchangeCost& e : b.exchanges) t.ep_comm += exchange(e.counts * 8.0) + 2 * exchange(rows_bytes(e));
    return t;
  }

  // Backward of one block: every attention GEMM twice (input and weight gradients), the
  // sheet's backward traffic, the same number of collectives as forward.
  PassTime block_backward(const CostSheet& b) const {
    PassTime t;
    for (const AttentionCost& a : b.attention) t.compute += 2 * attention_sets(a) * attention_gemm_seconds(a);
    for (const AttentionCost& a : b.attention) t.compute += memory(scores(a) * a.backward_score_accesses * 4);
    t.compute += linears_backward(b);
    t.compute += memory(elementwise_bytes(b, Direction::Backward));
    // A column-parallel linear's input gradients are summed over the group.
    t.tp_comm = b.column_parallel_linears() * tp_allreduce_;
    // The output gradients out to the experts' ranks and the input gradients back.
    for (const ExchangeCost& e : b.exchanges) t.ep_comm += 2 * exchange(rows_bytes(e));
    return t;
  }

  PassTime embedding_forward(const CostSheet& e) const {
    PassTime t;
    t.compute = memory(elementwise_bytes(e, Direction::Forward));
    t.tp_comm = tp_allreduce_;  // vocabulary-parallel lookup
    return t;
  }
  PassTime embedding_backward(const CostSheet& e) const {
    PassTime t;
    t.compute = memory(elementwise_bytes(e, Direction::Backward));
    return t;
  }

  // Final LayerNorm, LM head GEMM and vocabulary-parallel cross-entropy.
  PassTime head_forward(const CostSheet& h) const {
    PassTime t;
    t.compute = linears_forward(h) + memory(elementwise_bytes(h, Direction::Forward));
    // Cross-entropy's three small all-reduces (maximum, sum, target logit) and, under sequence
    // parallelism, the all-gather of the head's input (half an all-reduce).
    t.tp_comm = 3 * small_allreduce_ + (region_tokens_ < tokens_ ? tp_allreduce_ / 2 : 0);
    return t;
  }
  PassTime head_backward(const CostSheet& h) const {
    PassTime t;
    t.compute = linears_backward(h) + memory(elementwise_bytes(h, Direction::Backward));
    t.tp_comm = h.column_parallel_linears() * tp_allreduce_;  // the head's input gradient
    return t;
  }

  double memory(double bytes) const { return bandwidth_ > 0 ? bytes / bandwidth_ : 0; }

 private:
  enum class Direction { Forward, Backward };

  double attention_sets(const AttentionCost& a) const {  // (sequence, local head) pairs
    return sequences_ * (static_cast<double>(a.heads) / tp_);
  }
  double attention_gemm_seconds(const AttentionCost& a) const {
    const GemmShape s = a.scores(queries_, keys_), w = a.weighted_sum(queries_, keys_);
    return gemm_.seconds(s.m, s.n, s.k) + gemm_.seconds(w.m, w.n, w.k);
  }
  double scores(const AttentionCost& a) const { return attention_sets(a) * queries_ * keys_; }

  // One rank's send buffer of an exchange: its tokens (split over tp under sequence
  // parallelism, as the MoE layer sees the residual stream) times their rows.
  double rows_bytes(const ExchangeCost& e) const {
    return region_tokens_ * e.rows_per_token * static_cast<double>(e.width) * act_bytes_;
  }
  // One blocking all_to_all over the expert group, balanced: (ep-1)/ep of it leaves the rank.
  double exchange(double bytes) const {
    if (ep_ <= 1 || !expert_exchange_) return 0;
    return expert_exchange_->seconds(CollectiveKind::AllToAll, bytes, ep_) + sync_;
  }

  // A dense linear is one GEMM over every token of the rank. An expert linear is a grouped GEMM
  // of this rank's experts / ep experts, each priced at its own size: balanced routing gives each
  // a 1 / experts share of the rows the expert group routes (the region's tokens, as the mixture
  // sees them, times top_k, from each of the ep ranks); smaller groups run at a lower rate.
  double groups_of(const LinearCost& l) const {
    return l.experts > 0 ? static_cast<double>(l.experts) / ep_ : 1.0;
  }
  double rows_of(const LinearCost& l) const {
    return l.experts > 0 ? region_tokens_ * l.rows_per_token * ep_ / static_cast<double>(l.experts)
                         : tokens_;
  }
  double linears_forward(const CostSheet& sheet) const {
    double seconds = 0;
    for (const LinearCost& l : sheet.linears) {
      const GemmShape f = l.forward(rows_of(l), tp_);
      seconds += groups_of(l) * gemm_.seconds(f.m, f.n, f.k);
    }
    return seconds;
  }
  double linears_backward(const CostSheet& sheet) const {
    double seconds = 0;
    for (const LinearCost& l : sheet.linears) {
      const GemmShape d = l.backward_data(rows_of(l), tp_), w = l.backward_weight(rows_of(l), tp_);
      seconds += groups_of(l) * (gemm_.seconds(d.m, d.n, d.k) + gemm_.seconds(w.m, w.n, w.k));
    }
    return seconds;
  }
  double elementwise_bytes(const CostSheet& sheet, Direction pass) const {
    double bytes = 0;
    for (const ElementwiseCost& e : sheet.elementwise) {
      const double tokens = e.tokens == ElementwiseCost::Tokens::Region ? region_tokens_ : tokens_;
      const bool forward = pass == Direction::Forward;
      const ElementwiseCost::Bytes kind = forward ? e.forward_bytes : e.backward_bytes;
      const double element = kind == ElementwiseCost::Bytes::Fp32 ? 4 : act_bytes_;
      bytes += tokens * e.local_width(tp_) * element * (forward ? e.forward_accesses : e.backward_accesses);
    }
    return bytes;
  }

  const GemmRates& gemm_;
  double bandwidth_;
  double tp_;
  double act_bytes_;
  int ep_;
  const AlphaBeta* expert_exchange_;
  double sync_;
  double tokens_ = 0, region_tokens_ = 0;
  double sequences_ = 0, queries_ = 0, keys_ = 0;
  double tp_allreduce_ = 0, small_allreduce_ = 0;
};

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

// The prediction, or (bound_only) its lower bound without simulating the pipeline: a stage's last
// compute ends no earlier than its first input can arrive plus its own work, which cores lent by
// idle ranks (below) speed up by at most `sharing`; the rest of the step (dp, optimizer) is
// priced alike.
StepTimePrediction predict(const Config& c, const MachineProfile& profile, bool bound_only) {
  const ParallelOptions& par = c.parallel;
  const GridShape shape = c.grid_shape();
  const int R = std::max(1, profile.ranks_per_node);
  const LinkClass tp_link = link_of(shape, Axis::Tensor, R), dp_link = link_of(shape, Axis::Data, R),
                  pp_link = link_of(shape, Axis::Pipeline, R);
  StepTimePrediction out;
  const bool crosses_nodes = shape.world_size() > R;
  if (crosses_nodes && !profile.has_inter_node())
    out.caveats.push_back("the machine profile " + profile.path + " has no inter-node measurement (a single-node calibration): "
                          "links across nodes are priced as inside one");
  if (profile.threads_per_rank != std::max(1, c.run.threads) && profile.device == "cpu")
    out.caveats.push_back("the profile was measured with " + std::to_string(profile.threads_per_rank) +
                          " thread(s) per rank, the run uses " + std::to_string(std::max(1, c.run.threads)));
  if (par.offload != Offload::None) out.caveats.push_back("optimizer offload is priced as if on the device");
  if (par.cp > 1)
    out.caveats.push_back("context parallelism: ring attention's transfers are priced as hidden "
                          "behind attention (bench --suite context: the ring at 0.985 of compute "
                          "alone on one node), and its gradient reduction over dp x cp on dp's links");
  if (par.uneven_shares())
    out.caveats.push_back("ranks are priced as identical: parallel.balance and rebalance (uneven "
                          "shares for ranks of different speeds) are not modelled");

  // Expert parallelism: the expert group exchanges rows (all_to_all) and the expert-data group
  // reduces the experts' gradients; both fold over the replicas, so neither is one axis.
  const bool moe = c.model.feed_forward == FeedForwardKind::Moe;
  const AlphaBeta* expert_exchange = nullptr;
  LinkClass expert_data_link = dp_link;
  if (moe)
    out.caveats.push_back("mixture of experts: routing is priced as balanced (every expert gets "
                          "top_k / experts of the tokens; a rank's experts run as one grouped "
                          "GEMM of groups that size)");
  if (moe && par.ep > 1) {
    const LinkClass ep_link = link_of_groups(shape.expert_groups(), R);
    expert_data_link = link_of_groups(shape.expert_data_groups(), R);
    CollectiveKind kind = CollectiveKind::AllToAll;
    if (!profile.has_link(ep_link, kind)) {
      kind = CollectiveKind::AllGather;
      out.caveats.push_back("the machine profile " + profile.path + " has no all_to_all measurement (a "
                            "datasheet, or written before calibrate measured it): expert parallelism's "
                            "exchange is priced with all_gather's model; `meshtrain bench --suite "
                            "calibrate` measures it");
    }
    expert_exchange = &profile.link(ep_link, kind);
  }
  ChunkPricer pricer(c, profile, tp_link, expert_exchange);
  const int chunks = par.pp * par.virtual_stages;
  const std::vector<ChunkRange> ranges =
      par.partition.empty() ? default_partition(c) : explicit_partition(par.partition);

  std::vector<PassTime> forward(static_cast<size_t>(chunks)), backward(static_cast<size_t>(chunks));
  std::vector<double> parameters(static_cast<size_t>(chunks), 0.0);
  // Experts' parameters a rank holds under ep > 1 (its experts only), reduced over the
  // expert-data group rather than over all replicas; under ep 1 they count among `parameters`.
  std::vector<double> expert_parameters(static_cast<size_t>(chunks), 0.0);
  const ModelCostSheet& sheets = model_cost_sheet(c.model);
  const double tp = static_cast<double>(par.tp);
  // Each layer's passes, priced once per distinct sheet (today's blocks are all alike).
  struct LayerPrice {
    PassTime forward, backward, recompute;
    double parameters = 0, expert_parameters = 0;
  };
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
    if (par.ep > 1) {
      double experts = 0;
      for (const ParameterCost& q : sheets.blocks[l].parameters)
        if (q.expert_parallel) experts += q.local_numel(tp);
      p.parameters -= experts;
      p.expert_parameters = experts / par.ep;
    }
  }
  for (int k = 0; k < chunks; ++k) {
    const ChunkRange& r = ranges[static_cast<size_t>(k)];
    PassTime& f = forward[static_cast<size_t>(k)];
    PassTime& b = backward[static_cast<size_t>(k)];
    double& held = parameters[static_cast<size_t>(k)];
    double& held_experts = expert_parameters[static_cast<size_t>(k)];
    for (int l = r.first_layer; l < r.end_layer; ++l) {
      const LayerPrice& p = layer_prices[static_cast<size_t>(l)];
      f += p.forward;
      b += p.backward;
      b += p.recompute;
      held += p.parameters;
      held_experts += p.expert_parameters;
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

  SimulationCosts costs;
  for (int k = 0; k < chunks; ++k) {
    costs.chunk_forward.push_back(forward[static_cast<size_t>(k)].total());
    costs.chunk_backward.push_back(backward[static_cast<size_t>(k)].total());
  }
  const double act_bytes = static_cast<double>(dtype_size(c.train.precision));
  const double sent = static_cast<double>(c.train.micro_batch) * static_cast<double>(c.model.seq_len) *
                      static_cast<double>(c.model.d_model) * act_bytes /
                      (par.sequence_parallel && par.tp > 1 ? par.tp : 1) / par.cp;
  if (par.pp > 1)
    costs.send = profile.link(pp_link, CollectiveKind::PointToPoint).seconds(CollectiveKind::PointToPoint, sent, 2) +
                 profile.sync_seconds;
  const int m = c.microbatches();
  const CommModel comm = c.run.device == DeviceChoice::Cuda ? CommModel::Nccl : CommModel::Mpi;
  // How much faster a rank runs while others of its node idle: at most the node's oversubscription,
  // and only as far as ranks waiting in MPI leave their cores (they spin under the MPI libraries'
  // default polling: the profile measured it under the calibrating launch).
  const double oversubscribed = profile.device == "cpu"
                                    ? std::max(1.0, static_cast<double>(profile.ranks_per_node) *
                                                        std::max(1, profile.threads_per_rank) /
                                                        std::max(1, profile.cores_per_node))
                                    : 1.0;
  const double sharing = 1 + std::clamp(profile.waiting_ranks_lend, 0.0, 1.0) * (oversubscribed - 1);
  SimulationResult sim;
  if (!bound_only) {
    sim = simulate_cached(par.schedule, par.pp, par.virtual_stages, m, costs, comm);
    if (!sim.ok) throw DeckError("the time model could not run the schedule: " + sim.error);
  }

  // CPU ranks sharing cores (more ranks x threads than a node has cores): the profile's rates
  // are each rank's share while all of them compute, but a rank idle in a pipeline bubble
  // leaves its share to the others. The pipeline then takes the longer of its critical path at
  // an unshared core's speed and the node's whole work at the shared rates.
  std::vector<double> pipeline_end = sim.finish;
  if (profile.device == "cpu") {
    if (oversubscribed > 1 && sharing <= 1)
      out.caveats.push_back("ranks share cores, but ranks waiting in MPI kept theirs under the calibrating "
                            "launch (they spin): pipeline bubbles are priced as lending none; a launch "
                            "whose waiting ranks sleep (Open MPI: OMPI_MCA_mpi_yield_when_idle=1) runs "
                            "bubbly layouts faster, and wants a profile calibrated under it");
    if (sharing > 1 && sim.makespan > 0) {
      double mean_busy = 0;
      for (double b : sim.busy) mean_busy += b / static_cast<double>(sim.busy.size());
      const double pipeline = std::max(sim.makespan / sharing, mean_busy);
      for (double& t : pipeline_end) t *= pipeline / sim.makespan;
      char buf[320];
      std::snprintf(buf, sizeof buf, "%d ranks x %d thread(s) share %d cores per node: pipeline bubbles "
                    "lend %.0f%% of their cores to busy ranks (as measured under the calibrating launch: "
                    "a launch whose waiting ranks spin or sleep otherwise predicts otherwise)",
                    profile.ranks_per_node, profile.threads_per_rank, profile.cores_per_node,
                    100 * std::clamp(profile.waiting_ranks_lend, 0.0, 1.0));
      out.caveats.push_back(buf);
    }
  }

  // Data-parallel communication and the optimizer, per stage.
  const double grad_bytes = c.train.precision == DType::F64 ? 8 : 4;
  const double param_bytes = act_bytes;
  const int dp = par.dp * par.cp;  // the replicas: gradients are reduced and ZeRO shards over them
  const double bucket_bytes = std::max(1.0, par.bucket_mb * 1024 * 1024);
  for (int stage = 0; stage < par.pp; ++stage) {
    StageTime st;
    st.pp_rank = stage;
    double stage_params = 0, stage_experts = 0, forward_mb = 0, backward_mb = 0;
    for (int k : rank_chunks(stage, par.pp, par.virtual_stages, schedule_placement(par.schedule))) {
      stage_params += parameters[static_cast<size_t>(k)];
      stage_experts += expert_parameters[static_cast<size_t>(k)];
      forward_mb += forward[static_cast<size_t>(k)].total();
      backward_mb += backward[static_cast<size_t>(k)].total();
      st.compute_s += m * (forward[static_cast<size_t>(k)].compute + backward[static_cast<size_t>(k)].compute);
      st.tp_comm_s += m * (forward[static_cast<size_t>(k)].tp_comm + backward[static_cast<size_t>(k)].tp_comm);
      st.ep_comm_s += m * (forward[static_cast<size_t>(k)].ep_comm + backward[static_cast<size_t>(k)].ep_comm);
    }
    if (bound_only) {
      // Stage s computes nothing before the first micro-batch's forward has passed chunks 0 to
      // s - 1 (on ranks 0 to s - 1 under either placement) and reached it, and then at most its
      // own work back to back.
      double first_input = 0;
      for (int k = 0; k < stage; ++k) first_input += forward[static_cast<size_t>(k)].total() + costs.send;
      st.pipeline_end_s = (first_input + st.compute_s + st.tp_comm_s + st.ep_comm_s) / sharing;
    } else {
      st.pipeline_end_s = pipeline_end[static_cast<size_t>(stage)];
    }
    if (dp > 1) {
      // One group's gradient reduction of `held` parameters and, under ZeRO, its parameters'
      // all-gather, each bucket's collective waiting for its peers.
      struct Reduction {
        double reduce = 0, regather = 0, buckets = 0;
      };
      const auto reduction_over = [&](double held, int ranks, LinkClass link) {
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
      };
      Reduction all = reduction_over(stage_params, dp, dp_link);
      // Expert parallelism: the experts' gradients are reduced over their expert-data group only
      // (none where ep spans every replica), after or before the dense ones on the same path.
      if (stage_experts > 0 && dp / par.ep > 1) {
        const Reduction experts = reduction_over(stage_experts, dp / par.ep, expert_data_link);
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
        st.dp_exposed_s = hidden_behind(reduce, backward_mb) + regather;
      } else if (par.zero == 2) {
        st.dp_comm_s = m * reduce + regather;
        st.dp_exposed_s = m * hidden_behind(reduce, backward_mb) + regather;
      } else {  // ZeRO-3: parameters gathered for every forward and backward
        st.dp_comm_s = m * (2 * regather + reduce);
        st.dp_exposed_s = m * (hidden_behind(regather, forward_mb) + hidden_behind(regather + reduce, backward_mb));
      }
    }
    // AdamW reads parameter, gradient and both moments and writes three of them (fp32), plus
    // the cast back to the compute dtype; gradient clipping reads the gradients once more.
    double owned = par.zero >= 1 ? stage_params / dp : stage_params, read = stage_params;
    if (stage_experts > 0) {  // ZeRO shards the experts over their expert-data group
      owned += par.zero >= 1 ? stage_experts / (dp / par.ep) : stage_experts;
      read += stage_experts;
    }
    st.optimizer_s = pricer.memory(owned * (7 * 4 + param_bytes) + read * grad_bytes);
    st.end_s = st.pipeline_end_s + st.dp_exposed_s + st.optimizer_s;
    out.stages.push_back(st);
  }

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
