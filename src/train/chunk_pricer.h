#pragma once
// The time model's pricing of one model chunk's passes on one rank, from the layers' cost sheets
// (model/cost_sheet.h) and a machine profile: GEMMs and memory-bound kernels, tensor-parallel
// collectives, expert parallelism's exchanges. Internal to train/time_model.cpp.

#include <algorithm>

#include "meshtrain/config/config.h"
#include "meshtrain/model/model_costs.h"
#include "meshtrain/train/time_model.h"

namespace meshtrain {

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

  // Muon (train.optimizer = "muon", optim/muon.h): `steps` Newton-Schulz iterations on each of the
  // block's weight matrices that this rank holds, as if it ran them all (the owners share them),
  // and the matrices' elements (their update's sum over the replicas); dense matrices and experts
  // apart, whose owners are in other groups. Per iteration, n the shorter side and m the longer:
  // the Gram matrix (n x n over m), its square (n x n over n) and the product (n x m over n).
  struct MatrixWork {
    double dense_s = 0, expert_s = 0, dense_elements = 0, expert_elements = 0;
  };
  MatrixWork newton_schulz(const CostSheet& b, int steps) const {
    MatrixWork w;
    for (const LinearCost& l : b.linears) {
      const double n = static_cast<double>(std::min(l.in, l.out)), m = static_cast<double>(std::max(l.in, l.out));
      const double seconds =
          groups_of(l) * steps * (gemm_.seconds(n, n, m) + gemm_.seconds(n, n, n) + gemm_.seconds(n, m, n));
      const double elements = groups_of(l) * n * m;
      (l.experts > 0 ? w.expert_s : w.dense_s) += seconds;
      (l.experts > 0 ? w.expert_elements : w.dense_elements) += elements;
    }
    return w;
  }

 private:
  enum class Direction { Forward, Backward };

  double attention_sets(const AttentionCost& a) const {  // (sequence, local head) pairs
    return sequences_ * (static_cast<double>(a.heads) / tp_);
  }
  double attention_gemm_seconds(const AttentionCost& a) const {
    const GemmShape s = a.scores(queries_, a.keys_seen(keys_)), w = a.weighted_sum(queries_, a.keys_seen(keys_));
    return gemm_.seconds(s.m, s.n, s.k) + gemm_.seconds(w.m, w.n, w.k);
  }
  double scores(const AttentionCost& a) const { return attention_sets(a) * queries_ * a.keys_seen(keys_); }

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

}  // namespace meshtrain
