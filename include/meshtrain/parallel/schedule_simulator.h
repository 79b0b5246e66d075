#pragma once
// A dry run of a pipeline schedule on every rank at once, without tensors or MPI: checks that a
// schedule (with its communication, see insert_communication) is complete and deadlock-free,
// and measures its makespan, bubble and activation memory under given per-action costs.
// It models the executor's semantics described in schedule.h under either communicator model:
// MPI (sends and receive posts never block; tags match messages) or NCCL (each transfer step is
// one blocking operation on the rank's in-order communication stream; no tags: messages between
// two ranks match in issue order). Either way a compute action starts when its rank is free and
// the step receiving its input has delivered it.

#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/parallel/schedule.h"

namespace meshtrain {

// Cost of one action of one chunk on one microbatch, in any time unit.
struct SimulationCosts {
  double forward = 1.0;
  double backward = 2.0;
  // Transfer time of one activation or gradient: data sent at time t reaches a receive posted
  // at time t' at max(t, t') + send. Taken by the link, not by either rank.
  double send = 0.0;
  // Per chunk (indexed by chunk, stages * virtual_stages entries) where chunks differ (the
  // first holds the embedding, the last the head): these replace forward / backward.
  std::vector<double> chunk_forward, chunk_backward;
  // The weight gradient's part of a backward, where a schedule splits it (BackwardWeight); the
  // input gradient (BackwardInput) takes the rest. Half: the two GEMMs of every linear layer are
  // the same size.
  double weight_share = 0.5;
  // Per chunk, where the halves of a split backward were measured apart (zero_bubble_costs.h):
  // BackwardInput and BackwardWeight take these instead of shares of the backward.
  std::vector<double> chunk_input, chunk_weight;
  double of(Action a) const;  // the cost of a compute action
};

// Point-to-point semantics to check a schedule under (schedule.h, "Execution semantics").
enum class CommModel { Mpi, Nccl };
std::string_view comm_model_name(CommModel model);  // "mpi", "nccl"

// What a schedule runs: training (a Forward and a Backward per chunk and microbatch), or
// evaluation (make_forward_only: Forwards only).
enum class Passes { ForwardAndBackward, ForwardOnly };

struct SimulationResult {
  bool ok = false;  // complete and deadlock-free
  // On failure: what went wrong (for a deadlock, which rank waits at which action for which
  // send; under NCCL, which transfer step blocks which stream, or which messages in-order
  // matching would pair wrongly; otherwise each missing, duplicated, misplaced or out-of-order
  // action), followed by the format_schedule grid with the offending actions in [brackets].
  std::string error;
  double makespan = 0.0;             // time until the last rank finishes
  std::vector<double> busy;          // per rank: compute time
  std::vector<double> finish;        // per rank: when its last compute ended
  double bubble_fraction = 0.0;      // 1 - sum(busy) / (ranks * makespan)
  std::vector<int> peak_in_flight;   // per rank: most (chunk, microbatch) forwards whose
                                     // backward (weight gradient, when split) has not run yet
                                     // (activations held)
};

// Checks, in this order (a failing stage reports all its problems and stops):
//   1. shape: `stages` rank lists; every action names a chunk in [0, stages * virtual_stages)
//      owned by its rank (chunk_owner under `placement`) and a microbatch in [0, microbatches);
//   2. completeness: every (chunk, microbatch) has exactly one Forward and either one Backward
//      or one BackwardInput and one BackwardWeight (a split backward), every
//      send has exactly one matching recv and vice versa, and no communication is present
//      where producer and consumer share a rank;
//   3. order on each rank: a Backward (or BackwardInput) after its Forward, a BackwardWeight
//      after its BackwardInput, a send after the compute producing its
//      data, a recv before the compute consuming it, and a compute after a same-rank producer;
//   4. under NCCL only, matching: the k-th send from rank a to rank b must be the partner of the
//      k-th receive at b from a, for every ordered pair of ranks;
//   5. the timed run, which fails only by deadlock. Under NCCL a step's transfers each complete
//      when the peer's step holding the partner is at the head of the peer's stream too (at
//      max(both heads' start) + send), and the step completes when all of its transfers have;
//      only then does the stream start its next step.
// EndStep actions only split transfer steps; the MPI model ignores them.
// Throws std::invalid_argument for stages, virtual_stages or microbatches below 1, or for the V
// placement with virtual_stages other than 2.
SimulationResult simulate(const Schedule& with_communication, int stages, int virtual_stages,
                          int microbatches, SimulationCosts costs = {},
                          CommModel model = CommModel::Mpi,
                          Passes passes = Passes::ForwardAndBackward,
                          ChunkPlacement placement = ChunkPlacement::Looped);

// Bubble fraction 1 - (useful time) / (ranks x makespan) of a schedule with uniform costs and
// free communication, for p = stages, m = microbatches, v = virtual_stages:
//   gpipe, 1f1b (v = 1):  (p - 1) / (m + p - 1)       GPipe, arXiv 1811.06965, section 2.3;
//                                                     the same for PipeDream-Flush 1F1B
//   interleaved:          (p - 1) / (v m + p - 1)     arXiv 2104.04473, section 2.2: the bubble
//                                                     time (p - 1)(tf + tb) shrinks by v
//   gpipe, v > 1:         1 - v m / ((v - 1) max(m, p) + m + p - 1)
//   zb-h1:                (p - 1) / (3m + p - 1)      for m >= p: arXiv 2401.10241, section
//                                                     3.1, with F = I = W (the simulator's
//                                                     default costs), bubble (p - 1)(F + I - W);
//                         1 - 3m / (2(m + p - 1) + 1) for m < p, make_zb_h1's own makespan
//   zb-v (v = 2):         1 - 6m / max(6m + p - 1, m + 4p): the makespan bound of schedule.h
//                         (make_zb_v), which make_zb_v meets for m = p or m >= p + 4 (p <= 8);
//                         a lower bound elsewhere
// The gpipe v > 1 line is this file's derivation for the breadth-first looped GPipe of make_gpipe: each
// pass through one chunk per rank takes max(m, p) forward slots (the first microbatch needs p
// slots to come back round to rank 0), and the final pass m + p - 1; backward mirrors forward.
// For m >= p it equals the interleaved formula. Throws std::invalid_argument where
// make_schedule would refuse the arguments.
double theoretical_bubble(ScheduleKind kind, int stages, int microbatches, int virtual_stages);

}  // namespace meshtrain
