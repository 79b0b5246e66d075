#include "meshtrain/app/run_setup.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "meshtrain/app/auto_layout.h"
#include "meshtrain/app/cpu_binding.h"
#include "meshtrain/app/launch_check.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/blocking_watchdog.h"
#include "meshtrain/comm/flight_report.h"
#include "meshtrain/comm/mpi_runtime.h"
#include "meshtrain/comm/node.h"
#include "meshtrain/comm/recording_communicator.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/config/device_check.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/io/run_directory.h"
#include "meshtrain/train/trainer.h"

#if MESHTRAIN_HAVE_CUDA
#include "meshtrain/backend/cuda/cuda_backend.h"
#include "meshtrain/comm/nccl_communicator.h"
#include "meshtrain/comm/staged_mpi_communicator.h"
#endif

namespace meshtrain {

Config load_config(const std::string& deck, const std::vector<std::string>& overrides,
                   Communicator& world) {
  check_same_launch(world, deck, overrides);
  std::string text, error;
  if (world.rank() == 0) {
    try {
      text = read_deck_file(deck);
    } catch (const DeckError& e) {
      error = e.what();
    }
  }
  world.broadcast_bytes(error, 0);
  if (!error.empty()) throw DeckError(error);
  world.broadcast_bytes(text, 0);
  Config config = parse_deck(deck, text, overrides);
  config.overrides = overrides;
  // "auto" layout choices are settled by setup_run once the device and threads are known.
  if (!config.parallel.automatic.any()) check_layout(config, world.size());
  return config;
}

namespace {

// One number per rank for "did every rank settle on the same device choices".
double choice_code(const Config& c) {
  return static_cast<double>(static_cast<int>(c.run.device) * 100 +
                             static_cast<int>(c.train.precision) * 10 +
                             static_cast<int>(c.parallel.communicator));
}

// Collective over the node: this rank's share of the node's cores (cpu_binding.h), and rank 0's
// report of it for the start-up lines: a note for the device line and, when the binding leaves
// cores idle on some node, a warning naming the launcher's flag.
struct CpuThreads {
  ThreadChoice choice;
  std::string note, warning;
};
CpuThreads cpu_threads(const Config& c, Communicator& world, int node_rank) {
  // main() refuses a bad OMP_NUM_THREADS before MPI starts; a caller that did not pass there
  // (an in-process test) still gets one verdict on every rank. The node's gather comes before
  // the choice that may refuse, so every rank reaches it.
  TrainingThreads node;
  agree(world, [&] { node = training_threads(c.run.threads); });
  const NodeCpuShare& share = node.share;
  CpuThreads t;
  t.choice = node.choice;
  const Launcher launcher = detect_launcher();
  const double worst = world.all_reduce_scalar(share.unused, ReduceOp::Max);
  if (world.rank() != 0) return t;
  const size_t mine = static_cast<size_t>(node_rank);
  t.note = t.choice.source != "cores"
               ? "threads from " + t.choice.source
               : "threads from the node's cores: " + std::to_string(node.node_ranks) +
                     " rank(s) bound to " + format_cpu_list(share.bound) + " of " +
                     format_cpu_list(share.available) +
                     (share.sharing[mine] > 1
                          ? ", " + std::to_string(share.sharing[mine]) + " ranks to a core"
                          : "");
  if (share.unused > 0) {
    t.note += ", " + std::to_string(share.unused) + " idle";
    t.warning = idle_cores_warning(share, launcher);
  } else if (worst > 0) {
    t.warning = "the CPU binding leaves up to " + std::to_string(static_cast<int>(worst)) +
                " core(s) idle on some node (not rank 0's): a rank's threads run only on its "
                "cores; started by " + std::string(launcher_name(launcher)) + ", rerun with " +
                binding_fix(launcher, node.node_ranks, share.usable);
  }
  return t;
}
// Before anything is written into run.dir or checkpoint.dir (flight records, metrics, probes):
// a job started there while another runs is refused and leaves the other's files alone.
// One lock name (kDirectoryLockName) for both: a directory is one job's, whichever role it has in
// it (another job's run.dir given as this one's checkpoint.dir is refused too).
void lock_run_directories(RunSetup& s, Communicator& world) {
  const Config& c = s.config;
  std::string warning;
  agree(world, [&] {
    if (world.rank() != 0) return;
    create_run_directory(c.deck_path, c.run.dir);
    s.locks.push_back(DirectoryLock::take(c.run.dir, kDirectoryLockName, c.deck_path + ": run.dir = \"" +
                                          c.run.dir + "\": ", warning));
    // checkpoint.dir too, wherever it is: two runs of one lineage, or runs sharing checkpoint.dir
    // from different run directories, would otherwise overwrite and prune each other's files.
    const std::string key = c.deck_path + ": checkpoint.dir = \"" + c.checkpoint.dir + "\": ";
    std::error_code ec;
    if (!std::filesystem::create_directories(c.checkpoint.dir, ec) && ec)
      throw std::runtime_error(key + "cannot create the directory: " + ec.message() +
                               " (set checkpoint.dir to a directory every rank can write)");
    // The same directory twice: this process's second lock on the file would be refused by its
    // first (open-file-description locks conflict within a process too).
    if (!std::filesystem::equivalent(c.run.dir, c.checkpoint.dir, ec))
      s.locks.push_back(DirectoryLock::take(c.checkpoint.dir, kDirectoryLockName, key, warning));
  });
  if (!warning.empty()) std::fprintf(stderr, "meshtrain: warning: %s\n", warning.c_str());
}

}  // namespace

int local_ranks() { return node_membership(MPI_COMM_WORLD).local_size; }

int local_rank() { return node_membership(MPI_COMM_WORLD).local_rank; }

TrainingThreads training_threads(int configured) {
  std::vector<RankCpus> ranks;
  for (const std::string& text : gather_over_node(encode_rank_cpus(probe_rank_cpus())))
    ranks.push_back(decode_rank_cpus(text));
  TrainingThreads t;
  t.share = share_node_cpus(ranks);
  t.node_ranks = static_cast<int>(ranks.size());
  t.choice = choose_threads(configured, std::getenv("OMP_NUM_THREADS"), t.share, local_rank());
  return t;
}

std::vector<std::string> gather_over_node(const std::string& mine) {
  MPI_Comm node = split_by_node(MPI_COMM_WORLD);
  std::vector<std::string> out = all_gather_strings(node, mine);
  MPI_Comm_free(&node);
  return out;
}

std::unique_ptr<ProcessGrid> make_grid(const Config& c, Backend& backend, FlightRecorder* recorder,
                                       MPI_Comm world) {
  CommunicatorDecorator record;
  if (recorder)
    record = [recorder](std::unique_ptr<Communicator> comm, int id) -> std::unique_ptr<Communicator> {
      return std::make_unique<RecordingCommunicator>(std::move(comm), *recorder, id);
    };
  if (backend.device() == Device::Cpu)
    return std::make_unique<ProcessGrid>(world, c.grid_shape(), c.run.comm_timeout, nullptr, record);
#if MESHTRAIN_HAVE_CUDA
  const std::chrono::duration<double> timeout(c.run.comm_timeout);
  auto* cuda = static_cast<CudaBackend*>(&backend);
  const bool nccl = c.parallel.communicator == CommChoice::Nccl;
  return std::make_unique<ProcessGrid>(
      world, c.grid_shape(), c.run.comm_timeout,
      [cuda, nccl, timeout](MPI_Comm comm, const std::string& name) -> std::unique_ptr<Communicator> {
        auto mpi = std::make_unique<MpiCommunicator>(comm, name, timeout);
        if (nccl) return std::make_unique<NcclCommunicator>(std::move(mpi), *cuda, timeout);
        return std::make_unique<StagedMpiCommunicator>(std::move(mpi), *cuda, timeout);
      },
      record);
#else
  throw std::logic_error("a device backend in a build without CUDA");
#endif
}

// The device every rank settles on (run.device, train.precision, parallel.communicator from
// what each node has), the same on every rank; returns the facts it was settled from.
DeviceFacts settle_device(RunSetup& s, const std::string& deck, MpiCommunicator& world, int& node_rank) {
  const NodeMembership node = [] {
    const BlockingRegion region("finding the ranks of each node (MPI_Comm_split over the world)");
    return node_membership(MPI_COMM_WORLD);
  }();
  const int node_size = node.local_size;
  node_rank = node.local_rank;
  DeviceFacts facts = probe_device_facts(node_size, node_rank);
  facts.node_gpus = gather_over_node(facts.node_gpus.front());
  agree(world, [&] { resolve_device(s.config, facts); });
  const double code = choice_code(s.config);
  if (world.all_reduce_scalar(code, ReduceOp::Min) != world.all_reduce_scalar(code, ReduceOp::Max))
    throw AgreedError(deck + ": ranks settled on different devices (some nodes have GPUs, others "
                      "not, or ranks share GPUs on some nodes only): set run.device, "
                      "train.precision and parallel.communicator explicitly");
  return facts;
}

// This rank's backend: the CPU's with its threads (CpuThreads says how many and why), or the GPU's
// (a parameter server's optimizer runs on the host).
CpuThreads make_backend(RunSetup& s, const std::string& deck, MpiCommunicator& world,
                        [[maybe_unused]] const DeviceFacts& facts, int node_rank,
                        [[maybe_unused]] bool server) {
  const Config& c = s.config;
  CpuThreads cpu;
  if (c.run.device == DeviceChoice::Cpu) {
    // Refused before the first step rather than failing inside it: oneDNN has no bf16 GEMM below
    // AVX512_CORE (a CPU with AVX2 only, or ONEDNN_MAX_CPU_ISA=AVX2).
    agree(world, [&] {
      if (c.train.precision == DType::BF16 && !cpu_runs_bf16())
        throw DeckError(deck + ": train.precision = \"bf16\" on a CPU where oneDNN has no bf16 GEMM (" +
                        cpu::Gemm::onednn_version() + "; it needs AVX512_CORE or later, not capped below "
                        "by ONEDNN_MAX_CPU_ISA): use \"fp32\", or \"auto\" (fp32 on this CPU)");
    });
    cpu = cpu_threads(c, world, node_rank);
    s.backend = std::make_unique<CpuBackend>(cpu.choice.threads);
  } else {
#if MESHTRAIN_HAVE_CUDA
    agree(world, [&] {
      if (server) {  // the optimizer of a parameter server runs on the host
        s.backend = std::make_unique<CpuBackend>(1);
        return;
      }
      CudaBackendOptions options;
      options.device = facts.device_index;
      options.attention = parse_attention_impl(c.run.attention);
      options.fused_epilogues = c.run.fused_epilogues;
      s.backend = std::make_unique<CudaBackend>(options);
    });
#else
    throw std::logic_error("resolve_device chose CUDA in a build without it");
#endif
  }
  return cpu;
}

// The flight recorder of this rank's communication, and the hook that reads every rank's record
// when a communication fails.
void start_flight_records(RunSetup& s, MpiCommunicator& world) {
  const Config& c = s.config;
  agree(world, [&] {
    create_run_directory(c.deck_path, c.run.dir);
    s.recorder = std::make_unique<FlightRecorder>(flight_record_path(c.run.dir, world.rank()),
                                                  world.rank(), world.size(),
                                                  static_cast<size_t>(c.run.flight_records));
  });
  // On a communication failure the rank that noticed reads every rank's record before the job
  // ends (records are written as operations happen; the run directory is shared on a
  // cluster, or all ranks are on this node) and names the rank that did not arrive. Bounded:
  // past kExplainRanks records the reading could take longer than the abort should.
  constexpr int kExplainRanks = 256;
  if (world.size() <= kExplainRanks)
    s.explain_at_abort = ScopedAbortHook([dir = c.run.dir, rank = world.rank()] {
      const FlightReport report = analyse_run_dir(dir);
      const std::string cause = report.likely_cause();
      std::fprintf(stderr, "meshtrain: rank %d: flight records of %d rank(s): %s; `meshtrain "
                   "diagnose %s` for the full report\n", rank, report.records,
                   cause.empty() ? "no rank went quiet" : cause.c_str(), dir.c_str());
    });
}

// The process grid's communicators; under parallel.data_sync = "async" the channel between
// workers and servers, and the servers' own.
void make_communicators(RunSetup& s, MpiCommunicator& world, bool server) {
  const Config& c = s.config;
  MPI_Comm workers = MPI_COMM_WORLD;
  {
    const BlockingRegion region("making the process grid's communicators (MPI_Comm_split and "
                                "MPI_Comm_dup over the world)");
    if (c.parallel.async()) {
      MPI_Comm_dup(MPI_COMM_WORLD, &s.server_channel);
      MPI_Comm part;
      MPI_Comm_split(MPI_COMM_WORLD, server ? 1 : 0, world.rank(), &part);
      (server ? s.servers : workers) = part;
    }
    if (!server) s.grid = make_grid(c, *s.backend, s.recorder.get(), workers);
  }
}

// Rank 0's device line, the layout the advisor chose, and the warnings about the launch.
void print_device_line(const RunSetup& s, const CpuThreads& cpu, const DeviceFacts& facts,
                       const std::string& layout_choice, const std::string& launch_differs) {
  const Config& c = s.config;
  const std::string cpus = cpu.note.empty() ? "" : " (" + cpu.note + ")";
  const std::string why = auto_precision_reason(c, facts);
  const std::string precision =
      std::string(dtype_name(c.train.precision)) + (why.empty() ? "" : " (" + why + ")");
  std::printf("device: %s%s, precision %s, communication %s, MPI library %s\n",
              s.backend->describe().c_str(), cpus.c_str(), precision.c_str(),
              c.run.device == DeviceChoice::Cpu ? "MPI"
              : c.parallel.communicator == CommChoice::Nccl
                  ? "NCCL (one GPU per rank)"
                  : "MPI through host buffers (ranks of a node share a GPU, or "
                    "parallel.communicator = \"mpi\")",
              mpi_library_version().c_str());
  if (!layout_choice.empty()) std::printf("%s\n", layout_choice.c_str());
  if (!launch_differs.empty()) std::fprintf(stderr, "meshtrain: warning: %s\n", launch_differs.c_str());
  if (!cpu.warning.empty()) std::fprintf(stderr, "meshtrain: warning: %s\n", cpu.warning.c_str());
  if (c.run.device == DeviceChoice::Cpu && c.train.precision == DType::BF16 && facts.cpu_bf16.empty())
    std::fprintf(stderr, "meshtrain: warning: train.precision = \"bf16\" on a CPU without bf16 "
                 "instructions (or with ONEDNN_MAX_CPU_ISA below them): oneDNN emulates bf16 "
                 "GEMMs, slower than fp32; \"fp32\" or \"auto\" trains faster here\n");
  if (const int spanning = s.grid->tensor_groups_spanning_nodes(); spanning > 0)
    std::fprintf(stderr, "meshtrain: warning: %d of %d tensor-parallel group(s) span nodes (tp "
                 "= %d, %d rank(s) on node %s), the first: %s; every layer's all-reduce there "
                 "crosses the network: use tp <= ranks per node, or an order starting with "
                 "\"tp\"\n",
                 spanning, c.parallel.dp * c.parallel.pp, c.parallel.tp, s.grid->local_size(),
                 s.grid->node_name().c_str(), s.grid->spanning_tensor_group().c_str());
  std::fflush(stdout);
}

RunSetup setup_run(const std::string& deck, const std::vector<std::string>& overrides,
                   MpiCommunicator& world, Flight flight) {
  RunSetup s;
  s.config = load_config(deck, overrides, world);
  // From here on a blocking MPI or MPI-IO call that a stalled peer never lets return ends the
  // job after run.comm_timeout, as a communicator's operation does (blocking_watchdog.h).
  set_blocking_timeout(s.config.run.comm_timeout);
  if (flight == Flight::Record) lock_run_directories(s, world);
  int node_rank = 0;
  const DeviceFacts facts = settle_device(s, deck, world, node_rank);
  const Config& c = s.config;

  // Parameter servers are the job's last ranks (parallel.data_sync = "async").
  const bool server = c.parallel.async() && world.rank() >= c.parallel.dp * c.parallel.tp * c.parallel.pp;
  const CpuThreads cpu = make_backend(s, deck, world, facts, node_rank, server);
  if (flight == Flight::Record && c.run.flight_records > 0) start_flight_records(s, world);
  // Rank 0's line, printed with the device line below.
  const std::string launch_differs =
      launch_warning(s.config, world, c.run.device == DeviceChoice::Cpu ? cpu.choice.threads : 1);
  const std::string layout_choice = settle_auto_layout(
      s.config, world, c.run.device == DeviceChoice::Cpu ? cpu.choice.threads : 1);
  make_communicators(s, world, server);
  if (world.rank() == 0) print_device_line(s, cpu, facts, layout_choice, launch_differs);
  return s;
}

void publish_flight_records(RunSetup& run, Communicator& world) {
  if (!run.recorder) return;
  // Each rank on its own, no collective: parameter servers publish before serving, workers
  // once their trainer starts, talking to them by then. A rename in the run directory that
  // fails is this rank's fault alone.
  try {
    run.recorder->publish();
  } catch (const std::runtime_error& e) {
    throw DataError(run.config.deck_path, "run.dir = \"" + run.config.run.dir + "\": " + e.what());
  }
  // Records of ranks this job does not have (an earlier, larger job) would mislead diagnose;
  // removed only now, by a start that is no longer refused.
  if (world.rank() != 0) return;
  for (const std::string& path : flight_record_paths(run.config.run.dir))
    if (const int r = std::atoi(path.c_str() + path.rfind("rank_") + 5); r >= world.size()) {
      std::remove(path.c_str());
      // Its published record too, where the pending one was listed in its place.
      if (const size_t at = path.rfind(kPendingSuffix); at != std::string::npos && at + 4 == path.size())
        std::remove(path.substr(0, at).c_str());
    }
}

}  // namespace meshtrain
