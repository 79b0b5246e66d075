#pragma once
// A watchdog for blocking calls that run.comm_timeout cannot reach from inside: a collective
// HDF5 or MPI-IO call (open, create, write, close of a checkpoint), a blocking MPI call at
// start-up (a communicator split). The communicator's own operations poll and give up after
// the timeout (communicator.h); a rank blocked inside MPI-IO waiting for a stalled peer never
// returns to a poll. So every such call is wrapped in a BlockingRegion, and one thread per
// process wakes a few times a second: a region older than the timeout ends the job the way a
// timed-out operation does (job_abort.h: the diagnosis naming the region, the abort hooks that
// read the flight records, MPI_Abort), from the watchdog's thread, while the blocked one stays
// where it is.
//
// Process-wide, like the job abort: the regions are entered on any thread (the training
// thread, a background checkpoint writer). The watchdog acts only while the job abort is
// armed (a command's run): unarmed (unit tests, library use) it has no way to end the call.

#include <cstdint>
#include <string>

namespace meshtrain {

class Communicator;

// Sets the limit on any one region (run.comm_timeout, seconds; 0: regions are not watched) and
// starts the watchdog's thread on the first call with a limit.
void set_blocking_timeout(double seconds);
double blocking_timeout();

// A blocking call in progress on this thread, described by `what` ("collective write of
// dataset /model/wte/param into ckpt/step_00000002.h5.tmp"). Cheap where no limit is set.
class BlockingRegion {
 public:
  explicit BlockingRegion(const std::string& what);
  ~BlockingRegion();
  BlockingRegion(const BlockingRegion&) = delete;
  BlockingRegion& operator=(const BlockingRegion&) = delete;

 private:
  uint64_t id_ = 0;
};

// A BlockingRegion that is also a collective of `group`'s members (every member enters the same
// such calls in the same order: a collective HDF5 call over the group's MPI communicator), so
// that the flight recorder, where `group` records, shows which member never entered it.
class CollectiveRegion {
 public:
  CollectiveRegion(Communicator& group, const std::string& what);
  ~CollectiveRegion();
  CollectiveRegion(const CollectiveRegion&) = delete;
  CollectiveRegion& operator=(const CollectiveRegion&) = delete;

 private:
  BlockingRegion region_;
  Communicator& group_;
  uint64_t ticket_;
};

}  // namespace meshtrain
