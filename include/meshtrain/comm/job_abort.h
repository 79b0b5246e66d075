#pragma once
// Ending the whole job when communication has failed for good: a wait past run.comm_timeout.
//
// Unwinding is the wrong way out of a stalled collective. Destructors on the way wait for the
// other pending operations (each another full timeout, and a throw from a destructor ends in
// std::terminate), synchronise device streams that a dead peer keeps busy, and destroy NCCL
// communicators, which blocks on the peers. So a command arms the job abort once at start-up, and
// the rank that detects the failure ends the job where it stands: it prints the diagnosis with
// its rank and node, aborts every NCCL communicator of the process (ncclCommAbort does not wait
// for peers), and calls MPI_Abort, which ends every rank of the job with the armed exit status.
// Unarmed (library use, unit tests), a failure throws CommTimeout as before.
//
// Process-wide on purpose: MPI_Abort and ncclCommAbort act on the whole process, whichever
// object notices the failure, and the hooks must reach every communicator, not just the one
// whose operation timed out.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace meshtrain {

// From now on a communication failure aborts the job with `exit_status` (see above).
void arm_job_abort(int exit_status);
void disarm_job_abort();
bool job_abort_armed();

// Something to release before MPI_Abort (an NCCL communicator: ncclCommAbort). Registered by
// its owner while it lives; the returned id unregisters it. Hooks must not block on peers.
uint64_t add_abort_hook(std::function<void()> hook);
void remove_abort_hook(uint64_t id);

// An abort hook registered for the lifetime of the object. Hooks run in registration order.
class ScopedAbortHook {
 public:
  ScopedAbortHook() = default;
  explicit ScopedAbortHook(std::function<void()> hook) : id_(add_abort_hook(std::move(hook))) {}
  ~ScopedAbortHook() {
    if (id_) remove_abort_hook(id_);
  }
  ScopedAbortHook(ScopedAbortHook&& o) noexcept : id_(o.id_) { o.id_ = 0; }
  ScopedAbortHook& operator=(ScopedAbortHook&& o) noexcept {
    std::swap(id_, o.id_);
    return *this;
  }

 private:
  uint64_t id_ = 0;
};

// A communication that can never complete: `what` says which and why. Armed: prints
// "meshtrain: rank R (node N): error: <what>; aborting the job", runs the hooks and calls
// MPI_Abort (does not return). Unarmed: throws CommTimeout(what).
void communication_failed(const std::string& what);

}  // namespace meshtrain
