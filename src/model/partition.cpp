#include "meshtrain/model/partition.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "meshtrain/model/model_costs.h"

namespace meshtrain {

double block_cost(const ModelSpec& cfg) {
  // Every block of the model is alike: the first one's sheet prices them all.
  const ModelCostSheet& sheets = model_cost_sheet(cfg);
  return sheets.blocks.empty() ? 0.0 : sheets.blocks.front().training_flops_per_token(static_cast<double>(cfg.seq_len));
}

double head_cost(const ModelSpec& cfg) {
  return model_cost_sheet(cfg).head.training_flops_per_token(static_cast<double>(cfg.seq_len));
}

double embedding_cost(const ModelSpec& cfg) {
  // The embedding multiplies nothing: its lookup's element accesses stand in, small beside a
  // block but not zero, so that of two splits with the same dearest chunk of blocks the one
  // that gives the embedding's chunk fewer layers wins.
  double accesses = 0;
  for (const ElementwiseCost& e : model_cost_sheet(cfg).embedding.elementwise)
    accesses += e.forward_accesses * static_cast<double>(e.width);
  return accesses;
}

double chunk_cost(const ModelSpec& cfg, const ChunkRange& r) {
  return r.layers() * block_cost(cfg) + (r.has_embedding ? embedding_cost(cfg) : 0.0) +
         (r.has_head ? head_cost(cfg) : 0.0);
}

std::vector<ChunkRange> explicit_partition(const std::vector<int>& layer_counts) {
  std::vector<ChunkRange> out;
  int layer = 0;
  for (int n : layer_counts) {
    out.push_back({layer, layer + n, false, false});
    layer += n;
  }
  if (!out.empty()) {
    out.front().has_embedding = true;
    out.back().has_head = true;
  }
  return out;
}

std::vector<ChunkRange> balanced_partition(const ModelSpec& cfg, int chunks,
                                           const std::vector<double>& stage_speeds) {
  const int L = cfg.layers;
  const auto speed = [&](int chunk) {
    return stage_speeds.empty() ? 1.0 : stage_speeds[chunk % stage_speeds.size()];
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][l]: the smallest possible maximum chunk cost splitting layers [0, l) into k chunks.
  std::vector<std::vector<double>> best(chunks + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(chunks + 1, std::vector<int>(L + 1, 0));
  best[0][0] = 0.0;
  for (int k = 1; k <= chunks; ++k) {
    for (int l = k; l <= L - (chunks - k); ++l) {
      for (int start = k - 1; start < l; ++start) {
        if (best[k - 1][start] == inf) continue;
        ChunkRange r{start, l, k == 1, k == chunks};
        const double cost = std::max(best[k - 1][start], chunk_cost(cfg, r) / speed(k - 1));
        // Ties go to the later cut: earlier chunks take more layers.
        if (cost <= best[k][l]) {
          best[k][l] = cost;
          cut[k][l] = start;
        }
      }
    }
  }
  std::vector<int> counts(chunks);
  for (int k = chunks, l = L; k >= 1; --k) {
    counts[k - 1] = l - cut[k][l];
    l = cut[k][l];
  }
  return explicit_partition(counts);
}

std::vector<ChunkRange> v_balanced_partition(const ModelSpec& cfg, int stages,
                                             const std::vector<double>& chunk_speeds) {
  const int L = cfg.layers;
  if (stages < 1 || L < 2 * stages)
    throw std::invalid_argument("v_balanced_partition: " + std::to_string(L) + " layers cannot fill " +
                                std::to_string(2 * stages) + " chunks of at least one layer (" +
                                std::to_string(stages) + " stages, two chunks each)");
  const double block = block_cost(cfg);
  const auto speed = [&](int stage) {
    return chunk_speeds.empty() ? 1.0 : chunk_speeds[static_cast<size_t>(stage) % chunk_speeds.size()];
  };
  const auto extra = [&](int stage) { return stage == 0 ? embedding_cost(cfg) + head_cost(cfg) : 0.0; };
  const auto stage_cost = [&](int stage, int layers) { return (layers * block + extra(stage)) / speed(stage); };
  // Two layers each, then every further layer to the stage it leaves cheapest: for costs that
  // grow with each layer this minimises the dearest stage.
  std::vector<int> layers(static_cast<size_t>(stages), 2);
  for (int left = L - 2 * stages; left > 0; --left) {
    int to = 0;
    for (int r = 1; r < stages; ++r)
      if (stage_cost(r, layers[r] + 1) < stage_cost(to, layers[to] + 1)) to = r;
    ++layers[to];
  }
  std::vector<int> counts(static_cast<size_t>(2 * stages));
  for (int r = 0; r < stages; ++r) {
    // Chunk r (the embedding's on stage 0) and chunk 2 x stages - 1 - r (the head's): the split
    // with the cheaper dearer chunk, the earlier chunk taking more layers on a tie.
    const double first_extra = r == 0 ? embedding_cost(cfg) : 0.0, second_extra = r == 0 ? head_cost(cfg) : 0.0;
    const auto dearer = [&](int first) {
      return std::max(first * block + first_extra, (layers[r] - first) * block + second_extra);
    };
    int best = layers[r] - 1;
    for (int x = layers[r] - 2; x >= 1; --x)
      if (dearer(x) < dearer(best)) best = x;
    counts[r] = best;
    counts[2 * stages - 1 - r] = layers[r] - best;
  }
  return explicit_partition(counts);
}

std::string describe_partition(const std::vector<ChunkRange>& ranges) {
  std::string s;
  for (const ChunkRange& r : ranges) {
    if (!s.empty()) s += " ";
    s += "[" + std::to_string(r.first_layer) + "-" + std::to_string(r.end_layer - 1);
    if (r.has_embedding) s += " +emb";
    if (r.has_head) s += " +head";
    s += "]";
  }
  return s;
}

}  // namespace meshtrain
