#pragma once
// run.tensorboard: the run's scalars as TensorBoard event files in <run.dir>/tensorboard, written
// by the rank that writes metrics.jsonl from the same records (train/training_log.h), so the two
// never disagree. Each run (and each resumed run) starts a file of its own,
// events.out.tfevents.<unix seconds>.<host>.<pid>, and never rewrites an older one: TensorBoard
// reads every file of the folder in name order.
//
// Every record is one write(2) of a whole TFRecord (io/tensorboard_events.h), so each log line is
// in the file as soon as it is logged, and a run killed mid-write leaves a file whose records are
// whole up to the cut. As with metrics.jsonl, a record that cannot be written warns once and
// training goes on.

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/io/metrics_writer.h"

namespace meshtrain {

using TensorBoardRecord = std::vector<std::pair<const char*, MetricsWriter::Value>>;

// The scalars of one metrics.jsonl record as TensorBoard shows them: (tag, value) for each key
// of the table in tensorboard_writer.cpp that the record holds (a per-layer list: one scalar per
// layer). Empty when the record holds none.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const TensorBoardRecord& record);

class TensorBoardWriter {
 public:
  // Creates the folder `dir` if missing (its parent, the run directory, exists) and a new event
  // file in it that starts with the file_version event. Throws DataError naming the folder or
  // the file, the reason and what would work.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();  // closes the file; warns on stderr if records were lost
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // The record's scalars (tensorboard_scalars) as one event at its "step"; nothing when it has
  // no step or no scalar.
  void write(const TensorBoardRecord& record);
  void write(std::initializer_list<std::pair<const char*, MetricsWriter::Value>> record);
  const std::string& path() const { return path_; }
  int64_t lost() const { return lost_; }  // events that could not be written

 private:
  void append(const std::string& event, int64_t step);

  std::string path_;
  int fd_ = -1;
  int64_t written_ = 0, lost_ = 0;
};

}  // namespace meshtrain
