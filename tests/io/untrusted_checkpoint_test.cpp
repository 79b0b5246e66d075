// A checkpoint file comes from someone else: CheckpointFile refuses, on open, a file that
// points outside itself (external raw storage) or declares more than it stores, and read_info
// reads every integer attribute exactly, whatever integer type stores it, and refuses one out
// of its range. What a reader prints of a file is escaped (terminal_safe); the files of an HF
// directory must be regular files (read_regular_file). The same hostile files, crafted with
// h5py, go through every command: tests/checkpoint/untrusted_file_test.py.

#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/io/regular_file.h"
#include "meshtrain/io/terminal_text.h"
#include "support/temp_dir.h"
#include "../../src/io/checkpoint_file_trust.h"

namespace meshtrain {
namespace {

std::string refusal(const std::string& path) {
  try {
    CheckpointFile f(path, MPI_COMM_SELF, CheckpointFile::Access::Read);
    (void)f.read_info();
  } catch (const CheckpointFileError& e) {
    return e.what();
  }
  return "";
}

// A file with one float32 dataset "/model/w" of `n` elements created through `dcpl`, written
// (and so allocated) unless `write` is false.
void write_plain_hdf5(const std::string& path, hid_t dcpl, hsize_t n, bool write = true) {
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t group = H5Gcreate2(file, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t space = H5Screate_simple(1, &n, nullptr);
  const hid_t ds = H5Dcreate2(group, "w", H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  if (write) {
    std::vector<float> v(n, 1.5f);
    H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  }
  H5Dclose(ds);
  H5Sclose(space);
  H5Gclose(group);
  H5Fclose(file);
}

TEST(UntrustedCheckpoint, ExternalRawStorageIsRefusedNamingTheDatasetAndTheFile) {
  testing::TempDir dir;
  const std::string outside = dir.file("secret.txt");
  std::ofstream(outside) << std::string(64, 's');
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_external(dcpl, outside.c_str(), 0, 64);
  write_plain_hdf5(dir.file("ext.h5"), dcpl, 16, /*write=*/false);
  H5Pclose(dcpl);
  EXPECT_EQ(refusal(dir.file("ext.h5")),
            dir.file("ext.h5") + ": dataset /model/w stores its data outside the file (external storage '" +
                outside + "'); a checkpoint must hold its data inside itself");
}

// Defence in depth behind the check on open: the dataset access properties CheckpointFile uses
// resolve a relative external file name under /dev/null/, where nothing can be opened.
TEST(UntrustedCheckpoint, ConfinedAccessResolvesNoRelativeExternalFile) {
  testing::TempDir dir;
  std::ofstream(dir.file("secret.bin"), std::ios::binary) << std::string(64, '\x41');
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_external(dcpl, "secret.bin", 0, 64);
  write_plain_hdf5(dir.file("rel.h5"), dcpl, 16, /*write=*/false);
  H5Pclose(dcpl);
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());  // where HDF5 resolves it by default
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t file = H5Fopen(dir.file("rel.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  std::vector<float> v(16);
  const hid_t plain = H5Dopen2(file, "/model/w", H5P_DEFAULT);
  EXPECT_GE(H5Dread(plain, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);  // reachable
  H5Dclose(plain);
  const hid_t dapl = confined_dataset_access();
  const hid_t confined = H5Dopen2(file, "/model/w", dapl);
  EXPECT_TRUE(confined < 0 || H5Dread(confined, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0);
  if (confined >= 0) H5Dclose(confined);
  H5Pclose(dapl);
  H5Fclose(file);
  std::filesystem::current_path(cwd);
}

TEST(UntrustedCheckpoint, CompactAndChunkedStorageInsideTheFileIsRead) {
  testing::TempDir dir;
  for (const H5D_layout_t layout : {H5D_COMPACT, H5D_CHUNKED}) {
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_layout(dcpl, layout);
    const hsize_t chunk = 4;
    if (layout == H5D_CHUNKED) H5Pset_chunk(dcpl, 1, &chunk);
    write_plain_hdf5(dir.file("in.h5"), dcpl, 10);
    H5Pclose(dcpl);
    CheckpointFile f(dir.file("in.h5"), MPI_COMM_SELF, CheckpointFile::Access::Read);
    Box all;
    all.count[0] = 10;
    std::vector<float> v(10);
    f.read("/model/w", {all}, v.data(), DType::F32);
    EXPECT_EQ(v[9], 1.5f) << "layout " << layout;
  }
}

TEST(UntrustedCheckpoint, ADatasetDeclaringMoreThanItStoresIsRefusedBeforeAnyRead) {
  testing::TempDir dir;
  // 2^28 float32 (1 GiB) declared, nothing written: HDF5 would return fill values for all of it.
  write_plain_hdf5(dir.file("huge.h5"), H5P_DEFAULT, hsize_t{1} << 28, /*write=*/false);
  EXPECT_EQ(refusal(dir.file("huge.h5")),
            dir.file("huge.h5") + ": dataset /model/w declares 1073741824 bytes (268435456 elements of 4 "
                                  "bytes) but stores 0; a checkpoint holds every element of its datasets (a "
                                  "truncated or crafted file)");
}

// A checkpoint of `info`, whose attribute `name` is then stored as `type` holding `value`.
std::string with_attribute(const testing::TempDir& dir, const char* name, hid_t type, const void* value) {
  const std::string path = dir.file(std::string(name) + ".h5");
  {
    CheckpointFile f(path, MPI_COMM_SELF, CheckpointFile::Access::Create);
    CheckpointInfo info;
    info.lineage = "0123456789abcdef0123456789ABCDEF";
    f.write_info(info);
    f.close();
  }
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  H5Adelete(file, name);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attr = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attr, type, value);
  H5Aclose(attr);
  H5Sclose(space);
  H5Fclose(file);
  return path;
}

TEST(UntrustedCheckpoint, IntegerAttributesAreReadExactlyAndRangeChecked) {
  testing::TempDir dir;
  struct Case {
    const char* name;
    hid_t type;
    int64_t s;
    uint64_t u;
    std::string shown;  // "" when accepted
  };
  const std::vector<Case> cases = {
      {"step", H5T_NATIVE_INT64, (int64_t{1} << 32) + 2, 0, "4294967298"},  // was read as step 2
      {"step", H5T_NATIVE_INT64, int64_t{1} << 31, 0, "2147483648"},
      {"step", H5T_NATIVE_UINT64, 0, ~uint64_t{0}, "18446744073709551615"},
      {"step", H5T_NATIVE_INT64, -1, 0, "-1"},
      {"step", H5T_NATIVE_UINT32, 0, 7, ""},
      {"optimizer_steps", H5T_NATIVE_UINT64, 0, uint64_t{1} << 63, "9223372036854775808"},
      {"world_size", H5T_NATIVE_INT64, (int64_t{1} << 32) + 1, 0, "4294967297"},  // was read as 1
      {"world_size", H5T_NATIVE_INT64, 3, 0, ""},
      {"format_version", H5T_NATIVE_INT64, (int64_t{1} << 32) + 2, 0, "4294967298"},  // was version 2
      {"seed", H5T_NATIVE_INT64, -5, 0, "-5"},  // was read as 0
      {"seed", H5T_NATIVE_INT8, 5, 0, ""},
  };
  for (const Case& c : cases) {
    const bool is_unsigned = H5Tget_sign(c.type) == H5T_SGN_NONE;
    uint8_t bytes[8] = {};
    if (H5Tget_size(c.type) == 8) std::memcpy(bytes, is_unsigned ? static_cast<const void*>(&c.u) : &c.s, 8);
    else if (H5Tget_size(c.type) == 4) { const uint32_t v = static_cast<uint32_t>(c.u); std::memcpy(bytes, &v, 4); }
    else bytes[0] = static_cast<uint8_t>(c.s);
    const std::string path = with_attribute(dir, c.name, c.type, bytes);
    const std::string error = refusal(path);
    if (c.shown.empty()) {
      EXPECT_EQ(error, "") << c.name;
      continue;
    }
    EXPECT_NE(error.find(path + ": attribute '" + c.name + "' = " + c.shown + " is out of range (expected "),
              std::string::npos)
        << error;
  }
}

TEST(UntrustedCheckpoint, ALineageIsThirtyTwoHexDigits) {
  EXPECT_TRUE(is_lineage_id("0123456789abcdef0123456789ABCDEF"));
  EXPECT_FALSE(is_lineage_id("0123456789abcdef0123456789abcde"));
  EXPECT_FALSE(is_lineage_id("0123456789abcdef0123456789abcdeg"));
  EXPECT_FALSE(is_lineage_id("../../../../../../../../etc/pass"));
}

TEST(TerminalText, ControlsAndInvalidBytesAreEscaped) {
  EXPECT_EQ(terminal_safe("plain text, ünïcode ✓"), "plain text, ünïcode ✓");
  EXPECT_EQ(terminal_safe("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(terminal_safe("\x1b]0;title\x07"), "\\x1b]0;title\\x07");
  EXPECT_EQ(terminal_safe("line\nnext\r\tx\x7f"), "line\\nnext\\r\\tx\\x7f");
  EXPECT_EQ(terminal_safe(std::string("nul\0!", 5)), "nul\\x00!");
  EXPECT_EQ(terminal_safe("\xc2\x9b" "31m"), "\\u{009b}31m");     // C1 CSI, as UTF-8
  EXPECT_EQ(terminal_safe("\x9b" "31m"), "\\x9b31m");             // C1 CSI, a raw byte
  EXPECT_EQ(terminal_safe("\xe2\x80\xae" "txt"), "\\u{202e}txt");  // right-to-left override
  EXPECT_EQ(terminal_safe("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(terminal_safe("\xe2\x9c"), "\\xe2\\x9c");  // a sequence cut short
}

TEST(RegularFile, OnlyARegularFileIsRead) {
  testing::TempDir dir;
  std::string out;
  std::ofstream(dir.file("a.json")) << "{}";
  EXPECT_EQ(read_regular_file(dir.file("a.json"), out), "");
  EXPECT_EQ(out, "{}");
  EXPECT_EQ(read_regular_file(dir.path(), out), "is a directory");
  EXPECT_EQ(read_regular_file(dir.file("none"), out), "cannot open: No such file or directory");
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  EXPECT_EQ(read_regular_file(dir.file("fifo"), out), "is a FIFO (named pipe), not a regular file");  // no wait
  EXPECT_EQ(regular_file_problem("/dev/null"), "is a character device, not a regular file");
}

}  // namespace
}  // namespace meshtrain
