#pragma once
// What workers and parameter servers say to each other (asynchronous data parallelism,
// parallel/parameter_server.h): the messages, and how the state is cut among the servers.
//
// Every rank of a replica holds its part of the model as one flat range (ModelState's flat
// view); the ranks of all replicas at the same tensor and pipeline coordinates ("position" q)
// hold the same layout. The servers' space is the positions' ranges one after another; server k
// holds elements [k E / S, (k + 1) E / S) of it. A worker exchanges with each server the piece
// of its range that server holds.
//
// Messages travel point to point over a duplicate of the world (servers are the job's last
// ranks), non-blocking on the workers so that they overlap with compute; every wait has the run's
// communication timeout, past which the job is aborted naming the rank that did not answer.

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/parallel/share_scheduler.h"

namespace meshtrain {

enum ServerTag : int {
  kTagAsk = 7101,         // replica leader -> server 0: report + request for work
  kTagAssign = 7102,      // server 0 -> leader: Assignment (+ logged steps for replica 0)
  kTagGradient = 7103,    // worker -> server: GradientHeader + gradient piece
  kTagPull = 7104,        // worker -> server: PullRequest
  kTagValues = 7105,      // server -> worker: PullReply + values
  kTagState = 7106,       // server -> worker: PullReply + values, exp_avg, exp_avg_sq
  kTagUpload = 7107,      // worker -> server: UploadHeader + segments + values + moments
  kTagShutdown = 7108,    // worker 0 -> server: the run is over (int32 exit status)
  kTagLayout = 7109,      // worker 0 -> server: int64 flat size of every position
};

struct AskMessage {
  int32_t replica = 0;
  int32_t stop = 0;  // a stop was requested on the leader
  ShareReport report;
};

// One step as the servers saw it, sent to replica 0's leader for the log and metrics.jsonl.
struct LoggedStep {
  int64_t step = 0;  // 0-based
  double loss_sum = 0, lr = 0, grad_norm = 0;
  double seconds = 0;  // since the previous version
  double staleness_mean = 0;
  int32_t staleness_max = 0, shares = 0;
};

struct AssignMessage {
  Assignment assignment;
  int32_t diverged = 0;  // the servers met a non-finite gradient norm at step `diverged_step`
  int32_t logged = 0;    // LoggedStep records that follow
  int64_t diverged_step = 0;
};

struct GradientHeader {
  int64_t step = 0, version = 0;
  int32_t share = 0, pad = 0;
};

struct PullRequest {
  int64_t min_version = 0;
  int32_t with_moments = 0, pad = 0;
};

struct PullReply {
  int64_t version = 0;
  int32_t diverged = 0, pad = 0;
};

struct UploadHeader {
  int64_t version = 0;
  int64_t segments = 0, norm_segments = 0;  // OptimizerSegment records that follow
};

// The servers' division of the replicas' state.
struct ServerPiece {
  int server = 0;
  int position = 0;
  int64_t local_begin = 0;   // in the position's flat range
  int64_t server_begin = 0;  // in the server's range
  int64_t count = 0;
};

class ServerLayout {
 public:
  // position_sizes[q]: the flat size of position q = tp + TP * pp.
  ServerLayout(std::vector<int64_t> position_sizes, int servers);
  int64_t total() const { return offsets_.back(); }
  int servers() const { return servers_; }
  int64_t server_begin(int k) const { return total() * k / servers_; }
  int64_t server_size(int k) const { return server_begin(k + 1) - server_begin(k); }
  std::vector<ServerPiece> pieces_of_position(int q) const;
  std::vector<ServerPiece> pieces_on_server(int k) const;

 private:
  std::vector<int64_t> offsets_;
  int servers_;
};

// Blocking helpers with the run's timeout: a wait past it ends the job (comm/job_abort.h)
// naming `what` and the peer's world rank.
void send_message(MPI_Comm channel, int dest, int tag, const void* data, size_t bytes,
                  double timeout, const std::string& what);
// Waits for a message from `source` (or MPI_ANY_SOURCE) with `tag`; returns its bytes.
std::vector<char> receive_message(MPI_Comm channel, int source, int tag, double timeout,
                                  const std::string& what, int* from = nullptr);
// Waits for a request, sleeping briefly between tests so that waiting ranks leave the cores to
// the computing ones.
void wait_request(MPI_Request& request, double timeout, const std::string& what);

// Byte packing of POD records.
template <class T>
void append_bytes(std::vector<char>& out, const T* data, size_t count) {
  const char* p = reinterpret_cast<const char*>(data);
  out.insert(out.end(), p, p + count * sizeof(T));
}

}  // namespace meshtrain
