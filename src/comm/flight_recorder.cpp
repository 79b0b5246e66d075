#include "meshtrain/comm/flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "meshtrain/comm/node.h"

namespace meshtrain {
namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("flight record " + path + ": " + what);
}

// The header a signal is noted in: the process's one recorder while it lives.
std::atomic<FlightHeader*> signal_header{nullptr};

// A library that gives up calls abort(): UCX, under MPICH, does so in every rank whose peer's
// process vanished, milliseconds after the death and before the launcher's signal. Noted like a
// termination signal, the abort tells diagnose which rank went first; then the abort goes on as
// it would have (the earlier disposition, the default one's core dump included).
struct sigaction abort_before{};

void note_abort_signal(int sig) {
  note_signal_in_flight_record(sig);
  ::sigaction(SIGABRT, &abort_before, nullptr);
  ::raise(SIGABRT);
}

void note_aborts_in_flight_record() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  struct sigaction action{};
  action.sa_handler = note_abort_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_NODEFER;
  ::sigaction(SIGABRT, &action, &abort_before);
}

double signal_safe_wall_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);  // async-signal-safe, unlike the C++ clocks
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}
}  // namespace

void note_signal_in_flight_record(int sig) {
  FlightHeader* h = signal_header.load(std::memory_order_acquire);
  if (!h || h->signalled != 0) return;
  h->signal = sig;
  h->signalled = signal_safe_wall_seconds();
}

void note_abort_in_flight_record() {
  FlightHeader* h = signal_header.load(std::memory_order_acquire);
  if (h && h->aborted == 0) h->aborted = signal_safe_wall_seconds();
}

std::string_view flight_op_name(FlightOp op) {
  switch (op) {
    case FlightOp::AllReduce: return "all_reduce";
    case FlightOp::ReduceScatter: return "reduce_scatter";
    case FlightOp::AllGather: return "all_gather";
    case FlightOp::Broadcast: return "broadcast";
    case FlightOp::Send: return "send";
    case FlightOp::Recv: return "recv";
    case FlightOp::Barrier: return "barrier";
    case FlightOp::ScalarAllReduce: return "scalar all_reduce";
    case FlightOp::BytesBroadcast: return "byte broadcast";
    case FlightOp::BytesAllGather: return "byte all_gather";
    case FlightOp::BlockingCall: return "collective file call";
    case FlightOp::AllToAll: return "all_to_all";
    case FlightOp::AllToAllCounts: return "all_to_all of counts";
  }
  return "?";
}

bool is_point_to_point(FlightOp op) { return op == FlightOp::Send || op == FlightOp::Recv; }

std::string flight_record_path(const std::string& run_dir, int world_rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%06d.rec", world_rank);
  return run_dir + "/flight/" + name;
}

std::vector<std::string> flight_record_paths(const std::string& run_dir) {
  // A rank's pending record (".rec.new") is of an attempt that started after its published one
  // was written (publish() renames it over that one) and never finished starting: killed or
  // stalled during start-up, which is what the records are then read to explain.
  std::map<std::string, std::string> by_rank;  // "rank_000003.rec" -> the path to read
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(run_dir + "/flight", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rank_", 0) != 0) continue;
    const std::string pending = kPendingSuffix;
    if (e.path().extension() == ".rec")
      by_rank.emplace(name, e.path().string());  // a pending one, listed earlier, stays
    else if (name.size() > pending.size() + 4 &&
             name.compare(name.size() - pending.size(), pending.size(), pending) == 0 &&
             name.compare(name.size() - pending.size() - 4, 4, ".rec") == 0)
      by_rank[name.substr(0, name.size() - pending.size())] = e.path().string();
  }
  std::vector<std::string> out;
  for (const auto& [rank, path] : by_rank) out.push_back(path);
  return out;
}

FlightRecord read_flight_record(const std::string& path) {
  // Before the open, which would block `diagnose` on a FIFO with no writer. (io/regular_file.h
  // says the same for io's readers; comm sits below io.)
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail(path, "is not a regular file (expected a meshtrain flight record, rank_N.rec)");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open: ") + std::strerror(errno));
  FlightRecord r;
  r.path = path;
  if (!in.read(reinterpret_cast<char*>(&r.header), sizeof r.header))
    fail(path, "shorter than a flight record's header");
  const FlightHeader& h = r.header;
  if (std::memcmp(h.magic, FlightHeader{}.magic, sizeof h.magic) != 0)
    fail(path, "not a meshtrain flight record");
  if (h.version != FlightHeader{}.version)
    fail(path, "format version " + std::to_string(h.version) + ", this build reads version " +
                   std::to_string(FlightHeader{}.version));
  if (h.group_count < 0 || h.group_count > FlightHeader::kMaxGroups || h.capacity == 0 ||
      h.capacity > (uint64_t{1} << 24) || h.world_size < 1 || h.world_rank < 0 ||
      h.world_rank >= h.world_size)
    fail(path, "damaged header");
  // The file must hold the ring before the ring is allocated: a damaged capacity in a short
  // file would otherwise cost up to 1 GiB (found by fuzz/flight_record_fuzz.cpp).
  std::error_code ec;
  const uintmax_t file_bytes = std::filesystem::file_size(path, ec);
  if (ec || file_bytes < sizeof(FlightHeader) + h.capacity * sizeof(FlightEntry))
    fail(path, "shorter than its " + std::to_string(h.capacity) + " entries");
  std::vector<FlightEntry> ring(h.capacity);
  if (!in.read(reinterpret_cast<char*>(ring.data()),
               static_cast<std::streamsize>(ring.size() * sizeof(FlightEntry))))
    fail(path, "shorter than its " + std::to_string(h.capacity) + " entries");
  for (const FlightEntry& e : ring)
    if (e.state != FlightState::Empty && e.serial > 0 && e.serial <= h.serial &&
        e.group >= 0 && e.group < h.group_count)
      r.entries.push_back(e);
  std::sort(r.entries.begin(), r.entries.end(),
            [](const FlightEntry& a, const FlightEntry& b) { return a.serial < b.serial; });
  return r;
}

FlightRecorder::FlightRecorder(const std::string& path, int world_rank, int world_size,
                               size_t capacity)
    : path_(path), pending_path_(path + kPendingSuffix) {
  if (capacity == 0) fail(path, "capacity 0");
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  // O_NOFOLLOW: a link planted at the pending name must not redirect the record elsewhere.
  const int fd = ::open(pending_path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) fail(path, std::string("cannot create: ") + std::strerror(errno));
  map_bytes_ = sizeof(FlightHeader) + capacity * sizeof(FlightEntry);
  // Allocate the blocks now: a full file system fails here, at start-up, not as a SIGBUS later.
  const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(map_bytes_));
  if (err != 0) {
    ::close(fd);
    fail(path, std::string("cannot allocate ") + std::to_string(map_bytes_) + " bytes: " +
                   std::strerror(err));
  }
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail(path, std::string("cannot map: ") + std::strerror(map_errno));
  }
  header_ = new (map_) FlightHeader();
  entries_ = reinterpret_cast<FlightEntry*>(static_cast<char*>(map_) + sizeof(FlightHeader));
  header_->world_rank = world_rank;
  header_->world_size = world_size;
  header_->pid = static_cast<int32_t>(::getpid());
  header_->opened = wall_seconds();
  header_->capacity = capacity;
  std::snprintf(header_->node, sizeof header_->node, "%s", node_name().c_str());
  header_->alive = header_->opened;
  flush_at_abort_ = ScopedAbortHook([this] { flush(); });
  signal_header.store(header_, std::memory_order_release);
  note_aborts_in_flight_record();
  alive_thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(alive_mutex_);
    const auto period = std::chrono::duration<double>(kAliveSeconds);
    while (!alive_wake_.wait_for(lock, period, [this] { return stopping_; }))
      header_->alive = wall_seconds();
  });
}

FlightRecorder::~FlightRecorder() {
  {
    std::lock_guard<std::mutex> lock(alive_mutex_);
    stopping_ = true;
  }
  alive_wake_.notify_all();
  alive_thread_.join();
  FlightHeader* mine = header_;
  signal_header.compare_exchange_strong(mine, nullptr);
  flush_at_abort_ = ScopedAbortHook();
  if (map_) {
    header_->closed = wall_seconds();
    ::munmap(map_, map_bytes_);
  }
  // Never published: the start was refused, and the record it would have replaced stays.
  if (!published_) ::unlink(pending_path_.c_str());
}

void FlightRecorder::publish() {
  if (published_) return;
  if (::rename(pending_path_.c_str(), path_.c_str()) != 0)
    fail(path_, "cannot rename " + pending_path_ + " to it: " + std::strerror(errno));
  published_ = true;
}

int FlightRecorder::add_group(const std::string& name, int id, int size, int rank) {
  if (header_->group_count >= FlightHeader::kMaxGroups) return -1;
  const int index = header_->group_count;
  FlightGroup& g = header_->groups[index];
  std::snprintf(g.name, sizeof g.name, "%s", name.c_str());
  g.id = id;
  g.size = size;
  g.rank = rank;
  sends_.emplace_back(static_cast<size_t>(size), 0);
  recvs_.emplace_back(static_cast<size_t>(size), 0);
  header_->group_count = index + 1;  // published last: a reader sees only complete groups
  return index;
}

FlightRecorder::Ticket FlightRecorder::begin(int group, FlightOp op, int peer, uint64_t bytes) {
  if (group < 0 || group >= header_->group_count) return {};
  FlightGroup& g = header_->groups[group];
  FlightEntry e;
  e.serial = header_->serial + 1;
  e.op = op;
  e.group = group;
  e.peer = peer;
  e.bytes = bytes;
  e.start = wall_seconds();
  e.state = FlightState::Entered;
  const bool collective = !is_point_to_point(op);
  if (collective) {
    e.seq = ++g.collectives_entered;
  } else if (peer >= 0 && peer < g.size) {
    e.seq = ++(op == FlightOp::Send ? sends_ : recvs_)[group][peer];
  }
  slot(e.serial) = e;
  header_->serial = e.serial;
  return {e.serial, group, collective};
}

void FlightRecorder::end(const Ticket& t) {
  if (t.serial == 0) return;
  FlightEntry& e = slot(t.serial);
  if (e.serial == t.serial) {  // not yet overwritten by a newer operation
    e.end = wall_seconds();
    e.state = FlightState::Completed;
  }
  if (t.collective) ++header_->groups[t.group].collectives_completed;
}

void FlightRecorder::flush() {
  if (map_) ::msync(map_, map_bytes_, MS_SYNC);
}

}  // namespace meshtrain
