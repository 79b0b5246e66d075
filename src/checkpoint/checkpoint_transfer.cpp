#include "checkpoint_transfer.h"

#include <cstdio>

namespace meshtrain {

namespace {

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// transfer_mode's thresholds: the smallest average run, over every rank, moved independently;
// and for loads, the smallest average sequential stretch (runs that follow one another in the
// file's dataset order without a gap), over every rank, read independently: a few times the
// OS's usual read-ahead window of a few MiB.
constexpr double kIndependentMinRunBytes = 256 << 10;
constexpr double kSequentialStretchBytes = 32 << 20;

}  // namespace

CheckpointFile::Transfer transfer_mode(CheckpointIo io, const std::vector<Entry>& entries,
                                       TransferDirection direction, DType dt, Communicator& world) {
  if (io == CheckpointIo::Collective) return CheckpointFile::Transfer::Collective;
  if (io == CheckpointIo::Independent) return CheckpointFile::Transfer::Independent;
  // A save moves each element once, from its primary holder; a load reads every held copy.
  const bool primary_only = direction == TransferDirection::Save;
  int64_t elements = 0, runs = 0, stretches = 0;
  // Positions along the concatenation of the datasets in the order they are written.
  int64_t base = 0, end = -1;
  for (const Entry& e : entries)
    for (int kind = 0; kind < kKinds; ++kind) {
      for_each_run(e.global, e.boxes(primary_only), [&](int64_t first, int64_t n) {
        elements += n;
        ++runs;
        if (base + first != end) ++stretches;
        end = base + first + n;
      });
      base += e.global.numel();
    }
  const double nothing = 1e300;  // nothing to move: no objection
  const double run = runs ? static_cast<double>(elements) * dtype_size(dt) / static_cast<double>(runs) : nothing;
  // One stretch is one sequential sweep, however short.
  const double stretch = direction == TransferDirection::Load && stretches > 1
                             ? static_cast<double>(elements) * dtype_size(dt) / static_cast<double>(stretches)
                             : nothing;
  const bool independent = world.all_reduce_scalar(run, ReduceOp::Min) >= kIndependentMinRunBytes &&
                           (world.size() == 1 ||
                            world.all_reduce_scalar(stretch, ReduceOp::Min) >= kSequentialStretchBytes);
  return independent ? CheckpointFile::Transfer::Independent : CheckpointFile::Transfer::Collective;
}

void check_sum(const CheckpointFile& file, const std::string& name, uint64_t sum, const uint64_t* written) {
  const std::optional<uint64_t> stored = file.checksum(name);
  if (!stored)
    throw CheckpointFileError(file.path() + ": dataset " + name +
                              " has no checksum attribute (not a complete meshtrain checkpoint)");
  if (*stored != sum || (written && *written != sum))
    throw CheckpointFileError(file.path() + ": dataset " + name + ": checksum MISMATCH: the data "
                              "read back sums to " + hex(sum) + ", the file's checksum "
                              "attribute says " + hex(*stored) +
                              " (the file is damaged; use an older checkpoint)");
}

void check_sums(const CheckpointFile& file, const std::vector<Entry>& entries,
                const std::vector<uint64_t>& sums, const std::vector<uint64_t>* written) {
  for (size_t i = 0; i < entries.size(); ++i)
    for (int kind = 0; kind < kKinds; ++kind) {
      const size_t j = i * kKinds + static_cast<size_t>(kind);
      check_sum(file, dataset_name(entries[i].name, kind), sums[j], written ? &(*written)[j] : nullptr);
    }
}

}  // namespace meshtrain
