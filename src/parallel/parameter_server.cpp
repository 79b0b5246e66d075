#include "meshtrain/parallel/parameter_server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>

#include "meshtrain/comm/job_abort.h"
#include "meshtrain/comm/mpi_communicator.h"

namespace meshtrain {

namespace {
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

template <class T>
void add_into(void* dst, const void* src, int64_t n) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}

template <class T>
double sum_squares(const void* p, int64_t n) {
  const T* x = static_cast<const T*>(p);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}
}  // namespace

struct ParameterServer::Impl {
  MPI_Comm channel;
  MpiCommunicator servers;
  Backend& be;
  ServerOptions o;
  int workers, dp, positions;
  int64_t elem;
  std::unique_ptr<ServerLayout> layout;
  std::vector<int> piece_of_position;  // index into pieces, -1: none here
  std::vector<ServerPiece> pieces;
  int64_t n = 0;
  Tensor values;
  std::unique_ptr<AdamW> optim;
  std::vector<OptimizerSegment> norm_segments;
  int64_t version = 0;
  std::map<int64_t, Tensor> accum;
  std::map<int64_t, std::set<std::pair<int, int>>> received;  // (share, position) per step
  struct Pull {
    int source = 0;
    PullRequest request;
  };
  std::vector<Pull> pulls;
  struct Outgoing {
    MPI_Request request;
    std::vector<char> bytes;
  };
  std::list<Outgoing> outgoing;
  std::unique_ptr<ShareScheduler> scheduler;  // server 0
  std::map<int64_t, LoggedStep> applied;      // server 0: lr, norm, seconds of applied steps
  std::deque<StepSummary> summaries;          // server 0: reported steps not yet sent
  bool diverged = false;
  int64_t diverged_step = 0;
  Clock::time_point last_apply = Clock::now(), last_message = Clock::now();
  int exit_status = -1;

  Impl(MPI_Comm ch, MPI_Comm sv, Backend& host, const ServerOptions& options)
      : channel(ch),
        servers(sv, "servers", std::chrono::duration<double>(options.timeout)),
        be(host),
        o(options),
        workers(options.grid.world_size()),
        dp(options.grid.dp),
        positions(options.grid.tp * options.grid.pp),
        elem(static_cast<int64_t>(dtype_size(options.dtype))) {}

  int world_rank() const { return workers + o.server; }
  std::string me() const {
    return "parameter server " + std::to_string(o.server) + " (rank " + std::to_string(world_rank()) + ")";
  }
  int position_of(int worker) const {
    const GridCoords c = o.grid.coordinates(worker);
    return c[axis_index(Axis::Tensor)] + o.grid.tp * c[axis_index(Axis::Pipeline)];
  }
  int leader_of(int replica) const {
    GridCoords c{};
    c[axis_index(Axis::Data)] = replica;
    return o.grid.world_rank(c);
  }
  void* at(const Tensor& t, int64_t offset) const { return static_cast<char*>(t.raw()) + offset * elem; }

  void post(int dest, int tag, std::vector<char> bytes) {
    outgoing.push_back({MPI_REQUEST_NULL, std::move(bytes)});
    Outgoing& out = outgoing.back();
    MPI_Isend(out.bytes.data(), static_cast<int>(out.bytes.size()), MPI_BYTE, dest, tag, channel, &out.request);
  }
  void reap() {
    for (auto it = outgoing.begin(); it != outgoing.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? outgoing.erase(it) : std::next(it);
    }
  }

  // Start-up: the layout from worker 0, then the state of every position held here from
  // replica 0 (its initial or resumed values and moments). False: the workers ended the run.
  bool receive_state() {
    int tag = 0, from = 0;
    std::vector<char> msg = next_message(&tag, &from);
    if (tag == kTagShutdown) return false;
    if (tag != kTagLayout) throw std::logic_error(me() + ": expected the layout, got tag " + std::to_string(tag));
    std::vector<int64_t> sizes(msg.size() / sizeof(int64_t));
    std::memcpy(sizes.data(), msg.data(), sizes.size() * sizeof(int64_t));
    layout = std::make_unique<ServerLayout>(sizes, servers.size());
    pieces = layout->pieces_on_server(o.server);
    piece_of_position.assign(static_cast<size_t>(positions), -1);
    for (size_t i = 0; i < pieces.size(); ++i) piece_of_position[static_cast<size_t>(pieces[i].position)] = static_cast<int>(i);
    n = layout->server_size(o.server);
    values = be.zeros({n}, o.dtype, MemoryCategory::OptimizerState);
    Tensor exp_avg = be.zeros({n}, o.dtype, MemoryCategory::OptimizerState);
    Tensor exp_avg_sq = be.zeros({n}, o.dtype, MemoryCategory::OptimizerState);
    std::vector<OptimizerSegment> segments;
    for (size_t got = 0; got < pieces.size();) {
      msg = next_message(&tag, &from);
      if (tag == kTagShutdown) return false;
      if (tag != kTagUpload) throw std::logic_error(me() + ": expected an upload, got tag " + std::to_string(tag));
      UploadHeader h;
      std::memcpy(&h, msg.data(), sizeof h);
      const ServerPiece& p = pieces[static_cast<size_t>(piece_of_position[static_cast<size_t>(position_of(from))])];
      const char* cursor = msg.data() + sizeof h;
      auto clip = [&](int64_t count, std::vector<OptimizerSegment>& into) {
        for (int64_t i = 0; i < count; ++i, cursor += sizeof(OptimizerSegment)) {
          OptimizerSegment s;
          std::memcpy(&s, cursor, sizeof s);
          const int64_t a = std::max(s.offset, p.local_begin), b = std::min(s.offset + s.count, p.local_begin + p.count);
          if (a < b) into.push_back({a - p.local_begin + p.server_begin, b - a, s.decay});
        }
      };
      clip(h.segments, segments);
      clip(h.norm_segments, norm_segments);
      for (Tensor* t : {&values, &exp_avg, &exp_avg_sq}) {
        std::memcpy(at(*t, p.server_begin), cursor, static_cast<size_t>(p.count * elem));
        cursor += p.count * elem;
      }
      version = h.version;
      ++got;
    }
    optim = std::make_unique<AdamW>(be, n, o.dtype, segments, o.adamw);
    be.copy(optim->exp_avg(), exp_avg);
    be.copy(optim->exp_avg_sq(), exp_avg_sq);
    optim->set_steps_taken(version);
    if (o.server == 0) scheduler = std::make_unique<ShareScheduler>(dp, o.staleness, version, o.last_step, o.fences);
    last_apply = Clock::now();
    return true;
  }

  // A start-up message (layout, upload or shutdown). Requests for work and gradients that
  // arrive meanwhile stay queued in MPI until the state is here.
  std::vector<char> next_message(int* tag, int* from) {
    const double limit = o.timeout;
    const Clock::time_point start = Clock::now();
    int sleep_us = 5;
    for (;;) {
      for (int t : {kTagShutdown, kTagLayout, kTagUpload}) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, t, channel, &flag, &st);
        if (!flag) continue;
        int bytes = 0;
        MPI_Get_count(&st, MPI_BYTE, &bytes);
        std::vector<char> out(static_cast<size_t>(bytes));
        MPI_Recv(out.data(), bytes, MPI_BYTE, st.MPI_SOURCE, t, channel, MPI_STATUS_IGNORE);
        if (t == kTagShutdown) std::memcpy(&exit_status, out.data(), sizeof exit_status);
        *tag = t;
        *from = st.MPI_SOURCE;
        return out;
      }
      if (seconds_since(start) > limit)
        communication_failed(me() + ": no state from the workers within run.comm_timeout = " +
                             std::to_string(static_cast<int>(limit)) + " s of start-up");
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(sleep_us * 2, 1000);
    }
  }

  void on_gradient(int from, const std::vector<char>& msg) {
    GradientHeader h;
    std::memcpy(&h, msg.data(), sizeof h);
    const int q = position_of(from);
    const int index = piece_of_position[static_cast<size_t>(q)];
    if (index < 0) throw std::logic_error(me() + ": a gradient from rank " + std::to_string(from) + ", which has no piece here");
    const ServerPiece& p = pieces[static_cast<size_t>(index)];
    if (static_cast<int64_t>(msg.size()) != static_cast<int64_t>(sizeof h) + p.count * elem || h.step < version)
      throw std::logic_error(me() + ": a malformed or late gradient from rank " + std::to_string(from));
    auto it = accum.find(h.step);
    if (it == accum.end()) it = accum.emplace(h.step, be.zeros({n}, o.dtype, MemoryCategory::Gradients)).first;
    if (o.dtype == DType::F64) add_into<double>(at(it->second, p.server_begin), msg.data() + sizeof h, p.count);
    else add_into<float>(at(it->second, p.server_begin), msg.data() + sizeof h, p.count);
    received[h.step].insert({h.share, q});
  }

  // Applies every step whose pieces have all arrived, in order.
  void apply_ready() {
    const size_t expected = static_cast<size_t>(dp) * pieces.size();
    while (!diverged && received.count(version) && received[version].size() == expected) {
      Tensor& g = accum.at(version);
      double local = 0;
      for (const OptimizerSegment& s : norm_segments)
        local += o.dtype == DType::F64 ? sum_squares<double>(at(g, s.offset), s.count)
                                       : sum_squares<float>(at(g, s.offset), s.count);
      const double norm = std::sqrt(servers.all_reduce_scalar(local, ReduceOp::Sum));
      if (!std::isfinite(norm)) {
        diverged = true;
        diverged_step = version;
        if (scheduler)
          for (int r : scheduler->take_waiting()) answer(r, Assignment{});
        break;
      }
      const double scale = o.grad_clip > 0 && norm > o.grad_clip ? o.grad_clip / (norm + 1e-6) : 1.0;
      const double lr = o.learning_rate(version);
      optim->step(values, g, lr, scale);
      if (scheduler) {
        LoggedStep& l = applied[version];
        l.step = version;
        l.lr = lr;
        l.grad_norm = norm;
        l.seconds = seconds_since(last_apply);
      }
      last_apply = Clock::now();
      accum.erase(version);
      received.erase(version);
      ++version;
      if (scheduler) scheduler->set_version(version);
    }
  }

  void answer_pulls() {
    for (auto it = pulls.begin(); it != pulls.end();) {
      if (!diverged && version < it->request.min_version) {
        ++it;
        continue;
      }
      const ServerPiece& p = pieces[static_cast<size_t>(piece_of_position[static_cast<size_t>(position_of(it->source))])];
      PullReply r;
      r.version = version;
      r.diverged = diverged ? 1 : 0;
      std::vector<char> bytes;
      append_bytes(bytes, &r, 1);
      const size_t b = static_cast<size_t>(p.count * elem);
      auto add = [&](const Tensor& t) {
        const char* src = static_cast<const char*>(at(t, p.server_begin));
        bytes.insert(bytes.end(), src, src + b);
      };
      add(values);
      if (it->request.with_moments) {
        add(optim->exp_avg());
        add(optim->exp_avg_sq());
      }
      post(it->source, it->request.with_moments ? kTagState : kTagValues, std::move(bytes));
      it = pulls.erase(it);
    }
  }

  void answer(int replica, const Assignment& a) {
    AssignMessage m;
    m.assignment = a;
    m.diverged = diverged ? 1 : 0;
    m.diverged_step = diverged_step;
    std::vector<LoggedStep> logged;
    if (replica == 0) {
      for (const StepSummary& s : scheduler->take_summaries()) summaries.push_back(s);
      while (!summaries.empty() && summaries.front().step < version) {
        const StepSummary& s = summaries.front();
        LoggedStep l = applied.at(s.step);
        applied.erase(s.step);
        l.loss_sum = s.loss_sum;
        l.staleness_mean = s.shares ? s.staleness_sum / s.shares : 0.0;
        l.staleness_max = s.staleness_max;
        l.shares = s.shares;
        logged.push_back(l);
        summaries.pop_front();
      }
    }
    m.logged = static_cast<int32_t>(logged.size());
    std::vector<char> bytes;
    append_bytes(bytes, &m, 1);
    append_bytes(bytes, logged.data(), logged.size());
    post(leader_of(replica), kTagAssign, std::move(bytes));
  }

  void on_ask(const std::vector<char>& msg) {
    AskMessage a;
    std::memcpy(&a, msg.data(), sizeof a);
    if (diverged) {
      answer(a.replica, Assignment{});
      return;
    }
    scheduler->ask(a.replica, a.report);
    if (a.stop) scheduler->request_stop();
  }

  // One message, if one has arrived.
  bool poll() {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, channel, &flag, &st);
    if (!flag) return false;
    int bytes = 0;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    std::vector<char> msg(static_cast<size_t>(bytes));
    MPI_Recv(msg.data(), bytes, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, channel, MPI_STATUS_IGNORE);
    last_message = Clock::now();
    switch (st.MPI_TAG) {
      case kTagGradient:
        on_gradient(st.MPI_SOURCE, msg);
        break;
      case kTagPull: {
        Pull p;
        p.source = st.MPI_SOURCE;
        std::memcpy(&p.request, msg.data(), sizeof p.request);
        pulls.push_back(p);
        break;
      }
      case kTagAsk:
        if (!scheduler) throw std::logic_error(me() + ": a request for work, but this is not server 0");
        on_ask(msg);
        break;
      case kTagShutdown:
        std::memcpy(&exit_status, msg.data(), sizeof exit_status);
        break;
      default:
        throw std::logic_error(me() + ": unexpected message tag " + std::to_string(st.MPI_TAG) +
                               " from rank " + std::to_string(st.MPI_SOURCE));
    }
    return true;
  }

  // A step that has some of its pieces but no news for the timeout: a worker has stalled.
  void check_stalled() {
    if (seconds_since(last_message) < o.timeout || !received.count(version)) return;
    const std::set<std::pair<int, int>>& got = received[version];
    std::string missing;
    int count = 0;
    for (int j = 0; j < dp; ++j)
      for (const ServerPiece& p : pieces)
        if (!got.count({j, p.position}) && count++ < 8)
          missing += (missing.empty() ? "" : ", ") + std::string("share ") + std::to_string(j) +
                     " from position " + std::to_string(p.position);
    communication_failed(me() + ": step " + std::to_string(version + 1) + " has waited " +
                         std::to_string(static_cast<int>(o.timeout)) + " s (run.comm_timeout) for " +
                         std::to_string(dp * static_cast<int>(pieces.size()) - static_cast<int>(got.size())) +
                         " gradient piece(s) (" + missing + "): the replica computing it is stalled or dead");
  }

  int serve() {
    if (!receive_state()) return finish();
    int idle_us = 5;
    while (exit_status < 0) {
      const bool got = poll();
      apply_ready();
      answer_pulls();
      if (scheduler && !diverged)
        for (const auto& [replica, a] : scheduler->dispatch()) answer(replica, a);
      reap();
      if (got) {
        idle_us = 5;
        continue;
      }
      check_stalled();
      std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
      idle_us = std::min(idle_us * 2, 200);
    }
    return finish();
  }

  int finish() {
    for (Outgoing& out : outgoing) wait_request(out.request, o.timeout, me() + " sending its last answers");
    outgoing.clear();
    return std::max(exit_status, 0);
  }
};

ParameterServer::ParameterServer(MPI_Comm channel, MPI_Comm servers, Backend& host, const ServerOptions& options)
    : impl_(std::make_unique<Impl>(channel, servers, host, options)) {}

ParameterServer::~ParameterServer() = default;

int ParameterServer::run() { return impl_->serve(); }

}  // namespace meshtrain
