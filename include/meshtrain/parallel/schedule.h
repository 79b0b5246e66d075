#pragma once
// Pipeline schedules as data: which compute and communication actions each pipeline rank runs,
// in order. The generators here produce compute-only schedules (GPipe, 1F1B, interleaved 1F1B);
// a separate pass inserts the point-to-point sends and receives. Nothing here executes
// anything: the executor walks these lists, and schedule_simulator.h dry-runs them to prove
// them deadlock-free and to measure the bubble.
//
// Layout: with pp ranks and v virtual stages there are pp * v model chunks, placed on ranks by a
// ChunkPlacement (below). The looped placement is every ScheduleKind's but zb-v's; the V
// placement is zb-v's (make_zb_v). schedule_placement names a kind's.
//
// Execution semantics. Sends and receives are issued in *transfer steps*: a run of consecutive
// communication actions in a rank's list is one step, issued together (one MPI post of every
// request, one ncclGroupStart/End); an EndStep action separates two steps that follow each other
// with no compute between them. The schedules insert_communication builds are correct under both
// communicator models the simulator checks (schedule_simulator.h):
//   - MPI: a send or a posted receive never stalls its rank, and messages between two ranks are
//     matched by (chunk, microbatch, direction) tags, so their order does not matter;
//   - NCCL: every step is one operation on the rank's single communication stream, which runs
//     steps in issue order, each until all its transfers have met their peers' (blocking); and
//     messages carry no tags: the k-th send from rank a to rank b is the k-th receive at b from a.
// In both, a compute action waits for the step that receives its input; a rank stalls only there.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/parallel/schedule_kind.h"

namespace meshtrain {

enum class Op : uint8_t {
  Forward,
  Backward,  // the whole backward: input gradient and weight gradient
  SendForward,
  RecvForward,
  SendBackward,
  RecvBackward,
  // Zero-bubble schedules (Qi et al., arXiv 2401.10241) split a backward in two: the input
  // gradient (which the previous stage waits for) and the weight gradient (which nobody waits
  // for, so it can fill a bubble). A (chunk, microbatch) has either one Backward, or one
  // BackwardInput and, later on the same rank, one BackwardWeight.
  BackwardInput,
  BackwardWeight,
  EndStep,  // ends a transfer step where the next action is another step's transfer
};

// One step of one rank. The chunk of a Send is the chunk that produced the data; the chunk of a
// Recv is the chunk that consumes it. So SendForward(k, m) on rank k % pp pairs with
// RecvForward(k + 1, m), and SendBackward(k, m) pairs with RecvBackward(k - 1, m).
struct Action {
  int chunk = 0;  // global model chunk index in [0, pp * v)
  Op op = Op::Forward;
  int microbatch = 0;

  // "2F0", "2B3", "2I3", "2W3", "1SEND_F0", "1RECV_F0", "1SEND_B2", "1RECV_B2" (PyTorch
  // pipelining's notation: B the whole backward, I its input-gradient and W its weight-gradient
  // part); an EndStep prints as "|" (its chunk and microbatch are 0).
  std::string to_string() const;
  // Inverse of to_string; throws std::invalid_argument naming the bad text and the format.
  static Action parse(std::string_view s);
  bool operator==(const Action&) const = default;
};

bool is_compute(Op op);        // Forward, Backward, BackwardInput or BackwardWeight
// Backward or BackwardInput: consumes the output's gradient and produces the input's.
bool is_input_gradient(Op op);
bool is_communication(Op op);  // a send or a receive (not EndStep)

// One ordered action list per pipeline rank (index = pp rank).
using Schedule = std::vector<std::vector<Action>>;

// Which pipeline rank runs each global chunk.
//   Looped: chunk k on rank k % pp, as its virtual chunk k / pp (Megatron's interleaving). The
//           data goes round the ranks v times: chunk pp - 1 -> pp crosses from the last rank
//           back to the first.
//   V:      exactly two chunks per rank, chunk k on rank k for k < pp and on rank 2 pp - 1 - k
//           after (ZB-V, Qi et al., arXiv 2401.10241, section 6). The data goes down the ranks
//           and back up, so rank 0 holds both the first and the last chunk, and chunks pp - 1 and
//           pp share the last rank: that hand-over is local (no send, no receive). Rank r runs
//           chunks r and 2 pp - 1 - r, whose activations sum to one full stage's, so counting
//           in flight per chunk a rank holding 2 pp holds what 1F1B's rank 0 holds with pp.
// For 8 chunks on pp = 4:  looped  0 1 2 3 0 1 2 3   V  0 1 2 3 3 2 1 0  (rank of chunk 0..7).
enum class ChunkPlacement { Looped, V };
std::string_view placement_name(ChunkPlacement placement);  // "looped", "v"
// The rank of `chunk`. Throws std::invalid_argument for stages below 1, a negative chunk, or
// under V a chunk outside [0, 2 * stages).
int chunk_owner(int chunk, int stages, ChunkPlacement placement);
// The placement a schedule runs its chunks in: V for zb-v, looped for every other kind.
ChunkPlacement schedule_placement(ScheduleKind kind);
// The stage of every chunk, in model order (chunk_owner of each).
std::vector<int> chunk_owners(int stages, int virtual_stages, ChunkPlacement placement);
// The chunks `rank` holds, in model order (its stage's chunk list: model/pipeline_stage.h), and a chunk's
// index in that list on its owner. Looped: r, r + pp, ...; V: r and 2 pp - 1 - r.
std::vector<int> rank_chunks(int rank, int stages, int virtual_stages, ChunkPlacement placement);
int local_chunk(int chunk, int stages, ChunkPlacement placement);


// Compute-only schedules. All throw std::invalid_argument for stages, microbatches or
// virtual_stages below 1.
//
// GPipe (Huang et al., arXiv 1811.06965): every forward, then every backward. With
// virtual_stages > 1 each rank runs its chunks breadth-first ("looped BFS"): all microbatches
// through its first chunk, then its second, ...; backwards go through the chunks in reverse.
Schedule make_gpipe(int stages, int microbatches, int virtual_stages = 1);
// 1F1B as in PipeDream-Flush (Narayanan et al., arXiv 2006.09668): rank r warms up with
// min(stages - r - 1, m) forwards, then alternates one forward and one backward, then drains
// the remaining backwards. One chunk per rank; the interleaved form is make_interleaved.
Schedule make_1f1b(int stages, int microbatches);
// Interleaved 1F1B (Narayanan et al., arXiv 2104.04473, section 2.2): v chunks per rank,
// microbatches in groups of `stages`. Requires microbatches % stages == 0. With
// virtual_stages == 1 this is exactly make_1f1b.
Schedule make_interleaved(int stages, int microbatches, int virtual_stages);
// ZB-H1 (Qi et al., arXiv 2401.10241, section 3.1): one chunk per rank, 1F1B's order with every
// backward split into BackwardInput and BackwardWeight, and rank r running each W r microbatches
// late, so that weight gradients fill the cool-down. Every rank holds at most min(m, stages)
// microbatches from forward to weight gradient: 1F1B's peak, which is rank 0's. With F, I and W
// of equal cost the makespan is 3m + p - 1 for m >= p (the paper's bubble (p - 1)(F + I - W))
// against 1F1B's 3(m + p - 1). W runs in ascending microbatch order, as every backward here.
Schedule make_zb_h1(int stages, int microbatches);
// ZB-V (Qi et al., arXiv 2401.10241, section 6): two chunks per rank in the V placement (pass
// ChunkPlacement::V and virtual_stages = 2 to insert_communication and simulate), every backward
// split into I and W. Built by a list scheduler on a unit clock (F = I = W = 1 per chunk): at
// each tick every rank runs its most urgent ready action, and a forward only while the rank holds
// fewer than min(2m, 2pp) chunk-microbatches from forward to weight gradient: 1F1B's activation
// memory (see ChunkPlacement). A few priority orders and caps are tried and the shortest schedule
// kept (zero_bubble_schedules.cpp). Per chunk, F, I and W each run in ascending microbatch order,
// so parameter gradients accumulate in the same order as under every other schedule.
//
// Makespan, with F = I = W: each rank has 6m units of work, and the last rank can start none of
// it before its first input has passed pp - 1 ranks, so no schedule beats 6m + pp - 1; nor
// m + 4pp (the last microbatch enters at m - 1, then runs 2pp forwards and 2pp input gradients
// in a chain, then a W), which is the larger only for m < pp. For pp <= 8 (schedule test)
// make_zb_v's makespan is 6m + pp - 1, the bound, where m = pp or m >= pp + 4, so its bubble is
//   (pp - 1) / (6m + pp - 1):  1/49 = 0.020 at pp = 2, m = 8; 3/51 = 0.059 at pp = 4, m = 8
//                              (no ZB-V schedule does better there); 3/99 = 0.030 at pp = 4,
//                              m = 16; 7/103 = 0.068 at pp = 8, m = 16.
// For pp < m < pp + 4 it is within pp / 2 units of the bound: there the memory cap costs time
// (allowed a few more chunk-microbatches, the same scheduler reaches the bound). That is ZB-H1's
// (pp - 1) / (3m + pp - 1) with the start-up cost halved: the first input reaches the last rank
// after pp - 1 half-stage forwards instead of full ones.
Schedule make_zb_v(int stages, int microbatches);
// Dispatch. OneFOneB and ZeroBubbleH1 refuse virtual_stages > 1 (pointing to interleaved);
// ZeroBubbleV needs virtual_stages = 2 and the V placement; GPipe accepts any.
Schedule make_schedule(ScheduleKind kind, int stages, int microbatches, int virtual_stages);

// Adds the sends and receives a compute-only schedule needs, grouped into transfer steps that
// are correct by construction under both communicator models. A chunk's output goes to the next
// chunk (forward) and its input-gradient to the previous one (backward); when both chunks are on
// the same rank under `placement` (every chunk with stages == 1; chunks pp - 1 and pp under V)
// the executor hands the tensor over locally and nothing is inserted.
//
// Placement, on a clock: the compute-only schedule is played with a forward taking 1 and a
// backward 2 time units, each compute starting when its rank's previous compute and the compute
// producing its input have ended. Every transfer is made in the step at its producer's end time,
// on both ranks: the sender's step follows the compute that produced the data, and the
// receiver's step comes after everything that ended by then on its rank. So
//   - every rank's list is ordered by time, a step of time t holds only transfers made at t on
//     both ends, and a compute waits only for steps of earlier times: two peers issue matching
//     steps in the same order, and no wait, blocking or not, closes a cycle (no deadlock);
//   - a rank's computes do not overlap, so a directed pair of ranks carries at most one message
//     per time, and in-order (tag-less) matching pairs exactly the right messages;
//   - a receive is issued before the compute that needs it, at the latest when its producer has
//     ended on the placement clock, so the transfer overlaps the receiver's work.
// The clock only orders the steps: any positive costs would be as correct; with these, the usual
// ratio, the simulator finds the blocking NCCL model as bubble-free as MPI's (schedule_test).
//
// A compute-only schedule that deadlocks under any communicator (a rank waits for an input whose
// producer waits for it) gets its remaining receives right before their consumers; the simulator
// then reports the deadlock.
//
// Throws std::invalid_argument when `compute` has a communication action, a chunk outside
// [0, stages * virtual_stages), or not exactly `stages` rank lists, or for the V placement with
// virtual_stages other than 2.
Schedule insert_communication(const Schedule& compute, int stages, int virtual_stages,
                              ChunkPlacement placement = ChunkPlacement::Looped);

// Forward-only actions for evaluation, with their communication: each rank runs its chunks
// micro-batch by micro-batch (microbatch-major, then its chunks in model order), in `placement`.
Schedule make_forward_only(int stages, int microbatches, int virtual_stages,
                           ChunkPlacement placement = ChunkPlacement::Looped);

// Where an action sits in a schedule.
struct ActionPosition {
  int rank = 0;
  int step = 0;
  bool operator==(const ActionPosition&) const = default;
};

// A step x rank grid, one column per rank and one row per list index (not a timeline), for logs
// and error messages. Actions at `marked` positions are shown in [brackets].
std::string format_schedule(const Schedule& schedule,
                            const std::vector<ActionPosition>& marked = {});

}  // namespace meshtrain
