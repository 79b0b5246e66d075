// CheckpointFile (io/checkpoint_file.h) on one rank: a directory is refused; root attributes
// round-trip (a deck over the 64 KiB compact-attribute limit too); datasets are listed, found and shaped; tp slices
// written as hyperslabs land at their global positions; the in-place checksum of stored
// elements equals the checksum of the values, also for a big-endian dataset another tool wrote
// (read and converted instead of hashed in place).

#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <numeric>
#include <string>
#include <vector>

#include "meshtrain/io/checkpoint_file.h"
#include "support/temp_dir.h"

namespace meshtrain {
namespace {

TEST(CheckpointFile, RootAttributesRoundTrip) {
  testing::TempDir dir;
  CheckpointInfo info;
  info.step = kMaxCheckpointStep;  // the largest a file may record (the trainer counts in int)
  info.optimizer_steps = 1234567890123;
  info.seed = 0xFEDCBA9876543210ull;
  info.deck = std::string(100000, 'x') + "\n[model]\nlayers = 2\n";
  info.overrides = "model.layers=2\ntrain.steps=3\n";
  info.config = "[model]\nlayers = 2\n";
  info.model = "layers = 2\nheads = 4\n";
  info.lineage = "0123456789abcdef0123456789abcdef";
  info.layout = "dp=2 tp=2 pp=2 zero=1 schedule=1f1b virtual_stages=1 micro_batch=2";
  info.world_size = 8;
  info.meshtrain_version = "9.8.7";
  info.created = utc_timestamp();
  {
    CheckpointFile f(dir.file("a.h5"), MPI_COMM_SELF, CheckpointFile::Access::Create);
    f.write_info(info);
    f.close();
  }
  CheckpointFile f(dir.file("a.h5"), MPI_COMM_SELF, CheckpointFile::Access::Read);
  const CheckpointInfo back = f.read_info();
  EXPECT_EQ(back.format_version, 2);
  EXPECT_EQ(back.step, info.step);
  EXPECT_EQ(back.optimizer_steps, info.optimizer_steps);
  EXPECT_EQ(back.seed, info.seed);
  EXPECT_EQ(back.deck, info.deck);
  EXPECT_EQ(back.overrides, info.overrides);
  EXPECT_EQ(back.config, info.config);
  EXPECT_EQ(back.model, info.model);
  EXPECT_EQ(back.lineage, info.lineage);
  EXPECT_EQ(back.layout, info.layout);
  EXPECT_EQ(back.world_size, 8);
  EXPECT_EQ(back.meshtrain_version, "9.8.7");
  EXPECT_EQ(back.created, info.created);
  EXPECT_EQ(back.created.size(), 20u);  // 2025-01-31T12:00:00Z
}

// MPI-IO opens a directory and then fails every read with an error printed per attempt: a
// directory is refused first, in one message.
TEST(CheckpointFile, ADirectoryIsRefusedInOneMessage) {
  testing::TempDir dir;
  try {
    CheckpointFile f(dir.path(), MPI_COMM_SELF, CheckpointFile::Access::Read);
    ADD_FAILURE() << "a directory opened as a checkpoint";
  } catch (const CheckpointFileError& e) {
    EXPECT_EQ(std::string(e.what()), dir.path() + ": is a directory, not a checkpoint file (give one "
                                     "of its step_*.h5 files)");
  }
}

TEST(CheckpointFile, SlicesLandAtTheirGlobalPositions) {
  testing::TempDir dir;
  const Shape global{4, 6};
  std::vector<float> whole(24);
  std::iota(whole.begin(), whole.end(), 0.0f);
  {
    CheckpointFile f(dir.file("b.h5"), MPI_COMM_SELF, CheckpointFile::Access::Create);
    f.create_dataset("/model/w", global, DType::F32);
    f.create_dataset("/optim/w/exp_avg", global, DType::F32);
    // Two column slices of (4, 3), as two tp ranks hold them, each written as hyperslabs.
    for (int part = 0; part < 2; ++part) {
      const SliceGeometry g{global, Shape{4, 3}, 1, part * 3};
      std::vector<float> slice;
      for (int64_t i = 0; i < 12; ++i) slice.push_back(whole[static_cast<size_t>((i / 3) * 6 + part * 3 + i % 3)]);
      f.write("/model/w", boxes_of_range(g, 0, 12), slice.data(), DType::F32);
    }
    Box all;
    all.count = {4, 6};
    f.write("/optim/w/exp_avg", {all}, whole.data(), DType::F32);
    f.set_checksum("/model/w", checksum_part(whole.data(), DType::F32, global, {all}));
    f.close();
  }
  CheckpointFile f(dir.file("b.h5"), MPI_COMM_SELF, CheckpointFile::Access::Read);
  EXPECT_EQ(f.dataset_names(), (std::vector<std::string>{"/model/w", "/optim/w/exp_avg"}));
  EXPECT_TRUE(f.has_dataset("/model/w"));
  EXPECT_FALSE(f.has_dataset("/model/v"));
  EXPECT_FALSE(f.has_dataset("/optim/v/exp_avg"));  // a missing group on the way is no error
  EXPECT_FALSE(f.has_dataset("/optim/w"));          // a group, not a dataset
  // Spellings HDF5 resolves to the same path (the checkpoint fuzzer found "/./" answered false).
  EXPECT_TRUE(f.has_dataset("/model/./w"));
  EXPECT_TRUE(f.has_dataset("/model//w"));
  EXPECT_TRUE(f.has_dataset("/optim/./w/exp_avg"));
  EXPECT_FALSE(f.has_dataset("/model/."));
  EXPECT_FALSE(f.has_dataset("/"));
  EXPECT_EQ(f.shape("/model/w"), global);
  EXPECT_EQ(f.dtype("/model/w"), DType::F32);
  Box all;
  all.count = {4, 6};
  std::vector<float> back(24);
  f.read("/model/w", {all}, back.data(), DType::F32);
  EXPECT_EQ(back, whole);
  std::vector<double> as_double(24);  // HDF5 converts on request
  f.read("/model/w", {all}, as_double.data(), DType::F64);
  EXPECT_EQ(as_double[23], 23.0);
  EXPECT_EQ(f.checksum("/model/w"), checksum_part(whole.data(), DType::F32, global, {all}));
  EXPECT_FALSE(f.checksum("/optim/w/exp_avg").has_value());
  // In place, for one slice: the checksum of that slice's values.
  const SliceGeometry g{global, Shape{4, 3}, 1, 3};
  const std::vector<Box> boxes = boxes_of_range(g, 2, 7);
  std::vector<float> part;
  for (int64_t i = 2; i < 9; ++i) part.push_back(whole[static_cast<size_t>((i / 3) * 6 + 3 + i % 3)]);
  EXPECT_EQ(f.stored_checksum("/model/w", boxes), checksum_part(part.data(), DType::F32, global, boxes));
}

TEST(CheckpointFile, BigEndianDataIsCheckedByValue) {
  testing::TempDir dir;
  const std::string path = dir.file("be.h5");
  std::vector<double> values(10);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5 * static_cast<double>(i) - 1.25;
  {
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t dims[1] = {10};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t ds = H5Dcreate2(file, "x", H5T_IEEE_F64BE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    H5Dclose(ds);
    H5Sclose(space);
    H5Fclose(file);
  }
  CheckpointFile f(path, MPI_COMM_SELF, CheckpointFile::Access::Read);
  EXPECT_EQ(f.dtype("/x"), DType::F64);
  Box all;
  all.count[0] = 10;
  EXPECT_EQ(f.stored_checksum("/x", {all}), checksum_part(values.data(), DType::F64, Shape{10}, {all}));
}

TEST(CheckpointFile, MissingFileIsRefusedWithHdf5sReason) {
  testing::TempDir dir;
  try {
    CheckpointFile f(dir.file("none.h5"), MPI_COMM_SELF, CheckpointFile::Access::Read);
    ADD_FAILURE() << "opened a missing file";
  } catch (const CheckpointFileError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("none.h5") + ": cannot open"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(HDF5: "), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain
