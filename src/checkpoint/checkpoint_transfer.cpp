#include "checkpoint_transfer.h"

#include <cstdio>

namespace meshtrain {

namespace {

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// transfer_mode's threshold: the smallest average run, over every rank, moved independently.
constexpr double kIndependentMinRunBytes = 256 << 10;

}  // namespace

CheckpointFile::Transfer transfer_mode(CheckpointIo io, const std::vector<Entry>& entries,
                                       bool primary_only, DType dt, Communicator& world) {
  if (io == CheckpointIo::Collective) return CheckpointFile::Transfer::Collective;
  if (io == CheckpointIo::Independent) return CheckpointFile::Transfer::Independent;
  int64_t elements = 0, runs = 0;
  for (const Entry& e : entries)
    for_each_run(e.global, e.boxes(primary_only), [&](int64_t, int64_t n) {
      elements += n;
      ++runs;
    });
  const double mine = runs ? static_cast<double>(elements) * dtype_size(dt) / static_cast<double>(runs)
                           : kIndependentMinRunBytes;  // nothing to move: no objection
  return world.all_reduce_scalar(mine, ReduceOp::Min) >= kIndependentMinRunBytes
             ? CheckpointFile::Transfer::Independent
             : CheckpointFile::Transfer::Collective;
}

void check_sums(const CheckpointFile& file, const std::vector<Entry>& entries,
                const std::vector<uint64_t>& sums, const std::vector<uint64_t>* written) {
  for (size_t i = 0; i < entries.size(); ++i)
    for (int kind = 0; kind < kKinds; ++kind) {
      const size_t j = i * kKinds + static_cast<size_t>(kind);
      const std::string name = dataset_name(entries[i].name, kind);
      const std::optional<uint64_t> stored = file.checksum(name);
      if (!stored)
        throw CheckpointFileError(file.path() + ": dataset " + name +
                                  " has no checksum attribute (not a complete meshtrain checkpoint)");
      if (*stored != sums[j] || (written && (*written)[j] != sums[j]))
        throw CheckpointFileError(file.path() + ": dataset " + name + ": checksum MISMATCH: the data "
                                  "read back sums to " + hex(sums[j]) + ", the file's checksum "
                                  "attribute says " + hex(*stored) +
                                  " (the file is damaged; use an older checkpoint)");
    }
}

}  // namespace meshtrain
