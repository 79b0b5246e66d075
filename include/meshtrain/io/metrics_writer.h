#pragma once
// metrics.jsonl: one JSON object per line, appended and flushed as the run goes, so that a run
// killed at any moment leaves every completed line readable.

#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>
#include <variant>

namespace meshtrain {

class MetricsWriter {
 public:
  using Value = std::variant<int64_t, double, std::string>;

  // An empty path writes nothing (ranks other than the one that logs).
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(std::initializer_list<std::pair<const char*, Value>> fields);

 private:
  FILE* file_ = nullptr;
};

}  // namespace meshtrain
