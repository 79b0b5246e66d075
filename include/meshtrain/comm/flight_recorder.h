#pragma once
// The flight recorder: each rank keeps its last N communication operations (kind, group, peer,
// bytes, sequence number, start and end time, state) in a file of the run directory mapped into
// memory, written as each operation starts and as it ends. A rank that is killed, aborts or hangs
// leaves its record on disk up to its last operation, with nothing to do at the moment of the
// failure (a killed rank could not); `meshtrain diagnose RUNDIR` merges every rank's record
// (flight_report.h) and names the operation where the ranks of a group parted ways.
//
// A thread of the recorder also stamps the header every kAliveSeconds while the process lives, and
// the recorder's destructor marks the record closed: a record neither closed nor stamped for a
// while belongs to a process that died (killed, crashed, its node lost), even one that died
// inside an operation, where its last entry looks like any waiting rank's.
//
// Sequence numbers make records comparable across ranks: the k-th collective a rank enters on a
// group is the k-th collective every member enters (collectives are issued in the same order on
// all members), and the k-th message from rank a to rank b of a group is the k-th b receives from
// a. Per-group counters in the header survive the ring's wrap-around.
//
// This file is the format (fixed-size, native byte order: written and read on the same kind of
// machine), the writer, and the reader. Not thread-safe: one thread issues a rank's
// communication.

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "meshtrain/comm/job_abort.h"

namespace meshtrain {

enum class FlightOp : uint8_t {
  AllReduce, ReduceScatter, AllGather, Broadcast, Send, Recv, Barrier, ScalarAllReduce,
  BytesBroadcast, BytesAllGather,
  BlockingCall,  // a collective call outside the communicator: HDF5 over its MPI communicator
  // Appended after the record's first version: earlier records keep their meaning.
  AllToAll, AllToAllCounts,
};
std::string_view flight_op_name(FlightOp op);  // "all_reduce", "send", ...
bool is_point_to_point(FlightOp op);            // Send or Recv

enum class FlightState : uint8_t { Empty, Entered, Completed };

struct FlightEntry {
  uint64_t serial = 0;  // this rank's operation count, 1-based: identifies the slot's occupant
  uint64_t seq = 0;     // collectives: count on the group; point-to-point: count on (peer, kind)
  double start = 0;     // wall clock, seconds since the epoch
  double end = 0;       // 0 while pending
  uint64_t bytes = 0;
  int32_t group = 0;    // index into FlightHeader::groups
  int32_t peer = -1;    // point-to-point: the peer's rank in the group; broadcast: the root
  FlightOp op = FlightOp::AllReduce;
  FlightState state = FlightState::Empty;
  uint8_t reserved[14] = {};
};
static_assert(sizeof(FlightEntry) == 64);

struct FlightGroup {
  char name[24] = {};   // "dp", "tp", "pp", "world", "embedding"
  int32_t id = 0;       // world rank of the group's rank 0: one instance of an axis's groups
  int32_t size = 0;
  int32_t rank = 0;     // this rank's rank in the group
  int32_t reserved = 0;
  uint64_t collectives_entered = 0;
  uint64_t collectives_completed = 0;
  uint64_t reserved2 = 0;
};
static_assert(sizeof(FlightGroup) == 64);

struct FlightHeader {
  static constexpr int kMaxGroups = 16;
  char magic[8] = {'M', 'T', 'F', 'L', 'I', 'G', 'H', 'T'};
  uint32_t version = 1;
  int32_t world_rank = 0;
  int32_t world_size = 0;
  int32_t pid = 0;
  double opened = 0;     // wall clock when the record was created
  uint64_t capacity = 0; // entries in the ring
  uint64_t serial = 0;   // operations recorded so far (the ring holds the last `capacity`)
  int32_t group_count = 0;
  int32_t reserved = 0;
  char node[64] = {};     // comm/node.h: the Slurm node name, else the hostname
  double alive = 0;       // wall clock of the last stamp of the process's liveness (0: none)
  double closed = 0;      // wall clock when the recorder was destroyed (0: not cleanly)
  // Wall clock and number of the first termination signal the process received (0: none):
  // the launcher's SIGTERM to the ranks still alive when it ends a job because one died; and
  // of the process ending the job itself (MPI_Abort, after a timeout or an error of its own).
  // A rank with neither, whose record stopped before the first of the others', is the one that
  // died.
  double signalled = 0;
  double aborted = 0;
  int32_t signal = 0;
  int32_t reserved3 = 0;
  uint8_t reserved2[96] = {};
  FlightGroup groups[kMaxGroups];
};
static_assert(sizeof(FlightHeader) == 256 + FlightHeader::kMaxGroups * sizeof(FlightGroup));

// One rank's record as read back.
struct FlightRecord {
  std::string path;
  FlightHeader header;
  std::vector<FlightEntry> entries;  // the ring's occupied slots, oldest first
};

// Reads a record written by FlightRecorder; throws std::runtime_error naming the path and what
// is wrong (missing, short, not a flight record, another version).
FlightRecord read_flight_record(const std::string& path);
// The suffix of a record not yet published (FlightRecorder::publish).
inline constexpr const char* kPendingSuffix = ".new";

// The record files of a run directory (RUNDIR/flight/rank_*.rec), sorted; a rank's pending
// record (rank_*.rec.new, of a start that never finished) in place of its published one.
std::vector<std::string> flight_record_paths(const std::string& run_dir);
std::string flight_record_path(const std::string& run_dir, int world_rank);

// Notes `sig` in the header of this process's recorder, if there is one and no signal was noted
// yet (FlightHeader::signalled). Async-signal-safe: for a signal handler (train/stop_request).
void note_signal_in_flight_record(int sig);
// Notes in the same header that this process is ending the job itself (comm/mpi_runtime.h's
// abort_job), once.
void note_abort_in_flight_record();

class FlightRecorder {
 public:
  static constexpr double kAliveSeconds = 0.25;  // period of the liveness stamp
  // Creates `path` + kPendingSuffix (truncating an older one) sized for `capacity` entries and
  // maps it; throws std::runtime_error naming the path on failure. The record replaces `path`
  // only once published: a start refused before then (a bad deck, another run's checkpoints)
  // removes its pending record and leaves the one of the run that last used the directory.
  FlightRecorder(const std::string& path, int world_rank, int world_size, size_t capacity);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Registers a group of which this rank is `rank` of `size`; returns its index. Beyond
  // kMaxGroups, operations of further groups go unrecorded (index -1).
  int add_group(const std::string& name, int id, int size, int rank);

  struct Ticket {
    uint64_t serial = 0;
    int group = -1;
    bool collective = false;
  };
  Ticket begin(int group, FlightOp op, int peer, uint64_t bytes);
  void end(const Ticket& t);
  // Renames the pending record to `path` (once start-up is accepted); throws on failure.
  void publish();
  // Forces the mapping to disk (before an abort: the page cache would keep it anyway unless
  // the node itself goes down).
  void flush();

 private:
  FlightEntry& slot(uint64_t serial) { return entries_[(serial - 1) % header_->capacity]; }

  std::string path_, pending_path_;
  bool published_ = false;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  FlightHeader* header_ = nullptr;
  FlightEntry* entries_ = nullptr;
  // Point-to-point counts per (group, peer, send or receive), for the entries' seq.
  std::vector<std::vector<uint64_t>> sends_, recvs_;
  ScopedAbortHook flush_at_abort_;  // the record reaches the disk before the job ends
  // Stamps header_->alive every kAliveSeconds until the destructor stops it.
  std::mutex alive_mutex_;
  std::condition_variable alive_wake_;
  bool stopping_ = false;
  std::thread alive_thread_;
};

}  // namespace meshtrain
