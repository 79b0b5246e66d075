#pragma once
// Where a flat range of a rank's tensor-parallel slice lies in the global tensor, as boxes
// (hyperslabs) of global coordinates — the language parallel HDF5 selects data in. It is not
// the file I/O itself (checkpoint_file.h).
//
// A rank holds the global tensor restricted to [split_begin, split_begin + local[d]) along
// d = split_dim (or the whole tensor when split_dim = -1), and owns a flat range
// [begin, begin + count) of that slice in row-major order. Such a range of a box decomposes
// into at most 2 rank - 1 boxes, recursively over dimensions:
//
//     partial leading row | full middle rows | partial trailing row
//       (recurse inside)     (one box)           (recurse inside)
//
// Example: local (3, 4), elements [2, 11) -> row 0 cols [2, 4); rows [1, 2) full; row 2 cols
// [0, 3). Restricting a tensor to a range of one dimension keeps row-major order, so the boxes
// listed in order and read row-major within each visit the elements in local flat order — the
// order HDF5 uses for a union of hyperslabs, which is why the memory side of a transfer can be
// the contiguous piece.

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

struct SliceGeometry {
  Shape global;           // the whole tensor
  Shape local;            // this rank's slice
  int split_dim = -1;     // -1: the slice is the whole tensor
  int64_t split_begin = 0;
};

// A box of global coordinates: dimensions [start[k], start[k] + count[k]) for k < rank.
struct Box {
  std::array<int64_t, Shape::kMaxRank> start{}, count{};
  int64_t numel(int rank) const;
};

// The boxes covering local flat elements [begin, begin + count) of the slice, in row-major
// order; empty when count == 0. Throws std::out_of_range if the range leaves the slice.
std::vector<Box> boxes_of_range(const SliceGeometry& g, int64_t begin, int64_t count);

// Calls f(first, n) for each run of n elements with consecutive global flat indices
// first .. first + n - 1, visiting the boxes in order and each row-major: the order in which
// the elements lie in memory. Runs are as long as the boxes allow (a box covering whole rows
// of every trailing dimension is one run).
void for_each_run(const Shape& global, const std::vector<Box>& boxes,
                  const std::function<void(int64_t first, int64_t n)>& f);

}  // namespace meshtrain
