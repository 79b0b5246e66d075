#include "meshtrain/parallel/server_channel.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "meshtrain/comm/job_abort.h"

namespace meshtrain {

ServerLayout::ServerLayout(std::vector<int64_t> position_sizes, int servers) : servers_(servers) {
  if (servers < 1) throw std::invalid_argument("ServerLayout: no servers");
  offsets_.push_back(0);
  for (int64_t n : position_sizes) offsets_.push_back(offsets_.back() + n);
}

std::vector<ServerPiece> ServerLayout::pieces_of_position(int q) const {
  std::vector<ServerPiece> out;
  const int64_t lo = offsets_[static_cast<size_t>(q)], hi = offsets_[static_cast<size_t>(q) + 1];
  for (int k = 0; k < servers_; ++k) {
    const int64_t a = std::max(lo, server_begin(k)), b = std::min(hi, server_begin(k + 1));
    if (a >= b) continue;
    out.push_back({k, q, a - lo, a - server_begin(k), b - a});
  }
  return out;
}

std::vector<ServerPiece> ServerLayout::pieces_on_server(int k) const {
  std::vector<ServerPiece> out;
  for (size_t q = 0; q + 1 < offsets_.size(); ++q)
    for (const ServerPiece& p : pieces_of_position(static_cast<int>(q)))
      if (p.server == k) out.push_back(p);
  return out;
}

namespace {
// Short sleeps while nothing has arrived: a spinning rank would take a core from the ranks
// computing beside it (servers and waiting workers often share nodes with busy ones).
class Backoff {
 public:
  explicit Backoff(double timeout) : deadline_(clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout))) {}
  // false once the deadline has passed
  bool pause() {
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    sleep_us_ = std::min(sleep_us_ * 2, 200);
    return clock::now() < deadline_;
  }

 private:
  using clock = std::chrono::steady_clock;
  clock::time_point deadline_;
  int sleep_us_ = 5;
};

std::string timed_out(const std::string& what, double timeout) {
  return what + ": no answer within run.comm_timeout = " + std::to_string(static_cast<int>(timeout)) +
         " s (the rank is stalled or dead; raise run.comm_timeout if it is only slow)";
}
}  // namespace

void wait_request(MPI_Request& request, double timeout, const std::string& what) {
  Backoff backoff(timeout);
  for (;;) {
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (!backoff.pause()) communication_failed(timed_out(what, timeout));
  }
}

void send_message(MPI_Comm channel, int dest, int tag, const void* data, size_t bytes,
                  double timeout, const std::string& what) {
  MPI_Request r;
  MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, dest, tag, channel, &r);
  wait_request(r, timeout, what);
}

std::vector<char> receive_message(MPI_Comm channel, int source, int tag, double timeout,
                                  const std::string& what, int* from) {
  Backoff backoff(timeout);
  MPI_Status status;
  for (;;) {
    int flag = 0;
    MPI_Iprobe(source, tag, channel, &flag, &status);
    if (flag) break;
    if (!backoff.pause()) communication_failed(timed_out(what, timeout));
  }
  int bytes = 0;
  MPI_Get_count(&status, MPI_BYTE, &bytes);
  std::vector<char> out(static_cast<size_t>(bytes));
  MPI_Recv(out.data(), bytes, MPI_BYTE, status.MPI_SOURCE, tag, channel, MPI_STATUS_IGNORE);
  if (from) *from = status.MPI_SOURCE;
  return out;
}

}  // namespace meshtrain
