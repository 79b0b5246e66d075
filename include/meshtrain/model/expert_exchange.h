#pragma once
// How a mixture of experts' rows travel between the tokens' ranks and their experts' ranks
// (expert parallelism, model/expert_parallel.h), and back.
//
// A rank routes its own tokens over all E experts (model/moe_routing.h) and lists their rows in
// expert order; with the experts split over the expert group (L = E / ep consecutive ones per
// rank), the rows for one rank are a contiguous block of that list. The dispatch:
//   1. counts: each rank sends each peer the rows it has for each of the peer's L experts
//      (Communicator::all_to_all_counts, L counts per peer);
//   2. rows: one all_to_all; a rank receives its peers' blocks peer by peer, each in expert order;
//   3. a local gather puts them in expert-major order (expert, then sending peer, then the
//      sender's order), so that each local expert's rows are contiguous for its GEMMs.
// The combine runs the same steps backward: the gather's inverse, then the all_to_all with the
// counts swapped. Every step keeps a fixed order, so the result does not depend on timing.
//
// Without expert parallelism the rows stay where they are: the expert side is the local list.

#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/model/expert_parallel.h"
#include "meshtrain/model/moe_routing.h"

namespace meshtrain {

class ExpertExchange {
 public:
  // Exchanges the counts (a blocking collective over the expert group, when it is on) and
  // builds the reordering; `category` holds its device index tensors.
  ExpertExchange(Backend& be, const ExpertParallel& ep, const Routing& routing,
                 MemoryCategory category);

  // The experts this rank computes (E / ep of them, from first_expert()), and on the expert
  // side each one's first row and row count.
  int64_t local_experts() const { return static_cast<int64_t>(counts_.size()); }
  int64_t first_expert() const { return first_expert_; }
  int64_t expert_begin(int64_t l) const { return begin_[static_cast<size_t>(l)]; }
  int64_t expert_rows(int64_t l) const { return counts_[static_cast<size_t>(l)]; }
  // Every local expert's row count, in order: the groups of the experts' grouped GEMMs.
  const std::vector<int64_t>& expert_row_counts() const { return counts_; }
  int64_t rows() const { return rows_; }  // on the expert side

  // The routing's expert-sorted rows (M, C) to the expert side (rows(), C); `meanwhile` runs
  // while they travel (the shared expert's work), before this returns. Without expert
  // parallelism: `local` itself, after `meanwhile`.
  Tensor to_experts(const Tensor& local, MemoryCategory category,
                    const std::function<void()>& meanwhile = nullptr) const;
  // The expert side's rows (rows(), C) back to the routing's expert-sorted order (M, C).
  Tensor from_experts(const Tensor& expert_side, MemoryCategory category) const;

 private:
  Backend* be_;
  ExpertParallel ep_;
  int64_t first_expert_ = 0, rows_ = 0, local_rows_ = 0;
  std::vector<int64_t> begin_, counts_;
  std::vector<int64_t> send_rows_, recv_rows_;  // per peer (expert parallelism only)
  Tensor to_expert_major_, to_peer_major_;      // (rows(), 1) int32 row indices
};

}  // namespace meshtrain
