#pragma once
// A communicator that records every operation of another one in the rank's flight recorder
// (flight_recorder.h): entered when issued, completed when its Work completes (or, for the
// blocking helpers, when they return). Everything else is the wrapped communicator's.

#include <memory>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/flight_recorder.h"

namespace meshtrain {

class RecordingCommunicator final : public Communicator {
 public:
  // `id` names this instance of a group across ranks: the world rank of its rank 0.
  // `recorder` must outlive this.
  RecordingCommunicator(std::unique_ptr<Communicator> inner, FlightRecorder& recorder, int id);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return inner_->name(); }
  std::string backend() const override { return inner_->backend(); }
  Communicator& inner() { return *inner_; }

  void check_supported(const std::string& op, const Tensor& t, Use use) const override {
    inner_->check_supported(op, t, use);
  }
  // Recorded as a collective (FlightOp::BlockingCall) of this group, on the recording thread
  // only (the recorder is not thread-safe): a background writer's group does not record.
  uint64_t enter_blocking_collective() override;
  void leave_blocking_collective(uint64_t token) override;

 protected:
  // A group of one is handled by the front before these are reached, as the wrapped
  // communicator's front would: it never waits, so there is nothing to record.
  Work do_all_reduce(Tensor& t, ReduceOp op) override;
  Work do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override;
  Work do_all_gather(Tensor& out, const Tensor& in) override;
  Work do_broadcast(Tensor& t, int root) override;
  Work do_send(const Tensor& t, int dst, int tag) override;
  Work do_recv(Tensor& t, int src, int tag) override;
  std::vector<Work> do_exchange(const std::vector<Transfer>& step) override;
  Work do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                     const std::vector<int64_t>& recv_rows) override;
  std::vector<int64_t> do_all_to_all_counts(const std::vector<int64_t>& send) override;
  void do_barrier() override;
  void do_broadcast_bytes(std::string& bytes, int root) override;
  std::vector<std::string> do_all_gather_bytes(const std::string& mine) override;
  double do_all_reduce_scalar(double value, ReduceOp op) override;
  void copy_local(Tensor& out, const Tensor& in) override { copy_local_of(*inner_, out, in); }

 private:
  Work recorded(Work inner, const FlightRecorder::Ticket& ticket);
  FlightRecorder::Ticket begin(FlightOp op, int peer, uint64_t bytes) {
    return recorder_.begin(group_, op, peer, bytes);
  }

  std::unique_ptr<Communicator> inner_;
  FlightRecorder& recorder_;
  int group_;
};

}  // namespace meshtrain
