#include "meshtrain/comm/recording_communicator.h"

namespace meshtrain {
namespace {

// The wrapped operation, marked completed in the record when it completes.
class RecordedWork final : public Work::Impl {
 public:
  RecordedWork(std::unique_ptr<Work::Impl> inner, FlightRecorder& recorder,
               FlightRecorder::Ticket ticket)
      : inner_(std::move(inner)), recorder_(recorder), ticket_(ticket) {}
  bool test() override {
    if (!inner_->test()) return false;
    recorder_.end(ticket_);
    return true;
  }
  void order_consumers() override { inner_->order_consumers(); }
  std::string describe() const override { return inner_->describe(); }

 private:
  std::unique_ptr<Work::Impl> inner_;
  FlightRecorder& recorder_;
  FlightRecorder::Ticket ticket_;
};

}  // namespace

RecordingCommunicator::RecordingCommunicator(std::unique_ptr<Communicator> inner,
                                             FlightRecorder& recorder, int id)
    : inner_(std::move(inner)), recorder_(recorder),
      // A group of one never waits for anyone: not worth a slot, nor ring entries.
      group_(inner_->size() > 1 ? recorder.add_group(inner_->name(), id, inner_->size(), inner_->rank())
                                : -1) {}

Work RecordingCommunicator::recorded(Work inner, const FlightRecorder::Ticket& ticket) {
  const std::chrono::duration<double> timeout = inner.timeout();
  std::unique_ptr<Work::Impl> impl = inner.release();
  if (!impl) {  // completed at once (a group of one, an empty tensor)
    recorder_.end(ticket);
    return {};
  }
  return Work(std::make_unique<RecordedWork>(std::move(impl), recorder_, ticket), timeout);
}

Work RecordingCommunicator::do_all_reduce(Tensor& t, ReduceOp op) {
  const auto ticket = begin(FlightOp::AllReduce, -1, t.nbytes());
  return recorded(inner_->all_reduce(t, op), ticket);
}

Work RecordingCommunicator::do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  const auto ticket = begin(FlightOp::ReduceScatter, -1, in.nbytes());
  return recorded(inner_->reduce_scatter(out, in, op), ticket);
}

Work RecordingCommunicator::do_all_gather(Tensor& out, const Tensor& in) {
  const auto ticket = begin(FlightOp::AllGather, -1, out.nbytes());
  return recorded(inner_->all_gather(out, in), ticket);
}

Work RecordingCommunicator::do_broadcast(Tensor& t, int root) {
  const auto ticket = begin(FlightOp::Broadcast, root, t.nbytes());
  return recorded(inner_->broadcast(t, root), ticket);
}

Work RecordingCommunicator::do_send(const Tensor& t, int dst, int tag) {
  const auto ticket = begin(FlightOp::Send, dst, t.nbytes());
  return recorded(inner_->send(t, dst, tag), ticket);
}

Work RecordingCommunicator::do_recv(Tensor& t, int src, int tag) {
  const auto ticket = begin(FlightOp::Recv, src, t.nbytes());
  return recorded(inner_->recv(t, src, tag), ticket);
}

std::vector<Work> RecordingCommunicator::do_exchange(const std::vector<Transfer>& step) {
  std::vector<FlightRecorder::Ticket> tickets;
  for (const Transfer& t : step)
    tickets.push_back(begin(t.kind == Transfer::Kind::Send ? FlightOp::Send : FlightOp::Recv,
                            t.peer, t.tensor.nbytes()));
  std::vector<Work> works = inner_->exchange(step);
  for (size_t i = 0; i < works.size(); ++i) works[i] = recorded(std::move(works[i]), tickets[i]);
  return works;
}

// Recorded with the bytes this rank sends: its share of the exchange, as for the other
// collectives.
Work RecordingCommunicator::do_all_to_all(Tensor& out, const Tensor& in,
                                          const std::vector<int64_t>& send_rows,
                                          const std::vector<int64_t>& recv_rows) {
  const auto ticket = begin(FlightOp::AllToAll, -1, in.nbytes());
  return recorded(inner_->all_to_all(out, in, send_rows, recv_rows), ticket);
}

std::vector<int64_t> RecordingCommunicator::do_all_to_all_counts(const std::vector<int64_t>& send) {
  const auto ticket = begin(FlightOp::AllToAllCounts, -1, send.size() * sizeof(int64_t));
  std::vector<int64_t> recv = inner_->all_to_all_counts(send);
  recorder_.end(ticket);
  return recv;
}

void RecordingCommunicator::do_barrier() {
  const auto ticket = begin(FlightOp::Barrier, -1, 0);
  inner_->barrier();
  recorder_.end(ticket);
}

void RecordingCommunicator::do_broadcast_bytes(std::string& bytes, int root) {
  const auto ticket = begin(FlightOp::BytesBroadcast, root, bytes.size());
  inner_->broadcast_bytes(bytes, root);
  recorder_.end(ticket);
}

std::vector<std::string> RecordingCommunicator::do_all_gather_bytes(const std::string& mine) {
  const auto ticket = begin(FlightOp::BytesAllGather, -1, mine.size());
  std::vector<std::string> all = inner_->all_gather_bytes(mine);
  recorder_.end(ticket);
  return all;
}

double RecordingCommunicator::do_all_reduce_scalar(double value, ReduceOp op) {
  const auto ticket = begin(FlightOp::ScalarAllReduce, -1, sizeof value);
  const double out = inner_->all_reduce_scalar(value, op);
  recorder_.end(ticket);
  return out;
}

uint64_t RecordingCommunicator::enter_blocking_collective() {
  if (group_ < 0) return 0;
  return begin(FlightOp::BlockingCall, -1, 0).serial;
}

void RecordingCommunicator::leave_blocking_collective(uint64_t token) {
  if (token != 0) recorder_.end({token, group_, true});
}

}  // namespace meshtrain
