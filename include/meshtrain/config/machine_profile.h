#pragma once
// A machine profile: what the time model (train/time_model.h) needs to know of a machine to
// predict a training step's time. Written by `meshtrain bench --suite calibrate --out P.toml`
// (measured on the machine it ran on) or by hand from public datasheets (input/machines/,
// marked source = "datasheet"). Read with the same care as a deck: an unknown key, a missing
// one or a value out of range is a DeckError naming the file, the key, the value and what
// would be accepted.
//
// The file (TOML; every rate per rank, i.e. per GPU or per CPU rank with its threads):
//   [machine]
//   name = "dgx-h100"
//   source = "datasheet"          # or "measured"
//   notes = "..."                 # where the numbers come from
//   device = "cuda"               # "cpu" or "cuda"
//   ranks_per_node = 8            # ranks (GPUs) of one node: tp/dp/pp groups inside it use
//                                 # the intra_node links, wider ones the inter_node links
//   cores_per_node = 112          # CPU cores of a node (a CPU job's ranks share them)
//   threads_per_rank = 1          # CPU threads each rank computed with when measured
//   memory_per_rank = 85899345920 # bytes a rank may hold (device memory on GPUs)
//   sync_seconds = 0              # optional: what each blocking collective or transfer costs
//                                 # beyond its alpha-beta time when the ranks are busy (CPU
//                                 # ranks sharing cores wait for the scheduler to run them)
//   waiting_ranks_lend = 1        # optional: how much of its core a rank waiting in MPI leaves
//                                 # to the busy ranks of its node, 0 (it spins: Open MPI's and
//                                 # MPICH's default polling) to 1 (it sleeps, e.g. Open MPI's
//                                 # mpi_yield_when_idle); measured by calibrate for its launch
//   cores_per_rank = 1            # optional: the cores each rank was bound to when measured
//   idle_ranks = "spin"           # optional: whether ranks waiting in MPI "yield" or "spin"
//                                 # when measured (with ranks_per_node, cores_per_node and
//                                 # threads_per_rank: the launch, config/launch_shape.h)
//   [gemm.bf16]                   # GEMM rate by the smallest of m, n, k (shape class)
//   peak = 989e12                 # the ceiling MFU is measured against, FLOP/s
//   sizes = [64, 256, 1024, 4096] # smallest dimension
//   flops = [1e14, 4e14, 7e14, 7.5e14]  # FLOP/s at that size (interpolated in log2(size))
//   [gemm.fp32]  (same keys; fp64 optional)
//   [memory]
//   bytes_per_s = 3.35e12         # memory-bound kernels (stream bandwidth)
//   [link.intra_node.all_reduce]  # and all_gather, reduce_scatter, p2p, all_to_all (optional);
//   alpha = 5e-6                  # seconds per algorithm step (latency)
//   bus_bytes_per_s = 4.5e11      # bus bandwidth (nccl-tests' busbw convention)
//   [link.inter_node.all_reduce]  ... (absent on a single-node measurement: then inter-node
//                                 # transfers are priced at the intra-node link, and `plan`
//                                 # says so)

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/config/launch_shape.h"
#include "meshtrain/tensor/dtype.h"

namespace meshtrain {

enum class LinkClass { IntraNode = 0, InterNode = 1 };
std::string_view link_class_name(LinkClass l);  // "intra_node", "inter_node"
enum class CollectiveKind { AllReduce = 0, AllGather = 1, ReduceScatter = 2, PointToPoint = 3, AllToAll = 4 };
// "all_reduce", "all_gather", "reduce_scatter", "p2p", "all_to_all"
std::string_view collective_name(CollectiveKind c);
constexpr int kCollectiveKinds = 5;

// The alpha-beta model of one collective on one link class, ring algorithm's step counts:
//   all_reduce      2 (n-1) steps, 2 (n-1)/n x bytes over the bus
//   all_gather,
//   reduce_scatter  (n-1) steps, (n-1)/n x bytes (bytes: the whole, gathered buffer)
//   p2p             1 step, bytes (one message between two ranks; n ignored)
//   all_to_all      (n-1) steps, (n-1)/n x bytes (bytes: one rank's whole send buffer, equal
//                   blocks to every rank; its own block never leaves it). Expert parallelism's
//                   dispatch and combine. Optional in a profile: profiles written before it was
//                   measured lack it, and the time model then prices it as all_gather's model
//                   (the same step and byte counts) and says so.
struct AlphaBeta {
  double alpha = 0;            // seconds per step
  double bus_bytes_per_s = 0;  // > 0 when set
  double seconds(CollectiveKind kind, double bytes, int ranks) const;
};

// GEMM FLOP/s by shape class for one dtype.
struct GemmRates {
  double peak = 0;             // FLOP/s: the ceiling for MFU
  std::vector<double> sizes;   // increasing smallest-dimension sizes
  std::vector<double> flops;   // FLOP/s at each size
  // Seconds of C[m,n] = A[m,k] B[k,n]: 2mnk FLOPs at the rate interpolated (linearly in
  // log2 of the smallest dimension, clamped at both ends).
  double seconds(double m, double n, double k) const;
};

struct MachineProfile {
  std::string path;  // the file it was read from ("" when built in code)
  std::string name;
  std::string source;  // "measured" or "datasheet"
  std::string notes;
  std::string device;  // "cpu" or "cuda"
  int ranks_per_node = 1;
  int cores_per_node = 1;
  int threads_per_rank = 1;
  double memory_per_rank = 0;  // bytes; 0: unknown
  double sync_seconds = 0;     // per blocking synchronization among busy ranks
  // 0 to 1: the share of its cores a rank idle in MPI (a pipeline bubble) leaves to busy ranks
  // of its node, as measured under the calibrating launch (1 where not measured).
  double waiting_ranks_lend = 1;
  // The launch calibrate measured under (0 / "": not recorded, a datasheet or an older profile).
  int cores_per_rank = 0;
  std::string idle_ranks;
  LaunchShape launch() const;
  // Indexed by DType: F32, F64, BF16 (absent: sizes empty).
  std::optional<GemmRates> gemm_fp32, gemm_fp64, gemm_bf16;
  double memory_bytes_per_s = 0;
  // [link][collective]; inter_node absent on single-node measurements.
  std::array<std::optional<AlphaBeta>, kCollectiveKinds> intra_node, inter_node;

  // The rates of a compute dtype; throws DeckError naming the profile when it has none.
  const GemmRates& gemm(DType dtype) const;
  // The model of a collective on a link class: inter-node falls back to intra-node when the
  // profile has none (single-node measurement). Throws DeckError when neither is present.
  const AlphaBeta& link(LinkClass link, CollectiveKind kind) const;
  // Whether link(link, kind) finds a model (a kind added after a profile was written,
  // all_to_all, may be absent from it).
  bool has_link(LinkClass link, CollectiveKind kind) const;
  bool has_inter_node() const;
};

// Reads and validates a profile; throws DeckError naming the file, key, value and what would
// be accepted.
MachineProfile read_machine_profile(const std::string& path);
MachineProfile parse_machine_profile(const std::string& path, const std::string& text);
// The TOML text of a profile (read_machine_profile of it gives it back).
std::string format_machine_profile(const MachineProfile& profile);

}  // namespace meshtrain
