#include "meshtrain/io/checkpoint_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>
#include <sstream>
#include <type_traits>

#include "meshtrain/comm/blocking_watchdog.h"
#include "meshtrain/io/regular_file.h"
#include "meshtrain/io/terminal_text.h"
#include "meshtrain/tensor/philox.h"
#include "checkpoint_file_trust.h"
#include "hdf5_handle.h"

namespace meshtrain {

namespace hdf5 {

namespace {

herr_t innermost(unsigned n, const H5E_error2_t* e, void* out) {
  if (n == 0 && e->desc) *static_cast<std::string*>(out) = e->desc;
  return 0;
}

}  // namespace

std::string reason() {
  std::string reason;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &reason);
  H5Eclear2(H5E_DEFAULT);
  return reason.empty() ? "" : " (HDF5: " + reason + ")";
}

}  // namespace hdf5

static_assert(std::is_same_v<hid_t, int64_t>, "CheckpointFile stores hid_t as int64_t (HDF5 >= 1.10)");

namespace {

constexpr uint64_t kIndexMultiplier = 0x9E3779B97F4A7C15ull;

// HDF5 prints its error stack to stderr by default; we report our own messages instead and
// take the innermost HDF5 reason from the stack.
void silence_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

using hdf5::Handle;

std::string hdf5_reason() { return hdf5::reason(); }

hid_t file_type(DType t) {
  switch (t) {
    case DType::F32: return H5T_IEEE_F32LE;
    case DType::F64: return H5T_IEEE_F64LE;
    default: throw CheckpointFileError("checkpoints store fp32 or fp64, not " + std::string(dtype_name(t)));
  }
}

hid_t memory_type(DType t) {
  switch (t) {
    case DType::F32: return H5T_NATIVE_FLOAT;
    case DType::F64: return H5T_NATIVE_DOUBLE;
    default: throw CheckpointFileError("checkpoints store fp32 or fp64, not " + std::string(dtype_name(t)));
  }
}

// Hashes of elements [0, n) whose global indices are first + j; a loop the compiler vectorises
// (uint64 addition reassociates exactly).
template <class Bits>
uint64_t checksum_run(const char* data, int64_t first, int64_t n) {
  uint64_t sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    Bits b;
    std::memcpy(&b, data + j * static_cast<int64_t>(sizeof(Bits)), sizeof b);
    sum += mix64(static_cast<uint64_t>(first + j) * kIndexMultiplier + static_cast<uint64_t>(b));
  }
  return sum;
}

// Packed: data holds the boxes' elements back to back; in place: data is the whole tensor.
enum class Layout { Packed, InPlace };

// One thread: the checkpointer overlaps hashing with I/O on threads of its own, which wait
// without spinning (an OpenMP team here would spin and compete with the writer for cores).
template <class Bits>
uint64_t checksum_typed(const char* data, Layout layout, const Shape& global, const std::vector<Box>& boxes) {
  uint64_t sum = 0;
  int64_t offset = 0;
  for_each_run(global, boxes, [&](int64_t first, int64_t n) {
    const int64_t at = layout == Layout::Packed ? offset : first;
    sum += checksum_run<Bits>(data + at * static_cast<int64_t>(sizeof(Bits)), first, n);
    offset += n;
  });
  return sum;
}

// The global flat indices [lo, hi) spanned by `boxes` (lo >= hi when empty).
std::pair<int64_t, int64_t> element_span(const Shape& global, const std::vector<Box>& boxes) {
  int64_t lo = global.numel(), hi = 0;
  for_each_run(global, boxes, [&](int64_t first, int64_t n) {
    lo = std::min(lo, first);
    hi = std::max(hi, first + n);
  });
  return {lo, hi};
}

}  // namespace

uint64_t checksum_part(const void* data, DType dtype, const Shape& global,
                       const std::vector<Box>& boxes) {
  switch (dtype) {
    case DType::F32: return checksum_typed<uint32_t>(static_cast<const char*>(data), Layout::Packed, global, boxes);
    case DType::F64: return checksum_typed<uint64_t>(static_cast<const char*>(data), Layout::Packed, global, boxes);
    default: throw CheckpointFileError("checksums are defined for fp32 and fp64, not " + std::string(dtype_name(dtype)));
  }
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ---- file ----------------------------------------------------------------------------------

CheckpointFile::CheckpointFile(const std::string& path, MPI_Comm comm, Access access)
    : path_(path), comm_(comm) {
  silence_hdf5();
  disable_hdf5_plugins();
  // MPI-IO opens a directory, and then every HDF5 read fails with an MPI error printed per
  // rank and attempt: refuse it first, with one message.
  struct stat st{};
  if (access == Access::Read && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw CheckpointFileError(path + ": is a directory, not a checkpoint file (give one of its "
                              "step_*.h5 files)");
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  // The 1.8 format at least: attributes over 64 KiB (a long deck) go to dense storage.
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  // Collective over `comm` (MPI-IO): a peer that never comes, or a file system that stopped
  // answering, blocks here beyond any communicator's timeout (comm/blocking_watchdog.h).
  const BlockingRegion region((access == Access::Create ? "creating " : "opening ") + path +
                              " (an HDF5 call over MPI-IO)");
  if (access == Access::Create) {
    H5Pset_meta_block_size(fapl, kMetadataBlockBytes);
    file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (file_ < 0) throw CheckpointFileError(path + ": cannot create the checkpoint file" + hdf5_reason());
    dapl_ = confined_dataset_access();
  } else {
    if (const std::string why = non_regular_file_problem(path, "a checkpoint file", "a step_*.h5 file"); !why.empty()) throw CheckpointFileError(why);
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
    if (file_ < 0)
      throw CheckpointFileError(path + ": cannot open as an HDF5 checkpoint (missing, truncated or "
                                "not an HDF5 file)" + hdf5_reason());
    dapl_ = confined_dataset_access();
    // Before anything else is read: the file holds everything it declares inside itself. Every
    // rank checks the same file, and all agree before any of them goes on (or closes: H5Fclose
    // is collective).
    std::string problem;
    try {
      problem = check_self_contained(file_, path, dapl_, datasets_);
    } catch (const std::exception& e) {  // no rank may skip the agreement below
      problem = path + ": checking the file failed: " + e.what();
    }
    int ok = problem.empty() ? 1 : 0, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
    if (!all_ok) {
      try {
        close();
      } catch (const CheckpointFileError&) {  // the refusal below is the error to report
      }
      throw CheckpointFileError(!problem.empty() ? problem
                                                 : path + ": another rank found the file does not hold its "
                                                          "data inside itself (its message says where)");
    }
  }
}

CheckpointFile::~CheckpointFile() {
  try {
    close();
  } catch (const CheckpointFileError&) {  // reported by an explicit close() where it matters
  }
}

void CheckpointFile::close() {
  if (map_) {
    ::munmap(const_cast<char*>(map_), map_size_);
    map_ = nullptr;
  }
  if (dapl_ >= 0) {
    H5Pclose(dapl_);
    dapl_ = -1;
  }
  if (file_ < 0) return;
  const BlockingRegion region("closing " + path_ + " (an HDF5 call over MPI-IO that writes its metadata)");
  for (auto& [name, id] : datasets_) H5Dclose(id);
  datasets_.clear();
  const herr_t status = H5Fclose(file_);
  file_ = -1;
  if (status < 0) throw CheckpointFileError(path_ + ": closing the checkpoint failed" + hdf5_reason());
}

void CheckpointFile::discard() {
  if (file_ < 0) return;
  int rank = 0;
  MPI_Comm_rank(comm_, &rank);
  if (rank == 0) (void)::truncate(path_.c_str(), 0);
  const BlockingRegion region("giving up " + path_ + " (a barrier before closing it)");
  MPI_Barrier(comm_);  // nobody closes (and writes metadata) before the space is free
  try {
    close();
  } catch (const CheckpointFileError&) {  // the file is being given up anyway
  }
}

void CheckpointFile::reserve_space() {
  // The end of the last dataset's storage (H5Fget_eoa would say it for all, but only for
  // SWMR-capable drivers, not MPI-IO); metadata written later is small and not reserved.
  haddr_t end = 0;
  for (const auto& [name, id] : datasets_) {
    const haddr_t offset = H5Dget_offset(id);
    if (offset != HADDR_UNDEF) end = std::max<haddr_t>(end, offset + H5Dget_storage_size(id));
  }
  if (end == 0) return;
  const int fd = ::open(path_.c_str(), O_WRONLY);
  if (fd < 0) fail(std::string("cannot open to reserve space: ") + std::strerror(errno));
  // fallocate(2), not posix_fallocate: where the file system cannot reserve, glibc's fallback
  // writes a byte into every block, which on a parallel file system costs a pass over the file.
  const int status = ::fallocate(fd, 0, 0, static_cast<off_t>(end));
  const int error = errno;
  ::close(fd);
  if (status == 0 || error == EOPNOTSUPP || error == ENOSYS) return;
  char size[32];
  std::snprintf(size, sizeof size, "%.1f MB", static_cast<double>(end) / 1e6);
  throw CheckpointFileError(path_ + ": cannot reserve the checkpoint's " + size + ": " +
                            std::strerror(error));
}

void CheckpointFile::fail(const std::string& what) const {
  throw CheckpointFileError(path_ + ": " + what + hdf5_reason());
}

// ---- attributes ----------------------------------------------------------------------------

namespace {

bool write_scalar(hid_t obj, const char* name, hid_t stored, hid_t memory, const void* value) {
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(obj, name, stored, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  return attr.ok() && H5Awrite(attr, memory, value) >= 0;
}

bool write_string(hid_t obj, const char* name, const std::string& s) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, std::max<size_t>(1, s.size()));
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  H5Tset_cset(type, H5T_CSET_UTF8);
  std::string padded = s;
  padded.resize(std::max<size_t>(1, s.size()), '\0');
  return write_scalar(obj, name, type, type, padded.data());
}

}  // namespace

void CheckpointFile::write_info(const CheckpointInfo& info) {
  const int32_t version = info.format_version, world = info.world_size;
  const bool ok =
      write_scalar(file_, "format_version", H5T_STD_I32LE, H5T_NATIVE_INT32, &version) &&
      write_scalar(file_, "step", H5T_STD_I64LE, H5T_NATIVE_INT64, &info.step) &&
      write_scalar(file_, "optimizer_steps", H5T_STD_I64LE, H5T_NATIVE_INT64, &info.optimizer_steps) &&
      write_scalar(file_, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &info.seed) &&
      write_string(file_, "deck", info.deck) && write_string(file_, "overrides", info.overrides) &&
      write_string(file_, "config", info.config) && write_string(file_, "model", info.model) &&
      write_string(file_, "lineage", info.lineage) && write_string(file_, "layout", info.layout) &&
      write_scalar(file_, "world_size", H5T_STD_I32LE, H5T_NATIVE_INT32, &world) &&
      write_string(file_, "meshtrain_version", info.meshtrain_version) &&
      write_string(file_, "created", info.created) &&
      (info.optimizer.empty() || write_string(file_, "optimizer", info.optimizer)) &&
      (info.data_blend.empty() || write_string(file_, "data_blend", info.data_blend));
  if (!ok) fail("cannot write the root attributes");
}

namespace {

// Opens attribute `name` of `obj` and checks its class; "" on success, else the problem.
std::string open_attribute(hid_t obj, const char* name, H5T_class_t want, hid_t& attr) {
  if (H5Aexists(obj, name) <= 0) return "has no attribute '" + std::string(name) + "'";
  attr = H5Aopen(obj, name, H5P_DEFAULT);
  if (attr < 0) return "cannot open attribute '" + std::string(name) + "'";
  Handle type(H5Aget_type(attr), H5Tclose);
  Handle space(H5Aget_space(attr), H5Sclose);
  if (H5Tget_class(type) != want || H5Sget_simple_extent_npoints(space) != 1)
    return "attribute '" + std::string(name) + "' is not a scalar " +
           (want == H5T_STRING ? "string" : "integer");
  return "";
}

// An integer attribute as stored: int64 when its type is signed, else uint64.
struct StoredInteger {
  bool is_signed = true;
  int64_t s = 0;
  uint64_t u = 0;
  bool within(int64_t lo, uint64_t hi) const {
    if (is_signed) return s >= lo && (s < 0 || static_cast<uint64_t>(s) <= hi);
    return (lo <= 0 || u >= static_cast<uint64_t>(lo)) && u <= hi;
  }
  std::string to_string() const { return is_signed ? std::to_string(s) : std::to_string(u); }
  // Callers check within() first: a range of [lo, hi <= INT64_MAX] leaves no value int64 cannot
  // hold, and one of [0, hi] no negative one.
  int64_t value() const { return is_signed ? s : static_cast<int64_t>(u); }
  uint64_t unsigned_value() const { return is_signed ? static_cast<uint64_t>(s) : u; }
};

}  // namespace

std::map<std::string, std::string> recorded_model_settings(const std::string& model) {
  std::map<std::string, std::string> out;
  std::istringstream lines(model);
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 3);
  }
  return out;
}

bool is_lineage_id(const std::string& s) {
  return s.size() == 32 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
         });
}

CheckpointInfo CheckpointFile::read_info() const {
  // An integer attribute's exact value, read in its own signedness (a conversion to another
  // type would clamp or wrap it: 2^32+2 into int32 reads as 2), checked against [lo, hi].
  auto integer = [&](const char* name, int64_t lo, uint64_t hi, const char* why) -> StoredInteger {
    hid_t id = -1;
    const std::string problem = open_attribute(file_, name, H5T_INTEGER, id);
    Handle attr(id, H5Aclose);
    if (!problem.empty()) fail(problem + " (not a meshtrain checkpoint, or written by another tool)");
    Handle type(H5Aget_type(attr), H5Tclose);
    const std::string key = "attribute '" + std::string(name) + "'";
    if (H5Tget_size(type) > 8) fail(key + " is an integer of " + std::to_string(H5Tget_size(type)) +
                                    " bytes (expected at most 64 bits)");
    StoredInteger v;
    v.is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (H5Aread(attr, v.is_signed ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64, v.is_signed ? static_cast<void*>(&v.s)
                                                                                       : static_cast<void*>(&v.u)) < 0)
      fail("cannot read " + key);
    if (!v.within(lo, hi))
      fail(key + " = " + v.to_string() + " is out of range (expected " + std::to_string(lo) + " to " +
           std::to_string(hi) + ": " + why + ")");
    return v;
  };
  auto string = [&](const char* name) {
    hid_t id = -1;
    const std::string problem = open_attribute(file_, name, H5T_STRING, id);
    Handle attr(id, H5Aclose);
    if (!problem.empty()) fail(problem + " (not a meshtrain checkpoint, or written by another tool)");
    Handle type(H5Aget_type(attr), H5Tclose);
    std::string out;
    if (H5Tis_variable_str(type) > 0) {  // as h5py writes strings
      Handle memory(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(memory, H5T_VARIABLE);
      H5Tset_cset(memory, H5Tget_cset(type));
      char* p = nullptr;
      if (H5Aread(attr, memory, &p) < 0) fail("cannot read attribute '" + std::string(name) + "'");
      if (p) out = p;
      H5free_memory(p);
    } else {
      out.assign(H5Tget_size(type), '\0');
      if (H5Aread(attr, type, out.data()) < 0) fail("cannot read attribute '" + std::string(name) + "'");
      out.resize(std::strlen(out.c_str()));
    }
    return out;
  };
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  CheckpointInfo info;
  info.format_version = static_cast<int>(
      integer("format_version", 1, kIntMax, "a format version; this meshtrain reads version 2").value());
  info.step = integer("step", 0, kMaxCheckpointStep, "the optimizer steps a run can reach, train.steps").value();
  info.optimizer_steps = integer("optimizer_steps", 0, std::numeric_limits<int64_t>::max(),
                                 "AdamW's step count").value();
  info.seed = integer("seed", 0, std::numeric_limits<uint64_t>::max(), "run.seed").unsigned_value();
  info.deck = string("deck");
  auto optional = [&](const char* name) { return H5Aexists(file_, name) > 0 ? string(name) : std::string(); };
  info.overrides = optional("overrides");
  info.config = optional("config");
  info.model = optional("model");
  info.lineage = optional("lineage");
  if (!info.lineage.empty() && !is_lineage_id(info.lineage))
    fail("attribute 'lineage' = \"" + terminal_safe(info.lineage) +
         "\" is not a lineage (expected 32 hexadecimal digits, as a run records)");
  info.layout = string("layout");
  info.world_size = static_cast<int>(integer("world_size", 1, kIntMax, "the ranks that wrote the file").value());
  info.meshtrain_version = string("meshtrain_version");
  info.created = string("created");
  info.optimizer = optional("optimizer");
  info.data_blend = optional("data_blend");
  return info;
}

// ---- datasets ------------------------------------------------------------------------------

void CheckpointFile::create_dataset(const std::string& name, const Shape& shape, DType dtype) {
  hsize_t dims[Shape::kMaxRank];
  for (int k = 0; k < shape.rank(); ++k) dims[k] = static_cast<hsize_t>(shape[k]);
  Handle space(H5Screate_simple(shape.rank(), dims, nullptr), H5Sclose);
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl, 1);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  // Every element is written once; filling the space with zeros first would double the I/O.
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  const hid_t id = H5Dcreate2(file_, name.c_str(), file_type(dtype), space, lcpl, dcpl, H5P_DEFAULT);
  if (id < 0) fail("cannot create dataset " + name + " " + shape.to_string());
  datasets_[name] = id;
}

namespace {

herr_t collect_dataset(hid_t, const char* name, const H5O_info_t* info, void* out) {
  if (info->type == H5O_TYPE_DATASET)
    static_cast<std::vector<std::string>*>(out)->push_back("/" + std::string(name));
  return 0;
}

}  // namespace

std::vector<std::string> CheckpointFile::dataset_names() const {
  std::vector<std::string> names;
  if (H5Ovisit(file_, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names) < 0)
    fail("cannot list the datasets");
  std::sort(names.begin(), names.end());
  return names;
}

bool CheckpointFile::has_dataset(const std::string& name) const {
  if (datasets_.count(name)) return true;
  // Each level of the path must exist before H5Lexists may be asked about the next. HDF5's
  // path traversal skips empty and "." components ("/model/./w" names "/model/w") but
  // H5Lexists answers 0 for a prefix ending in "/.", so the walk goes over the components
  // HDF5 would follow.
  std::string prefix;
  for (size_t begin = 0; begin <= name.size();) {
    size_t end = name.find('/', begin);
    if (end == std::string::npos) end = name.size();
    const std::string component = name.substr(begin, end - begin);
    begin = end + 1;
    if (component.empty() || component == ".") continue;
    prefix += "/" + component;
    if (H5Lexists(file_, prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
  }
  if (prefix.empty()) return false;  // "/": the root group
  H5O_info_t info;
  if (H5Oget_info_by_name(file_, name.c_str(), &info, H5P_DEFAULT) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return false;
  }
  return info.type == H5O_TYPE_DATASET;
}

int64_t CheckpointFile::dataset(const std::string& name) const {
  auto it = datasets_.find(name);
  if (it != datasets_.end()) return it->second;
  const hid_t id = H5Dopen2(file_, name.c_str(), dapl_);
  if (id < 0) fail("has no dataset " + name);
  datasets_[name] = id;
  return id;
}

Shape CheckpointFile::shape(const std::string& name) const {
  Handle space(H5Dget_space(dataset(name)), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 1 || rank > Shape::kMaxRank)
    fail("dataset " + name + " has " + std::to_string(rank) + " dimensions (expected 1 to " +
         std::to_string(Shape::kMaxRank) + ")");
  hsize_t d[Shape::kMaxRank] = {};
  H5Sget_simple_extent_dims(space, d, nullptr);
  auto i = [&](int k) { return static_cast<int64_t>(d[k]); };
  switch (rank) {
    case 1: return Shape{i(0)};
    case 2: return Shape{i(0), i(1)};
    case 3: return Shape{i(0), i(1), i(2)};
    default: return Shape{i(0), i(1), i(2), i(3)};
  }
}

DType CheckpointFile::dtype(const std::string& name) const {
  Handle type(H5Dget_type(dataset(name)), H5Tclose);
  if (H5Tget_class(type) == H5T_FLOAT) {
    if (H5Tget_size(type) == 4) return DType::F32;
    if (H5Tget_size(type) == 8) return DType::F64;
  }
  fail("dataset " + name + " has an element type other than float32 or float64");
}

int64_t CheckpointFile::data_offset(const std::string& name) const {
  const haddr_t a = H5Dget_offset(dataset(name));
  if (a == HADDR_UNDEF) fail("dataset " + name + " has no contiguous storage");
  return static_cast<int64_t>(a);
}

namespace {

// The file-side selection of `boxes` in the dataset's space; returns the elements selected.
hssize_t select_boxes(hid_t space, const std::vector<Box>& boxes, int rank) {
  if (boxes.empty()) {
    H5Sselect_none(space);
    return 0;
  }
  for (size_t i = 0; i < boxes.size(); ++i) {
    hsize_t start[Shape::kMaxRank], count[Shape::kMaxRank];
    for (int k = 0; k < rank; ++k) {
      start[k] = static_cast<hsize_t>(boxes[i].start[k]);
      count[k] = static_cast<hsize_t>(boxes[i].count[k]);
    }
    if (H5Sselect_hyperslab(space, i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr, count,
                            nullptr) < 0)
      return -1;
  }
  return H5Sget_select_npoints(space);
}

}  // namespace

void CheckpointFile::transfer(const std::string& name, const std::vector<Box>& boxes, void* data,
                              DType dtype, Direction direction, bool collective) const {
  const hid_t ds = dataset(name);
  Handle fspace(H5Dget_space(ds), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(fspace);
  hsize_t n = 0;
  for (const Box& b : boxes) n += static_cast<hsize_t>(b.numel(rank));
  if (select_boxes(fspace, boxes, rank) != static_cast<hssize_t>(n))
    fail("dataset " + name + ": the selection of " + std::to_string(boxes.size()) +
         " box(es) is invalid or overlaps itself");
  const hsize_t mdims = std::max<hsize_t>(n, 1);
  Handle mspace(H5Screate_simple(1, &mdims, nullptr), H5Sclose);
  if (n == 0) H5Sselect_none(mspace);
  Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(dxpl, collective ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
  char dummy = 0;  // HDF5 refuses a null buffer even for an empty selection
  void* buf = n ? data : &dummy;
  const BlockingRegion region(std::string(collective ? "collective " : "independent ") +
                              (direction == Direction::Write ? "write of dataset " : "read of dataset ") +
                              name + (direction == Direction::Write ? " into " : " from ") + path_ +
                              " (HDF5 over MPI-IO)");
  if (direction == Direction::Write) {
    if (H5Dwrite(ds, memory_type(dtype), mspace, fspace, dxpl, buf) < 0)
      fail("writing dataset " + name + " failed");
  } else if (H5Dread(ds, memory_type(dtype), mspace, fspace, dxpl, buf) < 0) {
    fail("reading dataset " + name + " failed (truncated file?)");
  }
}

void CheckpointFile::write(const std::string& name, const std::vector<Box>& boxes,
                           const void* data, DType dtype, Transfer how) {
  if (how == Transfer::Independent && boxes.empty()) return;
  transfer(name, boxes, const_cast<void*>(data), dtype, Direction::Write, how == Transfer::Collective);
}

void CheckpointFile::read(const std::string& name, const std::vector<Box>& boxes, void* data,
                          DType dtype, Transfer how) {
  if (how == Transfer::Independent && boxes.empty()) return;
  transfer(name, boxes, data, dtype, Direction::Read, how == Transfer::Collective);
}

uint64_t CheckpointFile::stored_checksum(const std::string& name, const std::vector<Box>& boxes) {
  const DType type = dtype(name);
  const Shape global = shape(name);
  Handle stored(H5Dget_type(dataset(name)), H5Tclose);
  const haddr_t offset = H5Dget_offset(dataset(name));
  const bool in_place = H5Tget_order(stored) == H5T_ORDER_LE && offset != HADDR_UNDEF &&
                        std::endian::native == std::endian::little;
  if (!in_place) {  // e.g. a big-endian file from another tool: read and convert
    int64_t n = 0;
    for (const Box& b : boxes) n += b.numel(global.rank());
    std::vector<char> data(static_cast<size_t>(n) * dtype_size(type));
    H5Eclear2(H5E_DEFAULT);
    transfer(name, boxes, data.data(), type, Direction::Read, false);
    return checksum_part(data.data(), type, global, boxes);
  }
  if (!map_) {
    const int fd = ::open(path_.c_str(), O_RDONLY);
    if (fd < 0) fail("cannot open to map: " + std::string(std::strerror(errno)));
    struct stat st{};
    ::fstat(fd, &st);
    map_size_ = static_cast<size_t>(st.st_size);
    void* p = map_size_ ? ::mmap(nullptr, map_size_, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    ::close(fd);
    if (p == MAP_FAILED) fail("cannot map the file: " + std::string(std::strerror(errno)));
    map_ = static_cast<const char*>(p);
  }
  const size_t bytes = static_cast<size_t>(global.numel()) * dtype_size(type);
  if (offset + bytes > map_size_)
    fail("dataset " + name + " ends at byte " + std::to_string(offset + bytes) + " of a " +
         std::to_string(map_size_) + "-byte file (truncated)");
  // Map this rank's span in one go rather than a page fault at a time (on a shared file system
  // only the span: other ranks' parts are not fetched). Kernels before 5.14 refuse the advice;
  // faults then do the same, slower.
  if (const auto [lo, hi] = element_span(global, boxes); hi > lo) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t begin = (offset + static_cast<size_t>(lo) * dtype_size(type)) / page * page;
    const size_t end = offset + static_cast<size_t>(hi) * dtype_size(type);
    ::madvise(const_cast<char*>(map_) + begin, end - begin, MADV_POPULATE_READ);
  }
  const char* data = map_ + offset;
  return type == DType::F32 ? checksum_typed<uint32_t>(data, Layout::InPlace, global, boxes)
                            : checksum_typed<uint64_t>(data, Layout::InPlace, global, boxes);
}

void CheckpointFile::set_checksum(const std::string& name, uint64_t sum) {
  if (!write_scalar(dataset(name), "checksum", H5T_STD_U64LE, H5T_NATIVE_UINT64, &sum))
    fail("cannot write the checksum of dataset " + name);
}

std::optional<uint64_t> CheckpointFile::checksum(const std::string& name) const {
  hid_t id = -1;
  const std::string problem = open_attribute(dataset(name), "checksum", H5T_INTEGER, id);
  Handle attr(id, H5Aclose);
  if (!problem.empty()) {
    H5Eclear2(H5E_DEFAULT);
    return std::nullopt;
  }
  uint64_t sum = 0;
  if (H5Aread(attr, H5T_NATIVE_UINT64, &sum) < 0) fail("cannot read the checksum of dataset " + name);
  return sum;
}

}  // namespace meshtrain
