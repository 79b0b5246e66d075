// The `calibrate` suite: measures this machine as training uses it and writes a machine profile
// (config/machine_profile.h) for the time model.
//
// Every rank of the launch measures at once, so a rank's rates are those it gets while the other
// ranks of its node work too, as in training (a CPU rank shares memory bandwidth and, with more
// threads than cores, the cores). Rates are per rank: each rank's best of `repeats` runs (noise on
// a shared machine only lowers a run), then the median over ranks, which neither the luckiest
// nor the unluckiest rank sets; the slowest rank is reported beside it.
//
// With `passes` P, every point (each GEMM size, the memory bandwidth, each link message size) is
// measured P times, interleaved: pass 1 measures all of them, then pass 2 all again, and so on.
// The profile takes each point's median over the passes before fitting: load that comes and goes
// on a shared machine moves one pass's figures, not the profile.
//
//   GEMM    C(m,n) = A(m,k) B(k,n) through the CPU backend's Gemm (the library chosen as in
//           training), shapes of a GPT layer with smallest dimension s: m = 4s tokens, n = 2s,
//           k = s; fp32, and bf16 where the CPU has bf16 instructions. peak: the best size's rate.
//   memory  STREAM's scale (a = 3 b) over arrays far larger than the caches; bytes read + written.
//   links   all_reduce, all_gather, reduce_scatter and p2p from 4 KiB to 16 MiB on the ranks of a
//           node (intra_node; each node's ranks at once) and, on 2+ nodes, on the ranks of equal
//           node rank across nodes (inter_node; every node rank's group at once, as the data-
//           parallel groups of a layout with tp inside nodes run), fitted to the ring alpha-beta
//           model (app/calibrate.h). World rank 0's groups are the ones written. On one rank no
//           link is measurable: the profile then has none, and says so.

#include <mpi.h>
#include <omp.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/app/calibrate.h"
#include "meshtrain/app/cpu_binding.h"
#include "meshtrain/app/launch_probe.h"
#include "meshtrain/app/run_setup.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/backend/cpu/gemm.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/mpi_runtime.h"
#include "meshtrain/comm/node.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/io/data_error.h"
#include "meshtrain/tensor/bf16.h"

namespace meshtrain {

namespace {

namespace fs = std::filesystem;

constexpr int kGemmSizes[] = {32, 64, 128, 256, 512, 1024};
constexpr double kGemmSampleSeconds = 20e-3;
constexpr CollectiveKind kCollectives[] = {CollectiveKind::AllReduce, CollectiveKind::AllGather,
                                           CollectiveKind::ReduceScatter,
                                           CollectiveKind::PointToPoint, CollectiveKind::AllToAll};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Every rank's value, in rank order: the same vector on every rank.
std::vector<double> gather_all(double mine) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  std::vector<double> all(static_cast<size_t>(ranks));
  MPI_Allgather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return all;
}

struct OverRanks {
  double median = 0, slowest = 0;
};
OverRanks over_ranks(double mine) {
  std::vector<double> all = gather_all(mine);
  std::sort(all.begin(), all.end());
  return {all[all.size() / 2], all.front()};
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One point's passes: the median over passes of the median rank's figure and of the slowest's.
OverRanks median_over_passes(const std::vector<OverRanks>& passes) {
  std::vector<double> medians, slowest;
  for (const OverRanks& o : passes) {
    medians.push_back(o.median);
    slowest.push_back(o.slowest);
  }
  return {median_of(medians), median_of(slowest)};
}

// Rank 0's verdict on work only it does, shared: every rank throws the same AgreedError.
void agree_on_rank_zero(const std::function<void()>& work) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string error;
  if (rank == 0) {
    try {
      work();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  int length = static_cast<int>(error.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  error.resize(static_cast<size_t>(length));
  MPI_Bcast(error.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (length > 0) throw AgreedError(error);
}

// ---- GEMM -----------------------------------------------------------------------------------

// This rank's best FLOP/s of C(4s, 2s) = A(4s, s) B(s, 2s); every rank runs the same number of
// GEMMs per sample, started together. Inputs are multiples of 1/8 below 1 (exact in bf16) and
// every partial sum a multiple of 1/64 below 2^10: the fp32 result is exact, and probed.
double rank_gemm_rate(cpu::Gemm& gemm, DType dtype, int s, int repeats, int& wrong) {
  const int64_t m = 4 * int64_t{s}, n = 2 * int64_t{s}, k = s;
  std::vector<float> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i * 7 % 13) - 6) / 8;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i * 5 % 11) - 5) / 8;
  std::vector<uint16_t> a16(a.size()), b16(b.size());
  if (dtype == DType::BF16) {
    for (size_t i = 0; i < a.size(); ++i) a16[i] = float_to_bf16_bits(a[i]);
    for (size_t i = 0; i < b.size(); ++i) b16[i] = float_to_bf16_bits(b[i]);
  }
  const cpu::GemmShape shape = cpu::GemmShape::dense(cpu::Trans::No, cpu::Trans::No, m, n, k);
  auto run = [&] {
    if (dtype == DType::BF16) gemm.run_bf16(shape, a16.data(), b16.data(), nullptr, c.data());
    else gemm.run(shape, a.data(), b.data(), nullptr, c.data());
  };
  run();  // oneDNN builds its primitive on the first call
  double first = now();
  run();
  first = now() - first;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const int count = static_cast<int>(std::clamp(std::ceil(kGemmSampleSeconds / first), 1.0, 1e5));
  // A sample lasts until the slowest rank is done: the rate each rank sustains while all of
  // them work, which is what a rank gets in training. (Each rank's own best would count the
  // moments a rank had a shared core to itself: with more ranks than cores that overstates
  // the rate by the oversubscription.)
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now();
    for (int i = 0; i < count; ++i) run();
    // The rank that left the first barrier earliest measures the whole sample: a rank that
    // started late (its core busy with another rank) would time only its own share.
    MPI_Barrier(MPI_COMM_WORLD);
    double elapsed = now() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    best = std::max(best, 2.0 * m * n * k * count / elapsed);
  }
  for (int64_t probe = 0; probe < 8; ++probe) {
    const int64_t i = probe * 977 % m, j = probe * 389 % n;
    double expected = 0;
    for (int64_t p = 0; p < k; ++p) expected += double{a[i * k + p]} * b[p * n + j];
    if (std::abs(expected - c[i * n + j]) > 1e-3 * (1 + std::abs(expected))) ++wrong;
  }
  return best;
}

// One pass over the GEMM sizes: each size's rate over ranks, in kGemmSizes order; wrong results
// add to `wrongs` (one count per size).
std::vector<OverRanks> measure_gemm_sizes(DType dtype, int repeats, std::vector<int>& wrongs) {
  cpu::Gemm gemm;
  std::vector<OverRanks> rates;
  wrongs.resize(std::size(kGemmSizes));
  for (size_t i = 0; i < std::size(kGemmSizes); ++i)
    rates.push_back(over_ranks(rank_gemm_rate(gemm, dtype, kGemmSizes[i], repeats, wrongs[i])));
  return rates;
}

// The rates of `dtype` from every pass's sizes (passes[pass][size]): each size's median over
// passes, and their table.
GemmRates gemm_rates(DType dtype, const std::vector<std::vector<OverRanks>>& passes,
                     const std::vector<int>& wrongs, BenchReport& report) {
  GemmRates rates;
  std::vector<OverRanks> measured;
  for (size_t i = 0; i < std::size(kGemmSizes); ++i) {
    std::vector<OverRanks> point;
    for (const std::vector<OverRanks>& pass : passes) point.push_back(pass[i]);
    measured.push_back(median_over_passes(point));
    rates.sizes.push_back(kGemmSizes[i]);
    rates.flops.push_back(measured.back().median);
  }
  rates.peak = *std::max_element(rates.flops.begin(), rates.flops.end());
  for (size_t i = 0; i < measured.size(); ++i) {
    const double s = rates.sizes[i];
    report.row(std::string(dtype_name(dtype)) + " gemm s=" + std::to_string(kGemmSizes[i]),
               {4 * s, 2 * s, s, measured[i].median / 1e9, measured[i].slowest / 1e9,
                measured[i].median / rates.peak},
               wrongs[i]);
  }
  return rates;
}

// ---- synchronization under load ------------------------------------------------------------

// What one blocking synchronization costs ranks that are busy computing, beyond its idle-link
// time: rounds of (GEMMs of a few milliseconds, then an 8-byte all-reduce over the node) against
// the same GEMMs alone, per round. Where ranks share cores a rank that waits gives its core
// away and comes back only when the scheduler runs it again; on a node with a core per rank
// this is near zero. Timed to the slowest rank, like the rates.
double sync_penalty(MPI_Comm node) {
  cpu::Gemm gemm;
  const int64_t m = 512, n = 256, k = 128;
  std::vector<float> a(static_cast<size_t>(m * k), 0.25f), b(static_cast<size_t>(k * n), 0.5f),
      c(static_cast<size_t>(m * n));
  const cpu::GemmShape shape = cpu::GemmShape::dense(cpu::Trans::No, cpu::Trans::No, m, n, k);
  constexpr int kRounds = 16, kGemmsPerRound = 4;
  const auto timed = [&](bool synchronize) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now();
    for (int r = 0; r < kRounds; ++r) {
      for (int g = 0; g < kGemmsPerRound; ++g) gemm.run(shape, a.data(), b.data(), nullptr, c.data());
      if (synchronize) {
        double x = 1;
        MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, node);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double elapsed = now() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return elapsed;
  };
  timed(false);  // warm-up
  // Medians of alternating samples: the machine's noise falls on both alike.
  std::vector<double> alone, synced;
  for (int i = 0; i < 3; ++i) {
    alone.push_back(timed(false));
    synced.push_back(timed(true));
  }
  std::sort(alone.begin(), alone.end());
  std::sort(synced.begin(), synced.end());
  return std::max(0.0, (synced[1] - alone[1]) / kRounds);
}

// ---- memory ---------------------------------------------------------------------------------

// This rank's best bytes/s of a = 3 b over two arrays of `bytes` each, on its OpenMP threads.
// How much of their cores the ranks of a node that wait in MPI leave to a busy one: node rank 0
// times GEMMs while the others compute too, then while they wait in a barrier for it. A rank
// alone could run up to `oversubscribed` (ranks x threads / cores) times faster; MPI libraries
// poll by default, so a waiting rank keeps its core unless the launch makes it sleep (Open MPI's
// mpi_yield_when_idle) or binds ranks apart. 0 to 1: (speed-up - 1) / (oversubscribed - 1),
// rank 0's (the profile is its node's view), the median of alternating samples.
double waiting_ranks_lend(MPI_Comm node, double oversubscribed) {
  if (oversubscribed <= 1) return 1;  // nothing to lend: every rank has its cores
  int node_rank = 0;
  MPI_Comm_rank(node, &node_rank);
  cpu::Gemm gemm;
  const int64_t m = 512, n = 256, k = 128;
  std::vector<float> a(static_cast<size_t>(m * k), 0.25f), b(static_cast<size_t>(k * n), 0.5f),
      c(static_cast<size_t>(m * n));
  const cpu::GemmShape shape = cpu::GemmShape::dense(cpu::Trans::No, cpu::Trans::No, m, n, k);
  const auto timed = [&](bool others_wait) {
    MPI_Barrier(node);
    double elapsed = 0;
    if (node_rank == 0 || !others_wait) {
      const double t0 = now();
      for (int g = 0; g < 32; ++g) gemm.run(shape, a.data(), b.data(), nullptr, c.data());
      elapsed = now() - t0;
    }
    MPI_Barrier(node);  // the others wait here, in MPI, while rank 0 computes alone
    MPI_Bcast(&elapsed, 1, MPI_DOUBLE, 0, node);
    return elapsed;
  };
  timed(false);  // warm-up
  std::vector<double> speedups;
  for (int i = 0; i < 3; ++i) {
    const double busy = timed(false), alone = timed(true);
    speedups.push_back(alone > 0 ? busy / alone : 1);
  }
  std::sort(speedups.begin(), speedups.end());
  return std::clamp((speedups[1] - 1) / (oversubscribed - 1), 0.0, 1.0);
}

double rank_memory_rate(size_t bytes, int repeats, int& wrong) {
  const size_t n = bytes / sizeof(double);
  // Uninitialised, then touched by the threads that will use each page.
  std::unique_ptr<double[]> a(new double[n]), b(new double[n]);
  double* pa = a.get();
  double* pb = b.get();
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    pa[i] = 0;
    pb[i] = static_cast<double>(i % 1024);
  }
  double best = 0;
  for (int r = 0; r <= repeats; ++r) {  // the first pass warms the threads and the pages
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) pa[i] = 3 * pb[i];
    MPI_Barrier(MPI_COMM_WORLD);
    double elapsed = now() - t0;  // until the slowest rank is done, as for the GEMMs
    MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r > 0) best = std::max(best, 2.0 * static_cast<double>(n * sizeof(double)) / elapsed);
  }
  for (size_t probe = 0; probe < 8; ++probe) {
    const size_t i = probe * (n - 1) / 7;
    if (pa[i] != 3.0 * static_cast<double>(i % 1024)) ++wrong;
  }
  return best;
}

// Large enough that the arrays of a node's ranks, together, are at least twice its last-level
// cache (as the OS reports it; virtual machines may report the host's); at least 64 MiB.
size_t memory_array_bytes(int ranks_per_node) {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max<size_t>(size_t{64} << 20, l3 > 0 ? static_cast<size_t>(l3) / ranks_per_node : 0);
}

// ---- links ----------------------------------------------------------------------------------

std::vector<double> link_sizes() {
  std::vector<double> sizes;
  for (double bytes = 4096; bytes <= 16 << 20; bytes *= 4) sizes.push_back(bytes);
  return sizes;
}

struct LinkResult {
  bool measured = false;
  int ranks = 0;
  std::vector<LinkSample> samples;
  int wrong = 0;  // this rank's
  AlphaBetaFit fit;
};

// One pass of `kind` on `comm` where it has 2+ ranks, then world rank 0's result (the groups it
// is in are the ones the profile describes) shared with every rank; not yet fitted.
LinkResult measure_link_pass(MPI_Comm comm, CollectiveKind kind, int repeats) {
  const std::vector<double> sizes = link_sizes();
  LinkResult r;
  int comm_ranks = 1;
  if (comm != MPI_COMM_NULL) MPI_Comm_size(comm, &comm_ranks);
  if (comm_ranks >= 2) {
    r.samples = measure_link(comm, kind, sizes, repeats, r.wrong);
    r.measured = true;
    r.ranks = comm_ranks;
  }
  int shared[2] = {r.measured ? 1 : 0, r.ranks};
  MPI_Bcast(shared, 2, MPI_INT, 0, MPI_COMM_WORLD);
  r.measured = shared[0] == 1;
  r.ranks = shared[1];
  if (!r.measured) return r;
  std::vector<double> flat(2 * sizes.size());
  for (size_t i = 0; i < r.samples.size(); ++i) {
    flat[2 * i] = r.samples[i].bytes;
    flat[2 * i + 1] = r.samples[i].seconds;
  }
  MPI_Bcast(flat.data(), static_cast<int>(flat.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
  r.samples.resize(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) r.samples[i] = {flat[2 * i], flat[2 * i + 1]};
  return r;
}

// One collective's passes (all measured, or none): each size's median seconds over passes,
// fitted; wrong results summed.
LinkResult link_over_passes(CollectiveKind kind, const std::vector<LinkResult>& passes) {
  LinkResult r = passes.front();
  if (!r.measured) return r;
  r.wrong = 0;
  for (const LinkResult& pass : passes) r.wrong += pass.wrong;
  for (size_t i = 0; i < r.samples.size(); ++i) {
    std::vector<double> seconds;
    for (const LinkResult& pass : passes) seconds.push_back(pass.samples[i].seconds);
    r.samples[i].seconds = median_of(seconds);
  }
  r.fit = fit_alpha_beta(kind, r.ranks, r.samples);
  return r;
}

// The groups whose links are measured: world rank 0's is the one written.
struct LinkGroup {
  MPI_Comm comm;
  LinkClass link;
};

struct MeasuredLink {
  LinkClass link;
  CollectiveKind kind;
  LinkResult result;
};

// Two tables: every size against the fitted model, then the fits.
void report_links(const std::vector<MeasuredLink>& measured, int repeats, int passes,
                  BenchReport& report) {
  const AlphaBeta unit_bandwidth{0, 1};  // seconds per bus byte: bus bytes of a transfer
  report.header("links: MPI collectives, median of " + std::to_string(repeats) + ", then over " +
                std::to_string(passes) + " pass(es); busbw = bus bytes / time as nccl-tests counts them; fit_us: the fitted model");
  report.columns({"ranks", "bytes", "time_us", "busbw_GB/s", "fit_us"});
  for (const MeasuredLink& m : measured)
    for (const LinkSample& s : m.result.samples)
      report.row(std::string(link_class_name(m.link)) + " " + std::string(collective_name(m.kind)),
                 {static_cast<double>(m.result.ranks), s.bytes, s.seconds * 1e6,
                  unit_bandwidth.seconds(m.kind, s.bytes, m.result.ranks) / s.seconds / 1e9,
                  m.result.fit.model.seconds(m.kind, s.bytes, m.result.ranks) * 1e6},
                 0);
  report.header("link fits: time = steps x alpha + factor x bytes / busbw (ring step counts); "
                "best_GB/s: the best size's busbw; fit_err: the fit's largest relative error");
  report.columns({"ranks", "alpha_us", "busbw_GB/s", "best_GB/s", "fit_err"});
  for (const MeasuredLink& m : measured) {
    const LinkResult& r = m.result;
    double best = 0;
    for (const LinkSample& s : r.samples)
      best = std::max(best, unit_bandwidth.seconds(m.kind, s.bytes, r.ranks) / s.seconds);
    report.row(std::string(link_class_name(m.link)) + " " + std::string(collective_name(m.kind)),
               {static_cast<double>(r.ranks), r.fit.model.alpha * 1e6,
                r.fit.model.bus_bytes_per_s / 1e9, best / 1e9, r.fit.max_relative_error},
               r.wrong);
  }
}

// ---- machine facts and the file -------------------------------------------------------------

double node_memory_bytes() {
  struct sysinfo info {};
  if (sysinfo(&info) != 0) return 0;
  return static_cast<double>(info.totalram) * info.mem_unit;
}

void check_writable(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw DataError(path, "is a directory; --out names the profile file to write (e.g. " + path +
                              "/machine.toml)");
  const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  if (!fs::is_directory(parent, ec))
    throw DataError(path, "cannot write the machine profile: directory " + parent.string() +
                              " does not exist");
  if (access(parent.c_str(), W_OK) != 0)
    throw DataError(path, "cannot write the machine profile: directory " + parent.string() +
                              " is not writable (" + std::strerror(errno) + ")");
}

// Writes `text` to a temporary file beside `path`, flushed to disk, then renames it over `path`:
// a failure at any point leaves an old profile intact (and no temporary file behind).
void write_atomically(const std::string& path, const std::string& text) {
  const fs::path target(path);
  const fs::path tmp = target.parent_path() /
                       ("." + target.filename().string() + ".tmp." + std::to_string(getpid()));
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) throw DataError(path, "cannot create " + tmp.string() + ": " + std::strerror(errno));
  int error = std::fwrite(text.data(), 1, text.size(), f) == text.size() ? 0 : errno;
  if (error == 0 && std::fflush(f) != 0) error = errno;
  if (error == 0 && fsync(fileno(f)) != 0) error = errno;
  if (std::fclose(f) != 0 && error == 0) error = errno;
  std::error_code ec;
  if (error == 0) fs::rename(tmp, target, ec);
  if (error != 0 || ec) {
    fs::remove(tmp, ec);
    throw DataError(path, "cannot write the machine profile: " +
                              (error != 0 ? std::string(std::strerror(error)) : "rename failed"));
  }
}

}  // namespace

MachineProfile measure_machine_profile(int threads, int repeats, int passes, BenchReport& report) {
  passes = std::max(1, passes);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  CpuBackend backend(threads);  // sets this rank's OpenMP team, as training does

  const NodeMembership node = node_membership(MPI_COMM_WORLD);
  MPI_Comm node_comm = split_by_node(MPI_COMM_WORLD);
  MachineProfile p;
  p.name = node_name();
  p.source = "measured";
  p.device = "cpu";
  p.ranks_per_node = node.local_size;
  p.cores_per_node = node_usable_cores(node_comm);
  p.threads_per_rank = omp_get_max_threads();
  // The launch the rates hold for (config/launch_shape.h): world rank 0's view, as the rest.
  const LaunchShape launch = current_launch(p.threads_per_rank);
  p.cores_per_rank = launch.cores_per_rank;
  p.idle_ranks = launch.idle_ranks;
  p.memory_per_rank = std::floor(node_memory_bytes() / node.local_size);
  report.header("calibrate: " + std::to_string(ranks) + " rank(s) on " + std::to_string(node.count) +
                " node(s), " + std::to_string(p.ranks_per_node) + " per node on " +
                std::to_string(p.cores_per_node) + " core(s), " + std::to_string(p.threads_per_rank) +
                " thread(s) per rank; " + mpi_library_version() + ", " + cpu::Gemm::onednn_version());
  report.header("launch: " + describe_launch(launch) + " (recorded in the profile: `train` warns when its launch differs)");
  report.header("every rank measures at once; a rate is per rank: the median over ranks of each "
                "rank's best of " + std::to_string(repeats) + " (slowest: the lowest rank's); " +
                std::to_string(passes) + " pass(es) over every point, each point's median over them");

  // bf16 only where every rank's CPU has the instructions (else it would be emulated).
  int bf16 = cpu_bf16_instructions().empty() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &bf16, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  const size_t array_bytes = memory_array_bytes(p.ranks_per_node);
  std::vector<LinkGroup> link_groups;
  MPI_Comm across = MPI_COMM_NULL;
  if (ranks > 1) {
    link_groups.push_back({node_comm, LinkClass::IntraNode});
    if (node.count > 1) {
      MPI_Comm_split(MPI_COMM_WORLD, node.local_rank, rank, &across);
      link_groups.push_back({across, LinkClass::InterNode});
    }
  }

  // Every point once per pass, interleaved: [pass][size], [pass], [group x collective][pass].
  std::vector<std::vector<OverRanks>> fp32_passes, bf16_passes;
  std::vector<int> fp32_wrong(std::size(kGemmSizes)), bf16_wrong(std::size(kGemmSizes));
  std::vector<OverRanks> memory_passes;
  int memory_wrong = 0;
  std::vector<std::vector<LinkResult>> link_passes(link_groups.size() * std::size(kCollectives));
  for (int pass = 0; pass < passes; ++pass) {
    std::vector<int> wrong;
    fp32_passes.push_back(measure_gemm_sizes(DType::F32, repeats, wrong));
    for (size_t i = 0; i < wrong.size(); ++i) fp32_wrong[i] += wrong[i];
    if (bf16) {
      bf16_passes.push_back(measure_gemm_sizes(DType::BF16, repeats, wrong));
      for (size_t i = 0; i < wrong.size(); ++i) bf16_wrong[i] += wrong[i];
    }
    memory_passes.push_back(over_ranks(rank_memory_rate(array_bytes, repeats, memory_wrong)));
    for (size_t g = 0; g < link_groups.size(); ++g)
      for (size_t c = 0; c < std::size(kCollectives); ++c)
        link_passes[g * std::size(kCollectives) + c].push_back(
            measure_link_pass(link_groups[g].comm, kCollectives[c], repeats));
  }

  report.header("GEMM C(m,n) = A(m,k) B(k,n) through the CPU backend (library as in training), "
                "s = smallest dimension; ratio: to the dtype's peak (its best size)");
  report.columns({"m", "n", "k", "GFLOP/s", "slowest", "ratio"});
  p.gemm_fp32 = gemm_rates(DType::F32, fp32_passes, fp32_wrong, report);
  if (bf16) p.gemm_bf16 = gemm_rates(DType::BF16, bf16_passes, bf16_wrong, report);
  else report.header("bf16 GEMM: not measured (a CPU without bf16 instructions)");

  report.header("memory: a = 3 b over 2 x " + std::to_string(array_bytes >> 20) +
                " MiB per rank (bytes read + written per second)");
  report.columns({"MiB", "GB/s", "slowest"});
  const OverRanks memory = median_over_passes(memory_passes);
  p.memory_bytes_per_s = memory.median;
  report.row("memory scale", {2.0 * static_cast<double>(array_bytes >> 20), memory.median / 1e9,
                              memory.slowest / 1e9}, memory_wrong);

  if (node.local_size > 1) {
    const double oversubscribed =
        static_cast<double>(p.ranks_per_node) * p.threads_per_rank / std::max(1, p.cores_per_node);
    p.waiting_ranks_lend = waiting_ranks_lend(node_comm, oversubscribed);
    if (oversubscribed > 1)
      report.header("ranks waiting in MPI lend " + std::to_string(static_cast<int>(std::lround(100 * p.waiting_ranks_lend))) +
                    "% of their cores to busy ones (" + std::to_string(p.ranks_per_node) + " ranks x " +
                    std::to_string(p.threads_per_rank) + " thread(s) on " + std::to_string(p.cores_per_node) +
                    " cores; 0% when they spin, as MPI libraries do by default)");
    p.sync_seconds = sync_penalty(node_comm);
    report.header("synchronization under load: an 8-byte all-reduce over the node between GEMMs "
                  "costs busy ranks " + std::to_string(p.sync_seconds * 1e6) + " us more than the GEMMs alone");
  }

  MPI_Bcast(&p.waiting_ranks_lend, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);  // world rank 0's node's
  std::string links = "links: not measured (1 rank; run calibrate on 2 or more ranks)";
  if (ranks > 1) {
    std::vector<MeasuredLink> measured;
    for (size_t g = 0; g < link_groups.size(); ++g)
      for (size_t c = 0; c < std::size(kCollectives); ++c) {
        LinkResult r = link_over_passes(kCollectives[c], link_passes[g * std::size(kCollectives) + c]);
        if (!r.measured) continue;
        auto& slots = link_groups[g].link == LinkClass::IntraNode ? p.intra_node : p.inter_node;
        slots[static_cast<size_t>(kCollectives[c])] = r.fit.model;
        measured.push_back({link_groups[g].link, kCollectives[c], std::move(r)});
      }
    if (across != MPI_COMM_NULL) MPI_Comm_free(&across);
    report_links(measured, repeats, passes, report);
    double worst_fit = 0;
    for (const MeasuredLink& m : measured) worst_fit = std::max(worst_fit, m.result.fit.max_relative_error);
    links = std::string("links: ") +
            (p.intra_node[0] ? "intra_node from the ranks of one node" : "no intra_node (one rank per node)") +
            (p.has_inter_node() ? ", inter_node from the ranks of equal node rank, one per node"
                                : ", no inter_node (one node)") +
            "; ring alpha-beta fits of 4 KiB to 16 MiB, largest relative error " +
            std::to_string(static_cast<int>(std::lround(100 * worst_fit))) + "%";
  } else {
    report.header(links);
  }
  MPI_Comm_free(&node_comm);

  p.notes = "measured by `meshtrain bench --suite calibrate` on " + p.name + ", " + utc_timestamp() +
            ": " + std::to_string(ranks) + " rank(s) on " + std::to_string(node.count) +
            " node(s), " + std::to_string(p.threads_per_rank) + " thread(s) per rank; " +
            mpi_library_version() + "; " + cpu::Gemm::onednn_version() +
            ". GEMM m = 4s, n = 2s, k = s; rates are per rank while every rank works (each sample timed to the slowest rank), the best sample; "
            "every point the median of " + std::to_string(passes) + " pass(es); " + links + ".";
  return p;
}

void bench_calibrate(const BenchArgs& args, BenchReport& report) {
  // Rank 0's --out decides (it alone writes), so every rank takes the same collective path.
  int writes = args.out.empty() ? 0 : 1;
  MPI_Bcast(&writes, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (writes) agree_on_rank_zero([&] { check_writable(args.out); });
  // The rates the time model prices training with must be those of training's threads: a rank
  // of 8 on 2 cores runs 1 thread in `train`, and at 2 its GEMMs fight their own peers.
  const int threads = args.threads_given ? args.threads : training_threads(0).choice.threads;
  const MachineProfile p = measure_machine_profile(threads, std::max(3, args.steps), args.passes, report);
  if (!writes) {
    report.header("profile not written (--out PROFILE.toml writes it)");
    return;
  }
  agree_on_rank_zero([&] { write_atomically(args.out, format_machine_profile(p)); });
  report.header("wrote " + args.out);
}

}  // namespace meshtrain
