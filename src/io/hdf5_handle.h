#pragma once
// HDF5 mechanics shared by the checkpoint file's sources (private to src/io): an identifier
// closed at scope exit, and the innermost reason of HDF5's latest failure.

#include <hdf5.h>

#include <string>

namespace meshtrain::hdf5 {

// Closes an HDF5 identifier at scope exit.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  operator hid_t() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// " (HDF5: <reason>)" for the latest failure, or ""; clears HDF5's error stack.
std::string reason();

}  // namespace meshtrain::hdf5
