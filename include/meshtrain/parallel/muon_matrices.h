#pragma once
// Muon's matrices in the training state, and which rank orthogonalises each (optim/muon.h).
//
// Each hidden matrix (ParamRole::HiddenMatrix: a linear layer's weight, or one slice of a
// stacked tensor (E, rows, cols): an expert, or the query, key or value of a fused projection)
// is one Muon matrix. Newton-Schulz costs O(rows cols min(rows, cols)) per matrix and needs it
// whole, so running it on every replica would repeat the optimizer's largest cost dp times.
// Instead each matrix has one owner among the ranks that hold a piece or a copy of it: the
// group its parameter is replicated over (the data group, or the expert-data group of an
// expert) times the tensor group, chosen greedily by cost, largest matrix first, to the least
// loaded rank: the ranks share the iterations. The momentum lives where AdamW's exp_avg would
// be, element for element (this rank's tensor-parallel piece, and under ZeRO its owned range of
// the bucket), so checkpoints hold it layout-free like AdamW's moments; each rank moves the
// momentum of what it owns. The step then moves whole matrices (ShardedOptimizer::step_muon):
// ZeRO's pieces are all-gathered over the replica group, the tensor-parallel pieces summed into
// place over the tensor group, the owner orthogonalises (the others zero theirs), and the same
// two sums backwards hand every rank its piece of the update: each sum adds one matrix to
// zeros, exactly, so every layout applies the single rank's numbers.
#include <cstdint>
#include <vector>

#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/state_layout.h"

namespace meshtrain {

struct MuonMatrix {
  int bucket = 0;
  int64_t offset = 0;  // in the bucket (ZeRO 0: its owned range is the whole bucket)
  int64_t rows = 0, cols = 0;  // this rank's piece (its tensor-parallel shard)
  int64_t global_rows = 0, global_cols = 0;  // the whole matrix, which Newton-Schulz sees
  // The matrix's dimension split over the tensor group (0: rows, 1: columns; -1: whole on every
  // tensor rank) and the first row or column of this rank's piece.
  int tp_dim = -1;
  int64_t tp_begin = 0;
  int64_t whole_offset = 0;  // in the bucket's buffer of whole matrices (tensor group > 1)
  const Parameter* param = nullptr;
  int slice = -1;  // the slice of a stacked tensor (E, rows, cols); -1: the whole parameter
  // The rank that orthogonalises it, in the replica group x tensor group, numbered
  // replica rank x tp + tensor rank (owner_index below).
  int owner = 0;
  // Newton-Schulz's multiply-adds per iteration on the whole matrix, the owners' balance.
  double cost() const;
};

// Muon's matrices of the layout's buckets, with their owners, in bucket and parameter order.
std::vector<MuonMatrix> muon_matrices(const StateLayout& layout);

// This rank's number among a bucket's owners: replica rank x tensor size + tensor rank.
int owner_index(const StateLayout& layout, int bucket);

// Elements of bucket b's whole matrices (the buffer they are gathered into when tp > 1).
int64_t whole_matrix_elements(const std::vector<MuonMatrix>& matrices, int bucket);

// Whether a parameter is stepped by Muon under these options.
bool takes_muon(const Parameter& p, const ModelStateOptions& options);

// Bucket b's segments that AdamW steps: every parameter's but Muon's.
std::vector<OptimizerSegment> adamw_segments(const StateLayout& layout, int b);

}  // namespace meshtrain
