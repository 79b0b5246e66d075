#include "meshtrain/io/run_directory.h"

#include <filesystem>

#include "meshtrain/io/data_error.h"

namespace meshtrain {

// A parent that is a regular file is the usual mistake: name it.
void create_run_directory(const std::string& deck_path, const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (!ec && fs::is_directory(run_dir, ec)) return;
  std::string why = ec ? ec.message() : "it exists and is not a directory";
  for (fs::path p = fs::path(run_dir); !p.empty() && p != p.parent_path(); p = p.parent_path()) {
    std::error_code e;
    if (fs::exists(p, e) && !fs::is_directory(p, e)) {
      why = p.string() + " is a file, not a directory";
      break;
    }
  }
  throw DataError(deck_path, "run.dir = \"" + run_dir + "\": cannot create the run directory: " +
                                 why + " (expected a directory path that can be created)");
}

}  // namespace meshtrain
