#pragma once
// MuonClip's QK-clip (Kimi K2, arXiv 2507.20534, sec. 2.1): each attention head's largest
// pre-softmax logit S_max (the scaled q.k over every query/key pair the mask allows, over every
// micro-batch of the step and every rank holding part of the head) is recorded in the forward
// pass; after the optimizer step a head with S_max > tau has its query and key projections scaled
// by gamma = tau / S_max, so that the same inputs would give it a largest logit of tau:
//   multi-head attention: the head's query rows and key rows (and biases) by sqrt(gamma) each;
//   grouped-query attention: the query rows by gamma, the shared key head untouched (a key head
//     serves several query heads; this is the paper's rule for latent attention's shared
//     rotary key, and clips exactly the heads over tau, each by its own gamma).
// Here: the per-step log of the maxima (QkLogitLog), the factors (qk_clip_gammas), and the
// scaling a layer asks for, as rows of its parameters (RowScale, model/parameter.h), which
// parallel/ applies wherever the parameters' values live (masters, ZeRO shards).

#include <cstdint>
#include <vector>

#include "meshtrain/model/parameter.h"

namespace meshtrain {

// The largest logit of every attention head of the model, (layers, heads) with the model's heads
// numbered globally: a rank fills the entries of the heads it computes (its tensor rank's heads
// of its stage's layers) and leaves the others at -inf, so that the maximum over the world is
// every head's over the job. Recording is off until switched on (a run with tau > 0).
class QkLogitLog {
 public:
  QkLogitLog(int layers, int64_t heads, int64_t local_heads, int tp_rank);
  void switch_on() { on_ = true; }
  bool on() const { return on_; }
  // local_max: the largest logit of each of this rank's heads of `layer` in one forward pass.
  void record(int layer, const std::vector<double>& local_max);
  // The maxima since the last take, and forgets them (empty while off).
  std::vector<double> take();
  int64_t heads() const { return heads_; }
  int64_t first_local_head() const { return first_local_head_; }

 private:
  std::vector<double> blank() const;

  bool on_ = false;
  int layers_;
  int64_t heads_, local_heads_, first_local_head_;
  std::vector<double> maxima_;
};

// Per entry of the job's maxima: tau / S_max where S_max > tau, else 1.
std::vector<double> qk_clip_gammas(const std::vector<double>& job_maxima, double tau);

struct QkClipSummary {
  int clipped_heads = 0;
  double max_logit = 0;  // the largest logit of any head (-inf: none recorded)
};
QkClipSummary qk_clip_summary(const std::vector<double>& job_maxima, double tau);

}  // namespace meshtrain
