// Hyperslab decomposition (io/hyperslab.h): for every flat range of every tensor-parallel slice
// of small tensors of rank 1 to 4, the boxes cover exactly the range's elements, in local flat
// order, at the global positions Parameter::global_index gives; and there are at most
// 2 rank - 1 of them. Also the checkpoint checksum (io/checkpoint_file.h): its definition on a
// known case, and that the parts of any split add up to the whole.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "meshtrain/io/checkpoint_file.h"
#include "meshtrain/io/hyperslab.h"
#include "meshtrain/model/parameter.h"
#include "meshtrain/tensor/philox.h"

namespace meshtrain {
namespace {

struct Case {
  Shape global;
  int split_dim;  // -1: replicated
  int parts;
};

std::vector<Case> cases() {
  return {
      {Shape{7}, -1, 1},          {Shape{8}, 0, 2},          {Shape{3, 4}, -1, 1},
      {Shape{4, 6}, 0, 2},        {Shape{4, 6}, 1, 3},       {Shape{3, 4, 4}, 2, 2},
      {Shape{3, 4, 4}, 1, 4},     {Shape{2, 3, 2, 4}, 3, 2}, {Shape{2, 4, 3, 2}, 1, 2},
      {Shape{2, 2, 3, 2}, -1, 1},
  };
}

std::vector<int64_t> run_indices(const Shape& global, const std::vector<Box>& boxes) {
  std::vector<int64_t> out;
  for_each_run(global, boxes, [&](int64_t first, int64_t n) {
    for (int64_t j = 0; j < n; ++j) out.push_back(first + j);
  });
  return out;
}

TEST(Hyperslab, EveryRangeOfEverySliceMapsToItsGlobalElements) {
  for (const Case& c : cases()) {
    for (int part = 0; part < c.parts; ++part) {
      Parameter p;
      p.spec.global_shape = c.global;
      p.spec.tp_split_dim = c.split_dim;
      p.shape = split_shape(c.global, c.split_dim, c.parts);
      p.split_begin = c.split_dim >= 0 ? part * p.shape[c.split_dim] : 0;
      const SliceGeometry g{c.global, p.shape, c.split_dim, p.split_begin};
      const int64_t n = p.numel();
      for (int64_t begin = 0; begin <= n; ++begin) {
        for (int64_t count = 0; begin + count <= n; ++count) {
          SCOPED_TRACE(c.global.to_string() + " split " + std::to_string(c.split_dim) + " part " +
                       std::to_string(part) + " range [" + std::to_string(begin) + ", " +
                       std::to_string(begin + count) + ")");
          const std::vector<Box> boxes = boxes_of_range(g, begin, count);
          EXPECT_LE(static_cast<int>(boxes.size()), 2 * c.global.rank() - 1);
          std::vector<int64_t> want;
          for (int64_t i = begin; i < begin + count; ++i) want.push_back(p.global_index(i));
          ASSERT_EQ(run_indices(c.global, boxes), want);
          int64_t total = 0;
          for (const Box& b : boxes) {
            total += b.numel(c.global.rank());
            for (int k = 0; k < c.global.rank(); ++k) {
              EXPECT_GE(b.start[k], 0);
              EXPECT_LE(b.start[k] + b.count[k], c.global[k]);
            }
          }
          EXPECT_EQ(total, count);
        }
      }
    }
  }
}

TEST(Hyperslab, RangeOutsideTheSliceIsRefused) {
  const SliceGeometry g{Shape{4, 6}, Shape{4, 3}, 1, 3};
  EXPECT_THROW(boxes_of_range(g, 10, 3), std::out_of_range);
  EXPECT_THROW(boxes_of_range(g, -1, 2), std::out_of_range);
}

TEST(Hyperslab, WholeRowsAreOneRun) {
  // A (4, 6) tensor split over columns: a slice's full rows are not contiguous globally, but a
  // replicated tensor's rows [1, 3) are one run of 12.
  const SliceGeometry whole{Shape{4, 6}, Shape{4, 6}, -1, 0};
  int runs = 0;
  for_each_run(whole.global, boxes_of_range(whole, 6, 12), [&](int64_t first, int64_t n) {
    EXPECT_EQ(first, 6);
    EXPECT_EQ(n, 12);
    ++runs;
  });
  EXPECT_EQ(runs, 1);
}

TEST(Checksum, FollowsTheDocumentedFormula) {
  const float v[3] = {1.0f, -2.5f, 3.25f};
  uint64_t want = 0;
  for (int i = 0; i < 3; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &v[i], 4);
    want += mix64(static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + bits);
  }
  Box all;
  all.count[0] = 3;
  EXPECT_EQ(checksum_part(v, DType::F32, Shape{3}, {all}), want);
}

TEST(Checksum, PartsOfAnySplitAddUpToTheWhole) {
  const Shape global{4, 6};
  std::vector<double> values(24);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.1 * static_cast<double>(i) - 1.0;
  Box all;
  all.count = {4, 6};
  const uint64_t whole = checksum_part(values.data(), DType::F64, global, {all});
  // Columns split in two, each slice cut into two flat pieces at different places.
  uint64_t sum = 0;
  for (int part = 0; part < 2; ++part) {
    const SliceGeometry g{global, Shape{4, 3}, 1, part * 3};
    for (auto [begin, count] : {std::pair<int64_t, int64_t>{0, 5 + part}, {5 + part, 7 - part}}) {
      std::vector<double> piece;
      for (int64_t i = begin; i < begin + count; ++i)
        piece.push_back(values[static_cast<size_t>((i / 3) * 6 + part * 3 + i % 3)]);
      sum += checksum_part(piece.data(), DType::F64, global, boxes_of_range(g, begin, count));
    }
  }
  EXPECT_EQ(sum, whole);
  values[7] = std::nextafter(values[7], 10.0);  // one bit
  EXPECT_NE(checksum_part(values.data(), DType::F64, global, {all}), whole);
}

}  // namespace
}  // namespace meshtrain
