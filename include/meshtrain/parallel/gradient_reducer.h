#pragma once
// GradientReducer: each bucket's gradient reduction over its replica group, launched as soon as
// every unit writing into the bucket has finished its backward (its weight-gradient part, when a
// zero-bubble schedule splits it) and overlapped with the rest of backward: on the last
// micro-batch under ZeRO 0 (all-reduce) and 1 (reduce-scatter), on every micro-batch under ZeRO
// 2 and 3 (reduce-scatter of a staging buffer, added into the bucket's gradient shard), which
// keep no full gradients. A bucket is ready when all units writing it have completed the same
// number of backward passes, which also handles the tied embedding's two users. Finishing a
// backward waits for the reductions and adds up what other groups hold parts of: the
// sequence-parallel partial gradients over tp, the tied embedding's two copies over the first
// and last stage. Part of ModelState (model_state.h), over its StateLayout.

#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/progress_thread.h"
#include "meshtrain/parallel/state_layout.h"
#include "meshtrain/parallel/zero_gather.h"

namespace meshtrain {

class GradientReducer {
 public:
  GradientReducer(StateLayout& layout, ZeroGather& gather);
  // Pending reductions are waited for, before the buffers they write go, by their Work's
  // destructor, which never throws: this may run while an error unwinds, and a timeout here
  // ends the job through the armed abort (comm/job_abort.h).
  ~GradientReducer() { pending_.clear(); }

  // Starts a step's gradients: none is filled with zeros; each one's first writer assigns it
  // (Parameter::grad_unwritten), and a bucket zeroes what no unit wrote before its reduction.
  void begin_step();
  // ZeRO 2/3: gives `unit`'s buckets a staging buffer for its gradients, if they have none.
  void stage_gradients(int unit);
  // A unit's gradients for one more micro-batch are complete: reduce what is ready.
  void gradients_final(int unit);
  // Completes reductions that finished (never waits), keeping the progress thread running
  // exactly while reductions are in flight.
  void progress();
  // Completes every reduction; sums tied-embedding and sequence-parallel gradients.
  void finish_backward();
  // Zeroes every gradient that nothing has written since begin_step (a benchmark that reduces
  // without running the model's backward).
  void zero_unwritten_gradients();
  // Backward passes per unit per step from the next step on (ZeRO 0 and 1 only).
  void set_microbatches(int microbatches) { microbatches_ = microbatches; }

  // Seconds spent waiting for reductions in the last step (at the end of backward, and for
  // ZeRO 2/3 at each unit): the part of the data-parallel communication backward did not hide.
  double exposed_comm_seconds() const { return exposed_comm_seconds_; }
  // steady_clock seconds at which this rank's last backward ended (finish_backward entered) and
  // its reductions were complete: exposed communication of a step is the latest completion
  // minus the latest backward end over the ranks (a rank waiting for a slower one is skew,
  // not communication).
  double backward_end_time() const { return backward_end_time_; }
  double reductions_done_time() const { return reductions_done_time_; }

 private:
  struct Pending {
    int bucket;
    Work work;
    Tensor staging, out;  // kept alive until the reduction completes
    bool accumulate;      // add `out` into the bucket's gradient shard on completion
    int generation;       // the gradients_final call that launched it
  };
  void mark_unwritten(int b);
  void zero_unwritten(int b);
  void maybe_reduce(int b);
  void launch_reduction(int b);
  void complete(Pending& p);
  void retire_older_than(int generation);
  void check_all_reduced() const;
  void wait_for_reductions();
  void sum_partial_gradients_over_tp();
  void sum_tied_embedding_copies();

  StateLayout* layout_;
  ZeroGather* gather_;
  int microbatches_;
  std::vector<char> reduced_;   // per bucket: its reduction was launched this step
  std::vector<int> completed_;  // backward passes finished this step, per unit
  std::vector<Pending> pending_;
  double exposed_comm_seconds_ = 0;
  double backward_end_time_ = 0, reductions_done_time_ = 0;
  int generation_ = 0;  // gradients_final calls so far
  ProgressThread progress_thread_;
  bool progress_active_ = false;
};

}  // namespace meshtrain
