#include "meshtrain/model/expert_exchange.h"

#include <limits>
#include <stdexcept>
#include <string>

namespace meshtrain {

namespace {

Tensor index_column(Backend& be, const std::vector<int32_t>& v, MemoryCategory category) {
  Tensor out = be.empty({static_cast<int64_t>(v.size()), 1}, DType::I32, category);
  be.copy_from_host(out, v.data());  // an empty one copies nothing
  return out;
}

}  // namespace

ExpertExchange::ExpertExchange(Backend& be, const ExpertParallel& ep, const Routing& routing,
                               MemoryCategory category)
    : be_(&be), ep_(ep), local_rows_(static_cast<int64_t>(routing.token_of_row.size())) {
  const int64_t E = routing.experts;
  if (!ep.on()) {
    begin_.assign(routing.expert_begin.begin(), routing.expert_begin.begin() + E);
    counts_ = routing.counts;
    rows_ = local_rows_;
    return;
  }
  const int P = ep.size();
  const int64_t L = E / P;
  first_expert_ = ep.rank() * L;
  // recv[p L + l]: the rows peer p has for this rank's expert l.
  const std::vector<int64_t> recv = ep.comm->all_to_all_counts(routing.counts);
  send_rows_.assign(static_cast<size_t>(P), 0);
  recv_rows_.assign(static_cast<size_t>(P), 0);
  counts_.assign(static_cast<size_t>(L), 0);
  for (int p = 0; p < P; ++p)
    for (int64_t l = 0; l < L; ++l) {
      send_rows_[static_cast<size_t>(p)] += routing.counts[static_cast<size_t>(p * L + l)];
      recv_rows_[static_cast<size_t>(p)] += recv[static_cast<size_t>(p * L + l)];
      counts_[static_cast<size_t>(l)] += recv[static_cast<size_t>(p * L + l)];
    }
  begin_.assign(static_cast<size_t>(L), 0);
  for (int64_t l = 1; l < L; ++l)
    begin_[static_cast<size_t>(l)] = begin_[static_cast<size_t>(l - 1)] + counts_[static_cast<size_t>(l - 1)];
  rows_ = begin_.empty() ? 0 : begin_.back() + counts_.back();
  if (rows_ > std::numeric_limits<int32_t>::max())
    throw std::runtime_error("mixture of experts: expert rank " + std::to_string(ep.rank()) +
                             " receives " + std::to_string(rows_) + " rows in one micro-batch, "
                             "more than a row index holds (2^31 - 1): use a smaller "
                             "train.micro_batch or a larger parallel.ep");

  // Peer-major row j (block p, then expert l, then the sender's order) <-> expert-major row i.
  std::vector<int32_t> to_expert(static_cast<size_t>(rows_)), to_peer(static_cast<size_t>(rows_));
  std::vector<int64_t> next = begin_;  // the next expert-major row of each local expert
  int64_t j = 0;
  for (int p = 0; p < P; ++p)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t n = 0; n < recv[static_cast<size_t>(p * L + l)]; ++n, ++j) {
        const int64_t i = next[static_cast<size_t>(l)]++;
        to_expert[static_cast<size_t>(i)] = static_cast<int32_t>(j);
        to_peer[static_cast<size_t>(j)] = static_cast<int32_t>(i);
      }
  to_expert_major_ = index_column(be, to_expert, category);
  to_peer_major_ = index_column(be, to_peer, category);
}

Tensor ExpertExchange::to_experts(const Tensor& local, MemoryCategory category,
                                  const std::function<void()>& meanwhile) const {
  if (!ep_.on()) {
    if (meanwhile) meanwhile();
    return local;
  }
  const int64_t C = local.dim(1);
  Tensor received = be_->empty({rows_, C}, local.dtype(), MemoryCategory::Workspace);
  Work travel = ep_.comm->all_to_all(received, local, send_rows_, recv_rows_);
  if (meanwhile) meanwhile();
  travel.wait();
  Tensor out = be_->empty({rows_, C}, local.dtype(), category);
  be_->gather_rows(out, received, to_expert_major_, nullptr);
  return out;
}

Tensor ExpertExchange::from_experts(const Tensor& expert_side, MemoryCategory category) const {
  if (!ep_.on()) return expert_side;
  const int64_t C = expert_side.dim(1);
  Tensor peer_major = be_->empty({rows_, C}, expert_side.dtype(), MemoryCategory::Workspace);
  be_->gather_rows(peer_major, expert_side, to_peer_major_, nullptr);
  Tensor out = be_->empty({local_rows_, C}, expert_side.dtype(), category);
  ep_.comm->all_to_all(out, peer_major, recv_rows_, send_rows_).wait();
  return out;
}

}  // namespace meshtrain
