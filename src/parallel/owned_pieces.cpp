// The owned pieces a checkpoint reads and writes.
#include "meshtrain/parallel/owned_pieces.h"

namespace meshtrain {

std::vector<OwnedPiece> owned_pieces(StateLayout& layout, ShardedOptimizer& optimizer) {
  std::vector<OwnedPiece> out;
  const bool tp_leader = layout.groups().tp->rank() == 0;
  for (int b = 0; b < layout.buckets(); ++b) {
    const Bucket& bk = layout.plan().buckets[b];
    AdamW& adamw = optimizer.adamw(b);
    const int64_t lo = layout.owned_begin(b), hi = lo + layout.owned_size(b);
    const bool replica_leader = layout.zero() >= 1 || layout.replicas(b).rank() == 0;
    Tensor values = optimizer.values(b);
    for (size_t i = 0; i < bk.params.size(); ++i) {
      OptimizerSegment seg;
      if (!intersect(bk.offsets[i], bk.offsets[i] + bk.params[i]->numel(), lo, hi, seg)) continue;
      const Parameter& p = *bk.params[i];
      OwnedPiece piece;
      piece.param = bk.params[i];
      piece.local_begin = lo + seg.offset - bk.offsets[i];
      piece.count = seg.count;
      piece.value = values.view(seg.offset, {seg.count});
      piece.exp_avg = adamw.exp_avg().view(seg.offset, {seg.count});
      piece.exp_avg_sq = adamw.exp_avg_sq().view(seg.offset, {seg.count});
      piece.backend = &layout.state_backend();
      piece.primary = replica_leader && (p.spec.tp_split_dim >= 0 || tp_leader) && !p.tied_copy;
      out.push_back(piece);
    }
  }
  return out;
}

}  // namespace meshtrain
