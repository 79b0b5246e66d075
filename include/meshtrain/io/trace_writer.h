#pragma once
// A Chrome-trace (Trace Event Format) timeline of one rank: complete events ("ph": "X") with
// microsecond timestamps, written as JSON that chrome://tracing and ui.perfetto.dev open.
// Disabled writers record nothing and cost a branch.

#include <chrono>
#include <string>
#include <vector>

namespace meshtrain {

class TraceWriter {
 public:
  // Thread ids group events into rows of the timeline.
  enum Row { Compute = 0, PipelineComm = 1, DataComm = 2, Step = 3 };

  TraceWriter(int rank, bool enabled);
  bool enabled() const { return enabled_; }
  double now_us() const;
  void add(const std::string& name, const char* category, Row row, double begin_us, double end_us);
  // Writes the events so far; throws DataError naming the path and the reason (e.g. a full
  // disk) when any byte cannot be written, and removes the partial file.
  void write(const std::string& path) const;

  class Scope {
   public:
    Scope(TraceWriter& t, std::string name, const char* category, Row row)
        : t_(t), name_(std::move(name)), category_(category), row_(row), begin_(t.now_us()) {}
    ~Scope() {
      if (t_.enabled()) t_.add(name_, category_, row_, begin_, t_.now_us());
    }

   private:
    TraceWriter& t_;
    std::string name_;
    const char* category_;
    Row row_;
    double begin_;
  };

 private:
  struct Event {
    std::string name;
    const char* category;
    Row row;
    double begin_us, end_us;
  };
  int rank_;
  bool enabled_;
  std::chrono::steady_clock::time_point origin_;
  std::vector<Event> events_;
};

}  // namespace meshtrain
