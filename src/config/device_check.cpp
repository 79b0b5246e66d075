#include "meshtrain/config/device_check.h"

#if MESHTRAIN_HAVE_CUDA
#include "meshtrain/backend/cuda/cuda_backend.h"
#endif

namespace meshtrain {

DeviceFacts probe_device_facts(int local_ranks) {
  DeviceFacts f;
  f.local_ranks = local_ranks;
#if MESHTRAIN_HAVE_CUDA
  f.cuda_built = true;
  f.devices = cuda_device_count(&f.why_no_devices);
#else
  f.why_no_devices = "this build of meshtrain has no CUDA backend (nvcc was not found at build time)";
#endif
  return f;
}

void resolve_device(Config& c, const DeviceFacts& f) {
  const std::string& d = c.deck_path;
  auto fail = [&](const std::string& msg) { throw DeckError(d + ": " + msg); };
  if (c.run.device == DeviceChoice::Auto)
    c.run.device = f.cuda_built && f.devices > 0 ? DeviceChoice::Cuda : DeviceChoice::Cpu;
  const bool cuda = c.run.device == DeviceChoice::Cuda;
  if (cuda && !f.cuda_built)
    fail("run.device = \"cuda\", but " + f.why_no_devices + " (use run.device = \"cpu\" or \"auto\")");
  if (cuda && f.devices == 0)
    fail("run.device = \"cuda\", but no GPU is visible: " + f.why_no_devices +
         " (use run.device = \"cpu\" or \"auto\")");

  if (c.train.precision_auto) c.train.precision = cuda ? DType::BF16 : DType::F32;
  if (cuda && c.train.precision == DType::F64)
    fail("train.precision = \"fp64\" is for verification on the CPU (run.device = \"cpu\"); on a "
         "GPU use \"fp32\" or \"bf16\"");
  if (!cuda && c.train.precision == DType::BF16)
    fail("train.precision = \"bf16\" needs run.device = \"cuda\" (the CPU backend computes in "
         "fp32 or fp64)");
  if (!cuda && c.parallel.offload == Offload::Optimizer)
    fail("parallel.offload = \"optimizer\" needs run.device = \"cuda\" (on the CPU the optimizer "
         "state is in host memory already)");

  if (!cuda) {
    if (c.parallel.communicator == CommChoice::Nccl)
      fail("parallel.communicator = \"nccl\" needs run.device = \"cuda\"");
    c.parallel.communicator = CommChoice::Mpi;
    return;
  }
  // NCCL needs a GPU per rank: with more ranks than GPUs on a node, ranks share a GPU and
  // communicate through MPI with host buffers.
  const bool own_gpu = f.local_ranks <= f.devices;
  if (c.parallel.communicator == CommChoice::Nccl && !own_gpu)
    fail("parallel.communicator = \"nccl\" needs a GPU per rank, but this node runs " +
         std::to_string(f.local_ranks) + " ranks on " + std::to_string(f.devices) +
         " GPU(s) (use \"mpi\" or \"auto\", or launch at most " + std::to_string(f.devices) +
         " ranks per node)");
  if (c.parallel.communicator == CommChoice::Auto)
    c.parallel.communicator = own_gpu ? CommChoice::Nccl : CommChoice::Mpi;
}

}  // namespace meshtrain
