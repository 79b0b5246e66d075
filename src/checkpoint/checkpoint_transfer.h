#pragma once
// How the Checkpointer moves and verifies a checkpoint's datasets, shared by save and load: the
// choice between collective and independent MPI-IO transfers, running one transfer under the
// agreement it needs, and comparing checksums with the file's. Private to src/checkpoint.

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "meshtrain/comm/agreement.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/config/config.h"
#include "meshtrain/io/checkpoint_file.h"
#include "checkpoint_entries.h"

namespace meshtrain {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// checkpoint.io = "auto": independent transfers when every rank's pieces are long runs (ZeRO
// shards, whole tensors), where MPI-IO's aggregation only adds copies and a synchronisation per
// tensor; collective when some rank holds short strided runs (tensor-parallel column slices),
// which aggregation turns into large requests. A load is also collective where the ranks' runs
// take turns along the file in stretches shorter than kSequentialStretchBytes (ZeRO shards of a
// model in many buckets): read independently, every rank's stream skips ahead at each of the
// others' runs, so the OS's read-ahead restarts and each rank waits for one request at a time,
// while aggregators read the file in a few sequential sweeps. Collective.
enum class TransferDirection { Save, Load };
CheckpointFile::Transfer transfer_mode(CheckpointIo io, const std::vector<Entry>& entries,
                                       TransferDirection direction, DType dt, Communicator& world);

// Runs `transfer` on this rank: a collective transfer under one agreement each (a rank whose
// transfer failed must not leave the others inside the next collective); an independent one
// alone, keeping the first error in `error` for one agreement after the last, and skipping the
// rest once one failed. Returns whether it ran and succeeded here.
template <class F>
bool run_transfer(CheckpointFile::Transfer how, Communicator& world, std::string& error, F&& transfer) {
  if (how == CheckpointFile::Transfer::Collective) {
    agree(world, transfer);
    return true;
  }
  if (!error.empty()) return false;
  try {
    transfer();
    return true;
  } catch (const std::exception& e) {
    error = e.what();
    return false;
  }
}

// Compares the checksums of the data as read with the file's attributes (and, after a write,
// with what was written). Throws naming the first bad dataset. check_sum: one dataset's.
void check_sum(const CheckpointFile& file, const std::string& name, uint64_t sum, const uint64_t* written);
void check_sums(const CheckpointFile& file, const std::vector<Entry>& entries,
                const std::vector<uint64_t>& sums, const std::vector<uint64_t>* written);

}  // namespace meshtrain
