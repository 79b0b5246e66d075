#pragma once
// Test helper: one fresh directory for all ranks of MPI_COMM_WORLD (made by rank 0, its path
// broadcast), for files every rank must see — checkpoints written collectively. Removed by
// rank 0 once every rank is done with it. Collective: construct and destroy on every rank.

#include <mpi.h>

#include <optional>
#include <string>

#include "support/temp_dir.h"

namespace meshtrain::testing {

class SharedTempDir {
 public:
  SharedTempDir() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
      dir_.emplace();
      path_ = dir_->path();
    }
    int n = static_cast<int>(path_.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    path_.resize(static_cast<size_t>(n));
    MPI_Bcast(path_.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  }
  ~SharedTempDir() { MPI_Barrier(MPI_COMM_WORLD); }  // then rank 0's TempDir removes it
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::optional<TempDir> dir_;
  std::string path_;
};

}  // namespace meshtrain::testing
