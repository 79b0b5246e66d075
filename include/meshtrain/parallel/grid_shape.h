#pragma once
// The shape of the process grid: its axes, their sizes and the order in which world ranks run
// through them (deck parallel.order; parallel/process_grid.h builds the groups from it). A
// header of its own so that the configuration can hold a shape without MPI.

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain {

// Data (replicas on different samples), tensor (heads and channels), pipeline (layers) and
// context (the sequence, attention included: model/ring_attention.h).
enum class Axis { Data = 0, Tensor = 1, Pipeline = 2, Context = 3 };
inline constexpr int kAxes = 4;
std::string_view axis_name(Axis a);  // "dp", "tp", "pp", "cp"
// Index of an axis into per-axis arrays.
inline int axis_index(Axis a) {
  const int i = static_cast<int>(a);
  if (i < 0 || i >= kAxes) __builtin_unreachable();
  return i;
}
using GridCoords = std::array<int, kAxes>;  // indexed by axis_index
inline constexpr std::array<Axis, kAxes> kEveryAxis = {Axis::Data, Axis::Tensor, Axis::Pipeline,
                                                       Axis::Context};

// The pipeline stage of the LM head: the last (the looped chunk placement of every schedule but
// zb-v), or the first, beside the embedding (zb-v's V placement: parallel/schedule.h). Only with
// the head on the last stage does a tied embedding need an "embedding" group (process_grid.h).
enum class HeadStage { Last, First };

struct GridShape {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  std::array<Axis, kAxes> order = {Axis::Tensor, Axis::Context, Axis::Data, Axis::Pipeline};  // fastest first
  HeadStage head_stage = HeadStage::Last;

  int size(Axis a) const;
  int world_size() const { return dp * tp * pp * cp; }
  // Coordinates of a world rank, and back.
  GridCoords coordinates(int world_rank) const;
  int world_rank(const GridCoords& coords) const;
  // Parses "tp-cp-dp-pp" (any permutation of the four names), or three of them without cp,
  // which then varies right after tp ("tp-dp-pp" is "tp-cp-dp-pp"); throws std::invalid_argument.
  static std::array<Axis, kAxes> parse_order(const std::string& order);
  // Three names while cp == 1 (its place does not matter then), else four.
  std::string order_string() const;
  // The world ranks of every group along `a`, each in group-rank order.
  std::vector<std::vector<int>> groups(Axis a) const;
  // The replicas of the parameters: every rank with the same tensor and pipeline coordinates,
  // dp x cp of them (gradients are summed and ZeRO shards over them), in the order of
  // replica_rank.
  std::vector<std::vector<int>> replica_groups() const;
  // A rank's place among its replicas: its cp coordinate varies fastest.
  int replica_rank(const GridCoords& coords) const {
    return coords[axis_index(Axis::Context)] + cp * coords[axis_index(Axis::Data)];
  }
};

}  // namespace meshtrain
