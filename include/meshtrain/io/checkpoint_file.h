#pragma once
// One checkpoint file: a parallel HDF5 file (MPI-IO driver, collective transfers) in which
// every tensor is stored with its GLOBAL shape, so that any layout reads it back by selecting
// its own hyperslabs (hyperslab.h). This file is the HDF5 mechanics and the format; when and
// where checkpoints are written, and how a Trainer's state maps onto them, is
// checkpoint/checkpointer.h.
//
// Format version 2 (version 1 lacked @lineage, @model, @config and @overrides)
//
// | where                          | kind      | type                 | content                              |
// |--------------------------------|-----------|----------------------|--------------------------------------|
// | /model/<name>                  | dataset   | float32 or float64   | parameter <name> (e.g. h.0.attn.qkv.weight), global shape (e.g. (3, C, C)) |
// | /optim/<name>/exp_avg          | dataset   | as /model/<name>     | AdamW first moment, same shape       |
// | /optim/<name>/exp_avg_sq       | dataset   | as /model/<name>     | AdamW second moment, same shape      |
// | <every dataset>  @checksum     | attribute | uint64               | see "Checksum" below                 |
// | /  @format_version             | attribute | int32                | 2                                    |
// | /  @step                       | attribute | int64                | optimizer steps completed            |
// | /  @optimizer_steps            | attribute | int64                | AdamW's step count (bias correction) |
// | /  @seed                       | attribute | uint64               | run.seed                             |
// | /  @deck                       | attribute | string               | the input deck's text as read (--set overrides are not in it) |
// | /  @overrides                  | attribute | string               | the --set overrides, one "section.key=value" a line ("" if none) |
// | /  @config                     | attribute | string               | the effective configuration (deck + overrides + defaults, as the run used it) as canonical TOML (config/config_dump.h) |
// | /  @model                      | attribute | string               | the settings that decide the model's function, "key = value" lines: the [model] keys, what the build fixes (layernorm_eps, positions, activation) and the tokenizer (kind:vocab_size, "byte" for bytes); checked on load |
// | /  @lineage                    | attribute | string               | 32 hex digits naming the run: made when a run starts afresh, carried across resumes; a run writes, overwrites and prunes only checkpoints of its own lineage |
// | /  @layout                     | attribute | string               | "dp=2 tp=2 pp=2 zero=1 schedule=1f1b virtual_stages=1 micro_batch=2" |
// | /  @world_size                 | attribute | int32                | ranks that wrote the file            |
// | /  @meshtrain_version          | attribute | string               | MESHTRAIN_VERSION of the writer      |
// | /  @created                    | attribute | string               | UTC, ISO 8601 ("2025-01-31T12:00:00Z") |
// | /  @data_blend                 | attribute | string               | only by runs on a blend (data.train as weighted sources): each source's samples drawn before @step, "blend_position 1\n<c_0> <c_1> ...\n" (io/blend_schedule.h) |
//
// Element type: the run's precision (train.precision: float32, or float64 for "fp64"),
// little-endian IEEE. A reader with another precision converts after verifying. Strings are
// fixed-length UTF-8, null-padded. Datasets are contiguous (no chunking, no filters), so other
// tools read them directly: h5py `f["/model/wte"][...]`.
//
// Reading a file someone else made: every object is reached by hard links only, and every
// dataset keeps its elements inside the file — contiguous, chunked or compact storage, no
// filters (compression), no external raw storage, not virtual — and stores at least the bytes
// its shape declares, within the file's size. A file that does not is refused on open, naming
// the object (CheckpointFile's constructor; src/io/checkpoint_file_trust.h).
//
// Data state: the sampler is stateless — the samples of step s are a function of
// (run.seed, s) (io/sampler.h) — so @seed and @step are the whole state of the data pipeline
// of one source. A blend adds each source's position (@data_blend, versioned in its first
// line); a file without it is a run on one source, at position @step x global_batch. The
// learning rate is a function of @step as well.
//
// Checksum: per dataset, order- and layout-independent, so that each rank computes the part
// over the elements it holds and the parts add up:
//
//     checksum = sum over elements e of  mix64(i_e * 0x9E3779B97F4A7C15 + b_e)   (mod 2^64)
//
// with i_e the element's row-major flat index in the global shape (from 0), b_e the IEEE-754
// bit pattern of its value in the stored precision (float32: the 32 bits, zero-extended;
// float64: the 64 bits; byte order does not enter), and mix64 the splitmix64 finaliser of
// tensor/philox.h:
//     x += 0x9E3779B97F4A7C15; x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9;
//     x = (x ^ (x >> 27)) * 0x94D049BB133111EB; return x ^ (x >> 31);
// A flipped bit changes one term; a value moved to another index changes two.

#include <mpi.h>

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/io/hyperslab.h"
#include "meshtrain/tensor/dtype.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

inline constexpr int kCheckpointFormatVersion = 2;

// The largest @step a checkpoint may record: the trainer counts steps in int, and train.steps
// is one.
inline constexpr int64_t kMaxCheckpointStep = std::numeric_limits<int32_t>::max();

// Whether `s` is a lineage as a run records it (@lineage): 32 hexadecimal digits.
bool is_lineage_id(const std::string& s);

// The root group's attributes.
struct CheckpointInfo {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;
  int64_t optimizer_steps = 0;
  uint64_t seed = 0;
  std::string deck;
  std::string overrides;  // one a line
  std::string config;
  std::string model;
  std::string lineage;
  std::string layout;
  int world_size = 1;
  std::string meshtrain_version;
  std::string created;
  // The optimizer whose state the file holds: "muon", or "" for AdamW (written only by Muon
  // runs, so that AdamW's checkpoints stay what they were before there was a choice).
  std::string optimizer;
  // A blend's data position (train/data_feed.h), or "" (not written) for one source.
  std::string data_blend;
};

// The settings @model records, its "key = value" lines as key -> value (the checkpoint layer
// writes and checks them; export reads them).
std::map<std::string, std::string> recorded_model_settings(const std::string& model);

// A failure of the file itself (cannot be created, not HDF5, an attribute missing); the
// message names the file, the object and, where HDF5 said why, its innermost reason.
class CheckpointFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The checksum part of `n` elements stored as `dtype` (F32 or F64) back to back in `data`,
// at the global positions of `boxes` of a tensor of shape `global`, in box order.
uint64_t checksum_part(const void* data, DType dtype, const Shape& global,
                       const std::vector<Box>& boxes);

// The current time, UTC, ISO 8601 ("2025-01-31T12:00:00Z"): the @created attribute, and the
// date in a calibrated machine profile's notes.
std::string utc_timestamp();

// An open checkpoint file. Every method marked "collective" must be called by every rank of
// the communicator, in the same order, with the same names (HDF5 metadata changes and
// collective transfers require it); the others may be called by any rank alone.
class CheckpointFile {
 public:
  enum class Access { Create, Read };

  // A created file gathers its small metadata (object headers, attributes) into blocks of this
  // size: a load's hundreds of header reads then fall in one block near the start of the file,
  // one read-ahead on a cold cache, rather than in 2 KiB blocks scattered between the datasets
  // (a device round trip each). A file is up to this much larger than its data.
  static constexpr uint64_t kMetadataBlockBytes = uint64_t{256} << 10;

  // Collective. Create truncates an existing file. Read first checks that the file holds
  // everything it declares inside itself (no external storage, external or soft links, virtual
  // datasets or filters; every dataset's elements stored within the file's size) and refuses it
  // otherwise, on every rank, naming the first offending object. Throws CheckpointFileError.
  CheckpointFile(const std::string& path, MPI_Comm comm, Access access);
  // Closes collectively if still open; errors there are lost (call close() to see them).
  ~CheckpointFile();
  CheckpointFile(const CheckpointFile&) = delete;
  CheckpointFile& operator=(const CheckpointFile&) = delete;

  // Collective: closes every object and the file (the last buffered writes happen here).
  void close();
  // Collective: closes a file being created whose writing failed, dropping its contents first
  // (world rank 0 truncates it to zero bytes), so that the metadata HDF5 writes while closing
  // fits even on a full disk. Closing a parallel HDF5 file that cannot be written fails on some
  // ranks and not others and they deadlock inside H5Fclose; a file left open is closed again in
  // MPI_Finalize, which crashes. Errors are ignored; the caller deletes the (empty) file.
  void discard();
  const std::string& path() const { return path_; }

  // Collective; `info` must be identical on every rank.
  void write_info(const CheckpointInfo& info);
  // Reads the root attributes; throws naming the missing or malformed one, or an integer out of
  // its range (read exactly, whatever integer type stores it: @format_version >= 1, 0 <= @step
  // <= kMaxCheckpointStep, @optimizer_steps >= 0, @world_size >= 1, @seed >= 0), or a @lineage
  // that is not 32 hexadecimal digits. Does not judge
  // format_version (the caller says which versions it reads); the attributes version 2 added
  // are left empty where absent (version 1 files), and the caller requires them.
  CheckpointInfo read_info() const;

  // Collective: a dataset at `name` ("/model/wte"), intermediate groups created as needed.
  void create_dataset(const std::string& name, const Shape& shape, DType dtype);
  // Reserves on disk the bytes of everything created so far (the datasets are allocated at
  // creation), so that a full file system fails here instead of in the middle of a collective
  // write: there MPI-IO reports it only on the ranks whose own writes failed, and with MPICH's
  // ROMIO those leave HDF5's collective write early while the others wait inside it, with no
  // timeout (Open MPI's OMPIO happens to get through). Not collective: one rank calls it; a
  // file system that cannot reserve space (no fallocate) is left as it is. Throws
  // CheckpointFileError naming the size when the space is not there.
  void reserve_space();
  // Full paths of every dataset in the file, sorted.
  std::vector<std::string> dataset_names() const;
  bool has_dataset(const std::string& name) const;
  Shape shape(const std::string& name) const;
  // F32 or F64; throws naming the dataset for any other stored type.
  DType dtype(const std::string& name) const;
  // The dataset's byte offset in the file (contiguous storage); for tests that damage it.
  int64_t data_offset(const std::string& name) const;

  // This rank's elements of `name` — the union of `boxes` (global coordinates, disjoint, in
  // row-major order; none selects nothing) — from/to `data`, which holds them back to back in
  // row-major order as `dtype` (HDF5 converts to and from the stored type). Collective, unless
  // `transfer` is Independent: then each rank calls it alone (or not at all, with no boxes).
  enum class Transfer { Collective, Independent };
  void write(const std::string& name, const std::vector<Box>& boxes, const void* data, DType dtype,
             Transfer transfer = Transfer::Collective);
  void read(const std::string& name, const std::vector<Box>& boxes, void* data, DType dtype,
            Transfer transfer = Transfer::Collective);

  // The checksum part of this rank's elements `boxes` of `name` as stored, hashed in place
  // through a read-only mapping of the file: no copy, for verifying a file just written
  // (contiguous little-endian storage; anything else is read and converted). Not collective.
  uint64_t stored_checksum(const std::string& name, const std::vector<Box>& boxes);

  // Collective: the dataset's @checksum attribute.
  void set_checksum(const std::string& name, uint64_t sum);
  // Its @checksum, or nothing if absent.
  std::optional<uint64_t> checksum(const std::string& name) const;

 private:
  enum class Direction { Read, Write };
  void transfer(const std::string& name, const std::vector<Box>& boxes, void* data, DType dtype,
                Direction direction, bool collective) const;
  int64_t dataset(const std::string& name) const;  // an open handle (hid_t), cached
  [[noreturn]] void fail(const std::string& what) const;

  std::string path_;
  MPI_Comm comm_;
  int64_t file_ = -1;  // hid_t
  int64_t dapl_ = -1;  // hid_t: the dataset access properties of an untrusted file
  mutable std::map<std::string, int64_t> datasets_;
  const char* map_ = nullptr;  // stored_checksum's mapping of the file
  size_t map_size_ = 0;
};

}  // namespace meshtrain
