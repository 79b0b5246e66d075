#include "meshtrain/comm/agreement.h"

#include <new>

namespace meshtrain {

namespace {
// Marks a failure that was memory running out, so every rank can report it as such.
constexpr char kOutOfMemoryTag = '\x01';
}  // namespace

void agree(Communicator& group, const std::function<void()>& f) {
  std::string error;
  try {
    f();
  } catch (const std::bad_alloc&) {
    error = std::string(1, kOutOfMemoryTag) + "out of memory (an allocation failed)";
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  const double failed = group.all_reduce_scalar(error.empty() ? 0.0 : 1.0, ReduceOp::Max);
  if (failed == 0.0) return;
  const std::vector<std::string> all = group.all_gather_bytes(error);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    int others = 0;
    for (size_t q = r + 1; q < all.size(); ++q) others += all[q].empty() ? 0 : 1;
    const bool memory = all[r][0] == kOutOfMemoryTag;
    std::string msg = memory ? all[r].substr(1) : all[r];
    if (group.size() > 1) {
      msg += " [rank " + std::to_string(r);
      if (others > 0) msg += " and " + std::to_string(others) + " other rank(s)";
      msg += "]";
    }
    if (memory) throw AgreedOutOfMemory(msg);
    throw AgreedError(msg);
  }
}

}  // namespace meshtrain
