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
  // Expert parallelism, folded over the replicas (Megatron-Core's "parallel folding"): not an
  // axis of its own, so it adds no ranks. Of the dp x cp replicas of a (tp, pp) place, replica q
  // holds the experts of expert rank q mod ep; the ep consecutive replicas q / ep share their
  // tokens with each other (the expert group), and the replicas with the same q mod ep hold the
  // same experts (the expert-data group, over which those are reduced). ep divides dp x cp.
  int ep = 1;
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
  // The coordinates of replica q of the place `coords` is in (its dp and cp set from q).
  GridCoords with_replica_rank(GridCoords coords, int q) const {
    coords[axis_index(Axis::Context)] = q % cp;
    coords[axis_index(Axis::Data)] = q / cp;
    return coords;
  }
  int expert_rank(const GridCoords& coords) const { return replica_rank(coords) % ep; }
  int expert_data_rank(const GridCoords& coords) const { return replica_rank(coords) / ep; }
  // The expert groups (ep ranks that exchange tokens) and the expert-data groups (dp x cp / ep
  // ranks holding the same experts), each in group-rank order.
  std::vector<std::vector<int>> expert_groups() const;
  std::vector<std::vector<int>> expert_data_groups() const;
};

}  // namespace meshtrain
