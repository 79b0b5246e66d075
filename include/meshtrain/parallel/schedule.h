#pragma once
// Pipeline schedules as data: which compute and communication actions each pipeline rank runs,
// in order. The generators here produce compute-only schedules (GPipe, 1F1B, interleaved 1F1B);
// a separate pass inserts the point-to-point sends and receives. Nothing here executes
// anything: the executor walks these lists, and schedule_simulator.h dry-runs them to prove
// them deadlock-free and to measure the bubble.
//
// Layout (same as model/partition.h): with pp ranks and v virtual stages there are pp * v model
// chunks; global chunk k lives on pipeline rank k % pp as its virtual chunk k / pp.
//
// Execution semantics (the executor implements them, the simulator models them):
//   - a send is non-blocking (MPI_Isend, completed later) and never stalls its rank;
//   - a recv posts a non-blocking receive (MPI_Irecv) and never stalls its rank either;
//   - a compute action waits for the receive of each of its inputs, so a rank stalls only at a
//     compute action whose input the peer has not yet sent.
// Messages between two ranks are matched by (chunk, microbatch, direction) tags, so the order
// of different messages between the same pair does not matter.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

enum class Op : uint8_t { Forward, Backward, SendForward, RecvForward, SendBackward, RecvBackward };

// One step of one rank. The chunk of a Send is the chunk that produced the data; the chunk of a
// Recv is the chunk that consumes it. So SendForward(k, m) on rank k % pp pairs with
// RecvForward(k + 1, m), and SendBackward(k, m) pairs with RecvBackward(k - 1, m).
struct Action {
  int chunk = 0;  // global model chunk index in [0, pp * v)
  Op op = Op::Forward;
  int microbatch = 0;

  // "2F0", "2B3", "1SEND_F0", "1RECV_F0", "1SEND_B2", "1RECV_B2" (PyTorch pipelining's notation).
  std::string to_string() const;
  // Inverse of to_string; throws std::invalid_argument naming the bad text and the format.
  static Action parse(std::string_view s);
  bool operator==(const Action&) const = default;
};

bool is_compute(Op op);  // Forward or Backward

// One ordered action list per pipeline rank (index = pp rank).
using Schedule = std::vector<std::vector<Action>>;

enum class ScheduleKind { GPipe, OneFOneB, Interleaved };
std::string_view schedule_name(ScheduleKind kind);  // "gpipe", "1f1b", "interleaved"

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
// Dispatch. OneFOneB refuses virtual_stages > 1 (pointing to interleaved); GPipe accepts it.
Schedule make_schedule(ScheduleKind kind, int stages, int microbatches, int virtual_stages);

// Adds the sends and receives a compute-only schedule needs. A chunk's output goes to the next
// chunk (forward) and its input-gradient to the previous one (backward); when both chunks are
// on the same rank (only possible with stages == 1) the executor hands the tensor over locally
// and nothing is inserted.
//
// Placement: a send goes right after the compute that produces its data, so the peer can
// start as soon as possible. A recv goes one compute ahead of its consumer: just before the
// compute action that precedes the consumer on the same rank (after the sends of the one before
// that), or at the head of the list when the consumer is one of the rank's first two computes:
//   recv(C0) recv(C1) C0 send(C0) recv(C2) C1 send(C1) recv(C3) C2 send(C2) ...
// Any earlier position is also deadlock-free (a posted receive never blocks); one compute of
// look-ahead lets the transfer overlap with that compute, while at most two inputs per rank sit
// in posted receive buffers (posting everything at the start would hold one per action).
//
// Throws std::invalid_argument when `compute` has a communication action, a chunk outside
// [0, stages * virtual_stages), or not exactly `stages` rank lists.
Schedule insert_communication(const Schedule& compute, int stages, int virtual_stages);

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
