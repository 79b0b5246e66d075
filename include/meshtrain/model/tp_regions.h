#pragma once
// Tensor- and sequence-parallel region boundaries as named forward/backward pairs, after
// Megatron-LM (Shoeybi et al., arXiv 1909.08053; sequence parallelism: Korthikanti et al.,
// arXiv 2205.05198). N is a micro-batch's token count; a sequence-parallel region holds this
// rank's contiguous N/tp tokens of the flattened (B*T) token dimension.
//
//   region boundary               forward                       backward
//   copy_to_tp_region             identity                      all-reduce
//   reduce_from_tp_region         all-reduce                    identity
//   gather_from_sp_region         all-gather (N/tp -> N)        reduce-scatter (N -> N/tp)
//   reduce_scatter_to_sp_region   reduce-scatter (N -> N/tp)    all-gather (N/tp -> N)
//
// "enter" is the boundary in front of a column-parallel layer (copy_to / gather_from);
// "exit" the one behind a row-parallel layer (reduce_from / reduce_scatter_to). Each is written
// once here and chosen by the sequence-parallel setting.

#include "meshtrain/backend/backend.h"
#include "meshtrain/comm/communicator.h"

namespace meshtrain {

enum class SequenceParallel { Off, On };

struct TensorParallel {
  Communicator* comm = nullptr;  // the tp group
  SequenceParallel sequence = SequenceParallel::Off;

  int rank() const { return comm->rank(); }
  int size() const { return comm->size(); }
  bool sequence_parallel() const { return sequence == SequenceParallel::On; }
  // Tokens this rank holds in the sequence/replicated region of an N-token micro-batch.
  int64_t local_tokens(int64_t N) const { return sequence_parallel() ? N / size() : N; }
  // Flat index of this rank's first token in that region.
  int64_t token_begin(int64_t N) const { return sequence_parallel() ? rank() * (N / size()) : 0; }
  // The same group without sequence parallelism: generation's one token does not split, and the
  // weights are the same either way (only gradients and communication differ).
  TensorParallel without_sequence() const { return TensorParallel{comm, SequenceParallel::Off}; }
};

// Forward of the boundary before a column-parallel layer: (N_local, C) -> (N, C).
// Returns `x` itself where no communication is needed.
Tensor enter_tp_region_forward(Backend& be, const TensorParallel& tp, const Tensor& x,
                               MemoryCategory category);
// Its backward: partial (N, C) input gradients summed over the group, -> (N_local, C). Without
// sequence parallelism the sum is taken in place: `dx` is consumed.
Tensor enter_tp_region_backward(Backend& be, const TensorParallel& tp, const Tensor& dx,
                                MemoryCategory category);
// Forward of the boundary after a row-parallel layer: partial (N, C) -> (N_local, C); in place
// (consuming `partial`) without sequence parallelism.
Tensor exit_tp_region_forward(Backend& be, const TensorParallel& tp, const Tensor& partial,
                              MemoryCategory category);
// Its backward: (N_local, C) -> (N, C).
Tensor exit_tp_region_backward(Backend& be, const TensorParallel& tp, const Tensor& dy,
                               MemoryCategory category);

}  // namespace meshtrain
