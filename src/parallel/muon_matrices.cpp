// Muon's matrices in the buckets, their owners, and the segments left to AdamW.
#include "meshtrain/parallel/muon_matrices.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace meshtrain {

double MuonMatrix::cost() const {
  const double shorter = static_cast<double>(std::min(global_rows, global_cols));
  const double longer = static_cast<double>(std::max(global_rows, global_cols));
  // The Gram matrix and the product with it (shorter^2 longer each), and the Gram's square.
  return 2 * shorter * shorter * longer + shorter * shorter * shorter;
}

bool takes_muon(const Parameter& p, const ModelStateOptions& options) {
  return options.optimizer == OptimizerKind::Muon && p.spec.role == ParamRole::HiddenMatrix;
}

namespace {

// Each group's matrices to its ranks (times the tensor group's): largest cost first, each to
// the least loaded rank (the lowest on a tie), the same on every rank: the costs are the whole
// matrices', which every tensor rank knows alike.
void assign_owners(std::vector<MuonMatrix>& matrices, const StateLayout& layout, ReplicaGroup group) {
  std::vector<size_t> order;
  for (size_t i = 0; i < matrices.size(); ++i)
    if (layout.plan().buckets[matrices[i].bucket].group == group) order.push_back(i);
  if (order.empty()) return;
  const int ranks = layout.groups().replicas_of(group).size() * layout.groups().tp->size();
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return matrices[a].cost() > matrices[b].cost(); });
  std::vector<double> load(static_cast<size_t>(ranks), 0.0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());
    matrices[i].owner = static_cast<int>(least - load.begin());
    *least += matrices[i].cost();
  }
}

// A matrix of parameter p (slice e of a stack, or -1), its tensor-parallel split read from the
// parameter: a split along a matrix's rows or columns; a stack split along its slices would give
// the tensor ranks different matrices, which no layer registers.
MuonMatrix matrix_of(const Parameter& p, int bucket, int64_t offset, int e, int tp) {
  const Shape& s = p.shape;  // (rows, cols), or stacked (E, rows, cols)
  MuonMatrix m;
  m.bucket = bucket;
  m.rows = s[s.rank() - 2];
  m.cols = s[s.rank() - 1];
  m.offset = offset + (e < 0 ? 0 : e * m.rows * m.cols);
  m.global_rows = m.rows;
  m.global_cols = m.cols;
  m.param = &p;
  m.slice = e;
  const int split = p.spec.tp_split_dim;
  if (split < 0 || tp == 1) return m;
  m.tp_dim = split - (s.rank() - 2);
  if (m.tp_dim < 0)
    throw std::logic_error("Muon: " + p.spec.name + " is split over the tensor group along its " +
                           "stacked dimension " + std::to_string(split) +
                           "; Muon gathers splits of a matrix's rows or columns only");
  m.tp_begin = p.split_begin;
  (m.tp_dim == 0 ? m.global_rows : m.global_cols) *= tp;
  return m;
}

}  // namespace

int owner_index(const StateLayout& layout, int bucket) {
  const Communicator& tp = *layout.groups().tp;
  return layout.replicas(bucket).rank() * tp.size() + tp.rank();
}

int64_t whole_matrix_elements(const std::vector<MuonMatrix>& matrices, int bucket) {
  int64_t n = 0;
  for (const MuonMatrix& m : matrices)
    if (m.bucket == bucket) n = std::max(n, m.whole_offset + m.global_rows * m.global_cols);
  return n;
}

std::vector<MuonMatrix> muon_matrices(const StateLayout& layout) {
  std::vector<MuonMatrix> out;
  const int tp = layout.groups().tp->size();
  for (int b = 0; b < layout.buckets(); ++b) {
    const Bucket& bk = layout.plan().buckets[b];
    int64_t whole = 0;
    for (size_t i = 0; i < bk.params.size(); ++i) {
      const Parameter& p = *bk.params[i];
      if (!takes_muon(p, layout.options())) continue;
      const bool stacked = p.shape.rank() == 3;
      const int count = stacked ? static_cast<int>(p.shape[0]) : 1;
      for (int e = 0; e < count; ++e) {
        out.push_back(matrix_of(p, b, bk.offsets[i], stacked ? e : -1, tp));
        out.back().whole_offset = whole;
        whole += out.back().global_rows * out.back().global_cols;
      }
    }
  }
  assign_owners(out, layout, ReplicaGroup::Data);
  assign_owners(out, layout, ReplicaGroup::ExpertData);
  return out;
}

std::vector<OptimizerSegment> adamw_segments(const StateLayout& layout, int b) {
  const std::vector<OptimizerSegment>& all = layout.bucket(b).decay_segments;
  if (layout.options().optimizer != OptimizerKind::Muon) return all;
  // The decay segments are the parameters' pieces in the owned range, in the bucket's order
  // (StateLayout::find_segments): the same intersections, less Muon's.
  const Bucket& bk = layout.plan().buckets[b];
  const int64_t lo = layout.owned_begin(b), hi = lo + layout.owned_size(b);
  std::vector<OptimizerSegment> out;
  size_t seg = 0;
  for (size_t i = 0; i < bk.params.size(); ++i) {
    OptimizerSegment piece;
    if (!intersect(bk.offsets[i], bk.offsets[i] + bk.params[i]->numel(), lo, hi, piece)) continue;
    if (!takes_muon(*bk.params[i], layout.options())) out.push_back(all[seg]);
    ++seg;
  }
  return out;
}

}  // namespace meshtrain
