#pragma once
// Resolves the deck's device-dependent choices against what this build and this node offer:
// run.device "auto", train.precision "auto" (bf16 on GPUs, and on CPUs with bf16 instructions;
// fp32 on other CPUs), parallel.communicator "auto"; and refuses combinations that cannot work
// (fp64 on a GPU, NCCL on the CPU, CUDA in a build without it, NCCL where ranks of a node share
// a GPU) with a message naming the keys.
//
// Whether ranks share a GPU is decided from the GPUs' UUIDs, not from counts: under
// `srun --gpus-per-task=1` (or any per-rank CUDA_VISIBLE_DEVICES) every rank sees one device,
// numbered 0, yet each is a different GPU; with all GPUs visible, ranks beyond the device count
// wrap around onto GPUs already taken. Only the UUIDs tell these apart.

#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/config/deck_error.h"

namespace meshtrain {

struct DeviceFacts {
  bool cuda_built = false;     // this binary has the CUDA backend
  int devices = 0;             // GPUs visible to this process
  std::string why_no_devices;  // the CUDA runtime's reason when devices == 0
  int local_ranks = 1;         // ranks on this node
  int device_index = 0;        // the visible device this rank would use (node rank % devices)
  // The UUID of the GPU each rank of this node would use, indexed by node-local rank ("" for a
  // rank without a GPU, or whose GPU could not be identified). Gathered over the node.
  std::vector<std::string> node_gpus;
  // The CPU's bf16 instructions as oneDNN dispatches to them ("AVX512-BF16", "AMX"; "" when it
  // has none, or ONEDNN_MAX_CPU_ISA keeps oneDNN below them): "auto" trains bf16 on it then.
  std::string cpu_bf16;
};

// How the ranks of one node map onto GPUs, from DeviceFacts::node_gpus.
struct GpuSharing {
  bool own_gpu = true;      // every rank has a GPU no other rank of the node uses
  int ranks = 0;            // ranks on the node
  int distinct_gpus = 0;    // distinct identified GPUs among them
  // Why not, naming the ranks and the GPU, e.g. "ranks 0 and 2 share GPU GPU-5e1f... (4 ranks
  // on 2 distinct GPUs)"; empty when own_gpu.
  std::string why_not;
};
GpuSharing gpu_sharing(const std::vector<std::string>& node_gpus);

// Same facts on every rank of a node; nodes may differ, so callers agree on the outcome.
void resolve_device(Config& config, const DeviceFacts& facts);

// Why "auto" chose the precision that resolve_device set, for the device line: "auto: the CPU
// has AVX512-BF16", "auto: the CPU has no bf16 instructions", "auto: bf16 on GPUs"; "" when the
// deck named the precision.
std::string auto_precision_reason(const Config& config, const DeviceFacts& facts);

// This process's facts (CUDA runtime queried only in CUDA builds), with node_gpus holding only
// this rank's own GPU: the caller gathers them over the node.
DeviceFacts probe_device_facts(int local_ranks, int local_rank);

}  // namespace meshtrain
