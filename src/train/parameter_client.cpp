#include "meshtrain/train/parameter_client.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>

#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/train/divergence.h"
#include "meshtrain/train/lr_schedule.h"
#include "meshtrain/train/stop_request.h"

namespace meshtrain {

std::vector<int64_t> async_fences(const Config& c, int64_t first_step) {
  std::set<int64_t> out;
  const int64_t last = c.train.steps;
  auto every = [&](int64_t n) {
    if (n <= 0) return;
    for (int64_t f = (first_step / n + 1) * n; f <= last; f += n) out.insert(f);
  };
  if (c.data.has_val()) every(c.train.eval_every);
  every(c.checkpoint.every);
  every(c.train.sample_every);
  out.insert(last);
  return {out.begin(), out.end()};
}

ServerOptions server_options(const Config& c, int server) {
  ServerOptions o;
  o.server = server;
  o.grid = c.grid_shape();
  o.dtype = c.train.precision == DType::F64 ? DType::F64 : DType::F32;  // the optimizer's
  o.staleness = c.parallel.staleness;
  o.last_step = c.train.steps;
  // From step 0: the scheduler drops those at or behind a resumed version.
  o.fences = async_fences(c, 0);
  o.adamw = {c.train.beta1, c.train.beta2, c.train.eps, c.train.weight_decay};
  o.grad_clip = c.train.grad_clip;
  o.learning_rate = [t = c.train](int64_t step) { return learning_rate(t, static_cast<int>(step)); };
  o.timeout = c.run.comm_timeout;
  return o;
}

// A pull in flight: one reply per server piece.
struct ParameterClient::Pull {
  std::vector<MPI_Request> requests;
  std::vector<std::vector<char>> replies;
  std::vector<PullRequest> asks;
  bool active = false;
};

namespace {
PullReply reply_header(const std::vector<char>& bytes) {
  PullReply r;
  std::memcpy(&r, bytes.data(), sizeof r);
  return r;
}
}  // namespace

ParameterClient::ParameterClient(const Config& config, ProcessGrid& grid, ModelState& state, MPI_Comm channel)
    : cfg_(config),
      grid_(grid),
      state_(state),
      channel_(channel),
      pull_(std::make_unique<Pull>()),
      timeout_(config.run.comm_timeout) {
  const std::chrono::duration<double> timeout(timeout_);
  MPI_Comm replica;
  MPI_Comm_split(grid.mpi_world(), grid.rank(Axis::Data), grid.world_rank(), &replica);
  replica_ = std::make_unique<MpiCommunicator>(replica, "replica", timeout);
  // Every position's flat size, from replica 0.
  const int64_t mine = state.flat_size();
  const std::vector<std::string> all = grid.world().all_gather_bytes(
      std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
  const GridShape& g = grid.shape();
  std::vector<int64_t> sizes(static_cast<size_t>(g.tp * g.pp));
  for (int pp = 0; pp < g.pp; ++pp)
    for (int tp = 0; tp < g.tp; ++tp) {
      GridCoords c{};
      c[axis_index(Axis::Tensor)] = tp;
      c[axis_index(Axis::Pipeline)] = pp;
      std::memcpy(&sizes[static_cast<size_t>(tp + g.tp * pp)], all[static_cast<size_t>(g.world_rank(c))].data(),
                  sizeof(int64_t));
    }
  layout_ = std::make_unique<ServerLayout>(sizes, config.parallel.servers);
  pieces_ = layout_->pieces_of_position(grid.rank(Axis::Tensor) + g.tp * grid.rank(Axis::Pipeline));
  first_server_ = grid.world_size();
  elem_ = static_cast<int64_t>(dtype_size(state.state_dtype()));
  flat_.resize(static_cast<size_t>(mine * elem_));
  sends_.resize(pieces_.size());
  send_requests_.assign(pieces_.size(), MPI_REQUEST_NULL);
  pull_->requests.assign(pieces_.size(), MPI_REQUEST_NULL);
  pull_->replies.resize(pieces_.size());
  pull_->asks.resize(pieces_.size());
  if (grid.world_rank() == 0)  // the layout goes first: the servers size their ranges by it
    for (int k = 0; k < config.parallel.servers; ++k)
      send_message(channel_, first_server_ + k, kTagLayout, sizes.data(), sizes.size() * sizeof(int64_t),
                   timeout_, "sending the layout to " + server_name(k));
}

ParameterClient::~ParameterClient() {
  // Requests still posted when the run ends (a pull for a version that never came, on an
  // error path) are cancelled so that MPI can finish.
  for (MPI_Request& r : pull_->requests)
    if (r != MPI_REQUEST_NULL) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
  for (MPI_Request& r : send_requests_)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
}

double ParameterClient::replica_sum(double value) { return replica_->all_reduce_scalar(value, ReduceOp::Sum); }

void ParameterClient::upload(int64_t version) {
  if (grid_.rank(Axis::Data) == 0) {
    const std::vector<OptimizerSegment> segments = state_.flat_segments(), norms = state_.flat_norm_segments();
    std::vector<std::vector<char>> fields(3, std::vector<char>(flat_.size()));
    state_.read_flat(FlatField::Values, fields[0].data());
    state_.read_flat(FlatField::ExpAvg, fields[1].data());
    state_.read_flat(FlatField::ExpAvgSq, fields[2].data());
    for (const ServerPiece& p : pieces_) {
      UploadHeader h;
      h.version = version;
      h.segments = static_cast<int64_t>(segments.size());
      h.norm_segments = static_cast<int64_t>(norms.size());
      std::vector<char> bytes;
      append_bytes(bytes, &h, 1);
      append_bytes(bytes, segments.data(), segments.size());
      append_bytes(bytes, norms.data(), norms.size());
      for (const std::vector<char>& f : fields)
        bytes.insert(bytes.end(), f.begin() + p.local_begin * elem_, f.begin() + (p.local_begin + p.count) * elem_);
      send_message(channel_, first_server_ + p.server, kTagUpload, bytes.data(), bytes.size(), timeout_,
                   "uploading the state to " + server_name(p.server));
    }
  }
  // Every replica starts from replica 0's state (the same already, from the same seed or
  // checkpoint): pulled, so that no replica assumes it.
  installed_ = -1;
  ensure_version(version);
}

std::string ParameterClient::server_name(int k) const {
  return "parameter server " + std::to_string(k) + " (rank " + std::to_string(first_server_ + k) + ")";
}

void ParameterClient::post_pull(size_t i, int64_t min_version) {
  const ServerPiece& p = pieces_[i];
  pull_->replies[i].resize(sizeof(PullReply) + static_cast<size_t>(p.count * elem_));
  MPI_Irecv(pull_->replies[i].data(), static_cast<int>(pull_->replies[i].size()), MPI_BYTE,
            first_server_ + p.server, kTagValues, channel_, &pull_->requests[i]);
  pull_->asks[i].min_version = min_version;
  send_message(channel_, first_server_ + p.server, kTagPull, &pull_->asks[i], sizeof(PullRequest), timeout_,
               "asking " + server_name(p.server) + " for values");
}

void ParameterClient::start_pull(int64_t min_version) {
  for (size_t i = 0; i < pieces_.size(); ++i) post_pull(i, min_version);
  pull_->active = true;
}

bool ParameterClient::pull_ready() {
  if (!pull_->active) return false;
  int done = 0;
  MPI_Testall(static_cast<int>(pull_->requests.size()), pull_->requests.data(), &done, MPI_STATUSES_IGNORE);
  return done != 0;
}

// The pull's version once every server's piece is of the same one: pieces behind the newest
// are asked again for at least it (servers apply a step at slightly different moments).
// -2 when a server reported a divergence.
int64_t ParameterClient::coherent_version() {
  for (;;) {
    for (size_t i = 0; i < pieces_.size(); ++i)
      wait_request(pull_->requests[i], timeout_,
                   "waiting for values from " + server_name(pieces_[i].server));
    int64_t hi = -1, lo = INT64_MAX;
    for (const std::vector<char>& r : pull_->replies) {
      const PullReply h = reply_header(r);
      if (h.diverged) return -2;
      hi = std::max(hi, h.version);
      lo = std::min(lo, h.version);
    }
    if (lo == hi) return hi;
    for (size_t i = 0; i < pieces_.size(); ++i)
      if (reply_header(pull_->replies[i]).version != hi) post_pull(i, hi);
  }
}

void ParameterClient::install() {
  for (size_t i = 0; i < pieces_.size(); ++i)
    std::memcpy(flat_.data() + pieces_[i].local_begin * elem_, pull_->replies[i].data() + sizeof(PullReply),
                static_cast<size_t>(pieces_[i].count * elem_));
  state_.write_flat(FlatField::Values, flat_.data());
  state_.sync_after_load();
}

void ParameterClient::ensure_version(int64_t min_version) {
  const int64_t last = cfg_.train.steps;
  for (;;) {
    if (!pull_->active && installed_ < min_version) start_pull(std::max(min_version, installed_ + 1));
    // This rank's candidate: a complete, coherent pull (-1: none yet; -2: divergence).
    int64_t mine = -1;
    if (pull_->active && (installed_ < min_version || pull_ready())) mine = coherent_version();
    const auto lo = static_cast<int64_t>(replica_->all_reduce_scalar(static_cast<double>(mine), ReduceOp::Min));
    const auto hi = static_cast<int64_t>(replica_->all_reduce_scalar(static_cast<double>(mine), ReduceOp::Max));
    if (lo == -2 || hi == -2) diverged_everywhere(-1);
    if (lo >= 0 && lo == hi) {
      pull_->active = false;
      install();
      installed_ = lo;
      if (installed_ < last) start_pull(installed_ + 1);  // the next version, while computing
      if (installed_ >= min_version) return;
      continue;
    }
    if (lo >= 0) {  // every rank has one, not the same: all of the newest
      if (mine < hi)
        for (size_t i = 0; i < pieces_.size(); ++i) post_pull(i, hi);
      continue;
    }
    if (installed_ >= min_version) return;  // a newer version is on its way: not needed yet
  }
}

Assignment ParameterClient::next(const ShareReport& report, std::vector<LoggedStep>& logged) {
  // A stop requested on any rank of the replica reaches the scheduler.
  const bool stop = replica_->all_reduce_scalar(stop_request(), ReduceOp::Max) != 0;
  std::string answer;
  if (replica_->rank() == 0) {
    AskMessage ask;
    ask.replica = grid_.rank(Axis::Data);
    ask.stop = stop ? 1 : 0;
    ask.report = report;
    send_message(channel_, first_server_, kTagAsk, &ask, sizeof ask, timeout_,
                 "asking " + server_name(0) + " for work");
    const std::vector<char> bytes = receive_message(channel_, first_server_, kTagAssign, timeout_,
                                                    "waiting for work from " + server_name(0));
    AssignMessage m;
    std::memcpy(&m, bytes.data(), sizeof m);
    logged.resize(static_cast<size_t>(m.logged));
    std::memcpy(logged.data(), bytes.data() + sizeof m, logged.size() * sizeof(LoggedStep));
    answer.assign(bytes.data(), sizeof m);
  }
  replica_->broadcast_bytes(answer, 0);
  AssignMessage m;
  std::memcpy(&m, answer.data(), sizeof m);
  if (m.diverged) diverged_everywhere(m.diverged_step);
  return m.assignment;
}

void ParameterClient::pull_state(int64_t version) {
  std::vector<std::vector<char>> replies(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const ServerPiece& p = pieces_[i];
    PullRequest ask;
    ask.min_version = version;
    ask.with_moments = 1;
    send_message(channel_, first_server_ + p.server, kTagPull, &ask, sizeof ask, timeout_,
                 "asking " + server_name(p.server) + " for the optimizer state");
    replies[i] = receive_message(channel_, first_server_ + p.server, kTagState, timeout_,
                                 "waiting for the optimizer state from " + server_name(p.server));
    const PullReply h = reply_header(replies[i]);
    if (h.diverged) throw std::logic_error("a divergence reported at a fence");
    if (h.version != version)
      throw std::logic_error("parameter server " + std::to_string(p.server) + " is at version " +
                             std::to_string(h.version) + " at the fence of version " + std::to_string(version));
  }
  const FlatField fields[] = {FlatField::Values, FlatField::ExpAvg, FlatField::ExpAvgSq};
  for (int f = 0; f < 3; ++f) {
    for (size_t i = 0; i < pieces_.size(); ++i) {
      const int64_t bytes = pieces_[i].count * elem_;
      std::memcpy(flat_.data() + pieces_[i].local_begin * elem_,
                  replies[i].data() + sizeof(PullReply) + f * bytes, static_cast<size_t>(bytes));
    }
    state_.write_flat(fields[f], flat_.data());
  }
  state_.sync_after_load();
  state_.set_steps_taken(version);
  installed_ = version;
}

void ParameterClient::push(const Assignment& share) {
  state_.read_flat(FlatField::Gradients, flat_.data());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const ServerPiece& p = pieces_[i];
    // The previous push from this buffer has been received by now, or soon.
    if (send_requests_[i] != MPI_REQUEST_NULL)
      wait_request(send_requests_[i], timeout_, "pushing a gradient to " + server_name(p.server));
    GradientHeader h;
    h.step = share.step;
    h.share = share.share;
    h.version = installed_;
    std::vector<char>& bytes = sends_[i];
    bytes.resize(sizeof h + static_cast<size_t>(p.count * elem_));
    std::memcpy(bytes.data(), &h, sizeof h);
    std::memcpy(bytes.data() + sizeof h, flat_.data() + p.local_begin * elem_, static_cast<size_t>(p.count * elem_));
    MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, first_server_ + p.server, kTagGradient,
              channel_, &send_requests_[i]);
  }
}

void ParameterClient::diverged_everywhere(int64_t step) {
  // Every worker learns of it at its next request or pull; they leave together.
  grid_.world().all_reduce_scalar(1.0);
  throw diverged(cfg_, static_cast<int>(step < 0 ? installed_ + 1 : step + 1), std::nan(""), std::nan(""));
}

void ParameterClient::shutdown(MPI_Comm channel, int first_server, int servers, int status, double timeout) {
  const int32_t s = status;
  for (int k = 0; k < servers; ++k)
    send_message(channel, first_server + k, kTagShutdown, &s, sizeof s, timeout,
                 "ending parameter server " + std::to_string(k));
}

}  // namespace meshtrain
