#pragma once
// ZB-V re-planned for measured costs. make_zb_v plays its list scheduler on a unit clock
// (F = I = W); on real hardware an input gradient costs more than a forward (attention's
// backward has no weight half), the head's chunk more than the others, and a schedule made for
// equal costs leaves a rank waiting on a chain of input gradients every micro-batch. Given each
// chunk's measured F, I and W, this plays the same list scheduler on a real clock, over a family
// of priority orders, memory caps and waiting slacks, and keeps the candidate the simulator
// (schedule_simulator.h) finds shortest under those costs, if it beats make_zb_v's.
//
// What does not change, whatever the costs (so a run re-planned from timings trains bit for bit
// like one that is not):
//   - per chunk, F, I and W each run in ascending micro-batch order (every gradient sum's order);
//   - with tied embeddings, on the rank holding both the head (chunk 2p - 1) and the embedding
//     (chunk 0), the order of the head's forwards (whose backward runs inside them) and chunk 0's
//     weight gradients is make_zb_v's: both add to the one gradient, in that order;
//   - memory: on every rank, neither the chunk-micro-batches held from F to W nor those held
//     from F to I ever outnumber make_zb_v's peak on that rank (what `plan` counted).

#include <string>
#include <vector>

#include "meshtrain/parallel/schedule.h"
#include "meshtrain/parallel/schedule_simulator.h"

namespace meshtrain {

// The time of one action of one chunk on one micro-batch, per chunk in model order (2 x stages
// entries each), in any unit (the trainer passes whole microseconds).
struct ChunkActionCosts {
  std::vector<double> forward, input, weight;
  // From the end of an action to the start of its consumer on another rank: the transfer and
  // whatever the MPI progress of the two ranks adds (fit_send_time).
  double send = 0;
};

struct CostedSchedule {
  Schedule compute;           // compute-only, as make_zb_v's (insert_communication adds the rest)
  bool replanned = false;     // false: make_zb_v's own schedule was the shortest
  double makespan = 0;        // simulated under the costs (MPI model, free transfers)
  double bubble = 0;
  double unit_makespan = 0;   // make_zb_v's schedule, simulated under the same costs
  double unit_bubble = 0;
};

// Throws std::invalid_argument when a cost vector's size is not 2 x stages or a cost is not
// positive and finite, and where make_zb_v refuses the sizes.
CostedSchedule make_zb_v_for_costs(int stages, int microbatches, const ChunkActionCosts& costs,
                                   bool tied_embeddings = true);

// The transfer time that makes make_zb_v's schedule, simulated under `costs`, take
// `measured_makespan` (what a step took): with large messages a transfer completes only when
// both ranks make MPI progress, so a schedule that hands an input gradient on just in time
// waits for more than the copy. 0 where even free transfers do not explain the measured time
// away (the executor's early weight gradients beat the plan); at most four times the mean
// action. A bisection: the simulated makespan grows with the transfer time.
double fit_send_time(int stages, int microbatches, const ChunkActionCosts& costs,
                     double measured_makespan);

// The same costs as the simulator takes them (schedule_simulator.h).
SimulationCosts simulation_costs(const ChunkActionCosts& costs);

// "F 2.75/2.73/2.71/3.05 I ... W ... ms" for logs (costs in microseconds).
std::string format_chunk_costs(const ChunkActionCosts& costs);

}  // namespace meshtrain
