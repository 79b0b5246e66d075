#pragma once
// Communicator: collectives and point-to-point transfers over one group of ranks (a process-grid
// axis, or the world). MPI implements it for host buffers on any machine; NCCL for device
// buffers on GPUs. Every operation is non-blocking and returns a Work to wait on; the blocking
// form is `.wait()` on the result. Waits never hang silently: a wait that exceeds the
// communicator's timeout raises CommTimeout naming the operation and the group.
//
// Unsupported cases fail with "communicator 'mpi' does not support all_reduce(sum) for dtype bf16".

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

enum class ReduceOp { Sum, Max, Min };
std::string_view reduce_op_name(ReduceOp op);
// Per-rank row counts of an all_to_all as its errors and descriptions show them: "[3, 0, 5]".
std::string row_counts_text(const std::vector<int64_t>& rows);
// Where each rank's block starts in an all_to_all buffer of those row counts:
// [0, r0, r0 + r1, ...].
std::vector<int64_t> row_block_starts(const std::vector<int64_t>& rows);

class CommTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A pending operation. Movable; waiting on an empty Work returns at once.
class Work {
 public:
  struct Impl {
    virtual ~Impl() = default;
    // Progresses the operation; true once complete. Polling never orders other work after the
    // operation (a device stream waiting on it would lose the overlap the poll is there for);
    // once the host has seen completion, anything queued afterwards sees the result anyway.
    virtual bool test() = 0;
    // Called once by wait(), before it polls: makes work queued after the wait (on a device
    // stream) see the result, without the host's help. Nothing to do for host operations.
    virtual void order_consumers() {}
    virtual std::string describe() const = 0;
    // True where the waiting thread works in the background (a checkpoint's writer): wait()
    // then sleeps between polls, leaving the cores to the threads that train.
    virtual bool patient() const { return false; }
  };

  Work() = default;
  Work(std::unique_ptr<Impl> impl, std::chrono::duration<double> timeout)
      : impl_(std::move(impl)), timeout_(timeout) {}
  Work(Work&&) = default;
  // Both wait for a pending operation this Work held before letting it go: its buffers must
  // outlive it (assigning over a pending Work used to drop it mid-transfer).
  Work& operator=(Work&& other);
  ~Work();

  bool test();
  void wait();
  bool pending() const { return impl_ != nullptr; }
  // For communicators that wrap another's operations (comm/recording_communicator.h): hands
  // over the pending operation, and the timeout it waits with.
  std::unique_ptr<Impl> release() { return std::move(impl_); }
  std::chrono::duration<double> timeout() const { return timeout_; }

 private:
  std::unique_ptr<Impl> impl_;
  std::chrono::duration<double> timeout_{0};
};

// Waits for every Work in the list.
void wait_all(std::vector<Work>& works);

// One send or receive of a transfer step (Communicator::exchange).
struct Transfer {
  enum class Kind : uint8_t { Send, Recv };
  Kind kind = Kind::Send;
  Tensor tensor;  // read by a send, written by a receive
  int peer = 0;   // rank in the communicator's group
  int tag = 0;    // matches messages under MPI; NCCL has none and matches in issue order
};

// The public operations are a non-virtual front, the same for every backend: it checks the
// arguments (check_supported, then the sizes of reduce_scatter and all_gather), takes the
// shortcut of a group of one (nothing to do, or a local copy), and only then calls the
// backend's protected do_* method. A backend therefore sees only operations that need it.
class Communicator {
 public:
  // What an operation does with the elements, for check_supported: backends reduce fewer dtypes
  // than they move.
  enum class Use { Reduce, Move };

  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's name as the logs and errors show it: "world", "dp", "tp", "pp", "embedding".
  virtual std::string name() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "nccl"

  // Throws std::invalid_argument ("communicator 'mpi' does not support all_reduce(sum) for dtype
  // f16") unless this backend can carry out `op` on `t` (its device, its dtype). The front calls
  // it first, for every tensor of an operation, whatever the group's size.
  virtual void check_supported(const std::string& op, const Tensor& t, Use use) const;

  // A blocking call outside this communicator that every member makes, in the same order, over
  // its MPI communicator (a collective HDF5 call): entered and left where this group records its
  // operations (RecordingCommunicator), so that a member that never entered it shows. Returns a
  // token for leave_blocking_collective; nothing to record by default. CollectiveRegion
  // (blocking_watchdog.h) calls these.
  virtual uint64_t enter_blocking_collective() { return 0; }
  virtual void leave_blocking_collective(uint64_t) {}

  // In place: every rank ends with the reduction of all ranks' `t`.
  Work all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
  // `in` is size() equal chunks; this rank's chunk of the reduction lands in `out`.
  Work reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::Sum);
  // `out` is the concatenation, in rank order, of every rank's `in`.
  Work all_gather(Tensor& out, const Tensor& in);
  Work broadcast(Tensor& t, int root);
  Work send(const Tensor& t, int dst, int tag);
  Work recv(Tensor& t, int src, int tag);
  // One transfer step: issues every send and receive of `step` together and returns one Work
  // per transfer, in order. Where point-to-point calls block until the peer's matching call runs
  // (NCCL), the step is one group (ncclGroupStart/End), so a rank's sends and receives of one
  // step never wait for each other; a pipeline schedule that issues matching steps in the same
  // order on both peers is then deadlock-free (parallel/schedule.h). The default posts each
  // transfer through do_send() and do_recv(), which never block (MPI).
  std::vector<Work> exchange(const std::vector<Transfer>& step);
  // Every rank sends a block of rows of `in` to each member and receives one from each into
  // `out` (expert parallelism's token dispatch and combine). `in` is (sum(send_rows), W): the
  // first send_rows[0] rows go to rank 0, the next send_rows[1] to rank 1, and so on; `out` is
  // (sum(recv_rows), W), the block from rank 0 first. Both vectors hold size() non-negative row
  // counts; zero-row blocks are allowed, and the block a rank sends itself is a local copy
  // (send_rows[rank()] must equal recv_rows[rank()]). recv_rows[p] must equal rank p's
  // send_rows[rank()], which nothing local can check: exchange the counts first with
  // all_to_all_counts. `out` and `in` are distinct buffers of one dtype.
  Work all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                  const std::vector<int64_t>& recv_rows);
  // The counts' exchange before all_to_all, blocking: `send` holds size() blocks of k >= 1
  // non-negative counts each, block p for rank p (k: counts per peer, e.g. one per expert the
  // peer holds); returns the blocks received, block p rank p's block for this rank (with k = 1,
  // recv[p] is rank p's send[rank()]). Every rank passes the same k.
  std::vector<int64_t> all_to_all_counts(const std::vector<int64_t>& send);
  void barrier();

  // Byte-level helpers for host metadata (deck text, error messages).
  void broadcast_bytes(std::string& bytes, int root);
  std::vector<std::string> all_gather_bytes(const std::string& mine);
  // Host scalar reductions (loss sums, norms, error flags).
  double all_reduce_scalar(double value, ReduceOp op = ReduceOp::Sum);

 protected:
  // Called by the front after its checks; the collectives only when size() > 1, the
  // point-to-point transfers whatever the size.
  virtual Work do_all_reduce(Tensor& t, ReduceOp op) = 0;
  virtual Work do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) = 0;
  virtual Work do_all_gather(Tensor& out, const Tensor& in) = 0;
  virtual Work do_broadcast(Tensor& t, int root) = 0;
  virtual Work do_send(const Tensor& t, int dst, int tag) = 0;
  virtual Work do_recv(Tensor& t, int src, int tag) = 0;
  // `step` is not empty.
  virtual std::vector<Work> do_exchange(const std::vector<Transfer>& step);
  // Checked by the front: shapes, counts and the self block agree; size() > 1.
  virtual Work do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                             const std::vector<int64_t>& recv_rows) = 0;
  virtual std::vector<int64_t> do_all_to_all_counts(const std::vector<int64_t>& send) = 0;
  virtual void do_barrier() = 0;
  virtual void do_broadcast_bytes(std::string& bytes, int root) = 0;
  virtual std::vector<std::string> do_all_gather_bytes(const std::string& mine) = 0;
  virtual double do_all_reduce_scalar(double value, ReduceOp op) = 0;
  // The whole of reduce_scatter, all_gather and all_to_all in a group of one: `out` = `in`,
  // which are distinct buffers of the same size. The default copies host memory.
  virtual void copy_local(Tensor& out, const Tensor& in);
  // For communicators that wrap another (comm/recording_communicator.h): its local copy.
  static void copy_local_of(Communicator& inner, Tensor& out, const Tensor& in) {
    inner.copy_local(out, in);
  }

 private:
  // Throws std::invalid_argument naming the group and the numbers unless all_to_all's
  // arguments agree (see all_to_all).
  void check_all_to_all(const Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows) const;
};

}  // namespace meshtrain
