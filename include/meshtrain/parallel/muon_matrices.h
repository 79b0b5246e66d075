#pragma once
// Muon's matrices in the training state, and which rank orthogonalises each (optim/muon.h).
//
// Each hidden matrix (ParamRole::HiddenMatrix: a linear layer's weight, or one slice of a
// stacked tensor (E, rows, cols): an expert, or the query, key or value of a fused projection)
// is one Muon matrix. Newton-Schulz costs O(rows cols
// min(rows, cols)) per matrix and needs it whole, so running it on every replica would repeat
// the optimizer's largest cost dp times. Instead each matrix has one owner in the group its
// parameter is replicated over (the data group, or the expert-data group of an expert), chosen
// greedily by cost, largest matrix first, to the least loaded rank: the groups' ranks share the
// iterations. Every replica keeps the momentum (an element-wise update of the reduced gradient
// that every replica holds under ZeRO 0), the owner orthogonalises, and one sum over the group
// of the buckets' update buffers (zero but at each rank's own matrices) hands every replica
// every update, so the replicas apply the same numbers and stay identical.

#include <cstdint>
#include <vector>

#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/state_layout.h"

namespace meshtrain {

struct MuonMatrix {
  int bucket = 0;
  int64_t offset = 0;  // in the bucket (ZeRO 0: its owned range is the whole bucket)
  int64_t rows = 0, cols = 0;
  const Parameter* param = nullptr;
  int slice = -1;  // the slice of a stacked tensor (E, rows, cols); -1: the whole parameter
  int owner = 0;    // the rank of the bucket's replica group that orthogonalises it
  // Newton-Schulz's multiply-adds per iteration, the owners' balance.
  double cost() const;
};

// Muon's matrices of the layout's buckets, with their owners, in bucket and parameter order.
std::vector<MuonMatrix> muon_matrices(const StateLayout& layout);

// Whether a parameter is stepped by Muon under these options.
bool takes_muon(const Parameter& p, const ModelStateOptions& options);

// Bucket b's segments that AdamW steps: every parameter's but Muon's.
std::vector<OptimizerSegment> adamw_segments(const StateLayout& layout, int b);

}  // namespace meshtrain
