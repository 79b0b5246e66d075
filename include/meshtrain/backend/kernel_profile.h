#pragma once
// Where a step's time goes, per backend operation: calls, wall time and (for GEMMs and
// attention) floating-point operations. A backend given a profile times each operation it runs
// (outermost calls only, so nothing is counted twice); `bench --suite step` prints the table.
// Timing a GPU's queued work would need events: only the CPU backend records today.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

class KernelProfile {
 public:
  struct Entry {
    std::string op;
    int64_t calls = 0;
    double seconds = 0;
    double flops = 0;  // 0 where the operation is not counted in FLOPs
  };

  void add(std::string_view op, double seconds, double flops);
  // Entries by decreasing time.
  std::vector<Entry> entries() const;
  double total_seconds() const;
  void clear() { entries_.clear(); }

  // Times one operation into `profile` (may be null: then nothing happens). Nested scopes of
  // the same profile are not recorded: the outer operation already holds their time.
  class Scope {
   public:
    Scope(KernelProfile* profile, std::string_view op, double flops = 0);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    KernelProfile* profile_;
    std::string_view op_;
    double flops_;
    bool outermost_ = false;
    std::chrono::steady_clock::time_point begin_;
  };

 private:
  std::map<std::string, Entry, std::less<>> entries_;
  int depth_ = 0;
};

}  // namespace meshtrain
