// Device resolution: whether ranks get NCCL is decided by which GPU each rank of a node will use
// (its UUID), not by comparing the node's rank count with the devices one process sees. With
// `srun --gpus-per-task=1` every rank sees exactly one device (index 0), yet each is its own GPU.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "meshtrain/config/device_check.h"

namespace meshtrain {
namespace {

const std::string kGpu[] = {"GPU-00000000-0000-0000-0000-00000000000a",
                            "GPU-00000000-0000-0000-0000-00000000000b",
                            "GPU-00000000-0000-0000-0000-00000000000c",
                            "GPU-00000000-0000-0000-0000-00000000000d"};

Config cuda_config(CommChoice communicator) {
  Config c;
  c.deck_path = "input/gpu.toml";
  c.run.device = DeviceChoice::Cuda;
  c.train.precision = DType::BF16;
  c.parallel.communicator = communicator;
  return c;
}

// `visible` devices per process; node_gpus as gathered over the node.
DeviceFacts facts(int visible, std::vector<std::string> node_gpus) {
  DeviceFacts f;
  f.cuda_built = true;
  f.devices = visible;
  f.local_ranks = static_cast<int>(node_gpus.size());
  f.node_gpus = std::move(node_gpus);
  return f;
}

std::string refusal(Config c, const DeviceFacts& f) {
  try {
    resolve_device(c, f);
  } catch (const DeckError& e) {
    return e.what();
  }
  return "";
}

TEST(GpuSharing, DistinctUuidsOwnTheirGpu) {
  const GpuSharing g = gpu_sharing({kGpu[0], kGpu[1], kGpu[2], kGpu[3]});
  EXPECT_TRUE(g.own_gpu);
  EXPECT_EQ(g.ranks, 4);
  EXPECT_EQ(g.distinct_gpus, 4);
  EXPECT_EQ(g.why_not, "");
}

TEST(GpuSharing, NamesTheRanksOfTheMostSharedGpu) {
  // 8 ranks, every process sees 4 GPUs: rank r uses device r % 4, so ranks r and r + 4 share.
  const GpuSharing g = gpu_sharing({kGpu[0], kGpu[1], kGpu[2], kGpu[3], kGpu[0], kGpu[1],
                                    kGpu[2], kGpu[3]});
  EXPECT_FALSE(g.own_gpu);
  EXPECT_EQ(g.distinct_gpus, 4);
  EXPECT_EQ(g.why_not, "node ranks 0 and 4 share GPU " + kGpu[0] + " (8 ranks on 4 distinct GPU(s))");
  EXPECT_EQ(gpu_sharing({kGpu[1], kGpu[1], kGpu[0], kGpu[1]}).why_not,
            "node ranks 0, 1 and 3 share GPU " + kGpu[1] + " (4 ranks on 2 distinct GPU(s))");
}

TEST(GpuSharing, AnUnidentifiedGpuMayBeShared) {
  const GpuSharing g = gpu_sharing({kGpu[0], ""});
  EXPECT_FALSE(g.own_gpu);
  EXPECT_EQ(g.why_not, "node rank(s) 1 could not identify their GPU (2 ranks on 1 distinct GPU(s))");
}

// --gpus-per-task=1: four ranks, each seeing one device, four different GPUs.
TEST(ResolveDevice, OneVisibleGpuPerRankAllowsNccl) {
  const DeviceFacts f = facts(1, {kGpu[0], kGpu[1], kGpu[2], kGpu[3]});
  Config nccl = cuda_config(CommChoice::Nccl);
  EXPECT_EQ(refusal(nccl, f), "");
  Config aut = cuda_config(CommChoice::Auto);
  resolve_device(aut, f);
  EXPECT_EQ(aut.parallel.communicator, CommChoice::Nccl);
}

TEST(ResolveDevice, AllGpusVisibleAndEnoughOfThemAllowsNccl) {
  Config c = cuda_config(CommChoice::Auto);
  resolve_device(c, facts(4, {kGpu[0], kGpu[1], kGpu[2], kGpu[3]}));
  EXPECT_EQ(c.parallel.communicator, CommChoice::Nccl);
}

TEST(ResolveDevice, TwoRanksOnOneGpuRefuseNcclAndStageAutoThroughMpi) {
  const DeviceFacts f = facts(1, {kGpu[2], kGpu[2]});
  EXPECT_EQ(refusal(cuda_config(CommChoice::Nccl), f),
            "input/gpu.toml: parallel.communicator = \"nccl\" needs a GPU per rank, but node ranks "
            "0 and 1 share GPU " + kGpu[2] + " (2 ranks on 1 distinct GPU(s)) (use \"mpi\" or "
            "\"auto\", or give every rank its own GPU: at most 1 rank(s) on this node, or srun "
            "--gpus-per-task=1)");
  Config aut = cuda_config(CommChoice::Auto);
  resolve_device(aut, f);
  EXPECT_EQ(aut.parallel.communicator, CommChoice::Mpi);
  Config mpi = cuda_config(CommChoice::Mpi);
  resolve_device(mpi, f);
  EXPECT_EQ(mpi.parallel.communicator, CommChoice::Mpi);
}

TEST(ResolveDevice, MoreRanksThanVisibleGpusWrapOntoSharedOnes) {
  Config c = cuda_config(CommChoice::Auto);
  resolve_device(c, facts(2, {kGpu[0], kGpu[1], kGpu[0], kGpu[1]}));
  EXPECT_EQ(c.parallel.communicator, CommChoice::Mpi);
}

TEST(ResolveDevice, CpuRunsUseMpiWhateverTheGpus) {
  Config c = cuda_config(CommChoice::Auto);
  c.run.device = DeviceChoice::Cpu;
  c.train.precision = DType::F32;
  resolve_device(c, facts(1, {kGpu[0], kGpu[1]}));
  EXPECT_EQ(c.parallel.communicator, CommChoice::Mpi);
}

// The CUDA backend has no ring-attention kernels: context parallelism is refused there by name,
// and runs on CPUs.
TEST(ResolveDevice, ContextParallelismIsRefusedOnGpus) {
  const DeviceFacts f = facts(1, {kGpu[0], kGpu[1]});
  Config c = cuda_config(CommChoice::Auto);
  c.parallel.cp = 2;
  EXPECT_NE(refusal(c, f).find("input/gpu.toml: parallel.cp = 2 runs on the CPU backend only"),
            std::string::npos)
      << refusal(c, f);
  c.run.device = DeviceChoice::Cpu;
  c.train.precision = DType::F32;
  EXPECT_EQ(refusal(c, f), "");
}

// model.attention_window has no CUDA attention kernel: refused at startup, not trained with
// full attention.
TEST(ResolveDevice, SlidingWindowIsRefusedOnGpus) {
  const DeviceFacts f = facts(1, {kGpu[0]});
  for (const std::vector<int64_t>& window : {std::vector<int64_t>{1024, 0}, std::vector<int64_t>{}}) {
    Config c = cuda_config(CommChoice::Auto);
    c.model.attention_window = window;
    const std::string why = refusal(c, f);
    // A pattern is refused by its deck form; no window trains as before.
    EXPECT_EQ(why.find("input/gpu.toml: model.attention_window = [1024, 0] runs on the CPU "
                       "backend only") != std::string::npos,
              !window.empty())
        << why;
  }
}

// data.document_mask has no CUDA attention kernel: refused at startup, not trained causal.
TEST(ResolveDevice, DocumentMaskIsRefusedOnGpus) {
  const DeviceFacts f = facts(1, {kGpu[0]});
  Config c = cuda_config(CommChoice::Auto);
  c.data.document_mask = true;
  EXPECT_NE(refusal(c, f).find("input/gpu.toml: data.document_mask = true runs on the CPU "
                               "backend only"),
            std::string::npos)
      << refusal(c, f);
  c.run.device = DeviceChoice::Cpu;
  c.train.precision = DType::F32;
  EXPECT_EQ(refusal(c, f), "");
}

// train.precision = "auto" on a CPU: bf16 where oneDNN has bf16 instructions to run it on,
// fp32 elsewhere; the device line says which and why. A named precision is kept either way.
TEST(ResolveDevice, AutoPrecisionOnCpusFollowsTheirBf16Instructions) {
  Config c = cuda_config(CommChoice::Auto);
  c.run.device = DeviceChoice::Cpu;
  c.train.precision_auto = true;
  DeviceFacts with = facts(0, {""});
  with.cpu_bf16 = "AVX512-BF16";
  Config a = c;
  resolve_device(a, with);
  EXPECT_EQ(a.train.precision, DType::BF16);
  EXPECT_EQ(auto_precision_reason(a, with), "auto: the CPU has AVX512-BF16");

  const DeviceFacts without = facts(0, {""});
  Config b = c;
  resolve_device(b, without);
  EXPECT_EQ(b.train.precision, DType::F32);
  EXPECT_EQ(auto_precision_reason(b, without), "auto: the CPU has no bf16 instructions");

  for (DType named : {DType::F32, DType::F64, DType::BF16}) {
    Config n = c;
    n.train.precision_auto = false;
    n.train.precision = named;
    resolve_device(n, with);
    EXPECT_EQ(n.train.precision, named);
    EXPECT_EQ(auto_precision_reason(n, with), "");
    Config m = n;
    resolve_device(m, without);  // bf16 runs without the instructions too, emulated by oneDNN
    EXPECT_EQ(m.train.precision, named);
  }

  Config g = cuda_config(CommChoice::Auto);
  g.train.precision_auto = true;
  resolve_device(g, facts(1, {kGpu[0]}));
  EXPECT_EQ(g.train.precision, DType::BF16);
  EXPECT_EQ(auto_precision_reason(g, facts(1, {kGpu[0]})), "auto: bf16 on GPUs");
}

}  // namespace
}  // namespace meshtrain
