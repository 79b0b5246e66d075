// The `checkpoint` suite: how close writing and reading a checkpoint get to this machine's own
// file-system ceiling, measured in the same run and the same directory: a raw sequential
// write(2) of the same number of bytes in 4 MiB blocks, fsynced, and its read back.
//
//   raw write        every rank writes its share (bytes / ranks) to its own file, fsync
//   checkpoint save  Checkpointer::save: write .tmp, fsync, verify by reading back, rename,
//                    fsync the directory — everything a training run waits for (old
//                    checkpoints are deleted in the background, and waited for off the clock)
//   raw read         every rank reads its file back
//   checkpoint load  Checkpointer::load: read, verify checksums, apply
//   async save       checkpoint.async: the stall (planning, and the next update's wait for the
//                    snapshot's copy: what training waits for) against the synchronous save's
//                    time, the background write's
//                    own time, and the median training step while a background write goes on
//                    against the median step with none (the steps use every core of the node,
//                    the node's ranks x threads; the writer shares them at a lower priority)
// The page cache of every file is dropped (fsync, then POSIX_FADV_DONTNEED) before each read,
// so reads come from the device. Figures are the best of 5 interleaved repetitions (the
// machine may be shared: noise only adds time, to either side); ratio is checkpoint bandwidth
// over raw bandwidth. A load that does not give back the saved values bit for bit counts as
// wrong.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/app/bench_suites.h"
#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kBlock = size_t{4} << 20;

constexpr int kRepeats = 5;

double best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void io_error(const std::string& path, const char* what) {
  throw std::runtime_error(path + ": " + what + ": " + std::strerror(errno));
}

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) io_error(path, "cannot open");
  ::fsync(fd);  // dirty pages cannot be dropped
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Seconds to write `bytes` of `block` (repeated) to a new file `path` and fsync it. The old
// file is deleted off the clock, as the checkpointer deletes old checkpoints in the background.
double raw_write(const std::string& path, int64_t bytes, const std::vector<char>& block) {
  std::filesystem::remove(path);
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) io_error(path, "cannot create");
  for (int64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(bytes - done, static_cast<int64_t>(block.size())));
    const ssize_t w = ::write(fd, block.data(), n);
    if (w <= 0) io_error(path, "write failed");
    done += w;
  }
  if (::fsync(fd) != 0) io_error(path, "fsync failed");
  ::close(fd);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds to read `path` back; counts blocks that differ from `block` as wrong.
double raw_read(const std::string& path, const std::vector<char>& block, int& wrong) {
  std::vector<char> buf(block.size());
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) io_error(path, "cannot open");
  for (;;) {
    size_t got = 0;
    while (got < buf.size()) {
      const ssize_t r = ::read(fd, buf.data() + got, buf.size() - got);
      if (r < 0) io_error(path, "read failed");
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    if (got == 0) break;
    if (std::memcmp(buf.data(), block.data(), got) != 0) ++wrong;
    if (got < buf.size()) break;
  }
  ::close(fd);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<char> owned_bytes(Trainer& t, Backend& be) {
  std::vector<char> out;
  for (const OwnedPiece& p : t.state().owned_pieces())
    for (const Tensor* x : {&p.value, &p.exp_avg, &p.exp_avg_sq}) {
      const size_t at = out.size();
      out.resize(at + x->nbytes());
      be.copy_to_host(out.data() + at, *x);
    }
  return out;
}

}  // namespace

void bench_checkpoint(const BenchArgs& args, BenchReport& report) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // The training steps beside a write fill at most the node's cores: oversubscribed, a
  // step's time says more about the spinning OpenMP teams of other ranks than about the write.
  // The node's ranks and usable cores as the suites that emulate devices count them.
  const DeviceEmulation node = device_emulation();
  const int node_ranks = node.ranks_per_node, cores = node.cores;
  const int threads = std::max(1, std::min(args.threads, cores / node_ranks));
  CpuBackend backend(threads);

  Config config = bench_deck("checkpoint", bench_gpt2(args, 4, 384, 6, 256, 16384));
  config.run.dir = args.dir;
  config.train.global_batch = 4 * world;
  config.train.micro_batch = 4;
  config.parallel.zero = 1;  // every rank owns (and writes) a shard of the state
  config.checkpoint.dir = args.dir + "/checkpoint";
  config.checkpoint.keep = 1;
  config.checkpoint.resume = "none";
  check_layout(config, world);
  ProcessGrid grid(MPI_COMM_WORLD, config.grid_shape(), 3600.0);
  Trainer trainer(config, grid, backend);
  // Moments as non-zero as the values, so that no layer of the storage stack sees zero pages;
  // the second moment their magnitudes, as a load refuses a negative one.
  for (OwnedPiece& p : trainer.state().owned_pieces()) {
    backend.copy(p.exp_avg, p.value);
    backend.copy(p.exp_avg_sq, p.value);
    auto magnitudes = [](auto* x, int64_t n) {
      for (int64_t i = 0; i < n; ++i) x[i] = std::fabs(x[i]);
    };
    if (p.exp_avg_sq.dtype() == DType::F64) magnitudes(p.exp_avg_sq.data<double>(), p.exp_avg_sq.numel());
    else magnitudes(p.exp_avg_sq.data<float>(), p.exp_avg_sq.numel());
  }
  const std::vector<char> saved = owned_bytes(trainer, backend);
  // The litter of a bench killed earlier is another run's checkpoints, which saves refuse to
  // overwrite: the directory is the bench's own, start it empty.
  if (rank == 0) std::filesystem::remove_all(config.checkpoint.dir);
  MPI_Barrier(MPI_COMM_WORLD);
  Checkpointer checkpointer(config, grid);
  trainer.set_step(1);

  std::vector<char> block(kBlock);
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>((i * 2654435761u) >> 13);
  const std::string raw = args.dir + "/raw_rank" + std::to_string(rank) + ".bin";
  std::filesystem::create_directories(args.dir);

  std::vector<double> raw_w, raw_r, ck_w, ck_r, ck_w_data, ck_w_verify, ck_r_data;
  int64_t bytes = 0;
  int wrong = 0;
  bool independent = false, load_independent = false;
  std::string path;
  for (int rep = 0; rep < kRepeats; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    const CheckpointStats s = checkpointer.save(trainer.state(), trainer.step());
    ck_w.push_back(s.seconds);
    ck_w_data.push_back(s.data_seconds);
    ck_w_verify.push_back(s.verify_seconds);
    bytes = s.bytes;
    path = s.path;
    independent = s.independent;
    checkpointer.finish_pruning();  // not during the raw write

    MPI_Barrier(MPI_COMM_WORLD);
    double t = raw_write(raw, bytes / world, block);
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    raw_w.push_back(t);

    drop_cache(raw);
    drop_cache(path);
    MPI_Barrier(MPI_COMM_WORLD);
    const CheckpointStats l = checkpointer.load(trainer.state(), path);
    ck_r.push_back(l.seconds);
    ck_r_data.push_back(l.data_seconds);
    load_independent = l.independent;
    if (owned_bytes(trainer, backend) != saved) ++wrong;

    MPI_Barrier(MPI_COMM_WORLD);
    t = raw_read(raw, block, wrong);
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    raw_r.push_back(t);
    trainer.set_step(rep + 2);  // the next save is a new step; keep = 1 prunes this one
  }
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  std::filesystem::remove(raw);

  // Asynchronous saves, with training steps running beside them. Moments that train (the
  // copies of the values above would make the second moment negative); still non-zero.
  for (OwnedPiece& p : trainer.state().owned_pieces()) {
    backend.fill(p.exp_avg, 1e-6);
    backend.fill(p.exp_avg_sq, 1e-4);
  }
  Config async_config = config;
  async_config.checkpoint.async = true;
  Checkpointer background(async_config, grid);
  std::vector<double> stall, written, alone, overlapped;
  int step = 0;
  auto timed_step = [&] {
    const auto t0 = Clock::now();
    trainer.train_step(step++);
    double t = std::chrono::duration<double>(Clock::now() - t0).count();
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
  };
  timed_step();  // the first step allocates: off the clock
  for (int rep = 0; rep < kRepeats; ++rep) {
    for (int k = 0; k < 2; ++k) alone.push_back(timed_step());
    MPI_Barrier(MPI_COMM_WORLD);
    background.start_save(trainer.state(), 100 + rep, backend.memory());
    std::optional<CheckpointStats> done;
    do {
      overlapped.push_back(timed_step());
    } while (!(done = background.poll()));
    // The whole stall, as collected: the start and the first update's wait for the copy.
    stall.push_back(done->stall_seconds);
    written.push_back(done->seconds);
    background.finish_pruning();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(config.checkpoint.dir);  // 160 MB of litter

  char line[400];
  std::snprintf(line, sizeof line,
                "suite checkpoint: model %.1fM parameters (layers %d, d_model %lld, vocab %lld), "
                "fp32 values + 2 AdamW moments = %.1f MB file, %d rank(s) (%s) x %d thread(s), dir %s",
                config.model.parameter_count() / 1e6, config.model.layers,
                static_cast<long long>(config.model.d_model),
                static_cast<long long>(config.model.vocab_size), bytes / 1e6, world,
                describe_layout(config).c_str(), threads, args.dir.c_str());
  report.header(line);
  report.header("ceiling: raw write(2) of the same bytes in 4 MiB blocks + fsync, each rank its "
                "share to its own file; reads after POSIX_FADV_DONTNEED; best of 5");
  report.header(std::string("transfers (checkpoint.io = auto): save ") +
                (independent ? "independent" : "collective") + ", load " +
                (load_independent ? "independent" : "collective"));
  report.header("async save: the write's threads at checkpoint.async_nice = " +
                std::to_string(async_config.checkpoint.async_nice) +
                " once the copy is taken; the training steps on " + std::to_string(node_ranks) +
                " rank(s) x " + std::to_string(threads) + " thread(s) of this node's " +
                std::to_string(cores) + " cores");
  report.columns({"MB", "time_ms", "MB/s", "ratio"});
  const double mb = static_cast<double>(bytes) / 1e6;
  const double rw = best(raw_w), rr = best(raw_r), cw = best(ck_w), cr = best(ck_r);
  report.row("raw write + fsync", {mb, rw * 1e3, mb / rw, 1.0}, 0);
  report.row("checkpoint save (all phases)", {mb, cw * 1e3, mb / cw, rw / cw}, 0);
  // The phases (best of 5 each), to show where a shortfall comes from; the ratio column is
  // the phase's share of the save.
  report.row("  of which write + hash", {mb, best(ck_w_data) * 1e3, mb / best(ck_w_data), best(ck_w_data) / cw}, 0);
  report.row("  of which fsync + verify", {mb, best(ck_w_verify) * 1e3, mb / best(ck_w_verify), best(ck_w_verify) / cw}, 0);
  report.row("raw read (cold cache)", {mb, rr * 1e3, mb / rr, 1.0}, 0);
  report.row("checkpoint load (cold cache)", {mb, cr * 1e3, mb / cr, rr / cr}, wrong);
  report.row("  of which read + hash", {mb, best(ck_r_data) * 1e3, mb / best(ck_r_data), best(ck_r_data) / cr}, 0);
  // Async rows: the ratio of the stall is to the synchronous save (target <= 0.10); of the
  // steps, a step alone over a step beside a write, medians (target >= 0.8).
  const double st = median(stall), bw = median(written), sa = median(alone), so = median(overlapped);
  report.row("async save: training stall", {mb, st * 1e3, mb / st, st / cw}, 0);
  report.row("async save: background write", {mb, bw * 1e3, mb / bw, rw / bw}, 0);
  report.row("training step, no write (median)", {0, sa * 1e3, 0, 1.0}, 0);
  report.row("training step beside a write (median)", {0, so * 1e3, 0, sa / so}, 0);
}

}  // namespace meshtrain
