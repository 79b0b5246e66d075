#pragma once
// metrics.jsonl: one JSON object per line, appended and flushed as the run goes, so that a run
// killed at any moment leaves every completed line readable.
//
// Every write is checked. A line that cannot be written (a full or failing file system) does
// not stop training — the checkpoints are what a run must not lose, and they check their own
// writes — but the first failure prints a warning naming the file, the step and the reason,
// and the writer reports how many lines were lost when it closes.

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace meshtrain {

// `s` as a JSON string, quotes included: '"' and the backslash escaped, control characters as
// \n, \t or \u00XX (also a TOML basic string: the effective configuration's, config_dump.cpp).
std::string json_string(std::string_view s);

class MetricsWriter {
 public:
  // Numbers, strings and arrays of numbers (per-rank values: the straggler report's).
  using Value = std::variant<int64_t, double, std::string, std::vector<double>, std::vector<int64_t>>;

  // An empty path writes nothing (ranks other than the one that logs). Throws DataError naming
  // the path and the reason when the file cannot be opened for appending.
  explicit MetricsWriter(const std::string& path);
  // Closes the file; warns on stderr if lines were lost.
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(std::initializer_list<std::pair<const char*, Value>> fields);
  // The same, for a record whose fields depend on the run (some only where a setting is on).
  void write(const std::vector<std::pair<const char*, Value>>& fields);
  int64_t lost() const { return lost_; }  // lines that could not be written

 private:
  std::string path_;
  int fd_ = -1;
  int64_t written_ = 0, lost_ = 0;
};

}  // namespace meshtrain
