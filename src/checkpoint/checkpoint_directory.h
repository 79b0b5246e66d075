#pragma once
// What a run may do in checkpoint.dir. Every checkpoint records its run's lineage (@lineage,
// io/checkpoint_file.h): an id made when a run starts afresh and carried by every run that
// resumes from one of its checkpoints. A run writes, overwrites and prunes only checkpoints of
// its own lineage, and refuses to start where another lineage's checkpoints are (they would be
// overwritten, or outlive the new run's and be resumed by the next "auto"). Also the start-up
// check that every rank can write there. Private to src/checkpoint (the Checkpointer's).

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/config/config.h"

namespace meshtrain {

// A complete checkpoint found in a directory, with the lineage it records.
struct StoredCheckpoint {
  int64_t step = 0;
  std::string path;
  std::string lineage;  // "" when unknown: see problem
  std::string problem;  // why the lineage is unknown (unreadable, written before lineages)
};

// 32 hex digits from the OS's random source. Not collective: world rank 0 makes it and
// broadcasts it.
std::string new_lineage_id();

// The lineage `path` records. Opens the file on this rank alone (MPI_COMM_SELF).
StoredCheckpoint read_lineage(int64_t step, const std::string& path);

// The complete checkpoints (step_<digits>.h5) of `dir`, oldest first, with their lineages;
// none if `dir` does not exist. This rank alone.
std::vector<StoredCheckpoint> scan_checkpoints(const std::string& dir);

// Throws unless every checkpoint in `stored` is of `lineage`: the message names the directory
// (checkpoint.dir), the other lineages and their files, what this run does (`this_run`, e.g.
// "starts afresh (checkpoint.resume = \"none\")") and `hint`, what to do instead.
void refuse_other_lineages(const Config& config, const std::vector<StoredCheckpoint>& stored,
                           const std::string& lineage, const std::string& this_run,
                           const std::string& hint);

// Throws, naming the path and what it is, where something other than a file or a link is at
// `path` (a directory named step_00000006.h5): a save there would fail only at its rename; or
// a link at a .tmp's name, which the save would write through.
// `context` starts the message.
void refuse_occupied_name(const std::string& path, const std::string& context = "");
// refuse_occupied_name for every entry of checkpoint.dir named like a checkpoint or its .tmp
// (step_<digits>.h5[.tmp]): at start-up, before the first step, not at that step's save.
void refuse_occupied_names(const Config& config);

// Collective: world rank 0 creates checkpoint.dir, then every rank creates and deletes a file
// in it. Throws AgreedError naming checkpoint.dir, the path and the reason, so that a run learns
// at start-up, not at its first checkpoint, that it could not keep one.
void check_directory_writable(const Config& config, Communicator& world);

}  // namespace meshtrain
