#pragma once
// What one training step reports (the trainer's result, the log's input), and one rank's memory
// peaks as the log and metrics.jsonl show them.

#include <array>
#include <cstddef>
#include <vector>

#include "meshtrain/tensor/memory.h"

namespace meshtrain {

struct StepResult {
  int step = 0;  // optimizer steps completed
  double loss = 0, lr = 0, grad_norm = 0;
  double seconds = 0, tokens_per_second = 0;
  double bubble = 0;  // measured, mean over ranks
  // This rank's pipeline phase (the executor's forward and backward): its compute and its
  // length; bubble is 1 - their ratio, averaged over the ranks.
  double pipeline_compute_seconds = 0, pipeline_seconds = 0;
  double pipeline_longest_action_seconds = 0;  // this rank's longest compute action (padded)
  // This rank's compute: forward and backward (the executor's), and the optimizer step (with
  // ZeRO's parameter all-gather, which the ranks reach together: the loss and gradient-norm
  // reductions before it synchronise them). Host wall-clock time: with asynchronous kernels
  // (CUDA), only what the host waits for inside these calls.
  double compute_seconds = 0;
  // The statistics the stage's layers asked for (PipelineStage::take_step_statistics: a mixture
  // of experts' loads and balancing losses), summed over the world; empty where none did.
  std::vector<double> layer_statistics;
  // QK-clip (train.qk_clip_threshold > 0): every attention head's largest logit of the step, the
  // maximum over the world (PipelineStage::take_step_maxima), and the heads clipped after it.
  std::vector<double> attention_logit_maxima;
  int clipped_heads = 0;
  double max_attention_logit = 0;
};

// Per-category peaks of one rank's memory, as reported in the log and metrics.jsonl.
struct MemoryPeaks {
  int world_rank = 0, dp = 0, tp = 0, pp = 0, cp = 0;
  std::array<size_t, kMemoryCategories> peak{};  // per category
  size_t peak_total = 0;                          // of the sum, at its highest moment
};

}  // namespace meshtrain
