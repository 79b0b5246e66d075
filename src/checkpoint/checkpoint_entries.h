#pragma once
// The datasets of a model state, as a checkpoint stores them: per parameter its global shape
// and this rank's pieces of it as boxes of the global tensor (the same names on every rank, in
// the same order, as collective I/O needs). Private to src/checkpoint (the Checkpointer's).

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/backend/backend.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/io/hyperslab.h"
#include "meshtrain/parallel/model_state.h"

namespace meshtrain {

// The three tensors stored per parameter: /model/<name>, /optim/<name>/exp_avg, .../exp_avg_sq.
inline constexpr int kKinds = 3;
std::string dataset_name(const std::string& param, int kind);
const Tensor& piece_tensor(const OwnedPiece& p, int kind);

struct Piece {
  OwnedPiece owned;
  std::vector<Box> boxes;  // its elements in the global tensor
};

// One parameter of the model as the file stores it, with this rank's pieces of it (none when
// another stage or shard holds it all).
struct Entry {
  std::string name;
  Shape global;
  std::vector<Piece> pieces;  // one Parameter's, by local_begin: row-major order

  std::vector<Box> boxes(bool primary_only) const;
  int64_t count(bool primary_only) const;
};

// Every parameter of the whole model: the sorted union over the ranks of `world`, with this
// rank's pieces. Collective.
std::vector<Entry> plan_entries(ModelState& state, Communicator& world);

// This rank's primary elements of `kind`, back to back on the host: the tensor's own memory
// when it is one piece in host memory (no copy) unless `always_copy`, else a copy.
struct HostElements {
  std::vector<char> copy;
  Tensor pinned;  // a device's snapshot: a view of pinned host memory (empty_host), else empty
  const char* data = nullptr;
};
HostElements primary_on_host(const Entry& e, int kind, DType dt, bool always_copy = false);
// Sizes `into` for this rank's primary elements of one kind (kept when its size is right already,
// so that its pages are not faulted in again). Throws std::bad_alloc.
void size_for_primary(const Entry& e, DType dt, std::vector<char>& into);
// Copies this rank's primary elements of `kind` into `into` (sized as size_for_primary does).
// With from_any_thread the bytes are read with memcpy, not through the backend (whose calls
// belong to the training thread): every primary piece must be in host memory
// (primary_in_host_memory).
void copy_primary(const Entry& e, int kind, DType dt, std::vector<char>& into, bool from_any_thread = false);
// Whether every primary piece of `entries` lives in host memory another thread can read: a
// CPU tensor with memory behind it (not a planner's).
bool primary_in_host_memory(const std::vector<Entry>& entries);

// Bytes of this rank's primary elements of every parameter and both moments: what a checkpoint
// snapshot of this rank holds. Not collective.
size_t primary_state_bytes(ModelState& state);

// Element-wise sum (mod 2^64) of every rank's vector. Collective.
std::vector<uint64_t> sum_over(Communicator& world, const std::vector<uint64_t>& mine);

}  // namespace meshtrain
