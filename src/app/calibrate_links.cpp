// Timing collectives for calibrate (app/calibrate.h). Every rank of `comm` runs the same number
// of operations (the count is agreed before each sample), so no rank waits on a call another
// never makes. Inputs are small integers in fp32, so every result is exact and checked exactly.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "meshtrain/app/calibrate.h"

namespace meshtrain {

namespace {

constexpr double kSampleSeconds = 2e-3;  // long enough for the clock, short enough for 7 sizes
constexpr int kMaxOperationsPerSample = 1000;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One collective at one size, with its buffers; run() is one operation (p2p: one round trip).
class LinkOperation {
 public:
  LinkOperation(MPI_Comm comm, CollectiveKind kind, double bytes) : comm_(comm), kind_(kind) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &ranks_);
    const int64_t elements = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4));
    // Block-wise kinds move one block per peer: the measured size is the whole buffer.
    const bool gathered = kind == CollectiveKind::AllGather || kind == CollectiveKind::ReduceScatter ||
                          kind == CollectiveKind::AllToAll;
    block_ = static_cast<int>(gathered ? std::max<int64_t>(1, elements / ranks_) : elements);
    const size_t whole = static_cast<size_t>(gathered ? int64_t{block_} * ranks_ : block_);
    const size_t send = kind == CollectiveKind::AllGather ? static_cast<size_t>(block_) : whole;
    const size_t receive = kind == CollectiveKind::ReduceScatter ? static_cast<size_t>(block_) : whole;
    send_.assign(send, static_cast<float>(rank_ + 1));
    receive_.assign(receive, 0.0f);
    bytes_ = static_cast<double>(whole) * 4;
    partner_ = rank_ ^ 1;
  }

  double bytes() const { return bytes_; }

  void run() {
    switch (kind_) {
      case CollectiveKind::AllReduce:
        MPI_Allreduce(send_.data(), receive_.data(), block_, MPI_FLOAT, MPI_SUM, comm_);
        break;
      case CollectiveKind::AllGather:
        MPI_Allgather(send_.data(), block_, MPI_FLOAT, receive_.data(), block_, MPI_FLOAT, comm_);
        break;
      case CollectiveKind::ReduceScatter:
        MPI_Reduce_scatter_block(send_.data(), receive_.data(), block_, MPI_FLOAT, MPI_SUM, comm_);
        break;
      case CollectiveKind::AllToAll:  // equal blocks: expert parallelism's balanced exchange
        MPI_Alltoall(send_.data(), block_, MPI_FLOAT, receive_.data(), block_, MPI_FLOAT, comm_);
        break;
      case CollectiveKind::PointToPoint:
        if (partner_ >= ranks_) break;  // the odd rank out of an odd group idles
        if (rank_ % 2 == 0) {
          MPI_Send(send_.data(), block_, MPI_FLOAT, partner_, 0, comm_);
          MPI_Recv(receive_.data(), block_, MPI_FLOAT, partner_, 0, comm_, MPI_STATUS_IGNORE);
        } else {
          MPI_Recv(receive_.data(), block_, MPI_FLOAT, partner_, 0, comm_, MPI_STATUS_IGNORE);
          MPI_Send(send_.data(), block_, MPI_FLOAT, partner_, 0, comm_);
        }
        break;
    }
  }

  // Wrong elements of the last result, probed at a few places.
  int wrong() const {
    const float sum = static_cast<float>(ranks_) * (ranks_ + 1) / 2;
    int bad = 0;
    for (size_t probe = 0; probe < 8; ++probe) {
      const size_t i = probe * (receive_.size() - 1) / 7;
      float expected = sum;
      // Every rank sends its rank + 1 to all: block j of the result comes from rank j.
      if (kind_ == CollectiveKind::AllGather || kind_ == CollectiveKind::AllToAll) expected = static_cast<float>(i / block_ + 1);
      if (kind_ == CollectiveKind::PointToPoint)
        expected = partner_ < ranks_ ? static_cast<float>(partner_ + 1) : 0.0f;
      if (receive_[i] != expected) ++bad;
    }
    return bad > 0 ? 1 : 0;
  }

 private:
  MPI_Comm comm_;
  CollectiveKind kind_;
  int rank_ = 0, ranks_ = 1, partner_ = 0, block_ = 1;
  double bytes_ = 0;
  std::vector<float> send_, receive_;
};

// Seconds per operation of `count` back-to-back operations, as the slowest rank saw them.
double timed(MPI_Comm comm, LinkOperation& op, int count) {
  MPI_Barrier(comm);
  const double t0 = now();
  for (int i = 0; i < count; ++i) op.run();
  double seconds = (now() - t0) / count;
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
  return seconds;
}

}  // namespace

std::vector<LinkSample> measure_link(MPI_Comm comm, CollectiveKind kind,
                                     const std::vector<double>& bytes, int repeats, int& wrong) {
  std::vector<LinkSample> out;
  for (const double size : bytes) {
    LinkOperation op(comm, kind, size);
    const double first = timed(comm, op, 1);  // also warms the buffers and MPI's paths
    const int count = static_cast<int>(
        std::clamp(std::ceil(kSampleSeconds / std::max(first, 1e-9)), 1.0, double{kMaxOperationsPerSample}));
    std::vector<double> samples;
    for (int r = 0; r < repeats; ++r) samples.push_back(timed(comm, op, count));
    wrong += op.wrong();
    double seconds = median(samples);
    if (kind == CollectiveKind::PointToPoint) seconds /= 2;  // one way of the round trip
    out.push_back({op.bytes(), seconds});
  }
  return out;
}

}  // namespace meshtrain
