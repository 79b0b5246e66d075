#include "meshtrain/app/bench_report.h"

#include <cstdio>
#include <stdexcept>

namespace meshtrain {

BenchReport::BenchReport(std::vector<std::string> columns, bool print)
    : columns_(std::move(columns)), print_(print) {}

void BenchReport::header(const std::string& line) {
  headers_.push_back(line);
  if (!print_) return;
  std::printf("# %s\n", line.c_str());
  std::fflush(stdout);
}

void BenchReport::table(std::vector<std::string> columns) {
  columns_ = std::move(columns);
  printed_columns_ = false;
}

void BenchReport::row(const std::string& name, const std::vector<double>& values, int wrong) {
  rows_.push_back({columns_, name, values, wrong});
  wrong_ += wrong;
  if (!print_) return;
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
  if (!f) throw std::runtime_error(path + ": cannot write the benchmark JSON");
  std::fprintf(f, "{\"header\": [");
  for (size_t i = 0; i < headers_.size(); ++i) std::fprintf(f, "%s\"%s\"", i ? ", " : "", headers_[i].c_str());
  std::fprintf(f, "],\n \"rows\": [");
  for (size_t r = 0; r < rows_.size(); ++r) {
    std::fprintf(f, "%s\n  {\"name\": \"%s\"", r ? "," : "", rows_[r].name.c_str());
    const std::vector<std::string>& columns = rows_[r].columns;
    for (size_t c = 0; c < columns.size() && c < rows_[r].values.size(); ++c)
      std::fprintf(f, ", \"%s\": %.9g", columns[c].c_str(), rows_[r].values[c]);
    std::fprintf(f, ", \"wrong\": %d}", rows_[r].wrong);
  }
  std::fprintf(f, "\n]}\n");
  std::fclose(f);
}

}  // namespace meshtrain
