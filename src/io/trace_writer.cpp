#include "meshtrain/io/trace_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "meshtrain/io/data_error.h"

namespace meshtrain {

TraceWriter::TraceWriter(int rank, bool enabled)
    : rank_(rank), enabled_(enabled), origin_(std::chrono::steady_clock::now()) {}

double TraceWriter::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

void TraceWriter::add(const std::string& name, const char* category, Row row, double begin_us,
                      double end_us) {
  if (enabled_) events_.push_back({name, category, row, begin_us, end_us});
}

void TraceWriter::write(const std::string& path) const {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw DataError(path, std::string("cannot create the trace file: ") + std::strerror(errno));
  static const char* rows[] = {"compute", "pipeline p2p", "data-parallel comm", "step"};
  std::fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
  std::fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}}",
               rank_, rank_);
  for (int r = 0; r < 4; ++r)
    std::fprintf(f, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s\"}}",
                 rank_, r, rows[r]);
  for (const Event& e : events_)
    std::fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f}",
                 e.name.c_str(), e.category, rank_, static_cast<int>(e.row), e.begin_us,
                 e.end_us - e.begin_us);
  std::fprintf(f, "\n]}\n");
  // stdio reports a full disk only when its buffer is flushed: check the flush, the stream's
  // error flag (an earlier flush inside fprintf) and the close.
  int error = std::fflush(f) != 0 ? errno : 0;
  if (error == 0 && std::ferror(f)) error = EIO;
  if (std::fclose(f) != 0 && error == 0) error = errno;
  if (error != 0) {
    std::remove(path.c_str());  // a truncated trace would not parse; better none
    throw DataError(path, std::string("cannot write the trace file: ") + std::strerror(error));
  }
}

}  // namespace meshtrain
