// Muon's matrices in the buckets, their owners, and the segments left to AdamW.
#include "meshtrain/parallel/muon_matrices.h"

#include <algorithm>
#include <numeric>

namespace meshtrain {

double MuonMatrix::cost() const {
  const double shorter = static_cast<double>(std::min(rows, cols));
  const double longer = static_cast<double>(std::max(rows, cols));
  // The Gram matrix and the product with it (shorter^2 longer each), and the Gram's square.
  return 2 * shorter * shorter * longer + shorter * shorter * shorter;
}

bool takes_muon(const Parameter& p, const ModelStateOptions& options) {
  return options.optimizer == OptimizerKind::Muon && p.spec.role == ParamRole::HiddenMatrix;
}

namespace {

// Each group's matrices to its ranks: largest cost first, each to the least loaded rank (the
// lowest on a tie), the same on every rank.
void assign_owners(std::vector<MuonMatrix>& matrices, const StateLayout& layout, ReplicaGroup group) {
  std::vector<size_t> order;
  for (size_t i = 0; i < matrices.size(); ++i)
    if (layout.plan().buckets[matrices[i].bucket].group == group) order.push_back(i);
  if (order.empty()) return;
  const int ranks = layout.groups().replicas_of(group).size();
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return matrices[a].cost() > matrices[b].cost(); });
  std::vector<double> load(static_cast<size_t>(ranks), 0.0);
  for (size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());
    matrices[i].owner = static_cast<int>(least - load.begin());
    *least += matrices[i].cost();
  }
}

}  // namespace

std::vector<MuonMatrix> muon_matrices(const StateLayout& layout) {
  std::vector<MuonMatrix> out;
  for (int b = 0; b < layout.buckets(); ++b) {
    const Bucket& bk = layout.plan().buckets[b];
    for (size_t i = 0; i < bk.params.size(); ++i) {
      const Parameter& p = *bk.params[i];
      if (!takes_muon(p, layout.options())) continue;
      const Shape& s = p.shape;  // (rows, cols), or stacked (E, rows, cols)
      const bool stacked = s.rank() == 3;
      const int count = stacked ? static_cast<int>(s[0]) : 1;
      const int64_t rows = s[s.rank() - 2], cols = s[s.rank() - 1];
      for (int e = 0; e < count; ++e)
        out.push_back({b, bk.offsets[i] + e * rows * cols, rows, cols, &p, stacked ? e : -1, 0});
    }
  }
  assign_owners(out, layout, ReplicaGroup::Data);
  assign_owners(out, layout, ReplicaGroup::ExpertData);
  return out;
}

std::vector<OptimizerSegment> adamw_segments(const StateLayout& layout, int b) {
  const std::vector<OptimizerSegment>& all = layout.bucket(b).decay_segments;
  if (layout.options().optimizer != OptimizerKind::Muon) return all;
  // ZeRO 0 (the only stage Muon runs under): the owned range is the bucket, one segment per
  // parameter, in the bucket's order.
  const Bucket& bk = layout.plan().buckets[b];
  std::vector<OptimizerSegment> out;
  for (size_t i = 0; i < bk.params.size(); ++i)
    if (!takes_muon(*bk.params[i], layout.options())) out.push_back(all[i]);
  return out;
}

}  // namespace meshtrain
