#include "meshtrain/io/tensorboard_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <variant>

#include "meshtrain/io/data_error.h"
#include "meshtrain/io/tensorboard_events.h"
#include "meshtrain/io/write_all.h"

namespace meshtrain {

namespace {

// What TensorBoard shows, and from which metrics.jsonl key: adding a scalar is one line here.
// `layers`: for a per-layer list, the record's key that numbers its entries (tag/layer_<L>).
struct MirroredScalar {
  const char* key;
  const char* tag;
  const char* layers = nullptr;
};

constexpr MirroredScalar kScalars[] = {
    {"loss", "train/loss"},
    {"val_loss", "val/loss"},
    {"lr", "train/lr"},
    {"grad_norm", "train/grad_norm"},
    {"tokens_per_s", "perf/tokens_per_s"},
    {"mtp_loss", "train/mtp_loss"},
    {"expert_balance", "moe/expert_balance", "moe_layers"},  // max over mean tokens per expert
};

const MetricsWriter::Value* find_field(const TensorBoardRecord& record, const char* key) {
  for (const auto& [name, value] : record)
    if (std::strcmp(name, key) == 0) return &value;
  return nullptr;
}

void add_scalars(const MirroredScalar& s, const MetricsWriter::Value& value, const TensorBoardRecord& record,
                 std::vector<std::pair<std::string, double>>& out) {
  if (const auto* d = std::get_if<double>(&value)) {
    out.emplace_back(s.tag, *d);
  } else if (const auto* i = std::get_if<int64_t>(&value)) {
    out.emplace_back(s.tag, static_cast<double>(*i));
  } else if (const auto* list = std::get_if<std::vector<double>>(&value)) {
    const MetricsWriter::Value* numbers = s.layers ? find_field(record, s.layers) : nullptr;
    const auto* layers = numbers ? std::get_if<std::vector<int64_t>>(numbers) : nullptr;
    for (size_t k = 0; k < list->size(); ++k) {
      const int64_t label = layers && layers->size() == list->size() ? (*layers)[k] : static_cast<int64_t>(k);
      out.emplace_back(std::string(s.tag) + (layers ? "/layer_" : "/") + std::to_string(label), (*list)[k]);
    }
  }
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The host as a file name part: letters, digits, '.', '-' and '_' kept, anything else '_'.
std::string host_for_file_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
  std::string name = host;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  return name;
}

void create_folder(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) == 0) return;
  const int error = errno;
  struct stat st {};
  if (error == EEXIST && ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return;
  const std::string why = error == EEXIST ? "it exists and is not a directory" : std::strerror(error);
  throw DataError(dir, "cannot create the folder of the TensorBoard event files (run.tensorboard = true): " +
                           why + " (expected a directory the run can write; remove or rename what is there, "
                           "or set run.tensorboard = false)");
}

}  // namespace

std::vector<std::pair<std::string, double>> tensorboard_scalars(const TensorBoardRecord& record) {
  std::vector<std::pair<std::string, double>> scalars;
  for (const MirroredScalar& s : kScalars)
    if (const MetricsWriter::Value* value = find_field(record, s.key)) add_scalars(s, *value, record, scalars);
  return scalars;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  create_folder(dir);
  const double now = wall_time_now();
  // A new file per run: O_EXCL never opens an older one (a resumed run's file sorts after it).
  const std::string stem = dir + "/events.out.tfevents." + std::to_string(static_cast<long long>(now)) + "." +
                           host_for_file_name() + "." + std::to_string(::getpid());
  // The same process in the same second (a writer per test, a run resumed in-process) takes the
  // next suffix, which sorts after the name before it.
  for (int suffix = 0; suffix < 1000; ++suffix) {
    path_ = suffix == 0 ? stem : stem + "." + std::to_string(suffix);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ >= 0 || errno != EEXIST) break;
  }
  if (fd_ < 0)
    throw DataError(path_, std::string("cannot create the TensorBoard event file (run.tensorboard = true): ") +
                               std::strerror(errno) + " (expected a folder the run can write)");
  append(file_version_event(now), -1);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ < 0) return;
  if (::close(fd_) != 0 && lost_ == 0)
    std::fprintf(stderr, "meshtrain: warning: %s: closing the TensorBoard event file failed (%s); its last "
                 "events may be lost\n", path_.c_str(), std::strerror(errno));
  if (lost_ > 0)
    std::fprintf(stderr, "meshtrain: warning: %s is incomplete: %lld of %lld TensorBoard events could not be "
                 "written\n", path_.c_str(), static_cast<long long>(lost_),
                 static_cast<long long>(lost_ + written_));
}

void TensorBoardWriter::write(const TensorBoardRecord& record) {
  const MetricsWriter::Value* step = find_field(record, "step");
  if (fd_ < 0 || !step || !std::holds_alternative<int64_t>(*step)) return;
  const std::vector<std::pair<std::string, double>> scalars = tensorboard_scalars(record);
  if (scalars.empty()) return;
  const int64_t at = std::get<int64_t>(*step);
  append(scalar_event(wall_time_now(), at, scalars), at);
}

// Out of line, as MetricsWriter's: GCC 12 reports a bogus -Wmaybe-uninitialized where a vector of
// variants is built from an initializer list at the call.
void TensorBoardWriter::write(std::initializer_list<std::pair<const char*, MetricsWriter::Value>> record) {
  write(TensorBoardRecord(record));
}

void TensorBoardWriter::append(const std::string& event, int64_t step) {
  // One write of the whole record (no buffer holds a part of it): a run killed here leaves at
  // most this record cut short, which readers skip.
  struct stat before {};
  const bool sized = ::fstat(fd_, &before) == 0;
  const int error = write_all(fd_, tfrecord(event));
  if (error == 0) {
    ++written_;
    return;
  }
  // A part written before the failure (a full disk) would stop readers there, before the records
  // that later succeed: cut it off again (if even that fails, the warning below names the file).
  if (sized) (void)!::ftruncate(fd_, before.st_size);
  count_unwritten(path_, "TensorBoard events", "them", error, step, lost_);
}

}  // namespace meshtrain
