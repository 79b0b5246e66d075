#include "meshtrain/io/metrics_writer.h"

#include <cmath>
#include <stdexcept>

namespace meshtrain {

MetricsWriter::MetricsWriter(const std::string& path) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw std::runtime_error(path + ": cannot open the metrics file for writing");
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(std::initializer_list<std::pair<const char*, Value>> fields) {
  if (!file_) return;
  std::string line = "{";
  bool first = true;
  for (const auto& [key, value] : fields) {
    if (!first) line += ", ";
    first = false;
    line += "\"" + std::string(key) + "\": ";
    if (const auto* i = std::get_if<int64_t>(&value)) {
      line += std::to_string(*i);
    } else if (const auto* d = std::get_if<double>(&value)) {
      char buf[32];
      // JSON has no NaN or Infinity: write null so that every line stays parseable.
      if (std::isfinite(*d)) std::snprintf(buf, sizeof buf, "%.9g", *d);
      else std::snprintf(buf, sizeof buf, "null");
      line += buf;
    } else {
      line += "\"" + std::get<std::string>(value) + "\"";
    }
  }
  line += "}\n";
  std::fputs(line.c_str(), file_);
  std::fflush(file_);
}

}  // namespace meshtrain
