#pragma once
// ProcessGrid: splits the world into data- (dp), tensor- (tp), pipeline- (pp) and
// context-parallel (cp) groups.
//
// Rank order comes from one string, fastest-varying axis first (deck parallel.order):
//   "tp-dp-pp":  world_rank = tp + TP * (dp + DP * pp)
// so that, by default, a tensor group is made of consecutive ranks (one node, where NVLink is),
// data groups next, and pipeline stages furthest apart. Example, 8 ranks, dp = tp = pp = 2:
//   rank:  0 1 2 3 4 5 6 7
//   tp:    0 1 0 1 0 1 0 1     tensor groups   {0,1} {2,3} {4,5} {6,7}
//   dp:    0 0 1 1 0 0 1 1     data groups     {0,2} {1,3} {4,6} {5,7}
//   pp:    0 0 0 0 1 1 1 1     pipeline groups {0,4} {1,5} {2,6} {3,7}
// Each group is an MPI_Comm_split of the world: same coordinates on the other axes. cp ranks
// split every sequence (model/ring_attention.h) and vary right after tp by default
// ("tp-cp-dp-pp"): their ring carries keys and values every layer.
// The "embedding" group joins the first and last pipeline stage of each (dp, tp) pair, so the
// two copies of tied token embeddings can sum their gradients; under zb-v (GridShape::head_stage
// First) the head sits beside the embedding on the first stage and every such group is a lone one.

#include <mpi.h>

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/parallel/grid_shape.h"

namespace meshtrain {

// Makes the communicator of one group (dp, tp, pp, embedding) from its MPI communicator: MPI
// itself on the CPU, NCCL or MPI with host staging for device tensors. The world stays MPI.
using CommunicatorFactory =
    std::function<std::unique_ptr<Communicator>(MPI_Comm comm, const std::string& name)>;
// Wraps each group's communicator once built (the world's too): `id` is the world rank of the
// group's rank 0, which names the group among the others of its axis (the flight recorder).
using CommunicatorDecorator =
    std::function<std::unique_ptr<Communicator>(std::unique_ptr<Communicator> comm, int id)>;

class ProcessGrid {
 public:
  // Collective over `world`. The caller has validated shape.world_size() == world size.
  // Without a factory, every group is an MpiCommunicator.
  ProcessGrid(MPI_Comm world, const GridShape& shape, double timeout_seconds,
              const CommunicatorFactory& make_group = nullptr,
              const CommunicatorDecorator& decorate = nullptr);
  // The grid as world rank `world_rank` of a job that is only planned: every group is a
  // MetaCommunicator of the right rank and size, no MPI involved.
  static ProcessGrid planned(const GridShape& shape, int world_rank);

  const GridShape& shape() const { return shape_; }
  int rank(Axis a) const { return coords_[axis_index(a)]; }
  int size(Axis a) const { return shape_.size(a); }
  Communicator& comm(Axis a) { return *axis_comms_[axis_index(a)]; }
  Communicator& world() { return *world_; }
  // The replicas of this rank's parameters, dp x cp ranks (GridShape::replica_groups): gradients
  // are summed and ZeRO shards over it. The data group itself when cp == 1.
  Communicator& replicas() { return replicas_ ? *replicas_ : comm(Axis::Data); }
  int replica_rank() const { return shape_.replica_rank(coords_); }
  // Expert parallelism (GridShape::ep, folded over the replicas): the ep ranks that exchange
  // tokens with this one, and the replicas that hold the same experts. Both exist only when
  // ep > 1 (expert() is then not null); with ep == 1 the experts' replicas are replicas().
  Communicator* expert() { return expert_.get(); }
  Communicator& expert_data() { return expert_data_ ? *expert_data_ : replicas(); }
  // The MPI communicator the grid was built over (for MPI-IO); MPI_COMM_NULL when planned.
  MPI_Comm mpi_world() const { return mpi_world_; }
  // First and last stage of this rank's pipeline (size 1 when pp == 1 or not on such a stage).
  Communicator& embedding() { return *embedding_; }

  int world_rank() const { return world_rank_; }
  int world_size() const { return shape_.world_size(); }
  bool is_first_stage() const { return rank(Axis::Pipeline) == 0; }
  bool is_last_stage() const { return rank(Axis::Pipeline) == size(Axis::Pipeline) - 1; }
  // Neighbours along an axis, as ranks of comm(a) (wrapping around).
  int next_rank(Axis a) const { return (rank(a) + 1) % size(a); }
  int prev_rank(Axis a) const { return (rank(a) + size(a) - 1) % size(a); }

  // Node membership (comm/node.h: the node's name refined by shared memory).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int node_count() const { return node_count_; }
  const std::string& node_name() const { return node_name_; }
  // Tensor groups of the whole grid with members on more than one node (0 when every tensor
  // group lies inside a node), and the first of them, described with its nodes:
  // "ranks 0-3 on nodes n1 (ranks 0-1), n2 (ranks 2-3)". The same on every rank.
  int tensor_groups_spanning_nodes() const { return tp_spanning_groups_; }
  const std::string& spanning_tensor_group() const { return tp_spanning_example_; }

  std::string describe() const;  // "rank 5 (dp 0/2, tp 1/2, pp 1/2)"

 private:
  ProcessGrid() = default;
  GridShape shape_;
  GridCoords coords_{};
  int world_rank_ = 0;
  std::unique_ptr<Communicator> world_;
  MPI_Comm mpi_world_ = MPI_COMM_NULL;
  std::array<std::unique_ptr<Communicator>, kAxes> axis_comms_;
  std::unique_ptr<Communicator> replicas_;  // cp > 1 only
  std::unique_ptr<Communicator> expert_, expert_data_;  // ep > 1 only
  std::unique_ptr<Communicator> embedding_;
  // The tensor group's nodes, from its MPI communicator (collective over it): sets
  // tp_spanning_groups_ and tp_spanning_example_ (collective over `world`).
  void place_tensor_groups(MPI_Comm world, MPI_Comm tensor, int node_id);

  int local_rank_ = 0, local_size_ = 1, node_count_ = 1;
  std::string node_name_;
  int tp_spanning_groups_ = 0;
  std::string tp_spanning_example_;
};

}  // namespace meshtrain
