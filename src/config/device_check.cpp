#include "meshtrain/config/device_check.h"

#include <map>

#include "meshtrain/backend/cpu/cpu_backend.h"

#if MESHTRAIN_HAVE_CUDA
#include "meshtrain/backend/cuda/cuda_backend.h"
#endif

namespace meshtrain {

DeviceFacts probe_device_facts(int local_ranks, int local_rank) {
  DeviceFacts f;
  f.local_ranks = local_ranks;
  f.cpu_bf16 = cpu_bf16_instructions();
#if MESHTRAIN_HAVE_CUDA
  f.cuda_built = true;
  f.devices = cuda_device_count(&f.why_no_devices);
  if (f.devices > 0) {
    f.device_index = local_rank % f.devices;
    f.node_gpus = {cuda_device_uuid(f.device_index)};
  } else {
    f.node_gpus = {""};
  }
#else
  (void)local_rank;
  f.why_no_devices = "this build of meshtrain has no CUDA backend (nvcc was not found at build time)";
  f.node_gpus = {""};
#endif
  return f;
}

namespace {
std::string list_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}
}  // namespace

GpuSharing gpu_sharing(const std::vector<std::string>& node_gpus) {
  GpuSharing g;
  g.ranks = static_cast<int>(node_gpus.size());
  std::map<std::string, std::vector<int>> users;  // UUID -> node ranks using it
  std::vector<int> unknown;
  for (int r = 0; r < g.ranks; ++r) {
    if (node_gpus[r].empty()) unknown.push_back(r);
    else users[node_gpus[r]].push_back(r);
  }
  g.distinct_gpus = static_cast<int>(users.size());
  const std::string census = " (" + std::to_string(g.ranks) + " ranks on " +
                             std::to_string(g.distinct_gpus) + " distinct GPU(s))";
  // The most crowded GPU is the clearest example to name.
  const std::vector<int>* worst = nullptr;
  std::string worst_uuid;
  for (const auto& [uuid, ranks] : users)
    if (ranks.size() > 1 && (!worst || ranks.size() > worst->size())) {
      worst = &ranks;
      worst_uuid = uuid;
    }
  if (worst) {
    g.own_gpu = false;
    g.why_not = "node ranks " + list_ranks(*worst) + " share GPU " + worst_uuid + census;
  } else if (!unknown.empty()) {
    // A rank that cannot name its GPU might share it: NCCL would then fail at init or hang.
    g.own_gpu = false;
    g.why_not = "node rank(s) " + list_ranks(unknown) + " could not identify their GPU" + census;
  }
  return g;
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

  // bf16 where the hardware multiplies bf16 natively: every supported GPU, and CPUs with
  // AVX512-BF16 or AMX. Elsewhere oneDNN would emulate bf16 (slower than fp32), so "auto" keeps
  // fp32 there; train.precision = "bf16" still runs.
  if (c.train.precision_auto)
    c.train.precision = cuda || !f.cpu_bf16.empty() ? DType::BF16 : DType::F32;
  if (cuda && c.train.precision == DType::F64)
    fail("train.precision = \"fp64\" is for verification on the CPU (run.device = \"cpu\"); on a "
         "GPU use \"fp32\" or \"bf16\"");
  if (cuda && c.train.qk_clip_threshold > 0)
    fail("train.qk_clip_threshold > 0 runs on the CPU backend only: the CUDA backend's attention "
         "kernels do not record the heads' largest logits yet (use run.device = \"cpu\", or "
         "qk_clip_threshold = 0)");
  if (cuda && c.parallel.cp > 1)
    fail("parallel.cp = " + std::to_string(c.parallel.cp) + " runs on the CPU backend only: the "
         "CUDA backend has no ring-attention kernels yet (use run.device = \"cpu\", or cp = 1 "
         "with sequence_parallel to save activation memory on GPUs)");
  // cuDNN's fused attention has no block-causal mask over documents (backend/cuda/
  // cuda_attention.cpp): refused here rather than trained as plain causal attention.
  if (cuda && c.data.document_mask)
    fail("data.document_mask = true runs on the CPU backend only: the CUDA backend's attention "
         "(cuDNN and its own kernels) has no document mask yet (use run.device = \"cpu\", or "
         "data.document_mask = false)");
  // Neither cuDNN's graph nor the own kernels (backend/cuda/cuda_attention.cpp) take a window.
  if (cuda && c.model.windowed())
    fail("model.attention_window = " + attention_window_text(c.model.attention_window) +
         " runs on the CPU backend only: the CUDA backend's attention (cuDNN and its own "
         "kernels) has no sliding window yet (use run.device = \"cpu\", or attention_window = 0)");
  if (!cuda && c.parallel.offload == Offload::Optimizer)
    fail("parallel.offload = \"optimizer\" needs run.device = \"cuda\" (on the CPU the optimizer "
         "state is in host memory already)");

  if (!cuda) {
    if (c.parallel.communicator == CommChoice::Nccl)
      fail("parallel.communicator = \"nccl\" needs run.device = \"cuda\"");
    c.parallel.communicator = CommChoice::Mpi;
    return;
  }
  // NCCL needs a GPU per rank: where ranks of a node share one, they communicate through MPI
  // with host buffers.
  const GpuSharing sharing = gpu_sharing(f.node_gpus);
  if (c.parallel.communicator == CommChoice::Nccl && !sharing.own_gpu)
    fail("parallel.communicator = \"nccl\" needs a GPU per rank, but " + sharing.why_not +
         " (use \"mpi\" or \"auto\", or give every rank its own GPU: at most " +
         std::to_string(sharing.distinct_gpus) + " rank(s) on this node, or srun --gpus-per-task=1)");
  if (c.parallel.communicator == CommChoice::Auto)
    c.parallel.communicator = sharing.own_gpu ? CommChoice::Nccl : CommChoice::Mpi;
}

std::string auto_precision_reason(const Config& c, const DeviceFacts& f) {
  if (!c.train.precision_auto) return "";
  if (c.run.device == DeviceChoice::Cuda) return "auto: bf16 on GPUs";
  if (!f.cpu_bf16.empty()) return "auto: the CPU has " + f.cpu_bf16;
  return "auto: the CPU has no bf16 instructions";
}

}  // namespace meshtrain
