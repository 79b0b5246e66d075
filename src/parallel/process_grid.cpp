#include "meshtrain/parallel/process_grid.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <map>
#include <stdexcept>

#include "meshtrain/comm/meta_communicator.h"
#include "meshtrain/comm/mpi_communicator.h"
#include "meshtrain/comm/node.h"

namespace meshtrain {

ProcessGrid::ProcessGrid(MPI_Comm world, const GridShape& shape, double timeout_seconds,
                         const CommunicatorFactory& make_group,
                         const CommunicatorDecorator& decorate)
    : shape_(shape), mpi_world_(world) {
  const std::chrono::duration<double> timeout(timeout_seconds);
  auto wrap = [&](std::unique_ptr<Communicator> c, int id) {
    return decorate ? decorate(std::move(c), id) : std::move(c);
  };
  auto group = [&](MPI_Comm comm, const std::string& name, int id) -> std::unique_ptr<Communicator> {
    if (make_group) return wrap(make_group(comm, name), id);
    return wrap(std::make_unique<MpiCommunicator>(comm, name, timeout), id);
  };
  int world_size = 0;
  MPI_Comm_rank(world, &world_rank_);
  MPI_Comm_size(world, &world_size);
  if (world_size != shape_.world_size())
    throw std::invalid_argument("process grid dp*tp*pp*cp = " + std::to_string(shape_.world_size()) +
                                " does not match " + std::to_string(world_size) + " ranks");
  coords_ = shape_.coordinates(world_rank_);
  world_ = wrap(std::make_unique<MpiCommunicator>(world, "world", timeout), 0);

  const NodeMembership node = node_membership(world);
  local_rank_ = node.local_rank;
  local_size_ = node.local_size;
  node_count_ = node.count;
  node_name_ = node.name;

  for (Axis a : kEveryAxis) {
    // Colour: the rank's coordinates on the other axes; key: its coordinate on this one.
    GridCoords c = coords_;
    c[axis_index(a)] = 0;
    MPI_Comm sub;
    // The colour is the world rank of the group's rank 0, which also names the group.
    MPI_Comm_split(world, shape_.world_rank(c), rank(a), &sub);
    if (a == Axis::Tensor) place_tensor_groups(world, sub, node.id);
    axis_comms_[axis_index(a)] = group(sub, std::string(axis_name(a)), shape_.world_rank(c));
  }
  if (shape_.cp > 1) {  // with cp == 1 the replicas are the data group itself
    GridCoords c = coords_;
    c[axis_index(Axis::Data)] = c[axis_index(Axis::Context)] = 0;
    MPI_Comm sub;
    MPI_Comm_split(world, shape_.world_rank(c), shape_.replica_rank(coords_), &sub);
    replicas_ = group(sub, "dp+cp", shape_.world_rank(c));
  }
  if (shape_.ep > 1) {
    // Colour: the world rank of the group's first member, which names it; key: the rank in it.
    const int q = shape_.replica_rank(coords_), ep = shape_.ep;
    const int expert_first = shape_.world_rank(shape_.with_replica_rank(coords_, q / ep * ep));
    const int data_first = shape_.world_rank(shape_.with_replica_rank(coords_, q % ep));
    MPI_Comm sub;
    MPI_Comm_split(world, expert_first, q % ep, &sub);
    expert_ = group(sub, "ep", expert_first);
    MPI_Comm_split(world, data_first, q / ep, &sub);
    expert_data_ = group(sub, "ep-data", data_first);
  }

  // Tied-embedding group: first and last stage of the same (dp, tp); others get a lone group.
  // Under zb-v the head shares the first stage with the embedding: every group is a lone one.
  const bool on_end = shape_.pp > 1 && shape_.head_stage == HeadStage::Last &&
                      (is_first_stage() || is_last_stage());
  GridCoords c = coords_;
  c[axis_index(Axis::Pipeline)] = 0;
  MPI_Comm emb;
  MPI_Comm_split(world, on_end ? shape_.world_rank(c) : shape_.world_size() + world_rank_,
                 rank(Axis::Pipeline), &emb);
  embedding_ = group(emb, "embedding", on_end ? shape_.world_rank(c) : world_rank_);
}

namespace {
// "0-3", "0-1, 4-5", "0, 2, 4": ascending world ranks, runs of consecutive ones as ranges.
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}
}  // namespace

void ProcessGrid::place_tensor_groups(MPI_Comm world, MPI_Comm tensor, int node_id) {
  const int tp = size(Axis::Tensor);
  std::vector<int> ids(static_cast<size_t>(tp));
  MPI_Allgather(&node_id, 1, MPI_INT, ids.data(), 1, MPI_INT, tensor);
  const bool spans = std::any_of(ids.begin(), ids.end(), [&](int id) { return id != ids[0]; });
  std::string example;
  if (spans) {  // the same verdict on every rank of the group: all of it gathers the names
    const std::vector<std::string> names = all_gather_strings(tensor, node_name_);
    std::vector<int> members;
    std::map<int, std::vector<int>> by_node;  // node id -> world ranks, nodes in rank order
    GridCoords c = coords_;
    for (int i = 0; i < tp; ++i) {
      c[axis_index(Axis::Tensor)] = i;
      members.push_back(shape_.world_rank(c));
      by_node[ids[static_cast<size_t>(i)]].push_back(members.back());
    }
    std::sort(members.begin(), members.end());
    example = "ranks " + rank_list(members) + " on nodes ";
    std::string sep;
    for (auto& [id, ranks] : by_node) {
      const size_t first = static_cast<size_t>(std::find(ids.begin(), ids.end(), id) - ids.begin());
      std::sort(ranks.begin(), ranks.end());
      example += sep + names[first] + " (rank" + (ranks.size() > 1 ? "s " : " ") + rank_list(ranks) + ")";
      sep = ", ";
    }
  }
  // Over the grid: how many groups span nodes, and the first one's description for everyone.
  const bool leader = rank(Axis::Tensor) == 0;
  const int counted = spans && leader ? 1 : 0;
  MPI_Allreduce(&counted, &tp_spanning_groups_, 1, MPI_INT, MPI_SUM, world);
  if (tp_spanning_groups_ == 0) return;
  const int candidate = spans && leader ? world_rank_ : INT_MAX;
  int first = INT_MAX;
  MPI_Allreduce(&candidate, &first, 1, MPI_INT, MPI_MIN, world);
  int length = static_cast<int>(example.size());
  MPI_Bcast(&length, 1, MPI_INT, first, world);
  example.resize(static_cast<size_t>(length));
  MPI_Bcast(example.data(), length, MPI_CHAR, first, world);
  tp_spanning_example_ = example;
}

ProcessGrid ProcessGrid::planned(const GridShape& shape, int world_rank) {
  ProcessGrid g;
  g.shape_ = shape;
  g.world_rank_ = world_rank;
  g.coords_ = shape.coordinates(world_rank);
  g.world_ = std::make_unique<MetaCommunicator>("world", world_rank, shape.world_size());
  for (Axis a : kEveryAxis)
    g.axis_comms_[axis_index(a)] =
        std::make_unique<MetaCommunicator>(std::string(axis_name(a)), g.rank(a), shape.size(a));
  if (shape.cp > 1)
    g.replicas_ = std::make_unique<MetaCommunicator>("dp+cp", shape.replica_rank(g.coords_),
                                                     shape.dp * shape.cp);
  if (shape.ep > 1) {
    g.expert_ = std::make_unique<MetaCommunicator>("ep", shape.expert_rank(g.coords_), shape.ep);
    g.expert_data_ = std::make_unique<MetaCommunicator>(
        "ep-data", shape.expert_data_rank(g.coords_), shape.dp * shape.cp / shape.ep);
  }
  const bool on_end = shape.pp > 1 && shape.head_stage == HeadStage::Last &&
                      (g.is_first_stage() || g.is_last_stage());
  g.embedding_ = std::make_unique<MetaCommunicator>("embedding", g.is_first_stage() ? 0 : 1,
                                                    on_end ? 2 : 1);
  return g;
}

std::string ProcessGrid::describe() const {
  return "rank " + std::to_string(world_rank_) + " (dp " + std::to_string(rank(Axis::Data)) + "/" +
         std::to_string(size(Axis::Data)) + ", tp " + std::to_string(rank(Axis::Tensor)) + "/" +
         std::to_string(size(Axis::Tensor)) + ", pp " + std::to_string(rank(Axis::Pipeline)) + "/" +
         std::to_string(size(Axis::Pipeline)) +
         (size(Axis::Context) > 1 ? ", cp " + std::to_string(rank(Axis::Context)) + "/" +
                                        std::to_string(size(Axis::Context))
                                  : std::string()) +
         (shape_.ep > 1 ? ", ep " + std::to_string(shape_.expert_rank(coords_)) + "/" +
                              std::to_string(shape_.ep)
                        : std::string()) +
         ")";
}

}  // namespace meshtrain
