#pragma once
// What a checkpoint file may make its reader do (private to src/io: CheckpointFile's). A
// checkpoint comes from someone else (shared scratch, a download), and HDF5 will follow a file
// wherever it points: external raw storage reads any local file as a dataset's data, an
// external link opens another file, a virtual dataset maps others' data into its own, a
// filter makes a few stored bytes expand into any amount of memory (and an unknown filter id
// loads a plugin library). A file that is read is first checked to hold everything it declares
// inside itself, within its own size.

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <string>

namespace meshtrain {

// A dataset access property list for untrusted files, as defence in depth behind
// check_self_contained: external raw storage and virtual datasets' source files are resolved
// under "/dev/null/", where nothing can exist, and external links refuse to be traversed. The
// caller closes it (H5Pclose).
hid_t confined_dataset_access();

// Stops HDF5 from loading filter plugins (HDF5_PLUGIN_PATH) for the whole process: meshtrain
// never writes a filtered dataset, and a read must not run a library a file asked for.
void disable_hdf5_plugins();

// Walks every link of the open `file` at `path` and opens every dataset with `dapl`. Returns ""
// when the file holds itself, else one sentence naming the file and the first offending
// object: a soft, external or user-defined link; a dataset with external or virtual storage,
// a storage layout other than contiguous, chunked or compact, or a filter (compression); a
// dataset whose declared elements are more bytes than it stores, or that stores more than the
// file holds (a crafted or truncated file). The datasets it opened are added to `opened` (full
// path -> hid_t), the caller's to close, also when there is a problem. Reads metadata only;
// not collective, and never throws.
std::string check_self_contained(hid_t file, const std::string& path, hid_t dapl,
                                 std::map<std::string, int64_t>& opened);

}  // namespace meshtrain
