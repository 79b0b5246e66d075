#include "meshtrain/io/metrics_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "meshtrain/io/data_error.h"
#include "meshtrain/io/write_all.h"

namespace meshtrain {

namespace {

// JSON has no NaN or Infinity: null keeps every line parseable.
std::string json_number(double d) {
  char buf[32];
  if (std::isfinite(d)) std::snprintf(buf, sizeof buf, "%.9g", d);
  else std::snprintf(buf, sizeof buf, "null");
  return buf;
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw DataError(path, std::string("cannot open the metrics file for appending: ") +
                              std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (fd_ < 0) return;
  if (::close(fd_) != 0 && lost_ == 0) {
    std::fprintf(stderr, "meshtrain: warning: %s: closing the metrics file failed (%s); its "
                 "last lines may be lost\n", path_.c_str(), std::strerror(errno));
  }
  if (lost_ > 0) {
    std::fprintf(stderr, "meshtrain: warning: %s is incomplete: %lld of %lld metrics lines "
                 "could not be written\n", path_.c_str(), static_cast<long long>(lost_),
                 static_cast<long long>(lost_ + written_));
  }
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void MetricsWriter::write(std::initializer_list<std::pair<const char*, Value>> fields) {
  write(std::vector<std::pair<const char*, Value>>(fields));
}

void MetricsWriter::write(const std::vector<std::pair<const char*, Value>>& fields) {
  if (fd_ < 0) return;
  std::string line = "{";
  bool first = true;
  const int64_t* step = nullptr;
  for (const auto& [key, value] : fields) {
    if (!first) line += ", ";
    first = false;
    line += "\"" + std::string(key) + "\": ";
    if (const auto* i = std::get_if<int64_t>(&value)) {
      line += std::to_string(*i);
      if (std::strcmp(key, "step") == 0) step = i;
    } else if (const auto* d = std::get_if<double>(&value)) {
      line += json_number(*d);
    } else if (const auto* ds = std::get_if<std::vector<double>>(&value)) {
      line += "[";
      for (size_t k = 0; k < ds->size(); ++k) line += (k ? ", " : "") + json_number((*ds)[k]);
      line += "]";
    } else if (const auto* is = std::get_if<std::vector<int64_t>>(&value)) {
      line += "[";
      for (size_t k = 0; k < is->size(); ++k) line += (k ? ", " : "") + std::to_string((*is)[k]);
      line += "]";
    } else {
      line += json_string(std::get<std::string>(value));
    }
  }
  line += "}\n";
  const int error = write_all(fd_, line);
  if (error == 0) {
    ++written_;
    return;
  }
  count_unwritten(path_, "metrics", "lines", error, step ? *step : -1, lost_);
}

}  // namespace meshtrain
