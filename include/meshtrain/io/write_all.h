#pragma once
// Writing a whole buffer to a file descriptor, for the run's logs (metrics.jsonl, the TensorBoard
// event files) that are appended as the run goes and must be complete up to their last record.

#include <string_view>

namespace meshtrain {

// Writes all of `bytes` to `fd` with write(2) (no stdio buffer whose failure would surface later,
// or never), retrying after signals and short writes; returns 0 or the errno of the failure
// (ENOSPC where write(2) wrote nothing without one).
int write_all(int fd, std::string_view bytes);

}  // namespace meshtrain
