// Checkpointer policy and refusals (checkpoint/checkpointer.h):
//  - a damaged or mismatching checkpoint is refused on every rank with one message that names
//    the file and the dataset (or attribute), and — but for a checksum mismatch, found after
//    reading — the trainer's state is left as it was: truncated file, not HDF5, flipped bytes
//    (checksum mismatch), missing dataset, missing checksum, shape mismatch, a dataset the
//    deck's model lacks, unknown format_version;
//  - another model in the deck (model.d_model, model.layers, model.heads, which changes no
//    shape) or a model setting this build fixes (LayerNorm eps) recorded otherwise in the file is
//    refused naming the key and both values;
//  - a run never prunes or overwrites checkpoints of another lineage; begin_run() gives a fresh
//    run a new lineage, a resumed one the checkpoint's, and refuses "auto" among two runs;
//  - a failed save (checkpoint.dir is a file) is an agreed error naming the directory;
//  - keep: the newest checkpoint.keep survive, stale .tmp files of other steps go;
//  - resume: "auto" takes the newest complete step_*.h5 (never a .tmp), "none" nothing, a path
//    that does not exist is refused; Trainer::run() saves every N steps and resumes;
//  - an asynchronous save writes the state as it was at start_save, however far training has
//    changed it before the write ends; its snapshot is counted in the memory tracker while it
//    is held; one whose write fails is an agreed error when it is collected.
//
// Damage is done by rank 0 with the HDF5 C API (or plain file I/O) between collective steps.
// Launched by CTest under mpiexec with 1 and 2 ranks (2: tp = 2, so loads select tp slices).

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/backend/cpu/cpu_backend.h"
#include "meshtrain/comm/agreement.h"
#include "meshtrain/config/layout_check.h"
#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/parallel/process_grid.h"
#include "meshtrain/checkpoint/checkpointer.h"
#include "meshtrain/train/trainer.h"
#include "support/mpi_world.h"
#include "support/parity.h"
#include "support/shared_temp_dir.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part)                                    \
  EXPECT_NE(std::string(text).find(part), std::string::npos)           \
      << "message: " << (text) << "\nexpected to contain: " << (part)

using testing::world_rank;
using testing::world_size;

Config small_config(const std::string& dir) {
  Config c = testing::tiny_config(dir);
  c.model.layers = 2;
  c.parallel.tp = world_size();
  c.train.micro_batch = 8;
  c.checkpoint.dir = dir + "/checkpoints";
  check_layout(c, world_size());
  return c;
}

std::vector<float> owned_values(Trainer& t, Backend& be) {
  std::vector<float> out;
  for (const OwnedPiece& p : t.state().owned_pieces()) {
    std::vector<float> host(static_cast<size_t>(p.count));
    be.copy_to_host(host.data(), p.value);
    out.insert(out.end(), host.begin(), host.end());
  }
  return out;
}

// A good checkpoint of 2 steps, copies of it damaged by rank 0, and loads into fresh trainers.
class Refusal : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = small_config(dir_.path());
    grid_ = std::make_unique<ProcessGrid>(MPI_COMM_WORLD, config_.grid_shape(), 60.0);
    Trainer t(config_, *grid_, be_);
    for (int s = 0; s < 2; ++s) t.train_step(s);
    good_ = Checkpointer(config_, *grid_).save(t.state(), t.step()).path;
  }

  std::string damaged(const std::string& name, const std::function<void(const std::string&)>& damage) {
    const std::string path = dir_.file(name);
    if (world_rank() == 0) {
      fs::copy_file(good_, path, fs::copy_options::overwrite_existing);
      damage(path);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return path;
  }

  // The agreed error of loading `path` into a fresh trainer of `config` (same layout; "" if it
  // loaded). Refusals of the file's structure come before any data is read: they must leave
  // the trainer's parameters untouched (a checksum mismatch is found after reading).
  enum class Refused { BeforeReading, AfterReading };
  std::string load_error(const std::string& path, const Config& config,
                         Refused when = Refused::BeforeReading) {
    Trainer t(config, *grid_, be_);
    const std::vector<float> before = owned_values(t, be_);
    try {
      Checkpointer(config, *grid_).load(t.state(), path);
    } catch (const AgreedError& e) {
      if (when == Refused::BeforeReading) {
        EXPECT_EQ(owned_values(t, be_), before) << "a refused load changed the parameters";
      }
      EXPECT_EQ(t.step(), 0);
      return e.what();
    }
    return "";
  }
  std::string load_error(const std::string& path, Refused when = Refused::BeforeReading) {
    return load_error(path, config_, when);
  }

  testing::SharedTempDir dir_;
  Config config_;
  CpuBackend be_{1};
  std::unique_ptr<ProcessGrid> grid_;
  std::string good_;
};

TEST_F(Refusal, GoodCheckpointLoads) { EXPECT_EQ(load_error(good_), ""); }

TEST_F(Refusal, TruncatedFile) {
  const std::string path = damaged("truncated.h5", [](const std::string& p) {
    fs::resize_file(p, fs::file_size(p) * 2 / 3);
  });
  for (CheckpointIo io : {CheckpointIo::Collective, CheckpointIo::Independent}) {
    Config c = config_;
    c.checkpoint.io = io;
    const std::string msg = load_error(path, c);
    EXPECT_CONTAINS(msg, path);
    EXPECT_CONTAINS(msg, "truncated file: eof = ");  // HDF5's own diagnosis, passed on
  }
}

TEST_F(Refusal, NotAnHdf5File) {
  const std::string path = damaged("text.h5", [](const std::string& p) {
    std::ofstream(p, std::ios::trunc) << "this is not a checkpoint\n";
  });
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "not an HDF5 file");
  EXPECT_CONTAINS(msg, "file signature not found");
}

TEST_F(Refusal, FlippedBytesAreAChecksumMismatch) {
  const std::string dataset = "/model/h.1.mlp.fc.weight";
  const std::string path = damaged("flipped.h5", [&](const std::string& p) {
    int64_t offset = 0;
    {
      CheckpointFile f(p, MPI_COMM_SELF, CheckpointFile::Access::Read);
      offset = f.data_offset(dataset);
    }
    std::fstream io(p, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(offset + 101);
    char b = 0;
    io.read(&b, 1);
    b = static_cast<char>(b ^ 0x10);
    io.seekp(offset + 101);
    io.write(&b, 1);
  });
  for (CheckpointIo io : {CheckpointIo::Collective, CheckpointIo::Independent}) {
    SCOPED_TRACE(io == CheckpointIo::Collective ? "collective reads" : "independent reads");
    Config c = config_;
    c.checkpoint.io = io;
    const std::string msg = load_error(path, c, Refused::AfterReading);
    EXPECT_CONTAINS(msg, path);
    EXPECT_CONTAINS(msg, dataset + ": checksum MISMATCH");
  }
}

void with_hdf5_file(const std::string& path, const std::function<void(hid_t)>& f) {
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0) << path;
  f(file);
  H5Fclose(file);
}

TEST_F(Refusal, MissingDataset) {
  const std::string dataset = "/optim/h.0.attn.qkv.weight/exp_avg_sq";
  const std::string path = damaged("missing.h5", [&](const std::string& p) {
    with_hdf5_file(p, [&](hid_t f) { ASSERT_GE(H5Ldelete(f, dataset.c_str(), H5P_DEFAULT), 0); });
  });
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "dataset " + dataset + " is missing");
}

TEST_F(Refusal, MissingChecksum) {
  const std::string dataset = "/model/wpe";
  const std::string path = damaged("no_checksum.h5", [&](const std::string& p) {
    with_hdf5_file(p, [&](hid_t f) {
      const hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
      ASSERT_GE(H5Adelete(d, "checksum"), 0);
      H5Dclose(d);
    });
  });
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, dataset + " has no checksum");
}

TEST_F(Refusal, UnknownFormatVersion) {
  const std::string path = damaged("version.h5", [](const std::string& p) {
    with_hdf5_file(p, [](hid_t f) {
      ASSERT_GE(H5Adelete(f, "format_version"), 0);
      const hid_t space = H5Screate(H5S_SCALAR);
      const hid_t a = H5Acreate2(f, "format_version", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
      const int64_t v = 99;
      H5Awrite(a, H5T_NATIVE_INT64, &v);
      H5Aclose(a);
      H5Sclose(space);
    });
  });
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "format_version = 99 is not supported");
  EXPECT_CONTAINS(msg, "reads version 2");
}

// Another model in the deck is refused by its recorded settings, before any dataset is looked
// at: the message names the key and both values.
TEST_F(Refusal, AnotherModelNamesTheKeyAndBothValues) {
  Config wide = config_;
  wide.model.d_model = 64;
  std::string msg = load_error(good_, wide);
  EXPECT_CONTAINS(msg, good_);
  EXPECT_CONTAINS(msg, "model.d_model = 32 in the checkpoint, but <test> (with its --set overrides) "
                       "has model.d_model = 64");
  Config shallow = config_;
  shallow.model.layers = 1;
  msg = load_error(good_, shallow);
  EXPECT_CONTAINS(msg, "model.layers = 2 in the checkpoint");
  EXPECT_CONTAINS(msg, "has model.layers = 1");
}

// Datasets that disagree with the file's own recorded model (damage, another tool) are still
// refused by shape and existence.
void replace_dataset(hid_t f, const std::string& name, std::vector<hsize_t> dims) {
  if (H5Lexists(f, name.c_str(), H5P_DEFAULT) > 0) {
    ASSERT_GE(H5Ldelete(f, name.c_str(), H5P_DEFAULT), 0);
  }
  const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  // Its storage allocated (fill values): a dataset that stores less than it declares is refused
  // on open, before its shape is looked at.
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  const hid_t d = H5Dcreate2(f, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Pclose(dcpl);
  ASSERT_GE(d, 0) << name;
  const hid_t scalar = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(d, "checksum", H5T_STD_U64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
  const uint64_t zero = 0;
  H5Awrite(a, H5T_NATIVE_UINT64, &zero);
  H5Aclose(a);
  H5Sclose(scalar);
  H5Dclose(d);
  H5Sclose(space);
}

TEST_F(Refusal, ShapeMismatchNamesBothShapesAndTheDeckKey) {
  const std::string path = damaged("shape.h5", [](const std::string& p) {
    with_hdf5_file(p, [](hid_t f) { replace_dataset(f, "/model/h.0.attn.proj.bias", {64}); });
  });
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "dataset /model/h.0.attn.proj.bias has shape (64) but the deck's model needs (32)");
  EXPECT_CONTAINS(msg, "model.d_model");
}

TEST_F(Refusal, DatasetOutsideTheDecksModel) {
  const std::string path = damaged("extra.h5", [](const std::string& p) {
    with_hdf5_file(p, [](hid_t f) { replace_dataset(f, "/model/h.9.ln_1.bias", {32}); });
  });
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "dataset /model/h.9.ln_1.bias is not part of the deck's model (check model.layers");
}

TEST_F(Refusal, SaveIntoAFileIsAnAgreedError) {
  Config c = config_;
  c.checkpoint.dir = dir_.file("a_file");
  if (world_rank() == 0) std::ofstream(c.checkpoint.dir) << "x";
  MPI_Barrier(MPI_COMM_WORLD);
  Trainer t(c, *grid_, be_);
  try {
    Checkpointer(c, *grid_).save(t.state(), t.step());
    ADD_FAILURE() << "saving into a file succeeded";
  } catch (const AgreedError& e) {
    EXPECT_CONTAINS(std::string(e.what()), c.checkpoint.dir);
  }
}

TEST_F(Refusal, KeepsTheNewestAndDropsStaleTemporaries) {
  Config c = config_;
  c.checkpoint.dir = dir_.file("keep");
  c.checkpoint.keep = 2;
  Trainer t(c, *grid_, be_);
  Checkpointer ck(c, *grid_);
  if (world_rank() == 0) {
    fs::create_directories(c.checkpoint.dir);
    std::ofstream(c.checkpoint.dir + "/step_00000001.h5.tmp") << "left by a dead job";
    std::ofstream(c.checkpoint.dir + "/notes.txt") << "not ours";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (int step : {3, 4, 9, 10}) {
    t.set_step(step);
    ck.save(t.state(), t.step());
  }
  // An older step written last (a run resumed from an old checkpoint) is kept too.
  t.set_step(2);
  ck.save(t.state(), t.step());
  ck.finish_pruning();
  std::vector<int64_t> steps;
  for (const auto& [step, path] : Checkpointer::complete_checkpoints(c.checkpoint.dir)) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 9, 10}));
  EXPECT_FALSE(fs::exists(c.checkpoint.dir + "/step_00000001.h5.tmp"));
  EXPECT_TRUE(fs::exists(c.checkpoint.dir + "/notes.txt"));
}

TEST_F(Refusal, AutoTransfersAreIndependentOnlyForLongRuns) {
  // The fixture's tp-sliced tiny model: short strided runs -> collective.
  Config c = config_;
  c.checkpoint.dir = dir_.file("short_runs");
  {
    Trainer t(c, *grid_, be_);
    EXPECT_FALSE(Checkpointer(c, *grid_).save(t.state(), t.step()).independent);
  }
  // One layer of d_model 640, data parallel: whole tensors of 1.27 MB on average -> independent
  // and what it wrote loads back.
  Config wide = testing::tiny_config(dir_.path());
  wide.model.layers = 1;
  wide.model.d_model = 640;
  wide.model.heads = 8;
  wide.parallel.dp = world_size();
  wide.train.global_batch = 2 * world_size();
  wide.train.micro_batch = 2;
  wide.checkpoint.dir = dir_.file("long_runs");
  check_layout(wide, world_size());
  ProcessGrid grid(MPI_COMM_WORLD, wide.grid_shape(), 60.0);
  Trainer t(wide, grid, be_);
  Checkpointer ck(wide, grid);
  const CheckpointStats saved = ck.save(t.state(), t.step());
  EXPECT_TRUE(saved.independent);
  const CheckpointStats loaded = ck.load(t.state(), saved.path);
  EXPECT_TRUE(loaded.independent);
}

TEST_F(Refusal, AutoLoadsAreCollectiveWhereShardsTakeTurnsAlongTheFile) {
  // ZeRO 1 on the data-parallel ranks: each rank owns every other stretch of a few MB of the
  // file. Saved independently (long runs), loaded collectively (read independently, each rank's
  // stream would skip the others' stretches); one rank reads the file in one sweep.
  Config c = testing::tiny_config(dir_.path());
  c.model.layers = 2;
  c.model.d_model = 640;
  c.model.heads = 8;
  c.parallel.dp = world_size();
  c.parallel.zero = 1;
  c.train.global_batch = 2 * world_size();
  c.train.micro_batch = 2;
  c.checkpoint.dir = dir_.file("zero1_turns");
  check_layout(c, world_size());
  ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), 60.0);
  Trainer t(c, grid, be_);
  t.train_step(0);
  const std::vector<float> at_save = owned_values(t, be_);
  Checkpointer ck(c, grid);
  const CheckpointStats saved = ck.save(t.state(), t.step());
  EXPECT_TRUE(saved.independent);
  t.train_step(1);
  const CheckpointStats loaded = ck.load(t.state(), saved.path);
  EXPECT_EQ(loaded.independent, world_size() == 1);
  EXPECT_EQ(owned_values(t, be_), at_save);
}

// The nice values of this process's threads now (Linux: /proc/self/task/<tid>/stat, field 19).
// A thread may end between listing and reading: its stat then fails to open or to read (ESRCH;
// a stream would throw), and it is skipped.
std::vector<int> thread_nice_values() {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator("/proc/self/task", ec)) {
    const int fd = ::open((task.path() / "stat").c_str(), O_RDONLY);
    if (fd < 0) continue;
    char buf[1024];
    const ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n <= 0) continue;
    const std::string stat(buf, static_cast<size_t>(n));
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    std::string field;
    for (int k = 3; k <= 19 && fields >> field; ++k)
      if (k == 19) out.push_back(std::stoi(field));
  }
  return out;
}

TEST_F(Refusal, BackgroundWriteRunsAtItsNiceValue) {
  Config c = config_;
  c.checkpoint.dir = dir_.file("nice");
  c.checkpoint.async = true;
  c.checkpoint.async_nice = 7;
  ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), 60.0);
  Trainer t(c, grid, be_);
  t.set_step(1);
  Checkpointer ck(c, grid);
  ck.start_save(t.state(), t.step(), be_.memory());
  bool seen = false;
  do {
    for (int nice : thread_nice_values()) seen = seen || nice == 7;
  } while (!ck.poll());
  EXPECT_TRUE(seen) << "no thread of this rank ran at checkpoint.async_nice = 7 during the write";
  for (int nice : thread_nice_values()) EXPECT_EQ(nice, 0) << "the nice value outlived the write";
}

TEST_F(Refusal, BackgroundSaveWritesTheStateOfItsStep) {
  Config c = config_;
  c.checkpoint.dir = dir_.file("background");
  c.checkpoint.async = true;
  ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), 60.0);
  Trainer t(c, grid, be_);
  t.train_step(0);
  t.set_step(1);
  const std::vector<float> at_save = owned_values(t, be_);
  auto owner = std::make_unique<Checkpointer>(c, grid);
  Checkpointer& ck = *owner;
  const size_t snapshot = Checkpointer::snapshot_bytes(t.state());
  EXPECT_GT(snapshot, 0u);
  const size_t before = be_.memory().current(MemoryCategory::CheckpointSnapshot);
  const CheckpointStats started = ck.start_save(t.state(), t.step(), be_.memory());
  EXPECT_TRUE(started.asynchronous);
  EXPECT_TRUE(ck.save_in_progress());
  EXPECT_EQ(be_.memory().current(MemoryCategory::CheckpointSnapshot), before + snapshot);
  // In host memory the copy runs beside the next step, whose update waits for it.
  EXPECT_TRUE(t.state().update_fenced());
  // Training changes the state while the write goes on.
  t.train_step(1);
  EXPECT_FALSE(t.state().update_fenced());
  t.train_step(2);
  ASSERT_NE(owned_values(t, be_), at_save);
  std::optional<CheckpointStats> done = ck.wait_for_save();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->path, c.checkpoint.dir + "/" + Checkpointer::file_name(1));
  EXPECT_GT(done->bytes, 0);
  EXPECT_FALSE(ck.save_in_progress());
  EXPECT_FALSE(ck.poll().has_value());  // nothing left to collect
  // The buffers stay for the next snapshot, counted, until the checkpointer goes.
  EXPECT_EQ(be_.memory().current(MemoryCategory::CheckpointSnapshot), before + snapshot);

  Trainer fresh(c, grid, be_);
  EXPECT_EQ(ck.load(fresh.state(), done->path).step, 1);
  EXPECT_EQ(owned_values(fresh, be_), at_save) << "the background save wrote a later state";
  EXPECT_EQ(fresh.state().steps_taken(), 1);

  // A second background save reuses the buffers: still one snapshot counted.
  const std::vector<float> later = owned_values(t, be_);
  t.set_step(3);
  ck.start_save(t.state(), t.step(), be_.memory());
  EXPECT_EQ(be_.memory().current(MemoryCategory::CheckpointSnapshot), before + snapshot);
  t.train_step(3);
  const std::string second = ck.wait_for_save().value().path;
  Trainer again(c, grid, be_);
  EXPECT_EQ(ck.load(again.state(), second).step, 3);
  EXPECT_EQ(owned_values(again, be_), later);
  owner.reset();
  EXPECT_EQ(be_.memory().current(MemoryCategory::CheckpointSnapshot), before);
}

TEST_F(Refusal, FailedBackgroundSaveIsAgreedAtCollection) {
  Config c = config_;
  c.checkpoint.async = true;
  // A directory that exists and can be listed but where no file can be created, not even by
  // root: planning (which scans it) succeeds, the background thread's create fails. (A
  // directory at the .tmp's name no longer serves: planning refuses it.)
  c.checkpoint.dir = "/proc/self";
  ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), 60.0);
  Trainer t(c, grid, be_);
  Checkpointer ck(c, grid);
  ck.start_save(t.state(), 1, be_.memory());
  EXPECT_TRUE(ck.save_in_progress());
  try {
    ck.wait_for_save();
    FAIL() << "a save onto a directory succeeded";
  } catch (const AgreedError& e) {
    EXPECT_CONTAINS(e.what(), Checkpointer::file_name(1));
  }
  EXPECT_FALSE(ck.save_in_progress());
  EXPECT_FALSE(fs::exists(c.checkpoint.dir + "/" + Checkpointer::file_name(1)));
}

// Not a file where a checkpoint or its .tmp goes (made after start-up): refused when the save
// is planned, naming it, before anything is written; nothing is left in progress.
TEST_F(Refusal, ADirectoryNamedLikeTheCheckpointIsRefusedWhenPlanning) {
  for (const std::string suffix : {"", ".tmp"}) {
    Config c = config_;
    c.checkpoint.dir = dir_.file("blocked" + suffix);
    c.checkpoint.async = !suffix.empty();
    const std::string obstacle = c.checkpoint.dir + "/" + Checkpointer::file_name(1) + suffix;
    if (world_rank() == 0) fs::create_directories(obstacle);
    MPI_Barrier(MPI_COMM_WORLD);
    ProcessGrid grid(MPI_COMM_WORLD, c.grid_shape(), 60.0);
    Trainer t(c, grid, be_);
    Checkpointer ck(c, grid);
    try {
      if (c.checkpoint.async) ck.start_save(t.state(), 1, be_.memory());
      else ck.save(t.state(), 1);
      FAIL() << "a save onto " << obstacle << " was started";
    } catch (const AgreedError& e) {
      EXPECT_CONTAINS(e.what(), obstacle + " is a directory named like a checkpoint");
    }
    EXPECT_FALSE(ck.save_in_progress());
    EXPECT_TRUE(fs::is_directory(obstacle));
  }
  // A link at the .tmp's name: the save would write (truncate) where it points.
  Config c = config_;
  c.checkpoint.dir = dir_.file("linked");
  const std::string target = dir_.file("elsewhere.txt"), link = c.checkpoint.dir + "/" + Checkpointer::file_name(1) + ".tmp";
  if (world_rank() == 0) {
    fs::create_directories(c.checkpoint.dir);
    std::ofstream(target) << "keep me\n";
    fs::create_symlink(target, link);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Trainer t(c, *grid_, be_);
  try {
    Checkpointer(c, *grid_).save(t.state(), 1);
    FAIL() << "a save through " << link << " was written";
  } catch (const AgreedError& e) {
    EXPECT_CONTAINS(e.what(), link + " is a symbolic link named like a checkpoint's .tmp");
  }
  if (world_rank() == 0) {
    EXPECT_EQ(fs::file_size(target), 8u);
  }
}

TEST_F(Refusal, ResumeAutoTakesTheNewestCompleteCheckpoint) {
  Config c = config_;
  c.checkpoint.dir = dir_.file("resume");
  Trainer t(c, *grid_, be_);
  EXPECT_EQ(Checkpointer(c, *grid_).resume_path(), "");  // no directory yet
  for (int step : {8, 12}) {
    t.set_step(step);
    Checkpointer(c, *grid_).save(t.state(), t.step());
  }
  if (world_rank() == 0) {
    std::ofstream(c.checkpoint.dir + "/step_00000020.h5.tmp") << "incomplete";
    std::ofstream(c.checkpoint.dir + "/step_x.h5") << "not a step";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(Checkpointer(c, *grid_).resume_path(), c.checkpoint.dir + "/step_00000012.h5");
  c.checkpoint.resume = "none";
  EXPECT_EQ(Checkpointer(c, *grid_).resume_path(), "");
  c.checkpoint.resume = c.checkpoint.dir + "/step_00000008.h5";
  EXPECT_EQ(Checkpointer(c, *grid_).resume_path(), c.checkpoint.resume);
  c.checkpoint.resume = dir_.file("nowhere.h5");
  try {
    Checkpointer(c, *grid_).resume_path();
    ADD_FAILURE() << "a missing resume path was accepted";
  } catch (const AgreedError& e) {
    EXPECT_CONTAINS(std::string(e.what()), "checkpoint.resume = \"" + c.checkpoint.resume + "\"");
  }
}

TEST_F(Refusal, RunSavesEveryNStepsAndResumes) {
  Config c = config_;
  c.checkpoint.dir = dir_.file("run");
  c.checkpoint.every = 2;
  c.train.steps = 3;
  c.run.log_every = 100;
  {
    Trainer t(c, *grid_, be_);
    t.run();
  }
  std::vector<int64_t> steps;
  for (const auto& [step, path] : Checkpointer::complete_checkpoints(c.checkpoint.dir)) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 3}));  // every 2, and after the last
  c.train.steps = 4;
  Trainer t(c, *grid_, be_);
  t.run();  // resumes at 3 (checkpoint.resume = "auto"), trains one step, saves 4
  EXPECT_EQ(t.step(), 4);
  EXPECT_EQ(t.state().steps_taken(), 4);
}

// Two runs in one directory: the second (another lineage) keeps one checkpoint, yet never
// deletes the first run's, and refuses to overwrite one of them.
TEST_F(Refusal, NeverPrunesOrOverwritesAnotherRunsCheckpoints) {
  Config c = config_;
  c.checkpoint.dir = dir_.file("shared");
  c.checkpoint.keep = 5;
  Trainer t(c, *grid_, be_);
  {
    Checkpointer first(c, *grid_);
    for (int step : {2, 4}) {
      t.set_step(step);
      first.save(t.state(), t.step());
    }
    first.finish_pruning();
  }
  c.checkpoint.keep = 1;
  Checkpointer second(c, *grid_);
  for (int step : {1, 3}) {
    t.set_step(step);
    second.save(t.state(), t.step());
  }
  second.finish_pruning();
  std::vector<int64_t> steps;
  for (const auto& [step, path] : Checkpointer::complete_checkpoints(c.checkpoint.dir)) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 3, 4}));  // its own step 1 pruned, none of the first's
  t.set_step(4);
  try {
    second.save(t.state(), t.step());
    ADD_FAILURE() << "a run overwrote another run's checkpoint";
  } catch (const AgreedError& e) {
    EXPECT_CONTAINS(std::string(e.what()), c.checkpoint.dir + "/step_00000004.h5");
    EXPECT_CONTAINS(std::string(e.what()), "another run");
  }
}

// begin_run(): a fresh run gets a new lineage, a resumed one the checkpoint's; "auto" in a
// directory holding two runs' checkpoints is refused, naming both files.
TEST_F(Refusal, BeginRunSettlesTheLineage) {
  Config c = config_;
  c.checkpoint.dir = dir_.file("lineages");
  Trainer t(c, *grid_, be_);
  Checkpointer first(c, *grid_);
  EXPECT_EQ(first.begin_run(), "");  // empty directory, "auto": afresh
  const std::string a = first.lineage();
  EXPECT_EQ(a.size(), 32u);
  t.set_step(2);
  first.save(t.state(), t.step());
  // Its pruning runs in the background and deletes stale .tmp files of other steps: one run
  // writes a directory at a time, so the checkpointers below must not start before it ends
  // (a busy machine let it delete other's step 4 .tmp).
  first.finish_pruning();
  Checkpointer again(c, *grid_);
  EXPECT_EQ(again.begin_run(), c.checkpoint.dir + "/step_00000002.h5");
  EXPECT_EQ(again.lineage(), a);

  Checkpointer other(c, *grid_);  // never began: a lineage of its own at its first save
  t.set_step(4);
  other.save(t.state(), t.step());
  EXPECT_NE(other.lineage(), a);
  try {
    Checkpointer(c, *grid_).begin_run();
    ADD_FAILURE() << "\"auto\" chose among two runs";
  } catch (const AgreedError& e) {
    EXPECT_CONTAINS(std::string(e.what()), "checkpoint.dir = \"" + c.checkpoint.dir + "\"");
    EXPECT_CONTAINS(std::string(e.what()), "lineage " + a + ": step_00000002.h5");
    EXPECT_CONTAINS(std::string(e.what()), "would continue the newest, step_00000004.h5");
  }
}

// Hyper-parameters that change the model's function but no shape are checked on load.
TEST_F(Refusal, HeadsAreCheckedThoughNoShapeDependsOnThem) {
  Config c = config_;
  c.model.heads = 2;
  const std::string msg = load_error(good_, c);
  EXPECT_CONTAINS(msg, good_);
  EXPECT_CONTAINS(msg, "model.heads = 4");
  EXPECT_CONTAINS(msg, "model.heads = 2");
}

// Settings this build fixes (LayerNorm eps, positions, activation, tokenizer) are recorded too:
// a file that says otherwise is refused, naming the key and both values.
TEST_F(Refusal, BuildFixedModelSettingsAreChecked) {
  const std::string path = damaged("eps.h5", [](const std::string& p) {
    with_hdf5_file(p, [](hid_t f) {
      ASSERT_GT(H5Aexists(f, "model"), 0) << "no @model attribute";
      const hid_t a = H5Aopen(f, "model", H5P_DEFAULT);
      const hid_t type = H5Aget_type(a);
      std::string text(H5Tget_size(type), '\0');
      H5Aread(a, type, text.data());
      H5Aclose(a);
      const std::string from = "layernorm_eps = 1e-05", to = "layernorm_eps = 1e-06";
      const size_t at = text.find(from);
      ASSERT_NE(at, std::string::npos) << text;
      text.replace(at, from.size(), to);
      ASSERT_GE(H5Adelete(f, "model"), 0);
      const hid_t space = H5Screate(H5S_SCALAR);
      const hid_t b = H5Acreate2(f, "model", type, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(b, type, text.data());
      H5Aclose(b);
      H5Sclose(space);
      H5Tclose(type);
    });
  });
  const std::string msg = load_error(path);
  EXPECT_CONTAINS(msg, path);
  EXPECT_CONTAINS(msg, "model.layernorm_eps = 1e-06");
  EXPECT_CONTAINS(msg, "1e-05");
}

}  // namespace
}  // namespace meshtrain
