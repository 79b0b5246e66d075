#include "meshtrain/app/bench_report.h"

#include <mpi.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "meshtrain/io/data_error.h"

namespace meshtrain {

namespace {

// Only world rank 0 prints; every rank keeps the rows (and takes part in the wrong-count sum).
bool leader() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank == 0;
}

}  // namespace

void BenchReport::columns(std::vector<std::string> columns) {
  columns_ = std::move(columns);
  printed_columns_ = false;
}

void BenchReport::header(const std::string& line) {
  headers_.push_back(line);
  if (!leader() || !print_) return;
  std::printf("# %s\n", line.c_str());
  std::fflush(stdout);
}

void BenchReport::row(const std::string& name, const std::vector<double>& values, int wrong) {
  // Any rank's failed check fails the run: the count is summed over the world.
  int all_wrong = wrong;
  MPI_Allreduce(&wrong, &all_wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  wrong = all_wrong;
  rows_.push_back({name, columns_, values, wrong});
  wrong_ += wrong;
  if (!leader() || !print_) return;
  if (!printed_columns_) {
    std::printf("# %-30s", "name");
    for (const std::string& c : columns_) std::printf(" %12s", c.c_str());
    std::printf(" %6s\n", "wrong");
    printed_columns_ = true;
  }
  std::printf("  %-30s", name.c_str());
  for (double v : values) std::printf(" %12.4g", v);
  std::printf(" %6d\n", wrong);
  std::fflush(stdout);
}

void BenchReport::write_json(const std::string& path) const {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) throw DataError(path, std::string("cannot create the benchmark JSON: ") + std::strerror(errno));
  std::fprintf(f, "{\"header\": [");
  for (size_t i = 0; i < headers_.size(); ++i) std::fprintf(f, "%s\"%s\"", i ? ", " : "", headers_[i].c_str());
  std::fprintf(f, "],\n \"rows\": [");
  for (size_t r = 0; r < rows_.size(); ++r) {
    std::fprintf(f, "%s\n  {\"name\": \"%s\"", r ? "," : "", rows_[r].name.c_str());
    for (size_t c = 0; c < rows_[r].columns.size() && c < rows_[r].values.size(); ++c)
      std::fprintf(f, ", \"%s\": %.9g", rows_[r].columns[c].c_str(), rows_[r].values[c]);
    std::fprintf(f, ", \"wrong\": %d}", rows_[r].wrong);
  }
  std::fprintf(f, "\n]}\n");
  // A full disk shows only when stdio flushes: check the flush, the error flag and the close.
  int error = std::fflush(f) != 0 ? errno : 0;
  if (error == 0 && std::ferror(f)) error = EIO;
  if (std::fclose(f) != 0 && error == 0) error = errno;
  if (error != 0)
    throw DataError(path, std::string("cannot write the benchmark JSON: ") + std::strerror(error));
}

}  // namespace meshtrain
