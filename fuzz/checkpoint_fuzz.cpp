// Fuzzes what meshtrain reads from a checkpoint: the root attributes (read_info), the model
// signature check of a load (check_model_signature), the effective configuration inspect parses
// (@config through parse_deck), the datasets' names, shapes and types, and the checksum
// verification — through a real HDF5 file that the input describes. (Files that point outside
// themselves — external storage, links, virtual datasets — are not in the recipe: the
// untrusted-file tests craft them, tests/checkpoint/untrusted_file_test.py.)
//
// The input is not the file's bytes: HDF5's own format parser is upstream's to fuzz (and has
// its own record of crafted-file bugs). It is a recipe — attribute values, datasets (name,
// shape, type, contents, a correct or a wrong checksum) and one byte of a dataset's data to
// flip afterwards — for a file written through CheckpointFile and read back the ways `inspect`,
// `train` and `eval` read it. Each step either succeeds or throws one of our errors, and:
//   - every attribute reads back as written (strings up to their first NUL: fixed-length,
//     null-padded storage), or read_info refuses it exactly when a value is out of its range,
//   - the checksum of a dataset read through HDF5 equals the one hashed in place from the
//     file's mapping (stored_checksum), and equals the recorded one exactly when it was written
//     correctly and no byte of its data was flipped — a flipped byte is always detected.
// Anything else (a crash, a sanitizer report, another exception) is a bug.

#include <fuzzer/FuzzedDataProvider.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../src/checkpoint/model_signature.h"
#include "fuzz_file.h"
#include "meshtrain/config/deck.h"
#include "meshtrain/io/checkpoint_file.h"

// Open MPI keeps allocations for the process's lifetime: its singleton start-up, and the
// components (MPI-IO, collectives) it loads on first use, whose frames LSan may not symbolise.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libmpi\nleak:libopen-pal\nleak:libopen-rte\nleak:libpmix\nleak:libhwloc\n"
         "leak:libevent\nleak:libucs\nleak:libfabric\nleak:mca_\nleak:__vasprintf_internal\n";
}

// At exit, allocations of components Open MPI has unloaded have no module left to name them;
// leaks are still checked for every input (libFuzzer's -detect_leaks), which is where ours
// would show.
extern "C" const char* __lsan_default_options() { return "leak_check_at_exit=0"; }

namespace {
void write_and_read_once(const std::string& path);
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  // Load every MPI component a checkpoint uses before the first input, so that libFuzzer's
  // per-input leak check does not count their one-time allocations against that input.
  meshtrain::fuzz::ScratchFile warm("checkpoint-warm-up.h5");
  write_and_read_once(warm.write(nullptr, 0));
  return 0;
}

namespace {

using namespace meshtrain;

struct DatasetRecipe {
  std::string name;
  Shape shape;
  DType type = DType::F32;
  std::vector<uint8_t> bytes;
  bool correct_checksum = true;
  uint64_t wrong_checksum = 0;
};

std::string before_nul(const std::string& s) { return s.substr(0, s.find('\0')); }

// A name HDF5 may or may not accept ("/model/" + fuzz text): refusals must be our errors.
std::string dataset_name(FuzzedDataProvider& in) {
  static const char* const kPrefixes[] = {"/model/", "/optim/", "/", "/model/h.0/"};
  return std::string(kPrefixes[in.ConsumeIntegralInRange<int>(0, 3)]) + in.ConsumeRandomLengthString(24);
}

void trap_unless(bool ok) {
  if (!ok) __builtin_trap();
}

void write_and_read_once(const std::string& path) {
  {
    CheckpointFile out(path, MPI_COMM_SELF, CheckpointFile::Access::Create);
    out.write_info(CheckpointInfo{});
    out.create_dataset("/model/w", Shape{2}, DType::F32);
    const float w[2] = {1.0f, 2.0f};
    Box all;
    all.count[0] = 2;
    out.write("/model/w", {all}, w, DType::F32);
    out.set_checksum("/model/w", checksum_part(w, DType::F32, Shape{2}, {all}));
    out.close();
  }
  CheckpointFile back(path, MPI_COMM_SELF, CheckpointFile::Access::Read);
  (void)back.read_info();
  Box all;
  all.count[0] = 2;
  float w[2];
  back.read("/model/w", {all}, w, DType::F32);
  (void)back.stored_checksum("/model/w", {all});
  back.close();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static meshtrain::fuzz::ScratchFile file("checkpoint.h5");
  FuzzedDataProvider in(data, size);

  CheckpointInfo info;
  info.format_version = in.ConsumeIntegral<int>();
  info.step = in.ConsumeIntegral<int64_t>();
  info.optimizer_steps = in.ConsumeIntegral<int64_t>();
  info.seed = in.ConsumeIntegral<uint64_t>();
  info.world_size = in.ConsumeIntegral<int>();
  info.deck = in.ConsumeRandomLengthString(512);
  info.overrides = in.ConsumeRandomLengthString(128);
  info.config = in.ConsumeRandomLengthString(1024);
  info.model = in.ConsumeRandomLengthString(512);
  info.lineage = in.ConsumeRandomLengthString(40);
  info.layout = in.ConsumeRandomLengthString(80);
  info.meshtrain_version = in.ConsumeRandomLengthString(16);
  info.created = in.ConsumeRandomLengthString(24);

  std::vector<DatasetRecipe> sets(in.ConsumeIntegralInRange<size_t>(0, 4));
  for (DatasetRecipe& d : sets) {
    d.name = dataset_name(in);
    const int rank = in.ConsumeIntegralInRange<int>(1, 3);
    int64_t n[3];
    for (int64_t& dim : n) dim = in.ConsumeIntegralInRange<int64_t>(1, 9);
    d.shape = rank == 1 ? Shape{n[0]} : rank == 2 ? Shape{n[0], n[1]} : Shape{n[0], n[1], n[2]};
    d.type = in.ConsumeBool() ? DType::F64 : DType::F32;
    d.bytes = in.ConsumeBytes<uint8_t>(static_cast<size_t>(d.shape.numel()) * dtype_size(d.type));
    d.bytes.resize(static_cast<size_t>(d.shape.numel()) * dtype_size(d.type), 0);
    d.correct_checksum = in.ConsumeBool();
    d.wrong_checksum = in.ConsumeIntegral<uint64_t>();
  }
  const size_t flip_set = in.ConsumeIntegral<size_t>();
  const size_t flip_byte = in.ConsumeIntegral<size_t>();
  const uint8_t flip_mask = static_cast<uint8_t>(in.ConsumeIntegralInRange<int>(1, 255));

  const std::string& path = file.write(nullptr, 0);
  // Write the file as the recipe says; a name or value HDF5 refuses ends the input cleanly.
  std::vector<DatasetRecipe> written;
  try {
    CheckpointFile out(path, MPI_COMM_SELF, CheckpointFile::Access::Create);
    out.write_info(info);
    for (DatasetRecipe& d : sets) {
      try {
        out.create_dataset(d.name, d.shape, d.type);
      } catch (const CheckpointFileError&) {
        continue;  // an impossible name, or one already taken
      }
      Box all;
      for (int k = 0; k < d.shape.rank(); ++k) all.count[k] = d.shape[k];
      out.write(d.name, {all}, d.bytes.data(), d.type);
      const uint64_t right = checksum_part(d.bytes.data(), d.type, d.shape, {all});
      if (!d.correct_checksum && d.wrong_checksum == right) d.correct_checksum = true;
      out.set_checksum(d.name, d.correct_checksum ? right : d.wrong_checksum);
      written.push_back(d);
    }
    out.close();
  } catch (const CheckpointFileError&) {
    return 0;
  }

  // Damage one byte of one dataset's data, as a failing disk would.
  bool flipped = false;
  size_t flipped_set = 0;
  if (!written.empty() && (flip_set & 1)) {
    flipped_set = (flip_set >> 1) % written.size();
    try {
      CheckpointFile probe(path, MPI_COMM_SELF, CheckpointFile::Access::Read);
      const int64_t offset = probe.data_offset(written[flipped_set].name);
      probe.close();
      const size_t at = static_cast<size_t>(offset) + flip_byte % written[flipped_set].bytes.size();
      FILE* f = std::fopen(path.c_str(), "r+b");
      trap_unless(f != nullptr);
      std::fseek(f, static_cast<long>(at), SEEK_SET);
      const int c = std::fgetc(f);
      std::fseek(f, static_cast<long>(at), SEEK_SET);
      std::fputc((c ^ flip_mask) & 0xFF, f);
      std::fclose(f);
      flipped = true;
    } catch (const CheckpointFileError&) {
      __builtin_trap();  // a dataset just written has an offset
    }
  }

  // Read it back as inspect, train and eval do.
  try {
    CheckpointFile back(path, MPI_COMM_SELF, CheckpointFile::Access::Read);
    // read_info refuses exactly the values outside their ranges (CheckpointFile::read_info).
    const std::string lineage = before_nul(info.lineage);
    const bool in_range = info.format_version >= 1 && info.step >= 0 && info.step <= kMaxCheckpointStep &&
                          info.optimizer_steps >= 0 && info.world_size >= 1 &&
                          (lineage.empty() || is_lineage_id(lineage));
    CheckpointInfo got;
    bool refused = false;
    try {
      got = back.read_info();
    } catch (const CheckpointFileError&) {
      refused = true;
    }
    trap_unless(refused == !in_range);
    if (!refused) {
      trap_unless(got.format_version == info.format_version && got.step == info.step &&
                  got.optimizer_steps == info.optimizer_steps && got.seed == info.seed &&
                  got.world_size == info.world_size);
      for (auto [a, b] : {std::pair{&got.deck, &info.deck}, {&got.overrides, &info.overrides},
                          {&got.config, &info.config}, {&got.model, &info.model},
                          {&got.lineage, &info.lineage}, {&got.layout, &info.layout},
                          {&got.meshtrain_version, &info.meshtrain_version},
                          {&got.created, &info.created}})
        trap_unless(*a == before_nul(*b));
      try {
        check_model_signature(path, got.model, ModelSpec{}, "deck.toml", got.meshtrain_version);
      } catch (const CheckpointFileError&) {
      }
      try {
        (void)parse_deck("<checkpoint config>", got.config);
      } catch (const DeckError&) {
      }
    }

    const std::vector<std::string> names = back.dataset_names();
    trap_unless(names.size() == written.size());
    for (size_t i = 0; i < written.size(); ++i) {
      const DatasetRecipe& d = written[i];
      trap_unless(back.has_dataset(d.name) && back.shape(d.name) == d.shape && back.dtype(d.name) == d.type);
      Box all;
      for (int k = 0; k < d.shape.rank(); ++k) all.count[k] = d.shape[k];
      std::vector<uint8_t> read(d.bytes.size());
      back.read(d.name, {all}, read.data(), d.type);
      const uint64_t sum = checksum_part(read.data(), d.type, d.shape, {all});
      trap_unless(back.stored_checksum(d.name, {all}) == sum);
      const bool damaged = flipped && i == flipped_set;
      trap_unless((back.checksum(d.name) == sum) == (d.correct_checksum && !damaged));
    }
    back.close();
  } catch (const CheckpointFileError&) {
    __builtin_trap();  // the file was written by us and damaged only in its data
  }
  return 0;
}
