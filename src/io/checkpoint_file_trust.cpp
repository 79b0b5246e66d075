#include "checkpoint_file_trust.h"

#include <H5PLpublic.h>
#include <sys/stat.h>

#include <exception>
#include <vector>

#include "hdf5_handle.h"
#include "meshtrain/io/terminal_text.h"

namespace meshtrain {

namespace {

using hdf5::Handle;

constexpr const char* kInside = "; a checkpoint must hold its data inside itself";

herr_t refuse_external_link(const char*, const char*, const char*, const char*, unsigned*, hid_t, void*) {
  return -1;
}

struct Walk {
  hid_t file;
  hid_t dapl;
  std::string path;
  uint64_t file_size;
  std::map<std::string, int64_t>* opened;
  std::string problem;
};

std::string quoted(const std::string& s) { return "'" + terminal_safe(s) + "'"; }

std::string link_problem(const Walk& w, const char* name, const std::string& where, const H5L_info_t& info) {
  std::vector<char> value(info.type == H5L_TYPE_HARD ? 0 : info.u.val_size + 1, '\0');
  const bool have_value =
      !value.empty() && H5Lget_val(w.file, name, value.data(), info.u.val_size, H5P_DEFAULT) >= 0;
  H5Eclear2(H5E_DEFAULT);
  if (info.type == H5L_TYPE_SOFT)
    return where + " is a soft link" + (have_value ? " to " + quoted(value.data()) : std::string()) +
           "; a checkpoint names each of its groups and datasets directly (hard links only)";
  if (info.type == H5L_TYPE_EXTERNAL) {
    const char* file = nullptr;
    const char* object = nullptr;
    unsigned flags = 0;
    std::string target;
    if (have_value && H5Lunpack_elink_val(value.data(), info.u.val_size, &flags, &file, &object) >= 0 && file &&
        object)
      target = " to " + quoted(object) + " in file " + quoted(file);
    H5Eclear2(H5E_DEFAULT);
    return where + " is an external link" + target + kInside;
  }
  return where + " is a user-defined link (type " + std::to_string(static_cast<int>(info.type)) +
         "); a checkpoint names each of its groups and datasets directly (hard links only)";
}

std::string filter_name(hid_t dcpl) {
  unsigned flags = 0, config = 0;
  size_t n_values = 0;
  char name[64] = {};
  const H5Z_filter_t id = H5Pget_filter2(dcpl, 0, &flags, &n_values, nullptr, sizeof name, name, &config);
  H5Eclear2(H5E_DEFAULT);
  return quoted(name[0] ? name : "unnamed") + " (filter id " + std::to_string(static_cast<long long>(id)) + ")";
}

std::string dataset_problem(Walk& w, const char* name, const std::string& where) {
  const hid_t id = H5Dopen2(w.file, name, w.dapl);
  if (id < 0) return where + " cannot be opened" + hdf5::reason();
  (*w.opened)["/" + std::string(name)] = id;
  Handle dcpl(H5Dget_create_plist(id), H5Pclose);
  if (!dcpl.ok()) return where + ": its storage cannot be read" + hdf5::reason();
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  if (layout == H5D_VIRTUAL) {
    char source[4096] = {};
    const bool named = H5Pget_virtual_count(dcpl, nullptr) >= 0 && H5Pget_virtual_filename(dcpl, 0, source, sizeof source) > 0;
    H5Eclear2(H5E_DEFAULT);
    return where + " is a virtual dataset" + (named ? " (its data mapped from file " + quoted(source) + ")" : "") +
           kInside;
  }
  if (const int external = H5Pget_external_count(dcpl); external != 0) {
    char file[4096] = {};
    off_t offset = 0;
    hsize_t size = 0;
    const bool named = external > 0 && H5Pget_external(dcpl, 0, sizeof file, file, &offset, &size) >= 0;
    H5Eclear2(H5E_DEFAULT);
    return where + " stores its data outside the file (external storage" +
           (named ? " " + quoted(file) : std::string()) + ")" + kInside;
  }
  if (layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED && layout != H5D_COMPACT)
    return where + " has storage layout " + std::to_string(static_cast<int>(layout)) +
           " (accepted: contiguous, chunked or compact storage inside the file)";
  // Filtered data has no size bound by what is stored (a compressed chunk of a few bytes can
  // declare gigabytes), and meshtrain writes none.
  if (H5Pget_nfilters(dcpl) != 0)
    return where + " is stored through filter " + filter_name(dcpl) +
           ", but a checkpoint's datasets are stored unfiltered (no compression), so that what they "
           "hold is bounded by the file's size (write it without compression)";

  Handle space(H5Dget_space(id), H5Sclose);
  Handle type(H5Dget_type(id), H5Tclose);
  const hssize_t elements = space.ok() ? H5Sget_simple_extent_npoints(space) : -1;
  const size_t element_bytes = type.ok() ? H5Tget_size(type) : 0;
  if (elements < 0 || element_bytes == 0) return where + ": its shape or element type cannot be read" + hdf5::reason();
  const auto n = static_cast<uint64_t>(elements);
  if (n != 0 && element_bytes > UINT64_MAX / n)
    return where + " declares " + std::to_string(n) + " elements of " + std::to_string(element_bytes) +
           " bytes, more than any file holds";
  const uint64_t declared = n * element_bytes;
  const uint64_t stored = H5Dget_storage_size(id);
  H5Eclear2(H5E_DEFAULT);
  if (declared > stored)
    return where + " declares " + std::to_string(declared) + " bytes (" + std::to_string(n) + " elements of " +
           std::to_string(element_bytes) + " bytes) but stores " + std::to_string(stored) +
           "; a checkpoint holds every element of its datasets (a truncated or crafted file)";
  if (stored > w.file_size)
    return where + " claims " + std::to_string(stored) + " bytes of storage in a " + std::to_string(w.file_size) +
           "-byte file (a truncated or crafted file)";
  if (layout == H5D_CONTIGUOUS) {
    const haddr_t offset = H5Dget_offset(id);
    H5Eclear2(H5E_DEFAULT);
    if (offset != HADDR_UNDEF && (offset > w.file_size || stored > w.file_size - offset))
      return where + " ends at byte " + std::to_string(offset + stored) + " of a " + std::to_string(w.file_size) +
             "-byte file (truncated)";
  }
  return "";
}

herr_t visit_link(hid_t, const char* name, const H5L_info_t* info, void* data) {
  Walk& w = *static_cast<Walk*>(data);
  try {
    const std::string full = "/" + std::string(name);
    if (info->type != H5L_TYPE_HARD) {
      w.problem = link_problem(w, name, terminal_safe(full), *info);
    } else {
      H5O_info_t object;
      if (H5Oget_info_by_name2(w.file, name, &object, H5O_INFO_BASIC, H5P_DEFAULT) < 0)
        w.problem = "object " + terminal_safe(full) + " cannot be read" + hdf5::reason();
      else if (object.type == H5O_TYPE_DATASET)
        w.problem = dataset_problem(w, name, "dataset " + terminal_safe(full));
    }
  } catch (const std::exception& e) {  // HDF5 calls this from C: nothing may be thrown through it
    w.problem = std::string("checking the file failed: ") + e.what();
  }
  return w.problem.empty() ? 0 : 1;
}

}  // namespace

hid_t confined_dataset_access() {
  const hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
  H5Pset_efile_prefix(dapl, "/dev/null/");
  H5Pset_virtual_prefix(dapl, "/dev/null/");
  H5Pset_elink_cb(dapl, refuse_external_link, nullptr);
  return dapl;
}

void disable_hdf5_plugins() { H5PLset_loading_state(0); }

std::string check_self_contained(hid_t file, const std::string& path, hid_t dapl,
                                 std::map<std::string, int64_t>& opened) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return path + ": cannot be read to check its size";
  Walk w{file, dapl, path, static_cast<uint64_t>(st.st_size), &opened, ""};
  const herr_t status = H5Lvisit(file, H5_INDEX_NAME, H5_ITER_INC, visit_link, &w);
  if (!w.problem.empty()) return path + ": " + w.problem;
  if (status < 0) return path + ": its groups cannot be listed" + hdf5::reason();
  return "";
}

}  // namespace meshtrain
