#pragma once
// Writing a whole buffer to a file descriptor, for the run's logs (metrics.jsonl, the TensorBoard
// event files) that are appended as the run goes and must be complete up to their last record,
// and the warning when one cannot be written (training goes on: the checkpoints check their own).

#include <cstdint>
#include <string>
#include <string_view>

namespace meshtrain {

// Writes all of `bytes` to `fd` with write(2) (no stdio buffer whose failure would surface later,
// or never), retrying after signals and short writes; returns 0 or the errno of the failure
// (ENOSPC where write(2) wrote nothing without one).
int write_all(int fd, std::string_view bytes);

// Counts a record of `path` that could not be written (write_all's `error`, at `step`; -1: none)
// in `lost`, and on the first one warns on stderr: "<path>: cannot write <what> (<reason>) at step
// N; training goes on, but this file will lack <records> (...)". Later records are still tried:
// space may be freed while the run goes on.
void count_unwritten(const std::string& path, const char* what, const char* records, int error, int64_t step,
                     int64_t& lost);

}  // namespace meshtrain
