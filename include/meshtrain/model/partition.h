#pragma once
// Which layers each model chunk owns. With pp stages and v virtual stages there are pp * v
// chunks, in model order; which stage holds which chunk is the schedule's placement
// (parallel/schedule.h chunk_owner: k % pp, Megatron's interleaved layout, or zb-v's V), not this
// file's concern. The first chunk also holds the embeddings, the last the
// final LayerNorm, LM head and loss. By default the split balances an estimate of each
// chunk's training cost; a deck can give the layer counts instead.

#include <string>
#include <vector>

#include "meshtrain/model/model_spec.h"

namespace meshtrain {

struct ChunkRange {
  int first_layer = 0;
  int end_layer = 0;  // exclusive
  bool has_embedding = false;
  bool has_head = false;
  int layers() const { return end_layer - first_layer; }
};

// Estimated training cost per token of one block, the embedding and the head (their sheets).
double block_cost(const ModelSpec& cfg);
double head_cost(const ModelSpec& cfg);
double embedding_cost(const ModelSpec& cfg);

// Contiguous ranges of at least one layer each, minimising the most expensive chunk. With
// `stage_speeds` (one per chunk, or one per pipeline stage with chunk k on stage k % stages: the
// looped placement), a chunk's cost is divided by its stage's speed: a slower stage gets fewer
// layers.
std::vector<ChunkRange> balanced_partition(const ModelSpec& cfg, int chunks,
                                           const std::vector<double>& stage_speeds = {});
// zb-v's V placement: stage r holds chunks r and 2 x stages - 1 - r, so stage 0 holds both the
// embedding's chunk and the head's (the head is several blocks' worth with a large vocabulary),
// and balancing chunks alone can leave stage 0 the slowest by far. Here each stage gets the
// layers that minimise the dearest stage, its two chunks' costs summed over its speed
// (chunk_speeds: one per chunk, chunk r's being its stage's; none: equal), and splits them
// between its two chunks as evenly as their costs allow. Needs layers >= 2 x stages.
std::vector<ChunkRange> v_balanced_partition(const ModelSpec& cfg, int stages,
                                             const std::vector<double>& chunk_speeds = {});
// Ranges from explicit layer counts (validated by the caller: positive, summing to layers).
std::vector<ChunkRange> explicit_partition(const std::vector<int>& layer_counts);
double chunk_cost(const ModelSpec& cfg, const ChunkRange& r);
std::string describe_partition(const std::vector<ChunkRange>& ranges);  // "[0-5 +emb] [6-11 +head]"

}  // namespace meshtrain
