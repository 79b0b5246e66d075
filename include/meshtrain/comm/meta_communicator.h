#pragma once
// A communicator that moves no data: it has a rank and a size and completes every operation at
// once. It stands in for a group of a job that is only being planned (`meshtrain plan`), so that
// the real code allocates exactly the buffers the real job would, on one process.

#include "meshtrain/comm/communicator.h"

namespace meshtrain {

class MetaCommunicator final : public Communicator {
 public:
  MetaCommunicator(std::string name, int rank, int size)
      : name_(std::move(name)), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  std::string backend() const override { return "meta"; }

 protected:
  Work do_all_reduce(Tensor&, ReduceOp) override { return {}; }
  Work do_reduce_scatter(Tensor&, const Tensor&, ReduceOp) override { return {}; }
  Work do_all_gather(Tensor&, const Tensor&) override { return {}; }
  Work do_broadcast(Tensor&, int) override { return {}; }
  Work do_send(const Tensor&, int, int) override { return {}; }
  Work do_recv(Tensor&, int, int) override { return {}; }
  Work do_all_to_all(Tensor&, const Tensor&, const std::vector<int64_t>&,
                     const std::vector<int64_t>&) override {
    return {};
  }
  // No peer to ask: a plan assumes balanced routing, where every rank receives as many rows
  // from each peer as it sends it.
  std::vector<int64_t> do_all_to_all_counts(const std::vector<int64_t>& send) override {
    return send;
  }
  void do_barrier() override {}
  void do_broadcast_bytes(std::string&, int) override {}
  std::vector<std::string> do_all_gather_bytes(const std::string& mine) override {
    return std::vector<std::string>(static_cast<size_t>(size_), mine);
  }
  double do_all_reduce_scalar(double value, ReduceOp) override { return value; }
  // Planned tensors have no data to copy.
  void copy_local(Tensor&, const Tensor&) override {}

 private:
  std::string name_;
  int rank_, size_;
};

}  // namespace meshtrain
