#pragma once
// The shape of the process grid: its axes, their sizes and the order in which world ranks run
// through them (deck parallel.order; parallel/process_grid.h builds the groups from it). A
// header of its own so that the configuration can hold a shape without MPI.

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

enum class Axis { Data = 0, Tensor = 1, Pipeline = 2 };
std::string_view axis_name(Axis a);  // "dp", "tp", "pp"
// Index of an axis into per-axis arrays.
inline int axis_index(Axis a) {
  const int i = static_cast<int>(a);
  if (i < 0 || i > 2) __builtin_unreachable();
  return i;
}

// The pipeline stage of the LM head: the last (the looped chunk placement of every schedule but
// zb-v), or the first, beside the embedding (zb-v's V placement: parallel/schedule.h). Only with
// the head on the last stage does a tied embedding need an "embedding" group (process_grid.h).
enum class HeadStage { Last, First };

struct GridShape {
  int dp = 1, tp = 1, pp = 1;
  std::array<Axis, 3> order = {Axis::Tensor, Axis::Data, Axis::Pipeline};  // fastest first
  HeadStage head_stage = HeadStage::Last;

  int size(Axis a) const;
  int world_size() const { return dp * tp * pp; }
  // Coordinates (indexed by Axis) of a world rank, and back.
  std::array<int, 3> coordinates(int world_rank) const;
  int world_rank(const std::array<int, 3>& coords) const;
  // Parses "tp-dp-pp" (any permutation of the three names); throws std::invalid_argument.
  static std::array<Axis, 3> parse_order(const std::string& order);
  std::string order_string() const;
  // The world ranks of every group along `a`, each in group-rank order.
  std::vector<std::vector<int>> groups(Axis a) const;
};

}  // namespace meshtrain
