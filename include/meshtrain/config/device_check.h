#pragma once
// Resolves the deck's device-dependent choices against what this build and this node offer:
// run.device "auto", train.precision "auto", parallel.communicator "auto"; and refuses
// combinations that cannot work (fp64 on a GPU, bf16 or NCCL on the CPU, CUDA in a build
// without it, more ranks on a node than GPUs for NCCL) with a message naming the keys.

#include "meshtrain/config/config.h"
#include "meshtrain/config/deck_error.h"

namespace meshtrain {

struct DeviceFacts {
  bool cuda_built = false;     // this binary has the CUDA backend
  int devices = 0;             // GPUs visible on this node
  std::string why_no_devices;  // the CUDA runtime's reason when devices == 0
  int local_ranks = 1;         // ranks on this node
};

// Same facts on every rank of a node; nodes may differ, so callers agree on the outcome.
void resolve_device(Config& config, const DeviceFacts& facts);

// This process's facts (CUDA runtime queried only in CUDA builds).
DeviceFacts probe_device_facts(int local_ranks);

}  // namespace meshtrain
