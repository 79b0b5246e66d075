#include "meshtrain/comm/communicator.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "meshtrain/comm/job_abort.h"

namespace meshtrain {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

std::string row_counts_text(const std::vector<int64_t>& rows) {
  std::string text = "[";
  for (size_t i = 0; i < rows.size(); ++i) text += (i ? ", " : "") + std::to_string(rows[i]);
  return text + "]";
}

std::vector<int64_t> row_block_starts(const std::vector<int64_t>& rows) {
  std::vector<int64_t> starts(rows.size());
  for (size_t p = 1; p < rows.size(); ++p) starts[p] = starts[p - 1] + rows[p - 1];
  return starts;
}

Work::~Work() {
  if (!impl_) return;
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshtrain: abandoned communication failed: %s\n", e.what());
  }
}

Work& Work::operator=(Work&& other) {
  if (this == &other) return *this;
  wait();
  impl_ = std::move(other.impl_);
  timeout_ = other.timeout_;
  return *this;
}

bool Work::test() {
  if (!impl_) return true;
  if (impl_->test()) {
    impl_.reset();
    return true;
  }
  return false;
}

void Work::wait() {
  if (!impl_) return;
  impl_->order_consumers();
  // Poll rather than block: the wait can then give up after the timeout with a diagnosis, and
  // yields the core to other ranks when the node is oversubscribed.
  const auto start = std::chrono::steady_clock::now();
  const bool patient = impl_->patient();
  for (uint64_t spin = 0;; ++spin) {
    if (impl_->test()) break;
    // A patient waiter sleeps 20 us a poll, doubling every 16 polls up to 1 ms: a millisecond's
    // latency is nothing to a background write, and a spinning thread takes a core from training.
    if (spin > 64 && patient) {
      const uint64_t doublings = std::min<uint64_t>((spin - 64) / 16, 6);
      std::this_thread::sleep_for(std::chrono::microseconds(std::min<uint64_t>(20u << doublings, 1000)));
    } else if (spin > 64) {
      sched_yield();
    }
    if ((spin & 1023) == 1023 && timeout_.count() > 0 &&
        std::chrono::steady_clock::now() - start > timeout_) {
      const std::string what = impl_->describe();
      impl_.release();  // leaked on purpose: the request is stuck and the job is about to end
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.0f", timeout_.count());
      communication_failed(what + " did not complete within " + seconds +
                           " s (run.comm_timeout): a rank of the group has likely died, stalled "
                           "or taken a different code path");
    }
  }
  impl_.reset();
}

// ---- the front: checks and the group of one, the same for every backend ---------------------

namespace {

std::string reduction_name(const char* op, ReduceOp r) {
  return std::string(op) + "(" + std::string(reduce_op_name(r)) + ")";
}

}  // namespace

void Communicator::check_supported(const std::string&, const Tensor&, Use) const {}

void Communicator::copy_local(Tensor& out, const Tensor& in) {
  std::memcpy(out.raw(), in.raw(), out.nbytes());
}

Work Communicator::all_reduce(Tensor& t, ReduceOp op) {
  check_supported(reduction_name("all_reduce", op), t, Use::Reduce);
  if (size() == 1) return {};
  return do_all_reduce(t, op);
}

Work Communicator::reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  const std::string name = reduction_name("reduce_scatter", op);
  check_supported(name, in, Use::Reduce);
  check_supported(name, out, Use::Reduce);
  if (in.numel() != out.numel() * size() || in.dtype() != out.dtype())
    throw std::invalid_argument("communicator '" + backend() + "': reduce_scatter input of " +
                                std::to_string(in.numel()) + " elements is not " +
                                std::to_string(size()) + " x output " + std::to_string(out.numel()));
  if (size() == 1) {
    if (out.raw() != in.raw()) copy_local(out, in);
    return {};
  }
  return do_reduce_scatter(out, in, op);
}

Work Communicator::all_gather(Tensor& out, const Tensor& in) {
  check_supported("all_gather", in, Use::Move);
  check_supported("all_gather", out, Use::Move);
  if (out.numel() != in.numel() * size() || in.dtype() != out.dtype())
    throw std::invalid_argument("communicator '" + backend() + "': all_gather output of " +
                                std::to_string(out.numel()) + " elements is not " +
                                std::to_string(size()) + " x input " + std::to_string(in.numel()));
  if (size() == 1) {
    if (out.raw() != in.raw()) copy_local(out, in);
    return {};
  }
  return do_all_gather(out, in);
}

Work Communicator::broadcast(Tensor& t, int root) {
  check_supported("broadcast", t, Use::Move);
  if (size() == 1) return {};
  return do_broadcast(t, root);
}

Work Communicator::send(const Tensor& t, int dst, int tag) {
  check_supported("send", t, Use::Move);
  return do_send(t, dst, tag);
}

Work Communicator::recv(Tensor& t, int src, int tag) {
  check_supported("recv", t, Use::Move);
  return do_recv(t, src, tag);
}

std::vector<Work> Communicator::exchange(const std::vector<Transfer>& step) {
  // Every transfer is checked before any is issued: a refusal never leaves half a step posted.
  for (const Transfer& t : step)
    check_supported(t.kind == Transfer::Kind::Send ? "send" : "recv", t.tensor, Use::Move);
  if (step.empty()) return {};
  return do_exchange(step);
}

std::vector<Work> Communicator::do_exchange(const std::vector<Transfer>& step) {
  std::vector<Work> works;
  works.reserve(step.size());
  for (const Transfer& t : step) {
    Tensor tensor = t.tensor;
    works.push_back(t.kind == Transfer::Kind::Send ? do_send(tensor, t.peer, t.tag)
                                                   : do_recv(tensor, t.peer, t.tag));
  }
  return works;
}

namespace {

// The sum of row counts already known to be non-negative; -1 where it would overflow, which no
// tensor's row count can equal.
int64_t total_rows(const std::vector<int64_t>& counts) {
  int64_t sum = 0;
  for (int64_t c : counts)
    if (__builtin_add_overflow(sum, c, &sum)) return -1;
  return sum;
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* pa = static_cast<const char*>(a.raw());
  const auto* pb = static_cast<const char*>(b.raw());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace

// The counts come from the caller's routing, not from a user's input: a refusal is a bug there,
// and names the group, this rank and every number involved so that it can be found.
void Communicator::check_all_to_all(const Tensor& out, const Tensor& in,
                                    const std::vector<int64_t>& send_rows,
                                    const std::vector<int64_t>& recv_rows) const {
  const auto refuse = [&](const std::string& why) {
    throw std::invalid_argument("communicator '" + backend() + "': all_to_all on group '" +
                                name() + "' (rank " + std::to_string(rank()) + " of " +
                                std::to_string(size()) + ") " + why);
  };
  if (in.shape().rank() != 2 || out.shape().rank() != 2)
    refuse("moves rows of 2-D tensors (rows, width); got in " + in.shape().to_string() +
           " and out " + out.shape().to_string());
  if (in.dtype() != out.dtype())
    refuse("needs one dtype; got in " + std::string(dtype_name(in.dtype())) + " and out " +
           std::string(dtype_name(out.dtype())));
  if (in.dim(1) != out.dim(1))
    refuse("needs rows of one width; got in " + in.shape().to_string() + " and out " +
           out.shape().to_string());
  const auto n = static_cast<size_t>(size());
  if (send_rows.size() != n || recv_rows.size() != n)
    refuse("needs one row count per rank of the group (" + std::to_string(n) + "); got " +
           std::to_string(send_rows.size()) + " in send_rows " + row_counts_text(send_rows) +
           " and " + std::to_string(recv_rows.size()) + " in recv_rows " +
           row_counts_text(recv_rows));
  for (const auto* counts : {&send_rows, &recv_rows})
    for (int64_t c : *counts)
      if (c < 0)
        refuse("got a negative row count in " +
               std::string(counts == &send_rows ? "send_rows " : "recv_rows ") +
               row_counts_text(*counts));
  if (total_rows(send_rows) != in.dim(0))
    refuse("sends send_rows " + row_counts_text(send_rows) + " but in " + in.shape().to_string() +
           " has " + std::to_string(in.dim(0)) + " rows");
  if (total_rows(recv_rows) != out.dim(0))
    refuse("receives recv_rows " + row_counts_text(recv_rows) + " but out " +
           out.shape().to_string() + " has " + std::to_string(out.dim(0)) + " rows");
  const auto me = static_cast<size_t>(rank());
  if (send_rows[me] != recv_rows[me])
    refuse("sends itself " + std::to_string(send_rows[me]) + " rows (send_rows " +
           row_counts_text(send_rows) + ") but receives " + std::to_string(recv_rows[me]) +
           " from itself (recv_rows " + row_counts_text(recv_rows) + ")");
  if (overlaps(in, out)) refuse("cannot work in place: in and out overlap");
}

Work Communicator::all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows) {
  check_supported("all_to_all", in, Use::Move);
  check_supported("all_to_all", out, Use::Move);
  check_all_to_all(out, in, send_rows, recv_rows);
  if (size() == 1) {
    if (out.numel() > 0) copy_local(out, in);
    return {};
  }
  return do_all_to_all(out, in, send_rows, recv_rows);
}

std::vector<int64_t> Communicator::all_to_all_counts(const std::vector<int64_t>& send) {
  const bool negative = std::any_of(send.begin(), send.end(), [](int64_t c) { return c < 0; });
  if (send.empty() || send.size() % static_cast<size_t>(size()) != 0 || negative)
    throw std::invalid_argument(
        "communicator '" + backend() + "': all_to_all_counts on group '" + name() + "' (rank " +
        std::to_string(rank()) + " of " + std::to_string(size()) +
        ") needs the same number (at least one) of non-negative counts per rank of the group; "
        "got " + row_counts_text(send));
  if (size() == 1) return send;
  return do_all_to_all_counts(send);
}

void Communicator::barrier() {
  if (size() == 1) return;
  do_barrier();
}

void Communicator::broadcast_bytes(std::string& bytes, int root) {
  if (size() == 1) return;
  do_broadcast_bytes(bytes, root);
}

std::vector<std::string> Communicator::all_gather_bytes(const std::string& mine) {
  if (size() == 1) return {mine};
  return do_all_gather_bytes(mine);
}

double Communicator::all_reduce_scalar(double value, ReduceOp op) {
  if (size() == 1) return value;
  return do_all_reduce_scalar(value, op);
}

void wait_all(std::vector<Work>& works) {
  for (Work& w : works) w.wait();
}

}  // namespace meshtrain
