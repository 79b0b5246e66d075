#pragma once
// The head's loss sums, kept on the device until they are read. Reading a value to the host
// waits for everything queued on the device before it; reading the loss of every micro-batch
// drained the device once per micro-batch. Each head forward reduces its per-token losses into
// the next slot of a device buffer (Backend::reduce_into, no host round trip) and the step
// reads all slots with one copy.
//
// take() adds the slots in the order they were filled, starting from 0 — the order (and so the
// rounding) of summing the micro-batches' losses one by one on the host.

#include <cstdint>

#include "meshtrain/backend/backend.h"

namespace meshtrain {

// When the model reads its loss to the host: after every micro-batch (the loss sum of each head
// forward is added to the caller's double at once) or once per step (DecoderModel::loss().take()).
enum class LossReadout { PerMicroBatch, PerStep };

class LossAccumulator {
 public:
  explicit LossAccumulator(Backend& backend) : be_(&backend) {}

  // Queues slot n = sum of `losses` (N per-token losses, fp32 or fp64).
  void add(const Tensor& losses);
  // A loss computed on the host (a mixture of experts' balancing losses, already weighted as a
  // sum of per-token losses would be): added after the slots.
  void add_host(double value) { host_ += value; }
  // The sum of all slots since the last take(), read with one copy (none when empty); empties.
  double take();
  int64_t pending() const { return used_; }

  LossReadout readout() const { return readout_; }
  void set_readout(LossReadout r) { readout_ = r; }

 private:
  Backend* be_;
  Tensor slots_;  // (capacity) fp64 on the device
  int64_t used_ = 0;
  double host_ = 0;
  LossReadout readout_ = LossReadout::PerMicroBatch;
};

}  // namespace meshtrain
