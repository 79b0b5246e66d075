#include "meshtrain/io/hyperslab.h"

#include <stdexcept>
#include <string>

namespace meshtrain {

int64_t Box::numel(int rank) const {
  int64_t n = 1;
  for (int k = 0; k < rank; ++k) n *= count[k];
  return n;
}

namespace {

// Boxes of local flat offsets [lo, hi) inside the sub-box of dimensions dim.. at the fixed
// indices prefix[0..dim) (local coordinates).
void decompose(const Shape& local, int dim, std::array<int64_t, Shape::kMaxRank>& prefix,
               int64_t lo, int64_t hi, std::vector<Box>& out) {
  if (lo >= hi) return;
  const int rank = local.rank();
  int64_t inner = 1;  // elements per index of `dim`
  for (int k = dim + 1; k < rank; ++k) inner *= local[k];
  auto emit = [&](int64_t first, int64_t rows) {
    Box b;
    for (int k = 0; k < dim; ++k) {
      b.start[k] = prefix[k];
      b.count[k] = 1;
    }
    b.start[dim] = first;
    b.count[dim] = rows;
    for (int k = dim + 1; k < rank; ++k) b.count[k] = local[k];
    out.push_back(b);
  };
  int64_t row = lo / inner;
  if (lo % inner != 0) {  // partial leading row
    const int64_t end = std::min(hi, (row + 1) * inner);
    prefix[dim] = row;
    decompose(local, dim + 1, prefix, lo - row * inner, end - row * inner, out);
    lo = end;
    ++row;
    if (lo >= hi) return;
  }
  const int64_t full_end = hi / inner;  // rows [row, full_end) are complete
  if (full_end > row) emit(row, full_end - row);
  if (hi > full_end * inner) {  // partial trailing row
    prefix[dim] = full_end;
    decompose(local, dim + 1, prefix, 0, hi - full_end * inner, out);
  }
}

}  // namespace

std::vector<Box> boxes_of_range(const SliceGeometry& g, int64_t begin, int64_t count) {
  if (begin < 0 || count < 0 || begin + count > g.local.numel())
    throw std::out_of_range("boxes_of_range: elements [" + std::to_string(begin) + ", " +
                            std::to_string(begin + count) + ") leave the slice " +
                            g.local.to_string());
  std::vector<Box> out;
  if (count == 0) return out;
  std::array<int64_t, Shape::kMaxRank> prefix{};
  decompose(g.local, 0, prefix, begin, begin + count, out);
  if (g.split_dim >= 0)
    for (Box& b : out) b.start[g.split_dim] += g.split_begin;
  return out;
}

void for_each_run(const Shape& global, const std::vector<Box>& boxes,
                  const std::function<void(int64_t, int64_t)>& f) {
  const int rank = global.rank();
  std::array<int64_t, Shape::kMaxRank> stride{};
  int64_t s = 1;
  for (int k = rank - 1; k >= 0; --k) {
    stride[k] = s;
    s *= global[k];
  }
  for (const Box& b : boxes) {
    if (b.numel(rank) == 0) continue;
    // The run: dimension j and every later one, which the box covers whole.
    int j = rank - 1;
    while (j > 0 && b.start[j] == 0 && b.count[j] == global[j]) --j;
    const int64_t run = b.count[j] * stride[j];
    // Row-major over the indices of dimensions [0, j), an odometer.
    std::array<int64_t, Shape::kMaxRank> idx{};
    while (true) {
      int64_t first = b.start[j] * stride[j];
      for (int k = 0; k < j; ++k) first += (b.start[k] + idx[k]) * stride[k];
      f(first, run);
      int k = j - 1;
      while (k >= 0 && ++idx[k] == b.count[k]) idx[k--] = 0;
      if (k < 0) break;
    }
  }
}

}  // namespace meshtrain
