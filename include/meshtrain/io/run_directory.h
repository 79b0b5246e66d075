#pragma once
// The run directory (run.dir): created with its parents before anything is written there.

#include <string>

namespace meshtrain {

// Creates `run_dir` and its parents; throws DataError naming `deck_path`, the key and why
// (usually a parent that is a regular file) when it cannot.
void create_run_directory(const std::string& deck_path, const std::string& run_dir);

}  // namespace meshtrain
