#pragma once
// Checkpoints of a training run: where they go, how one is written without ever losing the
// previous good one (DESIGN invariant 3), which one a run resumes from, and how a model state —
// on any layout — maps onto the layout-free file of io/checkpoint_file.h. The checkpointer sees
// the model state and the step (the data position follows from the step), not the Trainer,
// which owns the cadence. Files: checkpoint_policy.cpp (names, resume, pruning),
// save_protocol.h (the phases below), checkpoint_load.cpp, checkpoint_directory.h (lineage).
//
// Writing step s (collective over the world):
//   1. <checkpoint.dir>/step_<s, 8 digits>.h5.tmp is created collectively; each rank writes
//      the elements it owns (OwnedPiece::primary: replicas once) of /model/<name> and both
//      AdamW moments, as hyperslabs of the global datasets; ranks holding none of a dataset
//      join its collective write with an empty selection. The stage's buffers (state beside
//      the parameters, whole on every rank: PipelineStage::buffers, e.g. a router's expert
//      bias) are written by world rank 0 as /buffers/<name>, fp64, by name alone. Then the per-dataset checksums
//      (sums of the ranks' parts, hashed by a worker thread while MPI-IO writes) become
//      attributes, and the file is closed.
//   2. Verify, while every rank fsyncs the file in the background: the file is reopened and
//      every rank recomputes the checksums of its elements from the data as stored (hashed in
//      place through a read-only mapping); any difference refuses the checkpoint.
//   3. Rank 0 renames .tmp -> .h5 and fsyncs the directory: the checkpoint is complete.
//   4. Prune: keep the newest checkpoint.keep complete checkpoints of this run's lineage (never
//      the one just written), oldest deleted first, and stale .tmp files of other steps.
//
// Asynchronous saves (checkpoint.async): start_save sizes host buffers for every rank's elements
// (the snapshot, counted as MemoryCategory::CheckpointSnapshot from the first background save
// on: its buffers are kept for the next, whose copy then faults no page in) and returns; a
// thread of its own copies the elements there and runs steps 1-4 on a duplicate of the world
// communicator while training goes on. Training reads the state until its next update, which
// waits for the copy (ModelState::set_update_fence); where the state is on a device (a GPU)
// the device's copy engine copies it into pinned host memory beside the next step, whose
// update the device holds back until the copy is done (Backend::snapshot_to_host). The
// trainer calls poll() after every step, which collects a finished save on every rank at the
// same step (an agreed verdict, so a failure is thrown everywhere alike); the next save, load,
// resume and the destructor wait for it first. A kill at any moment leaves what a synchronous
// save would: the .tmp is incomplete or unrenamed, the previous checkpoint intact.
//
// Lineage (checkpoint/checkpoint_directory.h): every checkpoint records the id of its run, made when
// a run starts afresh and carried across resumes. A run never overwrites or prunes a checkpoint
// of another lineage, and begin_run() refuses to start where one is in its way.
// A failure on any rank at any step (disk full, permission denied) is agreed (agree()), so all
// ranks throw the same error naming the file; a rank killed mid-way leaves only a .tmp, which
// resuming ignores.
//
// Loading (any layout, ZeRO stage, tp, pp): first the file's structure is checked — format
// version, the model's settings (@model: heads, tied embeddings, ... the deck's and this build's;
// checkpoint/model_signature.h), every dataset of the deck's model present with its global shape and a
// checksum, no other — and a refusal there leaves the trainer as it was. Then each rank reads every piece it
// holds (replicas and the last stage's tied embedding included) straight from the global
// datasets (collectively where the ranks' pieces take turns along the file in short stretches,
// checkpoint_transfer.h), into the model's memory where it can (else staged:
// another precision is converted, device memory copied, after the check); checksums are
// recomputed over the primary pieces of THIS layout (each element once) by a worker while the
// next dataset is read. A mismatch refuses the checkpoint naming the dataset; the trainer's
// state is then undefined and the run must stop (every command does).
//
// Test hook: MESHTRAIN_FAULT=checkpoint_kill:<phase>[@<step>] (parsed by config/fault_injection.h,
// alone or in a list with other faults) makes world rank 0 raise SIGKILL
// while writing (the checkpoint of <step>, or any): phase "data" after half of the datasets
// are written (the .tmp is incomplete), "rename" after the verified .tmp is closed but before
// the rename, "prune" after the first old checkpoint is deleted. tests/checkpoint/ uses it to
// show that the previous checkpoint survives each.

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/parallel/model_state.h"
#include "meshtrain/parallel/process_grid.h"

namespace meshtrain {

struct CheckpointStats {
  std::string path;
  int64_t step = 0;
  int64_t bytes = 0;   // the file's size
  double seconds = 0;  // wall time of the whole save (write, verify, rename, prune) or load
  // Where the time went (each the slowest rank's): save: writing and hashing the data, then
  // flushing it to the device while reading it back to verify; load: reading and hashing.
  double data_seconds = 0;
  double verify_seconds = 0;  // save only
  // What training waited for (the slowest rank): a synchronous save's whole time; an
  // asynchronous one's planning (and waiting for the previous save, if any) and the snapshot:
  // start_save's stats count what it waited for, the collected stats add the wait of the
  // update that the snapshot's copy held back (where the state is in host memory the copy
  // runs beside the next step's forward and backward).
  double stall_seconds = 0;
  bool asynchronous = false;
  bool independent = false;  // transfers were independent (checkpoint.io), else collective
  // load only: the rotary settings the resume changed (context extension), the checkpoint's value
  // and the deck's, as "model.seq_len 64 -> 256, model.rope_scaling \"none\" -> \"yarn\""; empty:
  // none.
  std::string context_extension;
  // load: the checkpoint's blend position (CheckpointInfo::data_blend), "" if none.
  std::string data_blend;
};

class BackgroundWorker;
struct HostElements;
class KillHook;
class MpiCommunicator;
struct SaveJob;

class Checkpointer {
 public:
  // Reads the MESHTRAIN_FAULT test hook; throws DeckError if it is malformed. Collective (with
  // checkpoint.async it duplicates the world communicator for the background writes).
  Checkpointer(const Config& config, ProcessGrid& grid);
  // Waits for a save still in the background and for old checkpoints still being deleted; a
  // failure there is only warned about now.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective: the checkpoint checkpoint.resume names — "auto": the newest complete
  // step_*.h5 in checkpoint.dir (none: ""), "none": "", else the path, which must exist.
  std::string resume_path();
  // Collective, once before a training run: checks that every rank can write checkpoint.dir,
  // settles the run's lineage (a new one when it starts afresh, else the resumed checkpoint's)
  // and refuses (AgreedError) if checkpoint.dir holds checkpoints of another lineage, naming
  // them and what to do. Returns resume_path().
  std::string begin_run();
  // The run's lineage: set by begin_run() or load(), else made by the first save().
  const std::string& lineage() const { return lineage_; }
  // Collective: writes `state` as step_<step>.h5. Returns once it is complete and durable; the
  // checkpoints that checkpoint.keep drops are deleted in the background after that (see
  // finish_pruning). Waits for an asynchronous save still running first.
  // `data_blend`: the blend position to record (train/data_feed.h), "" for one source.
  CheckpointStats save(ModelState& state, int64_t step, const std::string& data_blend = "");
  // Collective: takes a snapshot of `state` and writes it as step_<step>.h5 in the background
  // (see above); returns what training waited for. Throws AgreedOutOfMemory when a rank has no
  // host memory for the snapshot (the save is then not started).
  // `memory` is where the snapshot is counted (the tracker the memory report reads).
  CheckpointStats start_save(ModelState& state, int64_t step, MemoryTracker& memory,
                             const std::string& data_blend = "");
  // Collective: the stats of the background save if it has finished on every rank (it is then
  // collected: its snapshot freed), else nothing. Throws AgreedError if it failed.
  std::optional<CheckpointStats> poll();
  // Collective: waits for the background save, if any, and collects it as poll() does.
  std::optional<CheckpointStats> wait_for_save();
  bool save_in_progress() const { return pending_ != nullptr; }
  // Collective: waits until the deletions of earlier saves are done; throws AgreedError if one
  // failed. save, load and resume_path do this first themselves.
  void finish_pruning();
  // Collective: loads `path` into `state` (parameters, moments, optimizer steps, and its
  // stage's buffers; the stats' step is the checkpoint's), and continues its lineage. Throws AgreedError naming the file and
  // the dataset or the model setting (key, the file's value, the deck's) if it is refused.
  CheckpointStats load(ModelState& state, const std::string& path);

  // "step_00000042.h5"
  static std::string file_name(int64_t step);
  // The complete checkpoints (step_<digits>.h5) in `dir`, oldest step first; none if `dir`
  // does not exist. Not collective.
  static std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& dir);
  // Host bytes of one rank's snapshot of `state` (checkpoint.async): the planner's figure.
  static size_t snapshot_bytes(ModelState& state);

 private:
  struct Pending;
  // World rank 0: the path checkpoint.resume names (throws if it names no file).
  std::string choose_resume() const;
  // The lineage saves record, made (collectively) if none is set yet.
  void settle_lineage();
  // Collects the finished background save: joins its thread, frees the snapshot, and rethrows
  // its error. Every rank calls it at the same point.
  CheckpointStats collect();
  // Counts `bytes` of snapshot buffers in `memory` (moving the count there, or resizing it).
  void count_snapshot(MemoryTracker& memory, size_t bytes);
  CheckpointStats summarize(const SaveJob& job, double seconds, double data, double verify, Communicator& comm) const;

  const Config& cfg_;
  ProcessGrid& grid_;
  MPI_Comm comm_;
  std::unique_ptr<KillHook> kill_;
  std::string lineage_;
  std::unique_ptr<BackgroundWorker> pruner_;  // world rank 0 deletes old checkpoints here
  std::unique_ptr<MpiCommunicator> writer_comm_;  // the background saves' (checkpoint.async)
  std::unique_ptr<Pending> pending_;              // the save running in the background
  // The last snapshot's buffers, reused by the next; counted in *snapshot_memory_ until the
  // Checkpointer goes.
  std::vector<HostElements> snapshot_buffers_;
  MemoryTracker* snapshot_memory_ = nullptr;
  size_t snapshot_bytes_ = 0;
};

// "dp=2 tp=2 pp=2 zero=1 schedule=1f1b virtual_stages=1 micro_batch=2": the @layout attribute.
std::string describe_layout(const Config& config);

}  // namespace meshtrain
